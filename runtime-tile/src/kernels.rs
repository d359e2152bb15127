//! Worker kernels, as assembly text. Each takes `$m1` = descriptor table, worker `k` reads the
//! 16-byte entry at `$m1 + 16k`. Issue counts are mirrored in `ipu_core::plan::cost::kernel_issues`
//! and checked by tests (docs/kernels.md).

/// AMP rows: descriptor (x, pin, out − 40, rows + 1). `{AMP}` is the AMP mnemonic.
const AMP: &str = "
.align 8
{NAME}:
    shl $m6, $m0, 4
    add $m6, $m1, $m6
    ld32 $m3, $m6, $m15, 0
    ld32 $m4, $m6, $m15, 4
    ld32 $m5, $m6, $m15, 8
    ld32 $m2, $m6, $m15, 12
    ld64pi $a0, $m3, 8
    ld64pi $a2, $m4, 8
    nop
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
    use ipu_core::plan::Kernel::*;
    match k {
        AmpF16 => "k_amp_f16",
        AmpF32 => "k_amp_f32",
        AddF16 => "k_add_f16",
        AddF32 => "k_add_f32",
    }
}

/// Assembly text of a kernel.
pub fn text(k: ipu_core::plan::Kernel) -> alloc::string::String {
    use ipu_core::plan::Kernel::*;
    let (tpl, op) = match k {
        AmpF16 => (AMP, "f16amp"),
        AmpF32 => (AMP, "f32amp"),
        AddF16 => (ADD, "f16v4add"),
        AddF32 => (ADD, "f32v2add"),
    };
    tpl.replace("{NAME}", label(k)).replace("{AMP}", op).replace("{OP}", op)
}
