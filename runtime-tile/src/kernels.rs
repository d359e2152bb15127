//! Worker kernels, as assembly text. Each takes `$m1` = descriptor table, worker `k` reads the
//! 16-byte entry at `$m1 + 16k`. Issue counts are mirrored in `ipu_core::plan::cost::kernel_issues`
//! and checked by tests (docs/kernels.md).

/// AMP rows: descriptor (x, pin, out − 40, rows + 1). `{AMP}` is the AMP mnemonic. The entry is
/// read with the table as base and `16k` as delta (no address add), which also puts the `rpt` at
/// word 7 (≡ 4 mod 8 bytes) without a `nop`: 10 issues outside the rows instead of 12.
const AMP: &str = "
.align 8
{NAME}:
    shl $m6, $m0, 4
    ld32 $m3, $m1, $m6, 0
    ld32 $m4, $m1, $m6, 4
    ld32 $m5, $m1, $m6, 8
    ld32 $m2, $m1, $m6, 12
    ld64pi $a0, $m3, 8
    ld64pi $a2, $m4, 8
    rpt $m2, 4
    { ld2st64pi $a0, $a2, $a4, $m3, $m4, $m5 ; {AMP} $a4, $a2, $a0, 0 }
    { ld2st64pi $a0, $a2, $a4, $m3, $m4, $m5 ; {AMP} $a4, $a2, $a0, 1 }
    { ld2st64pi $a0, $a2, $a4, $m3, $m4, $m5 ; {AMP} $a4, $a2, $a0, 2 }
    { ld2st64pi $a0, $a2, $a4, $m3, $m4, $m5 ; {AMP} $a4, $a2, $a0, 3 }
    st64pi $a4, $m5, 8
    exit
";

/// `out[i] = dst[i] + src[i]` over 8-byte chunks: descriptor (dst, src, out, chunks).
/// Reads run two chunks ahead of the stores, so `out == dst` is safe.
const ADD: &str = "
.align 8
{NAME}:
    shl $m6, $m0, 4
    add $m6, $m1, $m6
    ld32 $m3, $m6, $m15, 0
    ld32 $m4, $m6, $m15, 4
    ld32 $m5, $m6, $m15, 8
    ld32 $m2, $m6, $m15, 12
    brz $m2, {NAME}_done
    ld64pi $a0, $m3, 8
    ld64pi $a2, $m4, 8
    {OP} $a4, $a0, $a2
    ld64pi $a0, $m3, 8
    ld64pi $a2, $m4, 8
    add $m2, $m2, -1
    rpt $m2, 1
    { ld2st64pi $a0, $a2, $a4, $m3, $m4, $m5 ; {OP} $a4, $a0, $a2 }
    st64pi $a4, $m5, 8
{NAME}_done:
    exit
";

/// Label of a kernel's entry.
pub fn label(k: ipu_core::plan::Kernel) -> &'static str {
    use ipu_core::graph::BinaryOp;
    use ipu_core::plan::Kernel::*;
    match k {
        AmpF16 => "k_amp_f16",
        AmpF32 => "k_amp_f32",
        AddF16 => "k_add_f16",
        AddF32 => "k_add_f32",
        AddBlocksF16 => "k_add_blocks_f16",
        AddBlocksF32 => "k_add_blocks_f32",
        AmpF8 => "k_amp_f8",
        AmpF16Strided => "k_amp_f16_strided",
        AmpF32Strided => "k_amp_f32_strided",
        AmpF8Strided => "k_amp_f8_strided",
        CastF16ToF8 => "k_cast_f16_f8",
        CastF8ToF16 => "k_cast_f8_f16",
        ScaleF16 => "k_scale_f16",
        CvtF32ToF16 => "k_cvt_f32_f16",
        BiasF16 => "k_bias_f16",
        GeluF16 => "k_gelu_f16",
        CastF32ToF16 => "k_cast_f32_f16",
        CastF16ToF32 => "k_cast_f16_f32",
        SoftmaxF16 => "k_softmax_f16",
        CopyWords => "k_copy_words",
        ZeroWords => "k_zero_words",
        TransposeF16 => "k_transpose_f16",
        LayerNormF16 => "k_layernorm_f16",
        LayerNormSum => "k_layernorm_sum",
        LayerNormVar => "k_layernorm_var",
        LayerNormApply => "k_layernorm_apply",
        GeluErfF16 => "k_gelu_erf_f16",
        GeluSigmoidF16 => "k_gelu_sigmoid_f16",
        ReduceRowsF16 => "k_reduce_rows_f16",
        BinaryF16(BinaryOp::Add) => "k_add_rows_f16",
        BinaryF16(BinaryOp::Sub) => "k_sub_rows_f16",
        BinaryF16(BinaryOp::Mul) => "k_mul_rows_f16",
        SplatF16(BinaryOp::Add, false) => "k_add_splat_b_f16",
        SplatF16(BinaryOp::Sub, false) => "k_sub_splat_b_f16",
        SplatF16(BinaryOp::Mul, false) => "k_mul_splat_b_f16",
        SplatF16(BinaryOp::Add, true) => "k_add_splat_a_f16",
        SplatF16(BinaryOp::Sub, true) => "k_sub_splat_a_f16",
        SplatF16(BinaryOp::Mul, true) => "k_mul_splat_a_f16",
        MapF16(func) => crate::map::label(func),
    }
}

/// The f16×4 instruction of a binary op.
fn binary_mnemonic(op: ipu_core::graph::BinaryOp) -> &'static str {
    use ipu_core::graph::BinaryOp;
    match op {
        BinaryOp::Add => "f16v4add",
        BinaryOp::Sub => "f16v4sub",
        BinaryOp::Mul => "f16v4mul",
    }
}

/// `out = a ∘ b` over rows of f16 (`cost::binary_rows_issues`): descriptor (a, a row stride, b,
/// b row stride, out, out row stride, rows, 4-value chunks per row), 32 bytes per worker. A row
/// stride of 0 broadcasts one row to every row (a bias). Reads run two chunks ahead of the
/// stores, so `out` may be `a` or `b`, and every streamed row is followed by 8 readable bytes
/// (the planner's slack). `rpt` sits at byte 92 (≡ 4 mod 8).
const ROWS_BINARY: &str = "
.align 8
{NAME}:
    shl $m6, $m0, 5
    add $m6, $m1, $m6
    ld32 $m3, $m6, $m15, 0
    ld32 $m7, $m6, $m15, 4
    ld32 $m4, $m6, $m15, 8
    ld32 $m8, $m6, $m15, 12
    ld32 $m5, $m6, $m15, 16
    ld32 $m9, $m6, $m15, 20
    ld32 $m10, $m6, $m15, 24
    ld32 $m2, $m6, $m15, 28
    brz $m10, {NAME}_done
    brz $m2, {NAME}_done
    add $m10, $m10, -1
    add $m2, $m2, -1
{NAME}_row:
    add $m11, $m3, 0
    add $m12, $m4, 0
    add $m13, $m5, 0
    ld64pi $a0, $m11, 8
    ld64pi $a2, $m12, 8
    {OP} $a4, $a0, $a2
    ld64pi $a0, $m11, 8
    ld64pi $a2, $m12, 8
    nop
    rpt $m2, 1
    { ld2st64pi $a0, $a2, $a4, $m11, $m12, $m13 ; {OP} $a4, $a0, $a2 }
    st64pi $a4, $m13, 8
    add $m3, $m3, $m7
    add $m4, $m4, $m8
    add $m5, $m5, $m9
    brnzdec $m10, {NAME}_row
{NAME}_done:
    exit
";

/// `out = a ∘ b` over rows of f16 where one operand is one value per row (a column, `[R, 1]`) or
/// one value in all (a scalar) (`cost::splat_rows_issues`): descriptor (the other operand, its row
/// stride, the values — one f16 per 4 bytes —, their row stride (4, or 0 for a scalar), out, out
/// row stride, rows, 4-value chunks per row (≥ 1), the last chunk's lane mask as two words), 64
/// bytes per worker. Per row the value is splat into `$a6:7` (all lanes) and `$a8:9` (the last
/// chunk's lanes only, so the row padding stays 0 ∘ 0 = 0). One chunk per `ld64pi`/op/`st64pi`.
const ROWS_SPLAT: &str = "
.align 8
{NAME}:
    shl $m6, $m0, 6
    add $m6, $m1, $m6
    ld32 $m3, $m6, $m15, 0
    ld32 $m7, $m6, $m15, 4
    ld32 $m4, $m6, $m15, 8
    ld32 $m8, $m6, $m15, 12
    ld32 $m5, $m6, $m15, 16
    ld32 $m9, $m6, $m15, 20
    ld32 $m10, $m6, $m15, 24
    ld32 $m2, $m6, $m15, 28
    ld32 $m0, $m6, $m15, 32
    ld32 $m1, $m6, $m15, 36
    setzi $m6, 16
    brz $m10, {NAME}_done
    add $m10, $m10, -1
    add $m2, $m2, -1
{NAME}_row:
    ldh16 $a6, $m4, $m15, 0
    movma $m14, $a6
    shl $m11, $m14, $m6
    or $m14, $m14, $m11
    movam $a6, $m14
    movam $a7, $m14
    and $m11, $m14, $m0
    movam $a8, $m11
    and $m11, $m14, $m1
    movam $a9, $m11
    add $m11, $m3, 0
    add $m13, $m5, 0
    add $m12, $m2, 0
    brz $m12, {NAME}_last
    add $m12, $m12, -1
{NAME}_chunk:
    ld64pi $a0, $m11, 8
    {OP_FULL}
    st64pi $a4, $m13, 8
    brnzdec $m12, {NAME}_chunk
{NAME}_last:
    ld64pi $a0, $m11, 8
    {OP_LAST}
    st64pi $a4, $m13, 8
    add $m3, $m3, $m7
    add $m4, $m4, $m8
    add $m5, $m5, $m9
    brnzdec $m10, {NAME}_row
{NAME}_done:
    exit
";

/// `x = gelu(x)` in the erf form in place over blocks of f16 (`cost::gelu_erf_issues`):
/// descriptor (ptr, 4-value chunks per block, block stride, blocks, then the nine constants of
/// `plan::matmul::GELU_ERF_CONSTANTS`), 64 bytes per worker. Each chunk's four halves are done
/// two at a time (`{HALF}` on `$a2`, `$a3`, scratch `$a4..$a6`, constants in `$a7..$a15`).
/// `gelu_sigmoid_f16` is this code with its own `{HALF}` and constants.
const GELU_ERF_F16: &str = "
.align 8
{NAME}:
    shl $m6, $m0, 6
    add $m6, $m1, $m6
    ld32 $m3, $m6, $m15, 0
    ld32 $m2, $m6, $m15, 4
    ld32 $m5, $m6, $m15, 8
    ld32 $m7, $m6, $m15, 12
    lda32 $a7, $m6, $m15, 16
    lda32 $a8, $m6, $m15, 20
    lda32 $a9, $m6, $m15, 24
    lda32 $a10, $m6, $m15, 28
    lda32 $a11, $m6, $m15, 32
    lda32 $a12, $m6, $m15, 36
    lda32 $a13, $m6, $m15, 40
    lda32 $a14, $m6, $m15, 44
    lda32 $a15, $m6, $m15, 48
    brz $m7, {NAME}_done
    brz $m2, {NAME}_done
    add $m7, $m7, -1
{NAME}_block:
    add $m8, $m3, 0
    add $m9, $m3, 0
    add $m10, $m2, -1
{NAME}_loop:
    ld64pi $a0, $m8, 8
    f16v2tof32 $a2, $a0
{HALF}    f32v2tof16 $a0, $a2
    f16v2tof32 $a2, $a1
{HALF}    f32v2tof16 $a1, $a2
    st64pi $a0, $m9, 8
    brnzdec $m10, {NAME}_loop
    add $m3, $m3, $m5
    brnzdec $m7, {NAME}_block
{NAME}_done:
    exit
";

/// The erf-form GeLU of the f32 values in `$a2` and `$a3`, with A = `$a4`, B = `$a5`, C = `$a6`
/// and the constants p/√2, 1, −0.5, a5, a4, a3, a2, a1, 0.5 in `$a7..$a15`:
/// `A = x²`, `B = √A = |x|`, `x += B` (x + |x|, exact), `C = 1/(1 + B·p/√2)` = t,
/// `A = exp(−A/2)·B·C`, `B = t·(a5..a1 Horner)·A`, `x = (x − B)·0.5` — which is `x·Φ(x)` for
/// either sign of x (docs/kernels.md `gelu_erf_f16`).
fn gelu_erf_half() -> alloc::string::String {
    const STEPS: [&str; 21] = [
        "f32mul $a4, X, X",
        "f32sqrt $a5, $a4",
        "f32add X, X, $a5",
        "f32mul $a6, $a5, $a7",
        "f32add $a6, $a6, $a8",
        "f32div $a6, $a8, $a6",
        "f32mul $a4, $a4, $a9",
        "f32exp $a4, $a4",
        "f32mul $a4, $a4, $a5",
        "f32mul $a4, $a4, $a6",
        "f32mul $a5, $a6, $a10",
        "f32add $a5, $a5, $a11",
        "f32mul $a5, $a5, $a6",
        "f32add $a5, $a5, $a12",
        "f32mul $a5, $a5, $a6",
        "f32add $a5, $a5, $a13",
        "f32mul $a5, $a5, $a6",
        "f32add $a5, $a5, $a14",
        "f32mul $a5, $a5, $a4",
        "f32sub X, X, $a5",
        "f32mul X, X, $a15",
    ];
    per_register(&STEPS, &["$a2", "$a3"])
}

/// The quick GeLU `x/(e^{−1.702x} + 1)` of the f32 values in `$a2` and `$a3`, scratch `$a4`, the
/// constants −1.702 and 1 in `$a7`, `$a8` (`$a9..$a15` are loaded as zeros and unused): the
/// shape of `gelu_erf_f16` with this formula in place of its `{HALF}` (docs/kernels.md
/// `gelu_sigmoid_f16`). `x·σ(1.702x)` as one division: e^{−1.702x} = ∞ gives −0, x = NaN gives NaN.
fn gelu_sigmoid_half() -> alloc::string::String {
    const STEPS: [&str; 4] =
        ["f32mul $a4, X, $a7", "f32exp $a4, $a4", "f32add $a4, $a4, $a8", "f32div X, X, $a4"];
    per_register(&STEPS, &["$a2", "$a3"])
}

/// A formula's steps (`X` the value's register) written out once per register in `regs`, one
/// indented line per step: the f32 bodies of the gelu and map kernels.
pub(crate) fn per_register(steps: &[&str], regs: &[&str]) -> alloc::string::String {
    let mut s = alloc::string::String::new();
    for x in regs {
        for step in steps {
            s.push_str("    ");
            s.push_str(&step.replace('X', x));
            s.push('\n');
        }
    }
    s
}

/// Assembly text of a kernel.
pub fn text(k: ipu_core::plan::Kernel) -> alloc::string::String {
    use ipu_core::plan::Kernel::*;
    let (tpl, op) = match k {
        AmpF16 => (AMP, "f16amp"),
        AmpF32 => (AMP, "f32amp"),
        AmpF8 => (AMP, "f8amp"),
        AmpF16Strided => (crate::amp_strided::AMP_STRIDED, "f16amp"),
        AmpF32Strided => (crate::amp_strided::AMP_STRIDED, "f32amp"),
        AmpF8Strided => (crate::amp_strided::AMP_STRIDED, "f8amp"),
        AddF16 => (ADD, "f16v4add"),
        AddF32 => (ADD, "f32v2add"),
        // A K group's reduce-scatter step: the row binary kernel over blocks (rows) of partials.
        AddBlocksF16 => (ROWS_BINARY, "f16v4add"),
        AddBlocksF32 => (ROWS_BINARY, "f32v2add"),
        CastF16ToF8 => (CAST_TO_F8_PIPELINED, ""),
        CastF8ToF16 => (CAST, CAST_TO_F16),
        ScaleF16 => (SCALE, ""),
        CvtF32ToF16 => (CVT_F32_F16, ""),
        BiasF16 => (BIAS_F16, ""),
        GeluF16 => return GELU_F16.replace("{GELU_BODY}", &gelu_body()),
        GeluErfF16 => return GELU_ERF_F16.replace("{HALF}", &gelu_erf_half()).replace("{NAME}", label(k)),
        GeluSigmoidF16 => {
            return GELU_ERF_F16.replace("{HALF}", &gelu_sigmoid_half()).replace("{NAME}", label(k))
        }
        BinaryF16(op) => (ROWS_BINARY, binary_mnemonic(op)),
        MapF16(func) => return crate::map::text(func),
        SplatF16(op, splat_a) => {
            let (full, last) =
                if splat_a { ("$a4, $a6, $a0", "$a4, $a8, $a0") } else { ("$a4, $a0, $a6", "$a4, $a0, $a8") };
            let m = binary_mnemonic(op);
            return ROWS_SPLAT
                .replace("{OP_FULL}", &alloc::format!("{m} {full}"))
                .replace("{OP_LAST}", &alloc::format!("{m} {last}"))
                .replace("{NAME}", label(k));
        }
        CastF32ToF16 => (CAST, CAST_F32_TO_F16),
        CastF16ToF32 => (CAST, CAST_F16_TO_F32),
        SoftmaxF16 => return crate::softmax::text(),
        CopyWords => (WORD_LIST, COPY_WORDS),
        ZeroWords => (WORD_LIST, ZERO_WORDS),
        TransposeF16 => (TRANSPOSE_F16, ""),
        LayerNormF16 | LayerNormSum | LayerNormVar | LayerNormApply => {
            return crate::layernorm::text(k).replace("{NAME}", label(k))
        }
        ReduceRowsF16 => return crate::reduce_rows::text().replace("{NAME}", label(k)),
    };
    tpl.replace("{BODY}", op).replace("{NAME}", label(k)).replace("{AMP}", op).replace("{OP}", op)
}

/// Kernels over a list of word segments (`copy_words`, `zero_words`): the worker's descriptor
/// entry is (list, segments, 0, 0); `{BODY}` handles one list entry and advances `$m8` past it.
/// Six words precede the body; each body says where its `rpt` sits (≡ 4 mod 8 bytes, so that the
/// repeated bundles are 8-aligned).
const WORD_LIST: &str = "
.align 8
{NAME}:
    shl $m6, $m0, 4
    add $m6, $m1, $m6
    ld32 $m8, $m6, $m15, 0
    ld32 $m9, $m6, $m15, 4
    brz $m9, {NAME}_done
    add $m9, $m9, -1
{NAME}_segment:
{BODY}
    brnzdec $m9, {NAME}_segment
{NAME}_done:
    exit
";

/// Word copies (`cost::copy_issues`): each list entry (src, dst, words) with words in 1..=4095
/// (one `rpt`). Source and destination are 4-byte aligned and do not overlap. `rpt` sits at word
/// 11 (≡ 4 mod 8 bytes).
const COPY_WORDS: &str = "    ld32 $m3, $m8, $m15, 0
    ld32 $m4, $m8, $m15, 4
    ld32 $m2, $m8, $m15, 8
    add $m8, $m8, 12
    nop
    rpt $m2, 2
    { ld32pi $m7, $m3, 4 ; fnop }
    { st32pi $m7, $m4, 4 ; fnop }";

/// Word clears (`cost::zero_issues`): each list entry (dst, words) with words in 1..=4095 (one
/// `rpt`); dst 4-byte aligned. `rpt` sits at word 9 (≡ 4 mod 8 bytes), so its one-bundle body is
/// 8-aligned.
const ZERO_WORDS: &str = "    ld32 $m4, $m8, $m15, 0
    ld32 $m2, $m8, $m15, 4
    add $m8, $m8, 8
    rpt $m2, 1
    { st32pi $m15, $m4, 4 ; fnop }";

/// Last-two-axes transpose (`cost::transpose_issues`): descriptor (32 B per worker) x column
/// pointer, y row pointer, output rows, R (values per output row), x row stride, y row stride.
/// Output row c takes value c of each of the R input rows, one half at a time (an element is 2
/// bytes: no word move can do this).
const TRANSPOSE_F16: &str = "
.align 8
{NAME}:
    shl $m6, $m0, 5
    add $m6, $m1, $m6
    ld32 $m3, $m6, $m15, 0
    ld32 $m4, $m6, $m15, 4
    ld32 $m2, $m6, $m15, 8
    ld32 $m7, $m6, $m15, 12
    ld32 $m5, $m6, $m15, 16
    ld32 $m8, $m6, $m15, 20
    brz $m2, {NAME}_done
{NAME}_row:
    or $m9, $m3, $m15
    or $m10, $m4, $m15
    or $m11, $m7, $m15
    add $m11, $m11, -1
{NAME}_el:
    ldh16 $a0, $m9, $m15, 0
    sth16 $a0, $m10, $m15, 0
    add $m9, $m9, $m5
    add $m10, $m10, 2
    brnzdec $m11, {NAME}_el
    add $m3, $m3, 2
    add $m4, $m4, $m8
    add $m2, $m2, -1
    brnz $m2, {NAME}_row
{NAME}_done:
    exit
";

/// f16 → FP8 (or back) over chunks of four values; descriptor (src, dst, chunks, fmt | scale << 8).
const CAST: &str = "
.align 8
{NAME}:
    shl $m6, $m0, 4
    add $m6, $m1, $m6
    ld32 $m3, $m6, $m15, 0
    ld32 $m4, $m6, $m15, 4
    ld32 $m2, $m6, $m15, 8
    ld32 $m5, $m6, $m15, 12
    and $m7, $m5, 255
    uput 9, $m7
    setzi $m8, 8
    shr $m7, $m5, $m8
    uput 10, $m7
    brz $m2, {NAME}_done
    add $m2, $m2, -1
{NAME}_loop:
{BODY}
    brnzdec $m2, {NAME}_loop
{NAME}_done:
    exit
";

/// f16 → FP8, software-pipelined: descriptor (src, dst, pairs of 4-value chunks, format | scale
/// << 8); three bundles per eight values. Each loop pass stores the pair converted in the
/// previous pass while loading and converting the next, so there are no junk stores.
const CAST_TO_F8_PIPELINED: &str = "
.align 8
k_cast_f16_f8:
    shl $m6, $m0, 4
    add $m6, $m1, $m6
    ld32 $m3, $m6, $m15, 0
    ld32 $m4, $m6, $m15, 4
    ld32 $m2, $m6, $m15, 8
    ld32 $m5, $m6, $m15, 12
    and $m7, $m5, 255
    uput 9, $m7
    setzi $m8, 8
    shr $m7, $m5, $m8
    uput 10, $m7
    brz $m2, k_cast_f16_f8_done
    ld64pi $a0, $m3, 8
    ld64pi $a2, $m3, 8
    f16v4tof8 $a4, $a0
    f16v4tof8 $a5, $a2
    add $m2, $m2, -1
    rpt $m2, 3
    { ld64pi $a0, $m3, 8 ; f16v4tof8 $a5, $a2 }
    { st64pi $a4, $m4, 8 ; f16v4tof8 $a4, $a0 }
    { ld64pi $a2, $m3, 8 ; fnop }
    f16v4tof8 $a5, $a2
    st64pi $a4, $m4, 8
k_cast_f16_f8_done:
    exit
";

/// Four f32 → four f16 (round to nearest even): 16 bytes in, 8 out.
const CAST_F32_TO_F16: &str = "    ld64pi $a0, $m3, 8
    f32v2tof16 $a2, $a0
    ld64pi $a0, $m3, 8
    f32v2tof16 $a3, $a0
    st64pi $a2, $m4, 8";

/// Four f16 → four f32 (exact): 8 bytes in, 16 out.
const CAST_F16_TO_F32: &str = "    ld64pi $a0, $m3, 8
    f16v2tof32 $a2, $a0
    f16v2tof32 $a4, $a1
    st64pi $a2, $m4, 8
    st64pi $a4, $m4, 8";

const CAST_TO_F16: &str = "    lda32 $a0, $m3, $m15, 0
    f8v4tof16 $a2, $a0
    st64pi $a2, $m4, 8
    add $m3, $m3, 4";

/// `x = gelu(x)` in place over f16 AMP output blocks (`cost::gelu_issues`), the tanh form in f32:
/// `u = √(2/π)·(x + 0.044715·x³)`, `t = 1 + (−2)/(e^{2u} + 1)` (= `1 − 2/(e^{2u} + 1)` bit for bit:
/// IEEE defines `a − b` as `a + (−b)`, and `(−2)/d = −(2/d)` exactly), `y = (0.5·x)·(1 + t)`,
/// rounded to f16 (the reference, `reference::gelu_device`, does the same operations in the same
/// order; `f32exp` is libm's `expf` on both sides). Two values at a time with `f32v2mul` /
/// `f32v2add`, which round each lane as `f32mul` / `f32add` do (docs/target.md §4.7); `f32exp`
/// and `f32div` have no two-lane form, so they go lane by lane. Descriptor (64 bytes per worker):
/// ptr, 4-value chunks per block, block stride, blocks, then the constants √(2/π), 0.044715, 0.5,
/// 1, −2 (`plan::matmul::GELU_CONSTANTS`), each loaded into both lanes of a pair.
const GELU_F16: &str = "
.align 8
k_gelu_f16:
    shl $m6, $m0, 6
    add $m6, $m1, $m6
    ld32 $m3, $m6, $m15, 0
    ld32 $m2, $m6, $m15, 4
    ld32 $m5, $m6, $m15, 8
    ld32 $m7, $m6, $m15, 12
    lda32 $a10, $m6, $m15, 16
    lda32 $a11, $m6, $m15, 16
    lda32 $a8, $m6, $m15, 20
    lda32 $a9, $m6, $m15, 20
    lda32 $a12, $m6, $m15, 24
    lda32 $a13, $m6, $m15, 24
    lda32 $a14, $m6, $m15, 28
    lda32 $a15, $m6, $m15, 28
    lda32 $a6, $m6, $m15, 32
    brz $m7, k_gelu_f16_done
    brz $m2, k_gelu_f16_done
    add $m7, $m7, -1
k_gelu_f16_block:
    add $m8, $m3, 0
    add $m9, $m3, 0
    add $m10, $m2, -1
k_gelu_f16_loop:
    ld64pi $a0, $m8, 8
    f16v2tof32 $a2, $a0
    f16v2tof32 $a4, $a1
{GELU_BODY}    f32v2tof16 $a0, $a2
    f32v2tof16 $a1, $a4
    st64pi $a0, $m9, 8
    brnzdec $m10, k_gelu_f16_loop
    add $m3, $m3, $m5
    brnzdec $m7, k_gelu_f16_block
k_gelu_f16_done:
    exit
";

/// The GeLU of the f32 pair `X` (in place; `$a0:1` scratch), for each of `$a2:3`, `$a4:5`:
/// `x·x·x`, `·0.044715`, `+x`, `·√(2/π)` = u, `u+u`, exp, `+1`, `(−2)/·`, `1+·` = t, `1+t`,
/// `(x·0.5)·`. Constants: 0.044715 in `$a8:9`, √(2/π) in `$a10:11`, 0.5 in `$a12:13`, 1 in
/// `$a14:15`, −2 in `$a6`.
fn gelu_body() -> alloc::string::String {
    const STEPS: [&str; 15] = [
        "f32v2mul $a0, X, X",
        "f32v2mul $a0, $a0, X",
        "f32v2mul $a0, $a0, $a8",
        "f32v2add $a0, X, $a0",
        "f32v2mul $a0, $a0, $a10",
        "f32v2add $a0, $a0, $a0",
        "f32exp $a0, $a0",
        "f32exp $a1, $a1",
        "f32v2add $a0, $a0, $a14",
        "f32div $a0, $a6, $a0",
        "f32div $a1, $a6, $a1",
        "f32v2add $a0, $a14, $a0",
        "f32v2add $a0, $a14, $a0",
        "f32v2mul X, X, $a12",
        "f32v2mul X, X, $a0",
    ];
    per_register(&STEPS, &["$a2", "$a4"])
}

/// `row += bias` in place over f16 AMP output blocks (`cost::bias_issues`): descriptor (ptr, rows,
/// block stride, blocks, bias ptr, 0, 0, 0), 32 bytes per worker. Each block's 16 bias values
/// (32 bytes, consecutive per block) are held in $a8..$a15 while its rows stream through.
const BIAS_F16: &str = "
.align 8
k_bias_f16:
    shl $m6, $m0, 5
    add $m6, $m1, $m6
    ld32 $m3, $m6, $m15, 0
    ld32 $m2, $m6, $m15, 4
    ld32 $m5, $m6, $m15, 8
    ld32 $m7, $m6, $m15, 12
    ld32 $m4, $m6, $m15, 16
    brz $m7, k_bias_f16_done
    brz $m2, k_bias_f16_done
    add $m7, $m7, -1
k_bias_f16_block:
    ld64pi $a8, $m4, 8
    ld64pi $a10, $m4, 8
    ld64pi $a12, $m4, 8
    ld64pi $a14, $m4, 8
    add $m8, $m3, 0
    add $m9, $m3, 0
    add $m10, $m2, -1
k_bias_f16_row:
    ld64pi $a0, $m8, 8
    f16v4add $a0, $a0, $a8
    st64pi $a0, $m9, 8
    ld64pi $a0, $m8, 8
    f16v4add $a0, $a0, $a10
    st64pi $a0, $m9, 8
    ld64pi $a0, $m8, 8
    f16v4add $a0, $a0, $a12
    st64pi $a0, $m9, 8
    ld64pi $a0, $m8, 8
    f16v4add $a0, $a0, $a14
    st64pi $a0, $m9, 8
    brnzdec $m10, k_bias_f16_row
    add $m3, $m3, $m5
    brnzdec $m7, k_bias_f16_block
k_bias_f16_done:
    exit
";

/// f32 → f16 in place (`cost::cvt_issues`): descriptor (ptr, quads per block, block stride,
/// blocks), 16 bytes per worker. Each block's `4·quads` floats become as many halves packed from
/// the block's start. The `rpt` body takes one quad in three bundles, software-pipelined: load the
/// quad's second pair while the previous quad's halves are stored, so each bundle carries one load
/// or store. A quad is read (16 bytes at 16q) before its halves are written (8 bytes at 8q), so the
/// packing never overwrites a value not yet read; the last iteration reads 8 bytes past the
/// block's last quad (into the next worker's scratch or the buffer's slack) and discards them.
/// `quads` ≤ 4095 (one `rpt`; `matmul::candidates` keeps the rows per worker within it). The
/// `rpt` sits at word 13 (≡ 4 mod 8 bytes), so its bundles are 8-aligned.
const CVT_F32_F16: &str = "
.align 8
k_cvt_f32_f16:
    shl $m6, $m0, 4
    add $m6, $m1, $m6
    ld32 $m3, $m6, $m15, 0
    ld32 $m2, $m6, $m15, 4
    ld32 $m5, $m6, $m15, 8
    ld32 $m7, $m6, $m15, 12
    brz $m7, k_cvt_f32_f16_done
    brz $m2, k_cvt_f32_f16_done
    add $m7, $m7, -1
k_cvt_f32_f16_block:
    or $m8, $m3, $m15
    or $m9, $m3, $m15
    ld64pi $a0, $m8, 8
    f32v2tof16 $a4, $a0
    rpt $m2, 3
    { ld64pi $a2, $m8, 8 ; fnop }
    { ld64pi $a0, $m8, 8 ; f32v2tof16 $a5, $a2 }
    { st64pi $a4, $m9, 8 ; f32v2tof16 $a4, $a0 }
    add $m3, $m3, $m5
    brnzdec $m7, k_cvt_f32_f16_block
k_cvt_f32_f16_done:
    exit
";

/// In-place `x = f16(alpha · f32(x))` over two segments of blocks (`cost::scale_issues`):
/// descriptor (32 B per worker) ptr, chunks of four halves per block, alpha bits, block stride,
/// blocks, then the second segment's ptr, chunks and blocks (same alpha and stride; 0 for none).
/// Software-pipelined: each chunk's store and the next chunk's load go in bundles with the chunk's
/// conversions (a bundle's halves read the registers as they were before it), so the loads run
/// one chunk ahead and the last one reads 8 bytes past a block's chunks (the next worker's
/// scratch or the buffer's slack, as `cvt_f32_f16`) and discards them.
const SCALE: &str = "
.align 8
k_scale_f16:
    shl $m6, $m0, 5
    add $m6, $m1, $m6
    lda32 $a6, $m6, $m15, 8
    lda32 $a7, $m6, $m15, 8
    ld32 $m5, $m6, $m15, 12
    ld32 $m3, $m6, $m15, 0
    ld32 $m4, $m6, $m15, 4
    ld32 $m7, $m6, $m15, 16
    setzi $m9, 2
k_scale_f16_segment:
    brz $m4, k_scale_f16_next
    brz $m7, k_scale_f16_next
k_scale_f16_block:
    or $m8, $m3, $m15
    { or $m10, $m3, $m15 ; fnop }
    ld64pi $a0, $m8, 8
    f16v2tof32 $a2, $a0
    { ld64pi $a0, $m8, 8 ; f16v2tof32 $a4, $a1 }
    f32v2mul $a2, $a2, $a6
    f32v2mul $a4, $a4, $a6
    { nop ; f32v2tof16 $a8, $a2 }
    f32v2tof16 $a9, $a4
    add $m2, $m4, -1
    brz $m2, k_scale_f16_last
    add $m2, $m2, -1
k_scale_f16_loop:
    { st64pi $a8, $m10, 8 ; f16v2tof32 $a2, $a0 }
    { ld64pi $a0, $m8, 8 ; f16v2tof32 $a4, $a1 }
    f32v2mul $a2, $a2, $a6
    f32v2mul $a4, $a4, $a6
    f32v2tof16 $a8, $a2
    f32v2tof16 $a9, $a4
    brnzdec $m2, k_scale_f16_loop
k_scale_f16_last:
    st64pi $a8, $m10, 8
    add $m3, $m3, $m5
    add $m7, $m7, -1
    brnz $m7, k_scale_f16_block
k_scale_f16_next:
    ld32 $m3, $m6, $m15, 20
    ld32 $m4, $m6, $m15, 24
    ld32 $m7, $m6, $m15, 28
    add $m9, $m9, -1
    brnz $m9, k_scale_f16_segment
    exit
";
