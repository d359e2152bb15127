//! The cost model (`ipu_core::plan::cost`) predicts the simulator's cycles within 1% on every
//! example and on f16, f32-accumulate, K-split (exchange) and FP8 workloads from 1 to 1472 tiles.

use ipu_host::build::{build, BuildOptions};
use ipu_host::session::load;
use ipu_host::sim::{SimConfig, SimDevice};
use ipu_host::Device;

fn matmul(m: u64, k: u64, n: u64, acc: &str) -> String {
    format!(
        "name = \"mm\"\noutputs = [\"C\"]\n[inputs.A]\ndtype = \"f16\"\nshape = [{m}, {k}]\n[inputs.B]\ndtype = \"f16\"\n\
         shape = [{k}, {n}]\n[[ops]]\nop = \"matmul\"\na = \"A\"\nb = \"B\"\noutput = \"C\"\ndtype = \"{acc}\"\naccumulate = \"{acc}\"\n"
    )
}

/// Simulated cycles of one `run` call (inputs do not change timing) and the prediction.
fn measure(src: &str, tiles: usize, grid: Option<[u32; 3]>) -> (u64, u64) {
    let b =
        build("m.toml", src, &BuildOptions { threads: 2, grid, ..BuildOptions::new(tiles) }).expect("builds");
    let mut dev = SimDevice::new(SimConfig { tiles, threads: 2, max_cycles: 50_000_000 }).unwrap();
    load(&mut dev, &b.package).unwrap();
    dev.run_to_host_sync().unwrap();
    let r = dev.run_to_host_sync().unwrap();
    (r.cycles, b.package.plan.predicted_cycles)
}

fn example(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../examples/{name}.toml", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn predictions_within_one_percent_of_the_simulator() {
    let cases: Vec<(&str, String, usize, Option<[u32; 3]>)> = vec![
        ("matmul example, 1472 tiles", example("matmul"), 1472, None),
        ("f16 matmul 45x37x29, 37 tiles", matmul(45, 37, 29, "f16"), 37, None),
        ("f32-accumulate matmul, 16 tiles", matmul(96, 80, 40, "f32"), 16, None),
        ("K split over the exchange, 24 tiles", matmul(40, 100, 24, "f16"), 24, Some([4, 2, 3])),
        ("K split, f32, 24 tiles", matmul(40, 300, 24, "f32"), 24, Some([2, 3, 4])),
        ("FP8 Q·Kᵀ example, 64 tiles", example("qk"), 64, None),
        ("attention example, 64 tiles", example("attention"), 64, None),
        ("attention example, 1472 tiles", example("attention"), 1472, None),
        ("one tile", matmul(64, 64, 32, "f16"), 1, None),
    ];
    let mut report = String::new();
    for (name, src, tiles, grid) in cases {
        let (sim, pred) = measure(&src, tiles, grid);
        let err = (pred as f64 - sim as f64) / sim as f64;
        report.push_str(&format!("{name}: simulated {sim} predicted {pred} ({:+.2}%)\n", 100.0 * err));
        assert!(err.abs() <= 0.01, "{report}");
    }
    println!("{report}");
}
