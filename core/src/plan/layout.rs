//! Layout helpers shared by the planners (`matmul`, `reduce`, `epilogue`, the row and elementwise
//! planners): the AMP output block's row and scratch sizes, the read-ahead slack of streamed
//! buffers, even splits of a range, and zero-filled buffers. Kept apart so that the modules that
//! use them need not depend on the matmul planner (docs/kernels.md "Matmul").

use super::{Buffer, MemKind};

/// Bytes of one output row of a block on the tile: 16 halves or 8 floats.
pub(super) const ROW: u32 = 32;
/// Scratch before each worker's output rows: the AMP pipeline's first five stores.
pub(super) const SCRATCH: u32 = 40;
/// Read-ahead slack after buffers streamed by the kernels.
pub(super) const SLACK: u32 = 48;

/// Part `i` of `total` split into `parts` nearly equal ranges, the larger ones first. Shared by the
/// planners and the host reference (which must reproduce the K split exactly).
pub fn split(total: u64, parts: u64, i: u64) -> (u64, u64) {
    let base = total / parts;
    let extra = total % parts;
    let start = i * base + i.min(extra);
    (start, start + base + u64::from(i < extra))
}

/// A zero-filled buffer of `bytes` (16-byte aligned, live for the whole run).
pub(super) fn zero(name: &str, bytes: u64, kind: MemKind) -> Buffer {
    Buffer {
        name: name.into(),
        bytes: bytes as u32,
        align: 16,
        kind,
        init: super::Init::new(),
        live: super::Live::ALWAYS,
        read_past: 0,
    }
}
