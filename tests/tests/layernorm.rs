//! `layernorm` (docs/model-format.md, docs/kernels.md `layernorm_f16`): bit-exact against the
//! device-precision reference and within the derived f64 bound on odd widths (D < 4, D not a
//! multiple of 4), with and without gamma/beta, rows over 1 to 1472 tiles; the cost model is
//! exact up to barrel alignment (one kernel launch); a bad gamma is refused with its name and shape.

mod common;

use ipu_host::build::{build, BuildOptions};

fn model(rows: &str, d: u64, affine: bool, eps: &str) -> String {
    let mut s =
        format!("name = \"ln\"\noutputs = [\"Y\"]\n[inputs.X]\ndtype = \"f16\"\nshape = [{rows}, {d}]\n");
    let mut op =
        format!("[[ops]]\nop = \"layernorm\"\ninput = \"X\"\noutput = \"Y\"\ndtype = \"f16\"\n{eps}");
    if affine {
        s.push_str(&format!(
            "[inputs.g]\ndtype = \"f16\"\nshape = [{d}]\n[inputs.b]\ndtype = \"f16\"\nshape = [{d}]\n"
        ));
        op.push_str("gamma = \"g\"\nbeta = \"b\"\n");
    }
    s + &op
}

#[test]
fn layernorm_is_bit_exact_and_within_its_bound_on_odd_widths() {
    let mut report = String::new();
    for (rows, d, affine, eps, tiles) in [
        ("37", 50, true, "eps = 1e-6\n", 8),
        ("5", 3, true, "", 1),
        ("2, 7", 1152, true, "eps = 1e-6\n", 64),
        ("29", 37, false, "", 1472),
        ("13", 4, false, "eps = 0.1\n", 3),
        // One row per tile at SigLIP width: the six workers share each row.
        ("3", 1152, true, "eps = 1e-6\n", 4),
        ("7", 1151, false, "", 2),
    ] {
        let (out, pkg) = common::build_and_run(&model(rows, d, affine, eps), tiles, None, 11, 2);
        assert!(out.max_abs_error_f64 <= out.bound_f64 && out.worst_ratio_f64 <= 1.0, "{out:?}");
        // The bound is a few f16 ulps of normalised values, not a vacuous one.
        assert!(out.bound_f64 < 0.05, "{out:?}");
        let (sim, pred) = (out.cycles[1], pkg.plan.predicted_cycles);
        report.push_str(&format!("[{rows}, {d}] on {tiles}: simulated {sim} predicted {pred}\n"));
        // One launch (or three when the workers share rows): exact up to the barrel slot each
        // launch's slowest worker ends on (≤ 5 cycles per launch, §3).
        assert!(sim.abs_diff(pred) <= 15, "{report}");
    }
    println!("{report}");
}

#[test]
fn a_gamma_of_the_wrong_shape_is_refused_with_its_name() {
    let src = model("4", 8, true, "")
        .replace("[inputs.g]\ndtype = \"f16\"\nshape = [8]", "[inputs.g]\ndtype = \"f16\"\nshape = [4, 2]");
    let e = build("ln.toml", &src, &BuildOptions { threads: 1, ..BuildOptions::new(4) })
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("op 0 (layernorm): field `gamma`: `g` must be f16 of shape [8]"), "{e}");
    let src = model("4", 8, false, "eps = -1.0\n");
    let e = build("ln.toml", &src, &BuildOptions { threads: 1, ..BuildOptions::new(4) })
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("eps must be finite and ≥ 0"), "{e}");
}
