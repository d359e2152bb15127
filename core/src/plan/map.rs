//! The elementwise function kernels of `OpKind::Map` (docs/kernels.md `map_f16`): one kernel per
//! function, all with one shape — each worker streams its blocks of f16 values four at a time,
//! widens two to f32, applies the function's formula to each, narrows and stores in place — and a
//! descriptor of 64 bytes per worker: ptr, 4-value chunks per block, block stride, blocks, then
//! up to nine f32 constants the worker holds in `$a7..$a15` (a function's formula in
//! `runtime-tile/src/kernels.rs`, its issue count here, both specified in docs/kernels.md).

use alloc::vec::Vec;

use super::{Kernel, Word};
use crate::graph::MapFn;

/// Abramowitz & Stegun 7.1.26: `erf x ≈ 1 − t·(a1 + t(a2 + t(a3 + t(a4 + t·a5))))·e^{−x²}` with
/// `t = 1/(1 + p·x)` for x ≥ 0, absolute error ≤ 1.5e−7: p, 1, −1, a5, a4, a3, a2, a1, and
/// 1e−30, the floor of `|x|` in the sign `x/max(|x|, 1e−30)` (±1 exactly, 0 at 0).
// The published decimals, kept as printed; each rounds to the nearest f32.
#[allow(clippy::excessive_precision)]
pub const ERF_CONSTANTS: [f32; 9] = [
    0.327_591_1,
    1.0,
    -1.0,
    1.061_405_429,
    -1.453_152_027,
    1.421_413_741,
    -0.284_496_736,
    0.254_829_592,
    1e-30,
];

/// The constants a function's formula reads (`$a7` onwards).
pub fn constants(func: MapFn, exponent: f32) -> Vec<f32> {
    match func {
        MapFn::Tanh => alloc::vec![1.0, 2.0],
        MapFn::Sigmoid => alloc::vec![1.0, -1.0],
        MapFn::Exp | MapFn::Log | MapFn::Sqrt | MapFn::Abs => Vec::new(),
        MapFn::Reciprocal => alloc::vec![1.0],
        MapFn::Erf => ERF_CONSTANTS.to_vec(),
        MapFn::Pow | MapFn::Max | MapFn::LeakyRelu => alloc::vec![exponent],
        MapFn::Min => alloc::vec![-1.0, -exponent],
    }
}

/// Issues of a function's formula on one f32 value (`f32div`, `f32exp`, `f32ln`, `f32sqrt` cost
/// 2, every other f32 operation 1; docs/kernels.md lists each formula).
pub fn formula_issues(func: MapFn) -> u64 {
    match func {
        // x+x, exp, +1, 2/·, 1−·
        MapFn::Tanh => 7,
        // ·(−1), exp, +1, 1/·
        MapFn::Sigmoid => 6,
        MapFn::Exp | MapFn::Log | MapFn::Sqrt | MapFn::Reciprocal => 2,
        // x·x, √
        MapFn::Abs => 3,
        // 17 operations of cost 1, sqrt, two divides, exp (`map_erf_half` in runtime-tile)
        MapFn::Erf => 25,
        // ln, ·c, exp
        MapFn::Pow => 5,
        MapFn::Max => 1,
        // ·(−1), max, ·(−1)
        MapFn::Min => 3,
        // α·x, max
        MapFn::LeakyRelu => 2,
    }
}

/// Worker issues of `map_f16` for `func` over `blocks` blocks of `full` 4-value chunks and
/// `tail` single values: set-up 2 (shl, add) + 5 ld32 + one lda32 per constant, brz, `add`; per
/// block 2 moves and a brz, for full chunks an `add` and per chunk ld64pi, 2 × (f16v2tof32, the
/// formula on two values, f32v2tof16), st64pi, brnzdec; a brz, for a tail an `add` and per value
/// ldh16, f16v2tof32, the formula, f32v2tof16, sth16, add, brnzdec; the stride add and brnzdec;
/// exit. No blocks: 9 + constants.
pub fn issues(func: MapFn, full: u64, tail: u64, blocks: u64) -> u64 {
    let n = constants(func, 1.0).len() as u64;
    let s = formula_issues(func);
    if blocks == 0 {
        return 9 + n;
    }
    let chunks = if full > 0 { 1 + full * (7 + 4 * s) } else { 0 };
    let singles = if tail > 0 { 1 + tail * (6 + s) } else { 0 };
    10 + n + blocks * (6 + chunks + singles)
}

/// The kernel's name in profiles (`tanh_f16`); its assembly label is this with a `k_` prefix.
pub fn kernel_name(func: MapFn) -> &'static str {
    match func {
        MapFn::Tanh => "tanh_f16",
        MapFn::Sigmoid => "sigmoid_f16",
        MapFn::Exp => "exp_f16",
        MapFn::Log => "log_f16",
        MapFn::Sqrt => "sqrt_f16",
        MapFn::Reciprocal => "reciprocal_f16",
        MapFn::Abs => "abs_f16",
        MapFn::Erf => "erf_f16",
        MapFn::Pow => "pow_f16",
        MapFn::Max => "max_f16",
        MapFn::Min => "min_f16",
        MapFn::LeakyRelu => "leaky_relu_f16",
    }
}

/// The kernel of a function, its descriptor's words after the four block words (the constants,
/// then at word 11 the tail count) and its worker issues for `full` chunks and `tail` values per
/// block over `blocks` blocks.
pub fn kernel(func: MapFn, exponent: f32, full: u64, tail: u64, blocks: u64) -> (Kernel, Vec<Word>, u64) {
    let mut w: Vec<Word> = constants(func, exponent).iter().map(|c| Word::Const(c.to_bits())).collect();
    w.resize(11, Word::Const(0));
    w.push(Word::Const(tail as u32));
    (Kernel::MapF16(func), w, issues(func, full, tail, blocks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_fits_the_descriptor() {
        // Nine constants at most ($a7..$a15), twelve words in the descriptor.
        for f in MapFn::ALL {
            assert!(constants(f, 2.5).len() <= 9, "{f:?}");
            assert_eq!(kernel(f, 2.5, 1, 3, 1).1.len(), 12);
        }
    }
}
