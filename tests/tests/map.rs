//! The elementwise functions of `OpKind::Map` (`tanh`, `sigmoid`, `exp`, `log`, `sqrt`,
//! `reciprocal`, `abs`, `erf`, `pow`, `max`, `min`, `leaky_relu`; docs/kernels.md `map_f16`): every function on rows whose
//! width is and is not a multiple of four, with fewer rows than workers, on 1 to 1472 tiles —
//! bit-exact against the device-precision reference, within the f64 bound and costed up to barrel
//! alignment; each f32 formula against its f64 definition on every f16 input; the zero padding
//! after a row kept zero when f(0) is not (1/0 = ∞ in the padding would make a matmul's NaN).

mod common;

use ipu_core::graph::MapFn;
use ipu_host::build::{build, BuildOptions};
use ipu_host::reference::map;

/// The constant each function is tested with: a power, a bound inside the inputs' range (so that
/// both sides of it are met), a slope.
fn constant(func: MapFn) -> f32 {
    match func {
        MapFn::Max => -0.25,
        MapFn::Min => 0.5,
        MapFn::LeakyRelu => 0.01,
        _ => 1.5,
    }
}

fn model(func: MapFn, shape: &[u64]) -> String {
    let exponent = match func.field() {
        Some(f) => format!("{f} = {}\n", constant(func)),
        None => String::new(),
    };
    format!(
        "name = \"m\"\noutputs = [\"Y\"]\n[inputs.X]\ndtype = \"f16\"\nshape = {shape:?}\n[[ops]]\nop = \"{}\"\n\
         input = \"X\"\noutput = \"Y\"\ndtype = \"f16\"\n{exponent}",
        func.name()
    )
}

#[test]
fn every_function_on_any_rows_is_exact_and_costed() {
    let mut report = String::new();
    // Widths with 1, 0, 2 and 3 values after the last full chunk; [3, 1152] has fewer rows than
    // workers (the workers share each row's chunks); [1, 3] has no full chunk at all.
    let cases: [(&[u64], usize); 4] = [(&[13, 37], 1), (&[3, 1152], 4), (&[2, 5, 98], 1472), (&[1, 3], 1)];
    for func in MapFn::ALL {
        for (shape, tiles) in cases {
            let (out, pkg) = common::build_and_run(&model(func, shape), tiles, None, 11, 2);
            assert!(out.compared_elements > 0, "{out:?}");
            assert!(
                out.max_abs_error_f64 <= out.bound_f64 && out.worst_ratio_f64 <= 1.0,
                "{func:?}: {out:?}"
            );
            let (sim, pred) = (out.cycles[1], pkg.plan.predicted_cycles);
            report.push_str(&format!(
                "{} {shape:?} on {tiles}: simulated {sim} predicted {pred}\n",
                func.name()
            ));
            // A copy (the host's input and output are separate buffers) and the map: two
            // launches, each exact up to the barrel slot its slowest worker ends on.
            assert!(sim.abs_diff(pred) <= 12, "{report}");
        }
    }
    println!("{report}");
}

#[test]
fn each_formula_stays_within_its_bound_for_every_f16() {
    // Independent of the planner: the kernel's f32 formula (mirrored op for op by the reference)
    // against the f64 definition on every finite f16 input, within the bound the verdict uses;
    // and the bound not loose by orders of magnitude.
    for func in MapFn::ALL {
        let mut worst = 0f64;
        for h in 0..=u16::MAX {
            let x = half::f16::from_bits(h).to_f32();
            if !x.is_finite() {
                continue;
            }
            let c = constant(func);
            let (d, e) = (map::device(func, c, x) as f64, map::exact(func, c, x as f64));
            if e.is_nan() {
                assert!(d.is_nan(), "{func:?}({x}): device {d}, f64 NaN");
                continue;
            }
            let b = map::bound(func, c, x as f64, 0.0, e);
            if d == e {
                continue;
            }
            let exact = matches!(func, MapFn::Abs | MapFn::Max | MapFn::Min);
            assert!(!exact, "{func:?} is exact: at {x} gave {d}");
            assert!((d - e).abs() <= b, "{func:?}({x}): device {d} vs f64 {e}, bound {b}");
            if b.is_finite() {
                worst = worst.max((d - e).abs() / b);
            }
        }
        assert!(
            matches!(func, MapFn::Abs | MapFn::Max | MapFn::Min) || worst > 0.3,
            "{func:?}: the bound is loose by orders of magnitude: worst ratio {worst}"
        );
    }
}

#[test]
fn the_padding_after_a_row_stays_zero() {
    // 37 columns: three padding halves after each row. 1/0 = ∞ written there would meet the
    // matmul's zero weight padding as ∞·0 = NaN.
    let src = "name = \"pad\"\noutputs = [\"Y\"]\n[inputs.X]\ndtype = \"f16\"\nshape = [24, 37]\n[inputs.W]\n\
               dtype = \"f16\"\nshape = [37, 16]\n[[ops]]\nop = \"reciprocal\"\ninput = \"X\"\noutput = \"R\"\n\
               dtype = \"f16\"\n[[ops]]\nop = \"matmul\"\na = \"R\"\nb = \"W\"\noutput = \"Y\"\ndtype = \"f16\"\n\
               accumulate = \"f16\"\n";
    for tiles in [1, 8] {
        let (out, _) = common::build_and_run(src, tiles, None, 3, 1);
        assert!(out.compared_elements > 0, "{out:?}");
    }
}

#[test]
fn a_pow_without_its_exponent_and_unknown_ops_are_refused_by_name() {
    let opts = BuildOptions { threads: 1, ..BuildOptions::new(4) };
    let src = model(MapFn::Pow, &[4, 8]).replace("exponent = 1.5\n", "");
    let e = build("m.toml", &src, &opts).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("op 0 (pow): missing field `exponent`"), "{e}");
    let src = model(MapFn::Max, &[4, 8]).replace("value = -0.25\n", "");
    let e = build("m.toml", &src, &opts).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("op 0 (max): missing field `value`"), "{e}");
    // max(x, αx) is the leaky ReLU only for α ≤ 1.
    let src = model(MapFn::LeakyRelu, &[4, 8]).replace("alpha = 0.01", "alpha = 1.5");
    let e = build("m.toml", &src, &opts).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("field `alpha`: must be a finite number ≤ 1"), "{e}");
    let src = model(MapFn::Min, &[4, 8]) + "exponent = 2.0\n";
    let e = build("m.toml", &src, &opts).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("field `exponent` does not apply"), "{e}");
    let src = model(MapFn::Pow, &[4, 8]).replace("exponent = 1.5\n", "");
    let e = build("m.toml", &src, &opts).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("op 0 (pow): missing field `exponent`"), "{e}");
    let src = model(MapFn::Exp, &[4, 8]) + "exponent = 2.0\n";
    let e = build("m.toml", &src, &opts).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("field `exponent` does not apply"), "{e}");
    let src = model(MapFn::Exp, &[4, 8]).replace("\"exp\"", "\"cosh\"");
    let e = build("m.toml", &src, &opts).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("unknown op `cosh`") && e.contains("tanh, sigmoid, exp"), "{e}");
}

#[test]
fn a_square_reads_one_operand_twice() {
    // `mul X X` (what an imported `Pow(x, 2)` becomes): one buffer bound once, read as both
    // operands, on tiles with whole rows and with rows shared by the workers.
    let src = "name = \"sq\"\noutputs = [\"Y\"]\n[inputs.X]\ndtype = \"f16\"\nshape = [9, 37]\n[[ops]]\nop = \"exp\"\n\
               input = \"X\"\noutput = \"E\"\ndtype = \"f16\"\n[[ops]]\nop = \"mul\"\na = \"E\"\nb = \"E\"\n\
               output = \"Y\"\ndtype = \"f16\"\n";
    for tiles in [1, 4] {
        let (out, _) = common::build_and_run(src, tiles, None, 5, 1);
        assert!(out.compared_elements > 0 && out.max_abs_error_f64 <= out.bound_f64, "{out:?}");
    }
}
