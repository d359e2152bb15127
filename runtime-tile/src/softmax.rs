//! The row softmax kernel `k_softmax_f16` (docs/kernels.md, the softmax paragraph; its cost is
//! `ipu_core::plan::cost::softmax_issues`, exact against it in `tests/tests/softmax_kernel.rs`).

/// One group of four values in each softmax pass (`{MAX}`, `{SUM}`, `{APPLY}` in [`SOFTMAX`]; the
/// `…4` forms are four groups, a whole source block): the running max of each of the four lanes
/// (`f16v4max`, exact: the max of f16 values is one of them); `e = exp(x + (−max))` into
/// the two sum lanes and stored (f32) in the worker's `e` row; `f16(e · r)` from the stored `e`.
const SM_MAX: &str = "    ld64pi $a0, $m11, 8
    f16v4max $a6, $a6, $a0
";
/// `{MAX4}`: a whole source block's four groups, each load bundled with the previous group's
/// max (a bundle's halves read the registers as they were before it).
const SM_MAX4: &str = "    ld64pi $a0, $m11, 8
    { ld64pi $a2, $m11, 8 ; f16v4max $a6, $a6, $a0 }
    { ld64pi $a0, $m11, 8 ; f16v4max $a6, $a6, $a2 }
    { ld64pi $a2, $m11, 8 ; f16v4max $a6, $a6, $a0 }
    f16v4max $a6, $a6, $a2
";
const SM_SUM: &str = "    { ld64pi $a0, $m11, 8 ; fnop }
    f16v2tof32 $a2, $a0
    f32v2add $a2, $a2, $a8
    f32exp $a2, $a2
    f32exp $a3, $a3
    { st64pi $a2, $m0, 8 ; f32v2add $a10, $a10, $a2 }
    f16v2tof32 $a2, $a1
    f32v2add $a2, $a2, $a8
    f32exp $a2, $a2
    f32exp $a3, $a3
    { st64pi $a2, $m0, 8 ; f32v2add $a10, $a10, $a2 }
";
const SM_APPLY: &str = "    { ld64pi $a2, $m11, 8 ; fnop }
    { ld64pi $a4, $m11, 8 ; f32v2mul $a2, $a2, $a12 }
    f32v2mul $a4, $a4, $a12
    f32v2tof16 $a6, $a2
    f32v2tof16 $a7, $a4
    st64pi $a6, $m0, 8
";

/// Row softmax (docs/kernels.md). Descriptor, 64 bytes per worker: source row, source block jump,
/// destination row, destination block jump, rows, G (groups of four values), T (tail values, 0..3),
/// D (groups per destination block), the worker's `e` row (4·(4G + T) bytes, 8-aligned), 0, four
/// f16 −inf (`0xFC00FC00` twice, at byte 40: each row's lane maxima start from them), 0 × 4.
/// Max (four lanes at a time with `f16v4max`, then the lanes and the tail values with `f32max`:
/// the same maximum as one value at a time — only the sign of a zero maximum could differ, and
/// `0 − max` is +0 either way); then `e = exp(x + (−max))`, stored as f32 in the `e` row and summed in two f32 lanes
/// (`f32v2add`: lane 0 takes values 0 and 2 of each group, lane 1 values 1 and 3, tail values lane
/// 0), `sum = s₀ + s₁`, `r = 1 / sum`; then `f16(e · r)` from the stored `e` — all in f32, in
/// column order, the same operations as `reference::softmax_device`. Whole groups are loaded and
/// stored 64 bits at a time (a source block holds 4 groups, a destination block D); the last T
/// values go one at a time. Each pass takes the row's whole source blocks four groups at a time
/// (the block jump once per block, the destination jump in the third pass once per D/4 blocks),
/// then the G mod 4 groups left one at a time (they can end no destination block), then the tail.
/// `$m6` keeps the descriptor address (the `e` row is read from it in each row); `$m12` holds
/// G / 4, `$m8` G mod 4. The second and third passes put each group's loads and stores in bundles
/// with its ARF work (a bundle's halves read the registers as they were before it, so a store
/// takes the `e` pair its bundled add sums), and their loop heads bundle one `or` with an `fnop`
/// so that the loops' bundles fall on 8-byte boundaries (the assembler refuses them otherwise).
const SOFTMAX: &str = "
.align 8
k_softmax_f16:
    shl $m6, $m0, 6
    add $m6, $m1, $m6
    ld32 $m3, $m6, $m15, 0
    ld32 $m5, $m6, $m15, 4
    ld32 $m4, $m6, $m15, 8
    ld32 $m7, $m6, $m15, 12
    ld32 $m2, $m6, $m15, 16
    ld32 $m8, $m6, $m15, 20
    ld32 $m9, $m6, $m15, 24
    ld32 $m10, $m6, $m15, 28
    setzi $m14, 0
    seths $m14, 0xff80
    movam $a15, $m14
    setzi $m14, 0
    movam $a14, $m14
    shl $m14, $m10, 3
    setzi $m13, 2
    shr $m12, $m8, $m13
    and $m8, $m8, 3
    brz $m2, sm_done
sm_row:
    or $m11, $m3, $m15
    ld64 $a6, $m6, $m15, 40
    or $m13, $m12, $m15
    brz $m13, sm_p1_rest
    add $m13, $m13, -1
sm_p1_blk:
{MAX4}
    add $m11, $m11, $m5
    brnzdec $m13, sm_p1_blk
sm_p1_rest:
    or $m13, $m8, $m15
    brz $m13, sm_p1_tail
    add $m13, $m13, -1
sm_p1:
{MAX}
    brnzdec $m13, sm_p1
sm_p1_tail:
    f16v2tof32 $a0, $a6
    f16v2tof32 $a2, $a7
    f32max $a4, $a0, $a1
    f32max $a4, $a4, $a2
    f32max $a4, $a4, $a3
    or $m13, $m9, $m15
    brz $m13, sm_p2_start
sm_p1t:
    ldh16 $a0, $m11, $m15, 0
    f16v2tof32 $a2, $a0
    f32max $a4, $a4, $a2
    add $m11, $m11, 2
    add $m13, $m13, -1
    brnz $m13, sm_p1t
sm_p2_start:
    or $m11, $m3, $m15
    f32sub $a8, $a14, $a4
    f32add $a9, $a8, $a14
    f32add $a10, $a14, $a14
    f32add $a11, $a14, $a14
    ld32 $m0, $m6, $m15, 32
    { or $m13, $m12, $m15 ; fnop }
    brz $m13, sm_p2_rest
    add $m13, $m13, -1
sm_p2_blk:
{SUM4}
    add $m11, $m11, $m5
    brnzdec $m13, sm_p2_blk
sm_p2_rest:
    { or $m13, $m8, $m15 ; fnop }
    brz $m13, sm_p2_tail
    add $m13, $m13, -1
sm_p2:
{SUM}
    brnzdec $m13, sm_p2
sm_p2_tail:
    or $m13, $m9, $m15
    brz $m13, sm_p3_start
sm_p2t:
    ldh16 $a0, $m11, $m15, 0
    f16v2tof32 $a2, $a0
    f32add $a2, $a2, $a8
    f32exp $a2, $a2
    f32add $a10, $a10, $a2
    sta32 $a2, $m0, $m15, 0
    add $m0, $m0, 4
    add $m11, $m11, 2
    add $m13, $m13, -1
    brnz $m13, sm_p2t
sm_p3_start:
    f32add $a5, $a10, $a11
    setzi $m0, 0
    seths $m0, 0x3f80
    movam $a13, $m0
    f32div $a12, $a13, $a5
    f32add $a13, $a12, $a14
    ld32 $m11, $m6, $m15, 32
    or $m0, $m4, $m15
    or $m1, $m10, $m15
    { or $m13, $m12, $m15 ; fnop }
    brz $m13, sm_p3_rest
    add $m13, $m13, -1
sm_p3_blk:
{APPLY4}
    add $m1, $m1, -4
    brnz $m1, sm_p3_bnext
    add $m0, $m0, $m7
    or $m1, $m10, $m15
sm_p3_bnext:
    brnzdec $m13, sm_p3_blk
sm_p3_rest:
    or $m13, $m8, $m15
    brz $m13, sm_p3_tail
    add $m13, $m13, -1
sm_p3:
{APPLY}
    brnzdec $m13, sm_p3
sm_p3_tail:
    or $m13, $m9, $m15
    brz $m13, sm_row_end
sm_p3t:
    lda32 $a2, $m11, $m15, 0
    f32mul $a2, $a2, $a12
    f32v2tof16 $a6, $a2
    sth16 $a6, $m0, $m15, 0
    add $m11, $m11, 4
    add $m0, $m0, 2
    add $m13, $m13, -1
    brnz $m13, sm_p3t
sm_row_end:
    add $m3, $m3, 32
    add $m4, $m4, $m14
    add $m2, $m2, -1
    brnz $m2, sm_row
sm_done:
    exit
";

/// The kernel's assembly text: [`SOFTMAX`] with its per-group bodies filled in.
pub(crate) fn text() -> alloc::string::String {
    let mut t = alloc::string::String::from(SOFTMAX);
    for (name, body) in [("MAX", SM_MAX), ("SUM", SM_SUM), ("APPLY", SM_APPLY)] {
        let four = if name == "MAX" { SM_MAX4.into() } else { body.repeat(4) };
        t = t.replace(&alloc::format!("{{{name}4}}\n"), &four).replace(&alloc::format!("{{{name}}}\n"), body);
    }
    t
}
