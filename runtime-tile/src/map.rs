//! The elementwise function kernels (`Kernel::MapF16`, `ipu_core::plan::map`; docs/kernels.md
//! `map_f16`): one shape for every function, its formula on one f32 value spliced in.
//!
//! Descriptor, 64 bytes per worker: ptr, full 4-value chunks per block, block stride, blocks, the
//! function's constants (up to nine, held in `$a7..$a15`), and at byte 60 the values after the
//! last full chunk of each block (0..3). Those are done one at a time with 16-bit loads and stores,
//! so the zero padding after a row stays zero whatever f(0) is (e^0 = 1 and 1/0 = ∞ would
//! otherwise leak into the padding that matmuls and row kernels read as zeros).

use ipu_core::graph::MapFn;

/// The assembly label of a function's kernel.
pub fn label(func: MapFn) -> &'static str {
    match func {
        MapFn::Tanh => "k_tanh_f16",
        MapFn::Sigmoid => "k_sigmoid_f16",
        MapFn::Exp => "k_exp_f16",
        MapFn::Log => "k_log_f16",
        MapFn::Sqrt => "k_sqrt_f16",
        MapFn::Reciprocal => "k_reciprocal_f16",
        MapFn::Abs => "k_abs_f16",
        MapFn::Erf => "k_erf_f16",
        MapFn::Pow => "k_pow_f16",
        MapFn::Max => "k_max_f16",
        MapFn::Min => "k_min_f16",
        MapFn::LeakyRelu => "k_leaky_relu_f16",
    }
}

/// The formula on the f32 value in `X` (in place), scratch `$a4..$a6`, constants from `$a7` in
/// the order of `ipu_core::plan::map::constants`; issue counts in `map::formula_issues`.
fn formula(func: MapFn) -> &'static [&'static str] {
    match func {
        // 1 − 2/(e^{2x} + 1); constants 1, 2.
        MapFn::Tanh => {
            &["f32add X, X, X", "f32exp X, X", "f32add X, X, $a7", "f32div X, $a8, X", "f32sub X, $a7, X"]
        }
        // 1/(1 + e^{−x}); constants 1, −1.
        MapFn::Sigmoid => &["f32mul X, X, $a8", "f32exp X, X", "f32add X, X, $a7", "f32div X, $a7, X"],
        MapFn::Exp => &["f32exp X, X"],
        MapFn::Log => &["f32ln X, X"],
        MapFn::Sqrt => &["f32sqrt X, X"],
        // Constant 1.
        MapFn::Reciprocal => &["f32div X, $a7, X"],
        // √(x²): exact, x² of an f16 value needs 22 bits.
        MapFn::Abs => &["f32mul X, X, X", "f32sqrt X, X"],
        // Constants p, 1, −1, a5, a4, a3, a2, a1, 1e−30 (`map::ERF_CONSTANTS`): A = x², B = √A,
        // t = 1/(1 + p·B), s = x/max(B, 1e−30) (±1, or 0 at 0), E = e^{−A},
        // q = t·(a5..a1 by Horner)·E, erf = s·(1 − q).
        MapFn::Erf => &[
            "f32mul $a4, X, X",
            "f32sqrt $a5, $a4",
            "f32mul $a6, $a5, $a7",
            "f32add $a6, $a6, $a8",
            "f32div $a6, $a8, $a6",
            "f32max $a5, $a5, $a15",
            "f32div X, X, $a5",
            "f32mul $a4, $a4, $a9",
            "f32exp $a4, $a4",
            "f32mul $a5, $a6, $a10",
            "f32add $a5, $a5, $a11",
            "f32mul $a5, $a5, $a6",
            "f32add $a5, $a5, $a12",
            "f32mul $a5, $a5, $a6",
            "f32add $a5, $a5, $a13",
            "f32mul $a5, $a5, $a6",
            "f32add $a5, $a5, $a14",
            "f32mul $a5, $a5, $a6",
            "f32mul $a5, $a5, $a4",
            "f32sub $a5, $a8, $a5",
            "f32mul X, X, $a5",
        ],
        // e^{c·ln x}; constant c.
        MapFn::Pow => &["f32ln X, X", "f32mul X, X, $a7", "f32exp X, X"],
        // max(x, c) (maxNum); constant c.
        MapFn::Max => &["f32max X, X, $a7"],
        // −max(−x, −c); constants −1, −c. Negating is exact.
        MapFn::Min => &["f32mul X, X, $a7", "f32max X, X, $a8", "f32mul X, X, $a7"],
        // max(x, α·x); constant α.
        MapFn::LeakyRelu => &["f32mul $a4, X, $a7", "f32max X, X, $a4"],
    }
}

/// Set-up (the descriptor and the constants), then per block the full chunks (two values at a
/// time in `$a2`, `$a3`) and the tail values one by one (`$a2`; `$a3` holds the zero upper half).
const MAP_F16: &str = "
.align 8
{NAME}:
    shl $m6, $m0, 6
    add $m6, $m1, $m6
    ld32 $m3, $m6, $m15, 0
    ld32 $m2, $m6, $m15, 4
    ld32 $m5, $m6, $m15, 8
    ld32 $m7, $m6, $m15, 12
    ld32 $m4, $m6, $m15, 60
{CONSTANTS}    brz $m7, {NAME}_done
    add $m7, $m7, -1
{NAME}_block:
    add $m8, $m3, 0
    add $m9, $m3, 0
    brz $m2, {NAME}_tail
    add $m10, $m2, -1
{NAME}_loop:
    ld64pi $a0, $m8, 8
    f16v2tof32 $a2, $a0
{PAIR}    f32v2tof16 $a0, $a2
    f16v2tof32 $a2, $a1
{PAIR}    f32v2tof16 $a1, $a2
    st64pi $a0, $m9, 8
    brnzdec $m10, {NAME}_loop
{NAME}_tail:
    brz $m4, {NAME}_next
    add $m10, $m4, -1
{NAME}_one:
    ldh16 $a0, $m8, $m15, 0
    f16v2tof32 $a2, $a0
{ONE}    f32v2tof16 $a0, $a2
    sth16 $a0, $m8, $m15, 0
    add $m8, $m8, 2
    brnzdec $m10, {NAME}_one
{NAME}_next:
    add $m3, $m3, $m5
    brnzdec $m7, {NAME}_block
{NAME}_done:
    exit
";

/// Assembly text of a function's kernel.
pub fn text(func: MapFn) -> alloc::string::String {
    use crate::kernels::per_register;
    let mut constants = alloc::string::String::new();
    for i in 0..ipu_core::plan::map::constants(func, 1.0).len() {
        constants.push_str(&alloc::format!("    lda32 $a{}, $m6, $m15, {}\n", 7 + i, 16 + 4 * i));
    }
    MAP_F16
        .replace("{CONSTANTS}", &constants)
        .replace("{PAIR}", &per_register(formula(func), &["$a2", "$a3"]))
        .replace("{ONE}", &per_register(formula(func), &["$a2"]))
        .replace("{NAME}", label(func))
}
