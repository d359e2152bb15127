//! Layer normalisation kernels, composed from the same pass texts so that every variant performs
//! identical f32 operations (docs/kernels.md `layernorm_f16`; the host reference
//! `reference/layernorm.rs` mirrors each). Descriptor, 64 bytes per worker: x, y, rows, row stride,
//! chunks, tail, gamma, beta, 1/D, eps, 0, 0, 1.0, partials, 4·worker, 0.
//!
//! - `layernorm_f16`: each worker takes whole rows: sum, mean, variance, apply.
//! - `layernorm_sum` / `layernorm_var` / `layernorm_apply`: the six workers share each row, each
//!   taking a slice of its columns (whole 4-value chunks; the tail on the last worker); three
//!   launches, the supervisor's wait between them being the workers' barrier. Per row, the buffer
//!   of partials holds six f32 sums and then six f32 squared-deviation sums (48 bytes); a worker
//!   combines them in worker order `((p₀ + p₁) + …) + p₅`.

use ipu_core::plan::Kernel;

/// Setup: descriptor entry, pointers and counts, 1/D and eps (13 issues; the shared variants load
/// the partials' row pointer into `$m1` and 4·worker into `$m0`: 15).
const SETUP: &str = "
.align 8
{NAME}:
    shl $m6, $m0, 6
    add $m6, $m1, $m6
    ld32 $m3, $m6, $m15, 0
    ld32 $m4, $m6, $m15, 4
    ld32 $m2, $m6, $m15, 8
    ld32 $m5, $m6, $m15, 12
    ld32 $m7, $m6, $m15, 16
    ld32 $m8, $m6, $m15, 20
    ld32 $m9, $m6, $m15, 24
    ld32 $m10, $m6, $m15, 28
    lda32 $a14, $m6, $m15, 32
    lda32 $a15, $m6, $m15, 36
";

const SHARED_SETUP: &str = "    ld32 $m1, $m6, $m15, 52
    ld32 $m0, $m6, $m15, 56
";

/// Sum of the slice in two lanes; ends with `$a6 = s0 + s1`. Reads `$m3` (the row), `$m7`
/// (chunks), `$m8` (tail values) and two zero words at descriptor byte 40; scratch `$m11`, `$m12`,
/// `$a0..$a7`. Also the sum of `reduce_rows_f16` (`reduce_rows.rs`).
pub(crate) const SUM: &str = "    ld64 $a6, $m6, $m15, 40
    or $m11, $m3, $m15
    or $m12, $m7, $m15
    brz $m12, {NAME}_s_tail
    add $m12, $m12, -1
{NAME}_s:
    ld64pi $a0, $m11, 8
    f16v2tof32 $a2, $a0
    f16v2tof32 $a4, $a1
    f32v2add $a6, $a6, $a2
    f32v2add $a6, $a6, $a4
    brnzdec $m12, {NAME}_s
{NAME}_s_tail:
    or $m12, $m8, $m15
    brz $m12, {NAME}_s_end
{NAME}_st:
    ldh16 $a0, $m11, $m15, 0
    f16v2tof32 $a2, $a0
    f32add $a6, $a6, $a2
    add $m11, $m11, 2
    add $m12, $m12, -1
    brnz $m12, {NAME}_st
{NAME}_s_end:
    f32add $a6, $a6, $a7
";

/// The six partials at byte `off` of the row's partials, summed in worker order into `$a6`.
fn combine(off: u32) -> alloc::string::String {
    let mut s = alloc::format!("    lda32 $a6, $m1, $m15, {off}\n");
    for w in 1..6 {
        s.push_str(&alloc::format!("    lda32 $a7, $m1, $m15, {}\n    f32add $a6, $a6, $a7\n", off + 4 * w));
    }
    s
}

/// `$a8:9 = (−μ, −μ)` from `$a6 = Σ`.
const NEG_MEAN: &str = "    f32mul $a6, $a6, $a14
    ld64 $a8, $m6, $m15, 40
    f32sub $a8, $a8, $a6
    f32sub $a9, $a9, $a6
";

/// Sum of squared deviations of the slice in two lanes; ends with `$a6 = v0 + v1`.
const VAR: &str = "    ld64 $a6, $m6, $m15, 40
    or $m11, $m3, $m15
    or $m12, $m7, $m15
    brz $m12, {NAME}_v_tail
    add $m12, $m12, -1
{NAME}_v:
    ld64pi $a0, $m11, 8
    f16v2tof32 $a2, $a0
    f16v2tof32 $a4, $a1
    f32v2add $a2, $a2, $a8
    f32v2add $a4, $a4, $a8
    f32v2mul $a2, $a2, $a2
    f32v2mul $a4, $a4, $a4
    f32v2add $a6, $a6, $a2
    f32v2add $a6, $a6, $a4
    brnzdec $m12, {NAME}_v
{NAME}_v_tail:
    or $m12, $m8, $m15
    brz $m12, {NAME}_v_end
{NAME}_vt:
    ldh16 $a0, $m11, $m15, 0
    f16v2tof32 $a2, $a0
    f32add $a2, $a2, $a8
    f32mul $a2, $a2, $a2
    f32add $a6, $a6, $a2
    add $m11, $m11, 2
    add $m12, $m12, -1
    brnz $m12, {NAME}_vt
{NAME}_v_end:
    f32add $a6, $a6, $a7
";

/// `$a10 = $a11 = 1 / √(Σ·(1/D) + eps)` from `$a6 = Σ`.
const RSTD: &str = "    f32mul $a6, $a6, $a14
    f32add $a6, $a6, $a15
    f32sqrt $a6, $a6
    lda32 $a10, $m6, $m15, 48
    f32div $a10, $a10, $a6
    lda32 $a11, $m6, $m15, 48
    f32div $a11, $a11, $a6
";

/// `y = f16(((x + (−μ))·r)·γ + β)` over the slice.
const APPLY: &str = "    or $m11, $m3, $m15
    or $m12, $m4, $m15
    or $m13, $m9, $m15
    or $m14, $m10, $m15
    or $m0, $m7, $m15
    brz $m0, {NAME}_a_tail
    add $m0, $m0, -1
{NAME}_a:
    ld64pi $a0, $m11, 8
    f16v2tof32 $a2, $a0
    f16v2tof32 $a4, $a1
    f32v2add $a2, $a2, $a8
    f32v2add $a4, $a4, $a8
    f32v2mul $a2, $a2, $a10
    f32v2mul $a4, $a4, $a10
    ld64pi $a0, $m13, 8
    f16v2tof32 $a6, $a0
    f32v2mul $a2, $a2, $a6
    f16v2tof32 $a6, $a1
    f32v2mul $a4, $a4, $a6
    ld64pi $a0, $m14, 8
    f16v2tof32 $a6, $a0
    f32v2add $a2, $a2, $a6
    f16v2tof32 $a6, $a1
    f32v2add $a4, $a4, $a6
    f32v2tof16 $a0, $a2
    f32v2tof16 $a1, $a4
    st64pi $a0, $m12, 8
    brnzdec $m0, {NAME}_a
{NAME}_a_tail:
    or $m0, $m8, $m15
    brz $m0, {NAME}_row_end
{NAME}_at:
    ldh16 $a0, $m11, $m15, 0
    f16v2tof32 $a2, $a0
    f32add $a2, $a2, $a8
    f32mul $a2, $a2, $a10
    ldh16 $a0, $m13, $m15, 0
    f16v2tof32 $a6, $a0
    f32mul $a2, $a2, $a6
    ldh16 $a0, $m14, $m15, 0
    f16v2tof32 $a6, $a0
    f32add $a2, $a2, $a6
    f32v2tof16 $a0, $a2
    sth16 $a0, $m12, $m15, 0
    add $m11, $m11, 2
    add $m12, $m12, 2
    add $m13, $m13, 2
    add $m14, $m14, 2
    add $m0, $m0, -1
    brnz $m0, {NAME}_at
";

/// Next row (`shared`: also the next row of partials; `apply`: the apply pass's label target).
fn row_end(shared: bool, apply: bool) -> alloc::string::String {
    let label = if apply { "" } else { "{NAME}_row_end:\n" };
    let partials = if shared { "    add $m1, $m1, 48\n" } else { "" };
    alloc::format!(
        "{label}    add $m3, $m3, $m5\n    add $m4, $m4, $m5\n{partials}    add $m2, $m2, -1\n    brnz $m2, {{NAME}}_row\n{{NAME}}_done:\n    exit\n"
    )
}

/// The text of a layer normalisation kernel (`{NAME}` still to be replaced).
pub fn text(k: Kernel) -> alloc::string::String {
    let (shared, body): (bool, alloc::string::String) = match k {
        Kernel::LayerNormSum => (true, [SUM, "    sta32 $a6, $m1, $m0, 0\n"].concat()),
        Kernel::LayerNormVar => {
            (true, [&combine(0), NEG_MEAN, VAR, "    sta32 $a6, $m1, $m0, 24\n"].concat())
        }
        Kernel::LayerNormApply => {
            (true, [&combine(0), NEG_MEAN, &combine(24), RSTD, APPLY, "{NAME}_row_end:\n"].concat())
        }
        _ => (false, [SUM, NEG_MEAN, VAR, RSTD, APPLY, "{NAME}_row_end:\n"].concat()),
    };
    let apply = matches!(k, Kernel::LayerNormApply | Kernel::LayerNormF16);
    [
        SETUP,
        if shared { SHARED_SETUP } else { "" },
        "    brz $m2, {NAME}_done\n{NAME}_row:\n",
        &body,
        &row_end(shared, apply),
    ]
    .concat()
}
