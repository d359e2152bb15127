//! Profile instrumentation (docs/profile.md): cycle stamps between the steps of a tile plan.
//!
//! The runtime stores stamp 0 when the host sync releases the tile; this pass inserts
//! `Step::Stamp(n)` after every kernel launch, internal sync and exchange, and describes the
//! interval ending at each stamp (phase, kind, kernel). Weight loads and CSR writes are folded into
//! the compute interval of the kernel that follows them, so a sample is always worth its 2 cycles.

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;
use ipu_schema::{ProfilePlan, SampleKind, SamplePoint, TileSamples, NO_KERNEL};

use super::{Buffer, Kernel, MemKind, Step};

/// The profile plan of a plan, before linking gives the stamp buffers their addresses.
pub type Samples = ProfilePlan;

/// Name of the stamp buffer on every tile.
pub const BUFFER: &str = "profile";

/// Name of the phase of the first sample: from the host-sync release to the tile's first step
/// (the runtime reading the call), and on a tile with nothing to do, its whole wait for the
/// closing host sync. Named for that, so its span (the whole run, on a chip with idle tiles) does
/// not read as the host taking the run.
pub const HOST_PHASE: &str = "dispatch+idle";

/// Instrument every tile and return the profile plan (stamp buffers at address 0 until linked).
pub fn instrument(tiles: &mut super::Tiles) -> Samples {
    let mut phases = Names::default();
    let mut kernels = Names::default();
    phases.index(HOST_PHASE);
    let mut out = Vec::with_capacity(tiles.len());
    for tile in tiles.iter_mut() {
        let host = SamplePoint { phase: 0, kind: SampleKind::Host, kernel: NO_KERNEL };
        // Sample i spans stamps i and i + 1: each sample is pushed, then the stamp that ends it.
        let mut samples = alloc::vec![host];
        let mut steps = Vec::with_capacity(tile.steps.len() * 2 + 1);
        steps.push(Step::Stamp(1));
        let mut phase = 0u16;
        let mut pending_setup = false;
        for step in core::mem::take(&mut tile.steps) {
            let sample = match &step {
                Step::Phase(name) => {
                    phase = phases.index(name);
                    None
                }
                Step::LoadWeights(..) | Step::SetCsr(..) => {
                    pending_setup = true;
                    None
                }
                Step::RunAll(k, ..) => Some((SampleKind::Compute, kernels.index(kernel_name(*k)))),
                Step::Sync => Some((SampleKind::Sync, NO_KERNEL)),
                Step::Exchange(_) => Some((SampleKind::Exchange, NO_KERNEL)),
                // `plan()` instruments a plan once, before any stamp exists; none to keep.
                Step::Stamp(_) => continue,
            };
            if let Some((kind, kernel)) = sample {
                if pending_setup && kind != SampleKind::Compute {
                    // Set-up with no kernel after it (not emitted today): its own interval.
                    samples.push(SamplePoint { phase, kind: SampleKind::Compute, kernel: NO_KERNEL });
                    steps.push(Step::Stamp(samples.len() as u32));
                }
                pending_setup = false;
                steps.push(step);
                samples.push(SamplePoint { phase, kind, kernel });
                steps.push(Step::Stamp(samples.len() as u32));
            } else {
                steps.push(step);
            }
        }
        if pending_setup {
            samples.push(SamplePoint { phase, kind: SampleKind::Compute, kernel: NO_KERNEL });
            steps.push(Step::Stamp(samples.len() as u32));
        }
        tile.steps = steps;
        tile.buffers.push(Buffer {
            name: BUFFER.into(),
            bytes: 4 * (samples.len() as u32 + 1),
            align: 16,
            kind: MemKind::Profile,
            init: super::Init::new(),
            live: super::Live::ALWAYS,
            read_past: 0,
        });
        out.push(TileSamples { buffer: 0, samples });
    }
    ProfilePlan { phases: phases.list, kernels: kernels.list, tiles: out }
}

/// Kernel name in profiles (the label of its code, docs/kernels.md).
pub fn kernel_name(k: Kernel) -> &'static str {
    match k {
        Kernel::AmpF16 => "amp_f16",
        Kernel::AmpF32 => "amp_f32",
        Kernel::AddF16 => "add_f16",
        Kernel::AddF32 => "add_f32",
        Kernel::AddBlocksF16 => "add_blocks_f16",
        Kernel::AddBlocksF32 => "add_blocks_f32",
        Kernel::AmpF8 => "amp_f8",
        Kernel::AmpF16Strided => "amp_f16_strided",
        Kernel::AmpF32Strided => "amp_f32_strided",
        Kernel::AmpF8Strided => "amp_f8_strided",
        Kernel::CastF16ToF8 => "cast_f16_f8",
        Kernel::CastF8ToF16 => "cast_f8_f16",
        Kernel::ScaleF16 => "scale_f16",
        Kernel::CvtF32ToF16 => "cvt_f32_f16",
        Kernel::CopyWords => "copy_words",
        Kernel::ZeroWords => "zero_words",
        Kernel::TransposeF16 => "transpose_f16",
        Kernel::LayerNormF16 => "layernorm_f16",
        Kernel::LayerNormSum => "layernorm_sum",
        Kernel::LayerNormVar => "layernorm_var",
        Kernel::LayerNormApply => "layernorm_apply",
        Kernel::GeluErfF16 => "gelu_erf_f16",
        Kernel::GeluSigmoidF16 => "gelu_sigmoid_f16",
        Kernel::ReduceRowsF16 => "reduce_rows_f16",
        Kernel::MapF16(func) => super::map::kernel_name(func),
        Kernel::BinaryF16(crate::graph::BinaryOp::Add) => "add_rows_f16",
        Kernel::BinaryF16(crate::graph::BinaryOp::Sub) => "sub_rows_f16",
        Kernel::BinaryF16(crate::graph::BinaryOp::Mul) => "mul_rows_f16",
        Kernel::SplatF16(crate::graph::BinaryOp::Add, _) => "add_splat_f16",
        Kernel::SplatF16(crate::graph::BinaryOp::Sub, _) => "sub_splat_f16",
        Kernel::SplatF16(crate::graph::BinaryOp::Mul, _) => "mul_splat_f16",
        Kernel::BiasF16 => "bias_f16",
        Kernel::GeluF16 => "gelu_f16",
        Kernel::CastF32ToF16 => "cast_f32_f16",
        Kernel::CastF16ToF32 => "cast_f16_f32",
        Kernel::SoftmaxF16 => "softmax_f16",
    }
}

/// Names numbered in order of first appearance (tiles are visited in order: deterministic).
#[derive(Default)]
struct Names {
    list: Vec<String>,
    index: BTreeMap<String, u16>,
}

impl Names {
    fn index(&mut self, name: &str) -> u16 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        let i = self.list.len() as u16;
        self.list.push(name.into());
        self.index.insert(name.into(), i);
        i
    }
}
