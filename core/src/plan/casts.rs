//! Casts in row chains: the descriptor of the cast kernels and where the casts of side operands
//! run relative to the exchange (docs/search.md §5).

use alloc::vec::Vec;

use super::chain::fmt_bit;
use super::layout::split;
use super::Word;
use crate::target::WORKERS;

/// Descriptor of a cast over `chunks` chunks of four values, split over the workers.
/// `units` of `unit` values each (8 for the pipelined f16 → FP8 kernel, 4 for FP8 → f16).
pub(crate) fn cast_desc(
    (src, src_base): (&str, u64),
    (dst, dst_base): (&str, u64),
    units: u64,
    unit: u64,
    si: u64,
    so: u64,
    fp8: &crate::graph::Tensor,
) -> Vec<Word> {
    let fmtscale = fmt_bit(fp8.dtype) | ((fp8.scale as i32 as u32) & 0x3F) << 8;
    let mut words = Vec::new();
    for w in 0..WORKERS as u64 {
        let (c0, c1) = split(units, WORKERS as u64, w);
        words.extend([
            Word::Sym(src.into(), (src_base + c0 * unit * si) as u32),
            Word::Sym(dst.into(), (dst_base + c0 * unit * so) as u32),
            Word::Const((c1 - c0) as u32),
            Word::Const(fmtscale),
        ]);
    }
    words
}

/// Where the cast of a side operand (a matmul's `b` cast to FP8) runs relative to the exchange
/// (docs/search.md, "cast placement").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SideCast {
    /// The host loads the whole f16 operand on every tile; every tile casts all of it. No exchange.
    Replicated,
    /// Each tile of a batch group loads and casts a share, then the FP8 blocks are all-gathered:
    /// the exchange moves one byte per value.
    BeforeExchange,
    /// Each tile loads a share of the f16 blocks, they are all-gathered (two bytes per value), then
    /// every tile casts all of them.
    AfterExchange,
}

impl SideCast {
    /// All placements, in search order.
    pub const ALL: [SideCast; 3] = [SideCast::Replicated, SideCast::BeforeExchange, SideCast::AfterExchange];
    /// Name in logs and search states.
    pub fn name(self) -> &'static str {
        match self {
            SideCast::Replicated => "replicated",
            SideCast::BeforeExchange => "before_exchange",
            SideCast::AfterExchange => "after_exchange",
        }
    }
    /// The placement with this name (as in logs, search states and `build --side-cast`).
    pub fn from_name(name: &str) -> Option<SideCast> {
        SideCast::ALL.iter().copied().find(|c| c.name() == name)
    }
}

/// The 8-value units (in buffer order) that tile `i` of a batch group casts and sends when a side
/// cast is distributed over the group, else all of them.
pub(crate) fn own_units(mode: SideCast, units: u64, per_group: u64, i: u64) -> core::ops::Range<u64> {
    if mode == SideCast::Replicated {
        return 0..units;
    }
    let (u0, u1) = split(units, per_group, i);
    u0..u1
}
