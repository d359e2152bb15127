//! Efficiency of a large FP16 matmul on the whole chip: simulated cycles against the compute
//! lower bound MACs ÷ (tiles × MACs per cycle): 64 with f16 partials, 32 with f32 partials (the
//! f32-accumulating row has f16 output, rounded once). `cargo bench --bench matmul_efficiency`.

use ipu_core::target::{AMP_F16_MACS_PER_CYCLE, AMP_F32_MACS_PER_CYCLE};
use ipu_host::build::{build, BuildOptions};
use ipu_host::session::load;
use ipu_host::sim::{SimConfig, SimDevice};
use ipu_host::Device;
use std::time::Instant;

fn main() {
    for (acc, per_cycle) in [("f16", AMP_F16_MACS_PER_CYCLE), ("f32", AMP_F32_MACS_PER_CYCLE)] {
        run(acc, per_cycle as u64);
    }
}

fn run(acc: &str, per_cycle: u64) {
    let (m, k, n) = (2048u64, 1024u64, 2048u64);
    let src = format!(
        "name = \"big\"\noutputs = [\"C\"]\n[inputs.A]\ndtype = \"f16\"\nshape = [{m}, {k}]\n[inputs.B]\ndtype = \"f16\"\n\
         shape = [{k}, {n}]\n[[ops]]\nop = \"matmul\"\na = \"A\"\nb = \"B\"\noutput = \"C\"\ndtype = \"f16\"\naccumulate = \"{acc}\"\n"
    );
    let t0 = Instant::now();
    let b = build("big.toml", &src, &BuildOptions { threads: 0, grid: None, ..BuildOptions::new(1472) })
        .expect("builds");
    let build_ms = t0.elapsed().as_millis();
    let mut dev = SimDevice::new(SimConfig { tiles: 1472, threads: 0, max_cycles: u64::MAX }).unwrap();
    load(&mut dev, &b.package).unwrap();
    dev.run_to_host_sync().unwrap();
    let t1 = Instant::now();
    let r = dev.run_to_host_sync().unwrap();
    let sim_s = t1.elapsed().as_secs_f64();
    let bound = (m * k * n) as f64 / (1472.0 * per_cycle as f64);
    println!(
        "matmul_efficiency M={m} K={k} N={n} accumulate={acc} tiles=1472 tiles_used={} cycles={} predicted={} bound={bound:.0} \
         efficiency={:.1}% build_ms={build_ms} sim_s={sim_s:.2} instr_per_s={:.3e}",
        b.package.info.tiles_used,
        r.cycles,
        b.package.plan.predicted_cycles,
        100.0 * bound / r.cycles as f64,
        r.issued as f64 / sim_s
    );
}
