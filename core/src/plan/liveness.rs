//! Per-tile memory liveness for graphs of stages (docs/graph-planner.md §5).
//!
//! Positions: stage `k`'s redistribution is `2k`, its compute `2k + 1`. A stage's own buffers
//! live `[2k, 2k + 1]`; a buffer holding a tensor that a later stage `j` reads lives until `2j`
//! (the redistribution that reads it); params, descriptors, profile stamps, host-bound buffers
//! and graph outputs live always ([`Live::ALWAYS`]). The linker lets buffers with disjoint
//! lifetimes share bytes.
//!
//! The kernels rely on zero-filled buffers (AMP operand padding, zero `pin` rows, row padding
//! moved as part of a word). Reused bytes hold an earlier buffer's values, so every buffer that may
//! share bytes is cleared by `zero_words` at the start of its stage, every run. Clears cost
//! cycles, so a tile shares memory only when its buffers do not fit side by side: graphs that
//! fit keep their packages and cycles unchanged.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use super::{cost, placed_bytes, Buffer, Kernel, Live, MemKind, Step, TilePlan, Word};
use crate::graph::{Graph, TensorId};

/// Longest segment `zero_words` takes (one `rpt` of one bundle per word).
const ZERO_MAX_WORDS: u32 = 4095;

/// The last position at which each tensor made on the chip is read: `2j` for the last stage `j`
/// that reads it (or a view of it), `u32::MAX` for graph outputs and the bases of output views.
pub(super) fn last_reads(
    g: &Graph,
    stages: &[Vec<usize>],
    base_of: impl Fn(TensorId) -> TensorId,
) -> BTreeMap<TensorId, u32> {
    let mut last: BTreeMap<TensorId, u32> = BTreeMap::new();
    for (k, ops) in stages.iter().enumerate() {
        for &i in ops {
            for t in g.ops[i].kind.operands() {
                let e = last.entry(base_of(t)).or_insert(0);
                *e = (*e).max(2 * k as u32);
            }
        }
    }
    for &o in &g.outputs {
        last.insert(base_of(o), u32::MAX);
    }
    last
}

/// Whether a buffer may share bytes: zero-filled tensor or exchange data that the host neither
/// writes nor reads.
fn sharable(b: &Buffer, host: Option<&BTreeSet<String>>) -> bool {
    b.init.is_empty()
        && matches!(b.kind, MemKind::Tensor | MemKind::Exchange)
        && !host.is_some_and(|h| h.contains(b.name.as_str()))
}

/// Lifetimes of stage `k`'s buffers on one tile: `[2k, 2k + 1]`, extended to the last read of
/// any tensor a buffer holds (`holds`: buffer → tensors). Host-bound buffers live always.
pub(super) fn assign(
    buffers: &mut [Buffer],
    k: usize,
    holds: Option<&BTreeMap<String, Vec<TensorId>>>,
    last: &BTreeMap<TensorId, u32>,
    host: Option<&BTreeSet<String>>,
) {
    let born = 2 * k as u32;
    for b in buffers.iter_mut() {
        if !sharable(b, host) {
            b.live = Live::ALWAYS;
            continue;
        }
        let to = holds
            .and_then(|h| h.get(b.name.as_str()))
            .into_iter()
            .flatten()
            .map(|t| last.get(t).copied().unwrap_or(0))
            .fold(born + 1, u32::max);
        b.live = if to == u32::MAX { Live::ALWAYS } else { Live { from: born, to } };
    }
}

/// Bytes of `buffers` live at position `x` (each rounded up to the linker's 16-byte alignment).
pub(super) fn live_bytes(buffers: &[Buffer], x: u32) -> u64 {
    buffers
        .iter()
        .filter(|b| b.live.from <= x && x <= b.live.to)
        .map(|b| (b.bytes as u64).div_ceil(16) * 16)
        .sum()
}

/// The most bytes live at once: a sweep over lifetime ends (`live_bytes` at every position
/// would be quadratic in the buffers of a tile).
pub fn peak_bytes(buffers: &[Buffer]) -> u64 {
    let mut ends: Vec<(u64, i64)> = Vec::with_capacity(2 * buffers.len());
    for b in buffers {
        let bytes = ((b.bytes as u64).div_ceil(16) * 16) as i64;
        ends.push((b.live.from as u64, bytes));
        ends.push((b.live.to as u64 + 1, -bytes));
    }
    // At one position, bytes that are freed go before bytes that arrive.
    ends.sort_unstable();
    let (mut now, mut peak) = (0i64, 0i64);
    for (_, d) in ends {
        now += d;
        peak = peak.max(now);
    }
    peak as u64
}

/// Finish one tile: if its buffers fit side by side within `limit`, every buffer lives always
/// (no sharing, no clears); otherwise each sharable buffer is cleared at the start of the stage
/// that makes it (`starts[k]`: index of stage `k`'s first step). Returns the bytes cleared per run.
pub(super) fn finish(tile: &mut TilePlan, starts: &[usize], limit: u64) -> u64 {
    if placed_bytes(&tile.buffers) <= limit {
        for b in tile.buffers.iter_mut() {
            b.live = Live::ALWAYS;
        }
        return 0;
    }
    let mut cleared = 0;
    let mut launches: Vec<(usize, Vec<Buffer>, Step)> = Vec::new();
    for (k, &at) in starts.iter().enumerate() {
        let born = 2 * k as u32;
        let mut segs: Vec<(u32, Vec<Word>)> = Vec::new();
        for b in tile.buffers.iter().filter(|b| b.live != Live::ALWAYS && b.live.from == born) {
            // Whole words: the linker aligns every buffer to 8 bytes, so the last word's spare
            // bytes belong to no other buffer.
            let words = b.bytes.div_ceil(4);
            cleared += 4 * words as u64;
            let mut done = 0;
            while done < words {
                let n = (words - done).min(ZERO_MAX_WORDS);
                segs.push((n, alloc::vec![Word::Sym(b.name.clone(), 4 * done)]));
                done += n;
            }
        }
        if segs.is_empty() {
            continue;
        }
        let (list, desc) = (format!("z{k}_l"), format!("z{k}_d"));
        let (bufs, issues) = super::redistribute::word_launch(segs, cost::zero_issues, &list, &desc);
        launches.push((at, bufs, Step::RunAll(Kernel::ZeroWords, desc.into(), issues.into())));
    }
    // Later stages first, so that earlier insertion points stay valid.
    for (at, bufs, step) in launches.into_iter().rev() {
        tile.buffers.extend(bufs);
        tile.steps.insert(at, step);
    }
    cleared
}

/// Names of the buffers the host reads or writes on each tile.
pub(super) fn host_buffers(bindings: &[super::BindingPlan]) -> BTreeMap<u16, BTreeSet<String>> {
    let mut m: BTreeMap<u16, BTreeSet<String>> = BTreeMap::new();
    for b in bindings {
        for s in &b.slices {
            m.entry(s.tile).or_default().insert(String::from(s.buffer.as_str()));
        }
    }
    m
}
