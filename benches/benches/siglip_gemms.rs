//! The GEMMs of one SigLIP So400m encoder layer on the whole chip (729 tokens, width 1152, MLP
//! 4304; f16 operands, f32 accumulation, f16 output): simulated cycles against the compute bound
//! MACs ÷ (1472 × 32 f32-accumulating MACs per cycle) and against the f16-partials bound
//! (× 64), with build time and the search's choice. `cargo bench --bench siglip_gemms`
//! (about a minute on 2 cores; issue "Kernels at transformer scale").

use ipu_host::build::{build, BuildOptions};
use ipu_host::session::load;
use ipu_host::sim::{SimConfig, SimDevice};
use ipu_host::Device;
use std::time::Instant;

fn main() {
    let gemms = [
        ("qkv", 729u64, 1152u64, 3456u64),
        ("out-proj", 729, 1152, 1152),
        ("mlp-up", 729, 1152, 4304),
        ("mlp-down", 729, 4304, 1152),
    ];
    for (name, m, k, n) in gemms {
        let src = format!(
            "name = \"{name}\"\noutputs = [\"C\"]\n[inputs.A]\ndtype = \"f16\"\nshape = [{m}, {k}]\n[inputs.B]\ndtype = \"f16\"\n\
             shape = [{k}, {n}]\n[[ops]]\nop = \"matmul\"\na = \"A\"\nb = \"B\"\noutput = \"C\"\ndtype = \"f16\"\naccumulate = \"f32\"\n"
        );
        let t0 = Instant::now();
        let b =
            build("g.toml", &src, &BuildOptions { threads: 0, ..BuildOptions::new(1472) }).expect("builds");
        let build_ms = t0.elapsed().as_millis();
        let mut dev = SimDevice::new(SimConfig { tiles: 1472, threads: 0, max_cycles: u64::MAX }).unwrap();
        load(&mut dev, &b.package).unwrap();
        dev.run_to_host_sync().unwrap();
        let t1 = Instant::now();
        let r = dev.run_to_host_sync().unwrap();
        let sim_s = t1.elapsed().as_secs_f64();
        let macs = (m * k * n) as f64;
        let bound32 = macs / (1472.0 * ipu_core::target::AMP_F32_MACS_PER_CYCLE as f64);
        let bound16 = macs / (1472.0 * ipu_core::target::AMP_F16_MACS_PER_CYCLE as f64);
        let [tm, tn, tk] = b.package.plan.grids[0];
        println!(
            "siglip_gemm {name} M={m} K={k} N={n} grid={tm}x{tn}x{tk} cycles={} predicted={} \
             bound_f32acc={bound32:.0} ({:.1}%) bound_f16acc={bound16:.0} ({:.1}%) build_ms={build_ms} sim_s={sim_s:.1} \
             tile_instructions={} instr_per_s={:.3e}",
            r.cycles,
            b.package.plan.predicted_cycles,
            100.0 * bound32 / r.cycles as f64,
            100.0 * bound16 / r.cycles as f64,
            r.issued,
            r.issued as f64 / sim_s,
        );
    }
}
