//! `reduce_rows_f16`: one value per f16 row, the row's sum in f32 times a constant — 1 for
//! `reduce_sum`, 1/D for `reduce_mean` (docs/kernels.md `reduce_rows_f16`; planned by
//! `ipu_core::plan::row_reduce`, mirrored by the host reference `reference::reduce_row`).
//!
//! The sum is layer normalisation's first pass (`layernorm::SUM`), so both add a row's values
//! in the same order: whole 4-value chunks in two f32 lanes (even and odd values), the row's
//! tail values (D mod 4) one at a time into lane 0, then `s0 + s1`. The padding of the row is
//! never read. Each worker takes whole rows; the result of row r is one f16 at `y + r·ystride`
//! (`ystride` 4: one value per word, what a splat operand and a `[R, 1]` tensor's rows are).
//!
//! Descriptor, 64 bytes per worker: x, x row stride, y, y stride, rows, chunks, tail, scale (f32),
//! then zeros (the two at byte 40 are the sum's initial lanes).

/// The kernel text (`{NAME}` the label).
pub fn text() -> alloc::string::String {
    let head = "
.align 8
{NAME}:
    shl $m6, $m0, 6
    add $m6, $m1, $m6
    ld32 $m3, $m6, $m15, 0
    ld32 $m4, $m6, $m15, 4
    ld32 $m5, $m6, $m15, 8
    ld32 $m9, $m6, $m15, 12
    ld32 $m2, $m6, $m15, 16
    ld32 $m7, $m6, $m15, 20
    ld32 $m8, $m6, $m15, 24
    lda32 $a14, $m6, $m15, 28
    brz $m2, {NAME}_done
    add $m2, $m2, -1
{NAME}_row:
";
    let tail = "    f32mul $a6, $a6, $a14
    f32v2tof16 $a0, $a6
    sth16 $a0, $m5, $m15, 0
    add $m3, $m3, $m4
    add $m5, $m5, $m9
    brnzdec $m2, {NAME}_row
{NAME}_done:
    exit
";
    alloc::format!("{head}{}{tail}", crate::layernorm::SUM)
}
