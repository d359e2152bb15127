//! `add` as a matmul's bias (`Y = X·W + b`, b one f16 value per column): fused into the matmul
//! planner, added on each K-group root by `bias_f16` after alpha, bit-exact with the reference's
//! `f16(c + b)`, costed exactly; other adds are refused with what is accepted.

use ipu_host::build::{build, BuildOptions};
use ipu_host::package::Package;
use ipu_host::session::{self, RunOptions};
use ipu_host::sim::{SimConfig, SimDevice};
use std::collections::BTreeMap;

fn model(m: u64, k: u64, n: u64, bias_shape: &str, alpha: Option<f32>) -> String {
    let alpha = alpha.map(|a| format!("alpha = {a}\n")).unwrap_or_default();
    format!(
        "name = \"xwb\"\noutputs = [\"Y\"]\n[inputs.X]\ndtype = \"f16\"\nshape = [{m}, {k}]\n[inputs.W]\ndtype = \"f16\"\n\
         shape = [{k}, {n}]\n[inputs.b]\ndtype = \"f16\"\nshape = {bias_shape}\n[[ops]]\nop = \"matmul\"\na = \"X\"\n\
         b = \"W\"\noutput = \"XW\"\ndtype = \"f16\"\naccumulate = \"f16\"\n{alpha}[[ops]]\nop = \"add\"\na = \"XW\"\n\
         b = \"b\"\noutput = \"Y\"\ndtype = \"f16\"\n"
    )
}

fn run(src: &str, tiles: usize, grid: Option<[u32; 3]>) -> (u64, u64) {
    let built = build("b.toml", src, &BuildOptions { threads: 1, grid, ..BuildOptions::new(tiles) }).unwrap();
    let pkg = Package::from_bytes(&built.bytes).unwrap();
    let mut dev = SimDevice::new(SimConfig { tiles, threads: 2, max_cycles: 50_000_000 }).unwrap();
    let opts = RunOptions {
        package_path: "b.ipuexe".into(),
        inputs: BTreeMap::new(),
        output_dir: None,
        save_inputs: None,
        seed: 9,
        iterations: 2,
        profile: false,
    };
    let out = session::run(&pkg, &mut dev, &opts).unwrap();
    assert!(out.numerical_pass && out.max_abs_error == 0.0, "{out:?}");
    assert!(out.max_abs_error_f64 > 0.0 && out.max_abs_error_f64 <= out.bound_f64, "{out:?}");
    (out.cycles[0], pkg.plan.predicted_cycles)
}

#[test]
fn bias_is_added_on_every_mapping() {
    for (m, k, n, shape, alpha, tiles, grid) in [
        (33, 40, 24, "[24]", None, 8, None),
        (45, 37, 29, "[1, 29]", None, 37, None),
        (40, 100, 50, "[50]", Some(0.25), 24, Some([2, 2, 3])),
        (7, 16, 16, "[16]", Some(2.0), 1, None),
        (64, 64, 64, "[64]", None, 1472, None),
    ] {
        let (cycles, predicted) = run(&model(m, k, n, shape, alpha), tiles, grid);
        // Within 1%, or within the barrel alignment of the three kernel launches on a tiny
        // single tile (a launch ends on its slowest worker's slot: up to 5 cycles each, §3).
        let diff = cycles.abs_diff(predicted);
        assert!(diff * 100 <= cycles || diff <= 15, "{m}x{k}x{n} on {tiles}: {cycles} vs {predicted}");
    }
}

#[test]
fn other_adds_are_refused_with_what_is_accepted() {
    let opts = BuildOptions { threads: 1, ..BuildOptions::new(8) };
    // A matrix, not a vector of the columns.
    let src = model(8, 16, 16, "[8, 16]", None);
    let e = build("b.toml", &src, &opts).unwrap_err().to_string();
    assert!(e.contains("op 1 (add): add is planned as the bias of a single rank-2 matmul"), "{e}");
    // Shapes that do not broadcast are a model error.
    let e = build("b.toml", &model(8, 16, 16, "[5]", None), &opts).unwrap_err().to_string();
    assert!(e.contains("op 1 (add): shapes [8, 16] and [5] do not broadcast"), "{e}");
    // The matmul's own result as an output too: not the fused pattern.
    let src = model(8, 16, 16, "[16]", None).replace("outputs = [\"Y\"]", "outputs = [\"Y\", \"XW\"]");
    let e = build("b.toml", &src, &opts).unwrap_err().to_string();
    assert!(e.contains("add is planned as the bias"), "{e}");
}
