//! Elementwise ops on their own rows (docs/graph-planner.md, `core/src/plan/elementwise.rs`):
//! `add`, `sub`, `mul` with NumPy broadcasting over leading axes and `gelu` in its three forms, on 1 to
//! 1472 tiles, with rows fewer than the workers (columns shared) and widths that are not multiples
//! of 4; bit-exact against the device-precision reference, within the f64 bound, and costed up to
//! barrel alignment. The erf formula is checked against f64 erf on every f16 input here, with
//! the test's own f64 GeLU. Operands broadcast along the last axis (a column, a scalar) are splat.

mod common;

use ipu_host::build::{build, BuildOptions};

fn binary(op: &str, a: &[u64], b: &[u64]) -> String {
    format!(
        "name = \"ew\"\noutputs = [\"Y\"]\n[inputs.A]\ndtype = \"f16\"\nshape = {a:?}\n[inputs.B]\ndtype = \"f16\"\n\
         shape = {b:?}\n[[ops]]\nop = \"{op}\"\na = \"A\"\nb = \"B\"\noutput = \"Y\"\ndtype = \"f16\"\n"
    )
}

fn gelu(shape: &[u64], form: &str) -> String {
    format!(
        "name = \"g\"\noutputs = [\"Y\"]\n[inputs.X]\ndtype = \"f16\"\nshape = {shape:?}\n[[ops]]\nop = \"gelu\"\n\
         input = \"X\"\noutput = \"Y\"\ndtype = \"f16\"\napproximate = \"{form}\"\n"
    )
}

/// Build, run twice, require bit-exactness (in `build_and_run`) and the f64 bound; return
/// (simulated, predicted) cycles.
fn run(src: &str, tiles: usize) -> (u64, u64) {
    let (out, pkg) = common::build_and_run(src, tiles, None, 5, 2);
    assert!(out.max_abs_error_f64 <= out.bound_f64 && out.worst_ratio_f64 <= 1.0, "{out:?}");
    assert!(out.compared_elements > 0, "{out:?}");
    (out.cycles[1], pkg.plan.predicted_cycles)
}

#[test]
fn binary_ops_with_broadcasting_are_exact_and_costed() {
    let mut report = String::new();
    for (op, a, b, tiles) in [
        ("add", &[7u64, 3, 37][..], &[7u64, 1, 37][..], 1),
        ("sub", &[50], &[9, 50], 4),
        ("mul", &[2, 9, 50], &[9, 50], 64),
        ("sub", &[29, 1151], &[29, 1151], 1472),
        // Two rows of SigLIP width on one tile: the workers share each row's columns.
        ("mul", &[2, 1152], &[1152], 1),
        ("add", &[1, 97, 72], &[97, 72], 8),
        ("sub", &[3], &[5, 3], 2),
        // Broadcast along the last axis: a column, a scalar on either side, a column against a
        // row (neither laid out like the result), rows fewer than workers.
        ("mul", &[8, 16], &[8, 1], 4),
        ("sub", &[5, 3, 37], &[3, 1], 1),
        ("sub", &[1], &[7, 6], 3),
        ("add", &[2, 1], &[1, 5], 1),
        ("mul", &[3, 1152], &[1, 1], 1472),
        ("sub", &[2, 1], &[2, 7], 1),
    ] {
        let (sim, pred) = run(&binary(op, a, b), tiles);
        report.push_str(&format!("{op} {a:?} {b:?} on {tiles}: simulated {sim} predicted {pred}\n"));
        // One kernel launch: exact up to the barrel slot its slowest worker ends on (§3).
        assert!(sim.abs_diff(pred) <= 6, "{report}");
    }
    println!("{report}");
}

#[test]
fn gelu_of_any_rows_in_every_form() {
    let mut report = String::new();
    for (shape, tiles) in
        [(&[13u64, 37][..], 1), (&[3, 1152][..], 4), (&[2, 5, 96][..], 1472), (&[1, 3][..], 1)]
    {
        for form in ["tanh", "none", "sigmoid"] {
            let (sim, pred) = run(&gelu(shape, form), tiles);
            report.push_str(&format!("gelu {form} {shape:?} on {tiles}: simulated {sim} predicted {pred}\n"));
            // A copy (the host's input and output are separate buffers) and the gelu: two
            // launches, each exact up to barrel alignment.
            assert!(sim.abs_diff(pred) <= 12, "{report}");
        }
    }
    println!("{report}");
}

#[test]
fn erf_gelu_fused_after_a_matmul() {
    let src = "name = \"mlp\"\noutputs = [\"H\"]\n[inputs.X]\ndtype = \"f16\"\nshape = [33, 40]\n[inputs.W]\n\
               dtype = \"f16\"\nshape = [40, 24]\n[inputs.b]\ndtype = \"f16\"\nshape = [24]\n[[ops]]\nop = \"matmul\"\n\
               a = \"X\"\nb = \"W\"\noutput = \"XW\"\ndtype = \"f16\"\naccumulate = \"f16\"\n[[ops]]\nop = \"add\"\n\
               a = \"XW\"\nb = \"b\"\noutput = \"Y\"\ndtype = \"f16\"\n[[ops]]\nop = \"gelu\"\ninput = \"Y\"\n\
               output = \"H\"\ndtype = \"f16\"\napproximate = \"none\"\n";
    for tiles in [8, 1472] {
        let (sim, pred) = run(src, tiles);
        assert!(sim.abs_diff(pred) * 100 <= sim, "{tiles} tiles: {sim} vs {pred}");
    }
    // One mapping: the gelu is in the matmul's epilogue, not a stage of its own.
    let g = ipu_host::model::parse("m.toml", src).unwrap();
    let plan = ipu_core::plan::plan(&g, ipu_core::plan::PlanOptions::new(8)).unwrap();
    assert!(plan.mapping.iter().all(|m| !m.contains("stage")), "{:?}", plan.mapping);
}

/// GeLU in f64 from the definition, `x·Φ(x)` with `Φ(x) = (1 + erf(x/√2))/2`.
fn gelu_erf_exact(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

#[test]
fn the_erf_formula_stays_within_its_bound_for_every_f16() {
    // Independent of the planner: the kernel's f32 formula (mirrored op for op by the reference)
    // against the f64 definition, on every finite f16 input, within the bound the verdict uses.
    common::check_every_f16(ipu_host::reference::gelu_erf_device, gelu_erf_exact, |x, e| {
        x.abs() * (0.75e-7 + 40.0 * 2f64.powi(-24)) + 8.0 * 2f64.powi(-24) * e.abs()
    });
}

#[test]
fn bad_shapes_and_forms_are_refused_with_their_names() {
    let opts = BuildOptions { threads: 1, ..BuildOptions::new(4) };
    // Shapes that do not broadcast are a model error naming the op.
    let e = build("ew.toml", &binary("sub", &[8, 16], &[5]), &opts).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("op 0 (sub): shapes [8, 16] and [5] do not broadcast"), "{e}");
    // An unknown gelu form names the two there are.
    let e = build("g.toml", &gelu(&[4, 8], "exact"), &opts).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("\"tanh\"") && e.contains("\"none\"") && e.contains("\"sigmoid\""), "{e}");
}
