//! The AMP rows kernel for an A operand held row-major (`AmpF16Strided`, `AmpF32Strided`,
//! `AmpF8Strided`; docs/kernels.md "Matmul"), in its own file because `kernels.rs` is full.
//!
//! Why: the plain kernel (`kernels::AMP`) streams x with `ld2st64pi`, whose pointers advance by 8,
//! so block kb of A must sit as `[kb][row][16]`: one 32-byte piece per (row, block). A producer
//! holding whole rows then sends one exchange piece per row and block. This kernel reads block kb
//! of row r at `x + r·S` (x = the block's column in row 0) with `ld2xst64pace`, whose three packed
//! addresses each advance by their own amount (docs/target.md §4.8), so a tile can hold
//! `[row][K slice]` as it arrives.
//!
//! Descriptor: the six 16-byte entries of the plain kernel (x, pin, out − 40, rows + 1), then one
//! word, S in bytes (a multiple of 8, 32 ≤ S ≤ 4112), at table + 96. One word for all six workers,
//! not one per entry: the workers of a launch split the rows of one A block, whose row stride is
//! the same for all, and the entries keep their 16 bytes and their `16k` indexing, so the planner
//! writes the same entries as for the plain kernel and appends one word.
//!
//! Streams: the load in bundle j fetches the chunk bundle j + 1 uses. The prologue loads chunk 0
//! of row 0; bundles 0 and 1 load chunks 1 and 2 (+8 each), bundle 2 loads chunk 3 and then moves
//! to chunk 0 of the next row (+S − 24), bundle 3 loads it (+8). So only bundle 2 strides x, with
//! stride select `0b000010` (field 1 of `$m7` for the first address; pin and out step by 8). Field
//! 1 holds `(S − 24)/8`, a signed 10-bit count of 8-byte steps: `(S − 24) << 7`, fields 0 and 2
//! zero, hence S ≤ 24 + 8·511 = 4112. x reads reach `x + (rows + 1)·S + 8` (the flush row and the
//! next row's first chunk), the plain kernel's `x + 32·(rows + 1) + 8` with S = 32.
//!
//! The pace keeps the store address packed, so the last store (the flush row's phase-3 output)
//! goes to `out − 40 + 32·(rows + 1)`, computed after the loop from the count still in `$m2`;
//! that `shl` after the loop instead of before it also leaves `rpt` at word 11 (≡ 4 mod 8 bytes)
//! without a `nop`. Register use as the plain kernel: x in `$a0`, pin in `$a2` (the quad `$a0:3`),
//! the AMP's output in `$a4`; the packed addresses in `$m8:9`, the stride register `$m7`.
pub(crate) const AMP_STRIDED: &str = "
.align 8
{NAME}:
    shl $m6, $m0, 4
    ld32 $m3, $m1, $m6, 0
    ld32 $m4, $m1, $m6, 4
    ld32 $m5, $m1, $m6, 8
    ld32 $m2, $m1, $m6, 12
    ld32 $m7, $m1, $m15, 96
    add $m7, $m7, -24
    shl $m7, $m7, 7
    ld64pi $a0, $m3, 8
    ld64pi $a2, $m4, 8
    tapack $m8, $m3, $m4, $m5
    rpt $m2, 4
    { ld2xst64pace $a0, $a4, $m8, $m7, 0b000000 ; {AMP} $a4, $a2, $a0, 0 }
    { ld2xst64pace $a0, $a4, $m8, $m7, 0b000000 ; {AMP} $a4, $a2, $a0, 1 }
    { ld2xst64pace $a0, $a4, $m8, $m7, 0b000010 ; {AMP} $a4, $a2, $a0, 2 }
    { ld2xst64pace $a0, $a4, $m8, $m7, 0b000000 ; {AMP} $a4, $a2, $a0, 3 }
    shl $m2, $m2, 5
    st64 $a4, $m5, $m2, 0
    exit
";
