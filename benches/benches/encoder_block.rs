//! The pre-LN ViT encoder block (`examples/encoder_block/`: 50 tokens, width 96, 3 heads, MLP 384)
//! on 1472 tiles: build time, simulated cycles of one inference next to the sum of its GEMMs'
//! compute bounds, and per GEMM its simulated span (from a profiled run) against its own bound.
//! `cargo bench --bench encoder_block` (a few seconds on 2 cores; issue "Whole graphs").

use ipu_core::graph::{matmul_shape, OpKind};
use ipu_core::target::{AMP_F16_MACS_PER_CYCLE, NUM_TILES};
use ipu_host::build::{build, BuildOptions};
use ipu_host::profile::{table, Profile};
use ipu_host::session::{run, RunOptions};
use ipu_host::sim::{SimConfig, SimDevice};
use std::path::Path;
use std::time::Instant;

fn main() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/encoder_block/encoder_block.toml");
    let src = std::fs::read_to_string(&model).expect("example");
    let tiles = NUM_TILES;
    let t0 = Instant::now();
    let opts = BuildOptions { threads: 0, ..BuildOptions::new(tiles) };
    let built = build(model.to_str().unwrap(), &src, &opts).expect("builds");
    let build_ms = t0.elapsed().as_millis();
    let profiled =
        build(model.to_str().unwrap(), &src, &BuildOptions { profile: true, ..opts }).expect("builds");
    let pkg = ipu_host::package::Package::from_bytes(&built.bytes).unwrap();
    let ppkg = ipu_host::package::Package::from_bytes(&profiled.bytes).unwrap();
    let run_opts = |profile| RunOptions {
        package_path: "encoder_block.ipuexe".into(),
        inputs: Default::default(),
        output_dir: None,
        save_inputs: None,
        seed: 1,
        iterations: 1,
        profile,
    };
    let device = || SimDevice::new(SimConfig { tiles, threads: 0, max_cycles: u64::MAX }).unwrap();
    let out = run(&pkg, &mut device(), &run_opts(false)).expect("runs");
    assert!(out.numerical_pass);
    let pout = run(&ppkg, &mut device(), &run_opts(true)).expect("runs");
    let prof = Profile::from_run(&ppkg, "bench", "", "sim", pout.captured.as_ref().unwrap()).unwrap();
    let spans = table::table(&prof, table::GroupBy::Phase, None);
    let graph = ipu_host::model::parse(model.to_str().unwrap(), &src).expect("parses");
    let g = &graph;
    let mut bound_sum = 0.0;
    let mut rows = Vec::new();
    for (i, op) in g.ops.iter().enumerate() {
        let OpKind::MatMul { a, b, transpose_a, transpose_b, .. } = op.kind else { continue };
        let (batch, m, k, n) = matmul_shape(g.tensor(a), g.tensor(b), transpose_a, transpose_b).unwrap();
        let macs = (batch.iter().product::<u64>() * m * k * n) as f64;
        let fp8 = g.tensor(a).dtype.size() == 1;
        let per_cycle = AMP_F16_MACS_PER_CYCLE as f64 * if fp8 { 2.0 } else { 1.0 };
        let bound = macs / (tiles as f64 * per_cycle);
        bound_sum += bound;
        let phase = ipu_core::plan::op_phase(g, i);
        let span = spans.rows.iter().find(|r| r.0 == phase).map(|r| r.1[0]).unwrap_or(f64::NAN);
        rows.push(format!(
            "  {phase:<12} MACs={macs:.0} bound={bound:.1} span={span:.0} ({:.2}% of its bound)",
            100.0 * bound / span
        ));
    }
    let cycles = out.cycles[0];
    println!(
        "encoder_block tiles={tiles} build_ms={build_ms} cycles={cycles} predicted={} gemm_bound_sum={bound_sum:.0} \
         ({:.2}% of the cycles) device_s={:.2} reference_s={:.2}",
        pkg.plan.predicted_cycles,
        100.0 * bound_sum / cycles as f64,
        out.device_seconds,
        out.reference_seconds
    );
    for r in rows {
        println!("{r}");
    }
}
