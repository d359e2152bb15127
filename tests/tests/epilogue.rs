//! The matmul epilogue: `add` as a bias (`Y = X·W + b`, one f16 value per column) and `gelu`
//! (tanh form; and the quick GeLU, `gelu_sigmoid_f16`), fused into the matmul planner and run on each K-group root after alpha
//! (`bias_f16`, `gelu_f16`), bit-exact with the reference, costed exactly; other adds are row
//! stages of their own (`tests/tests/elementwise.rs`), or refused with the shapes.

use ipu_host::build::{build, BuildOptions};
use ipu_host::package::Package;
use ipu_host::session::{self, RunOptions};
use std::collections::BTreeMap;

fn with_gelu(src: &str) -> String {
    format!("{src}[[ops]]\nop = \"gelu\"\ninput = \"Y\"\noutput = \"H\"\ndtype = \"f16\"\napproximate = \"tanh\"\n")
        .replace("outputs = [\"Y\"]", "outputs = [\"H\"]")
}

fn model(m: u64, k: u64, n: u64, bias_shape: &str, alpha: Option<f32>) -> String {
    let alpha = alpha.map(|a| format!("alpha = {a}\n")).unwrap_or_default();
    format!(
        "name = \"xwb\"\noutputs = [\"Y\"]\n[inputs.X]\ndtype = \"f16\"\nshape = [{m}, {k}]\n[inputs.W]\ndtype = \"f16\"\n\
         shape = [{k}, {n}]\n[inputs.b]\ndtype = \"f16\"\nshape = {bias_shape}\n[[ops]]\nop = \"matmul\"\na = \"X\"\n\
         b = \"W\"\noutput = \"XW\"\ndtype = \"f16\"\naccumulate = \"f16\"\n{alpha}[[ops]]\nop = \"add\"\na = \"XW\"\n\
         b = \"b\"\noutput = \"Y\"\ndtype = \"f16\"\n"
    )
}

mod common;

fn run(src: &str, tiles: usize, grid: Option<[u32; 3]>) -> (u64, u64) {
    let (out, pkg) = common::build_and_run(src, tiles, grid, 9, 2);
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
fn adds_the_epilogue_does_not_take_are_stages_of_their_own() {
    let opts = BuildOptions { threads: 1, ..BuildOptions::new(8) };
    // A column of the rows (broadcast along N): neither a bias nor a residual, so a row stage
    // that splats it across each row.
    run(&model(8, 16, 16, "[8, 1]", None), 8, None);
    // Shapes that do not broadcast are a model error.
    let e = build("b.toml", &model(8, 16, 16, "[5]", None), &opts).unwrap_err().to_string();
    assert!(e.contains("op 1 (add): shapes [8, 16] and [5] do not broadcast"), "{e}");
    // The matmul's own result as an output too: not the fused pattern, so the add is a row stage
    // after the matmul, and both outputs are exact.
    let src = model(8, 16, 16, "[16]", None).replace("outputs = [\"Y\"]", "outputs = [\"Y\", \"XW\"]");
    run(&src, 8, None);
}

#[test]
fn bias_then_gelu_and_gelu_alone() {
    for (m, k, n, alpha, tiles, grid) in [
        (33, 40, 24, None, 8, None),
        (45, 37, 29, Some(0.5), 24, Some([2, 2, 3])),
        (64, 64, 64, None, 1472, None),
    ] {
        let src = with_gelu(&model(m, k, n, &format!("[{n}]"), alpha));
        let (cycles, predicted) = run(&src, tiles, grid);
        assert!(cycles.abs_diff(predicted) * 100 <= cycles, "{m}x{k}x{n}: {cycles} vs {predicted}");
    }
    // gelu straight after the matmul (no bias).
    let src = with_gelu(&model(20, 32, 40, "[40]", None))
        .replace("[inputs.b]\ndtype = \"f16\"\nshape = [40]\n", "")
        .replace("[[ops]]\nop = \"add\"\na = \"XW\"\nb = \"b\"\noutput = \"Y\"\ndtype = \"f16\"\n", "")
        .replace("input = \"Y\"", "input = \"XW\"");
    assert!(!src.contains("op = \"add\""), "{src}");
    run(&src, 6, None);
}

#[test]
fn the_device_formula_stays_within_its_bound_for_every_f16() {
    // Independent of the planner: the kernel's f32 formula against tanh GeLU in f64, on every
    // finite f16 input, within the bound the verdict uses (no carried error).
    common::check_every_f16(ipu_host::reference::gelu_device, ipu_host::reference::gelu_f64, |x, e| {
        0.5 * x.abs() * 64.0 * 2f64.powi(-24) + 8.0 * 2f64.powi(-24) * e.abs()
    });
}

#[test]
fn the_quick_gelu_formula_stays_within_its_bound_for_every_f16() {
    // `x/(e^{−1.702x} + 1)` in f32 against `x·σ(1.702x)` in f64, within `prob::gelu_formula`'s
    // 4 f32 ulps of |x| and the verdict's 8 ulps of the result.
    common::check_every_f16(
        ipu_host::reference::gelu_sigmoid_device,
        ipu_host::reference::gelu_sigmoid_f64,
        |x, e| x.abs() * 4.0 * 2f64.powi(-24) + 8.0 * 2f64.powi(-24) * e.abs(),
    );
}

/// CLIP's MLP-up: `quick_gelu(X·W + b)`, the quick GeLU (`approximate = "sigmoid"`) fused after
/// the bias in the matmul's epilogue as the tanh GeLU is: one stage, a `gelu` phase, no
/// redistribution; bit-exact with the reference and within the f64 bound; and after f32
/// partial sums too.
#[test]
fn quick_gelu_is_fused_after_the_bias_and_after_f32_partials() {
    let quick = |src: String| src.replace("approximate = \"tanh\"", "approximate = \"sigmoid\"");
    for (m, k, n, tiles, grid, acc) in [
        (33, 40, 24, 8, None, "f16"),
        (45, 37, 29, 24, Some([2, 2, 3]), "f16"),
        (33, 100, 24, 8, None, "f32"),
    ] {
        let mut src = quick(with_gelu(&model(m, k, n, &format!("[{n}]"), None)));
        if acc == "f32" {
            // f32 partials take no bias in the epilogue (their blocks are 8 columns): GeLU alone.
            src = src
                .replace(&format!("[inputs.b]\ndtype = \"f16\"\nshape = [{n}]\n"), "")
                .replace(
                    "[[ops]]\nop = \"add\"\na = \"XW\"\nb = \"b\"\noutput = \"Y\"\ndtype = \"f16\"\n",
                    "",
                )
                .replace("input = \"Y\"", "input = \"XW\"")
                .replace("accumulate = \"f16\"", "accumulate = \"f32\"");
        }
        let g = ipu_host::model::parse("q.toml", &src).expect("parses");
        let epi = ipu_core::plan::fused_epilogue(&g);
        assert!(
            epi.is_some_and(|e| e.gelu == Some(ipu_core::graph::GeluForm::Sigmoid)),
            "not fused: {epi:?}"
        );
        runs_as_one_stage("q.toml", &src, tiles, grid, &format!("{m}x{k}x{n} on {tiles}"));
    }
}

#[test]
fn the_mlp_example_with_resident_weights_runs_exactly() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/mlp/mlp.toml");
    let src = std::fs::read_to_string(path).unwrap();
    // On 20 tiles the grid 1×8 puts 119 of the 197 rows in a tail band on the other 12 tiles
    // (docs/kernels.md "Tail band"), with the bias and the GeLU fused on both.
    for tiles in [20, 64, 1472] {
        let built = build(path, &src, &BuildOptions { threads: 2, ..BuildOptions::new(tiles) }).unwrap();
        let pkg = Package::from_bytes(&built.bytes).unwrap();
        if tiles == 20 {
            assert_eq!(
                (pkg.plan.grids[0], pkg.info.tiles_used),
                ([1, 8, 1], 20),
                "the band's 12 tiles are used"
            );
        }
        assert_eq!(pkg.bindings.iter().filter(|b| b.direction == ipu_schema::Direction::Param).count(), 2);
        let mut dev = common::device(tiles, 2);
        let opts = RunOptions {
            package_path: "mlp.ipuexe".into(),
            inputs: BTreeMap::new(),
            output_dir: None,
            save_inputs: None,
            seed: 1,
            iterations: 1,
            profile: false,
        };
        let out = session::run(&pkg, &mut dev, &opts).unwrap();
        assert!(out.numerical_pass && out.max_abs_error == 0.0, "{out:?}");
        assert!(out.cycles[0].abs_diff(pkg.plan.predicted_cycles) * 100 <= out.cycles[0]);
        println!("mlp example on {tiles} tiles: {} simulated cycles", out.cycles[0]);
    }
}

/// `model` plus a residual: `Z = Y + R` with `R` a whole `[M, N]` input.
fn with_residual(src: &str, m: u64, n: u64) -> String {
    format!("{src}[[ops]]\nop = \"add\"\na = \"Y\"\nb = \"R\"\noutput = \"Z\"\ndtype = \"f16\"\n")
        .replace("outputs = [\"Y\"]", "outputs = [\"Z\"]")
        .replace(
            "[[ops]]\nop = \"matmul\"",
            &format!("[inputs.R]\ndtype = \"f16\"\nshape = [{m}, {n}]\n[[ops]]\nop = \"matmul\""),
        )
}

#[test]
fn bias_then_residual_as_in_an_output_projection() {
    for (m, k, n, tiles, grid) in
        [(33, 40, 24, 8, None), (45, 100, 29, 24, Some([2, 2, 3])), (64, 64, 64, 1472, None)]
    {
        let src = with_residual(&model(m, k, n, &format!("[{n}]"), None), m, n);
        assert!(src.contains("[inputs.R]") && src.contains("outputs = [\"Z\"]"), "{src}");
        let (cycles, predicted) = run(&src, tiles, grid);
        // Within 1%, or the barrel alignment of four short kernel launches (§3).
        let diff = cycles.abs_diff(predicted);
        assert!(diff * 100 <= cycles || diff <= 15, "{m}x{k}x{n} on {tiles}: {cycles} vs {predicted}");
    }
}

/// `H = gelu(X·W)` with f32 partial sums rounded to f16 once (the SigLIP MLP's first half): the
/// GeLU runs on the finishing tiles right after the rounding, not as a stage of its own behind a
/// redistribution; bit-exact with the reference, cost within 1% (or the barrel alignment of a few
/// short launches).
#[test]
fn gelu_after_f32_partials_is_the_epilogue() {
    let model = |m: u64, k: u64, n: u64| {
        format!(
            "name = \"up\"\noutputs = [\"H\"]\n[inputs.X]\ndtype = \"f16\"\nshape = [{m}, {k}]\n[inputs.W]\n\
             dtype = \"f16\"\nshape = [{k}, {n}]\n[[ops]]\nop = \"matmul\"\na = \"X\"\nb = \"W\"\noutput = \"XW\"\n\
             dtype = \"f16\"\naccumulate = \"f32\"\n[[ops]]\nop = \"gelu\"\ninput = \"XW\"\noutput = \"H\"\n\
             dtype = \"f16\"\napproximate = \"tanh\"\n"
        )
    };
    for (m, k, n, tiles, grid) in [
        (33, 40, 24, 8, None),
        (45, 100, 29, 24, Some([2, 2, 3])),
        (97, 64, 72, 37, None),
        (64, 256, 64, 1472, None),
    ] {
        let src = model(m, k, n);
        let g = ipu_host::model::parse("up.toml", &src).expect("parses");
        assert!(ipu_core::plan::fused_epilogue(&g).is_some_and(|e| e.gelu.is_some()), "not fused");
        runs_as_one_stage("up.toml", &src, tiles, grid, &format!("{m}x{k}x{n} on {tiles}"));
    }
}

/// Runs `src` (a matmul with a fused GeLU epilogue) within the f64 bound, with the GeLU in the
/// matmul's stage (a GeLU stage of its own would add a redistribution), and the cost model within
/// 1% or 15 cycles.
fn runs_as_one_stage(file: &str, src: &str, tiles: usize, grid: Option<[u32; 3]>, label: &str) {
    let (out, pkg) = common::build_and_run(src, tiles, grid, 9, 2);
    assert!(out.max_abs_error_f64 > 0.0 && out.max_abs_error_f64 <= out.bound_f64, "{label}: {out:?}");
    let opts = BuildOptions { threads: 1, grid, profile: true, ..BuildOptions::new(tiles) };
    let profiled = Package::from_bytes(&build(file, src, &opts).unwrap().bytes).unwrap();
    let phases = profiled.plan.profile.expect("a profile plan").phases;
    assert!(phases.iter().any(|p| p.starts_with("gelu")), "{label}: {phases:?}");
    assert!(!phases.iter().any(|p| p.starts_with("redistribute")), "{label}: {phases:?}");
    let (cycles, predicted) = (out.cycles[0], pkg.plan.predicted_cycles);
    let diff = cycles.abs_diff(predicted);
    assert!(diff * 100 <= cycles || diff <= 15, "{label}: {cycles} vs {predicted}");
}
