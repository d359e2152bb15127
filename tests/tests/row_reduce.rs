//! `reduce_sum` / `reduce_mean` over the last axis (`k_reduce_rows_f16`, docs/kernels.md;
//! `core/src/plan/row_reduce.rs`): the kernel on its own under a hand-written supervisor — every
//! result bit-exact with `reference::reduce::row_device`, the reference itself against values
//! computed by hand, the words past each result untouched, cycles differing between two sizes by
//! exactly 6 × `cost::reduce_rows_issues`' difference — and the ops in models: alone, as an
//! operand broadcast along the last axis (`x − mean(x)`), after a matmul; bit-exact with the
//! device-precision reference, within the f64 bound, costed up to barrel alignment.

mod common;
use common::*;
use half::f16;
use ipu_core::plan::{cost, row_reduce, Kernel};
use ipu_host::reference::reduce::row_device;
use ipu_host::Device;

/// Runs the kernel on six workers, each with `rows` rows of `d` values from `pick` (row stride
/// `⌈d/4⌉·8` bytes, zero padding) and checks every result and the untouched high half of its
/// word; returns the cycle of the host sync.
fn kernel(mean: bool, rows: u32, d: u32, pick: &mut dyn FnMut() -> f16) -> u64 {
    let prog = kernel_harness(Kernel::ReduceRowsF16, 6 * 64);
    let mut dev = device(1, 1);
    load(&mut dev, 0, &prog);
    let stride = d.div_ceil(4) * 8;
    let mut expected = Vec::new();
    for w in 0..6u32 {
        let x_at = 0x80000 + w * 0x4000;
        let y_at = 0xA0000 + w * 0x1000;
        let mut want = Vec::new();
        for r in 0..rows {
            let row: Vec<f16> = (0..d).map(|_| pick()).collect();
            let mut bytes: Vec<u8> = row.iter().flat_map(|h| h.to_bits().to_le_bytes()).collect();
            bytes.resize(stride as usize, 0);
            dev.write_memory(0, x_at + r * stride, &bytes).unwrap();
            let y = row_device(&row.iter().map(|h| h.to_f32()).collect::<Vec<_>>(), mean);
            // The high half of each result's word is a marker the kernel must leave.
            want.push(f16::from_f32(y).to_bits());
            want.push(0xBEEF);
        }
        dev.write_memory(0, y_at, &[0xEFu8, 0xBE].repeat(2 * rows as usize)).unwrap();
        let desc = [x_at, stride, y_at, 4, rows, d / 4, d % 4, row_reduce::scale(mean, d as u64).to_bits()];
        let mut words = desc.to_vec();
        words.resize(16, 0);
        write_u32s(&mut dev, prog.sym("desc") + 64 * w, &words);
        expected.push((y_at, want));
    }
    let cycles = dev.run_to_host_sync().expect("runs").cycles;
    for (at, want) in &expected {
        let got = read_u16s(&mut dev, 0, *at, want.len());
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            let same = g == w || (f16::from_bits(*g).is_nan() && f16::from_bits(*w).is_nan());
            assert!(
                same,
                "mean={mean} rows={rows} d={d}: half {k} at {at:#x}: device {g:#06x}, reference {w:#06x}"
            );
        }
    }
    cycles
}

#[test]
fn the_reference_is_the_hand_computed_sum_and_mean() {
    // Sums exact in f32; means times the f32-rounded 1/D, rounded once to f16.
    let f = |v: &[f32], mean| row_device(v, mean);
    assert_eq!(f(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], false), 28.0);
    assert_eq!(f(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], true), 3.5);
    // 7·f32(1/3) = 2.3333333 → f16 2.333984375 (NumPy: np.float16(np.float32(7) * np.float32(1/3))).
    assert_eq!(f(&[1.0, 2.0, 4.0], true), 2.333_984_4);
    // Lanes: 65504 + 1 in lane 0 (exact in f32), −65504 in lane 1: 1, where f16 partial sums
    // would have lost it.
    assert_eq!(f(&[65504.0, -65504.0, 1.0], false), 1.0);
    // A sum past f16's range is ∞; its mean is not.
    assert_eq!(f(&[60000.0; 4], false), f32::INFINITY);
    assert_eq!(f(&[60000.0; 4], true), 60000.0);
    assert!(f(&[1.0, f32::NAN], true).is_nan());
}

#[test]
fn the_kernel_is_the_reference_and_costs_its_formula() {
    let mut rng = Rng(7);
    let mut pick = move || f16::from_f32(rng.f16().to_f32() * 8.0);
    for mean in [false, true] {
        // Widths with and without a tail, a row of fewer than four values, no rows.
        for ((ra, da), (rb, db)) in
            [((1, 4), (3, 4)), ((2, 37), (5, 37)), ((1, 3), (4, 3)), ((0, 8), (2, 8)), ((2, 96), (2, 101))]
        {
            let (ta, tb) = (kernel(mean, ra, da, &mut pick), kernel(mean, rb, db, &mut pick));
            let issues = |r: u32, d: u32| cost::reduce_rows_issues(r as u64, (d / 4) as u64, (d % 4) as u64);
            assert_eq!(tb - ta, 6 * (issues(rb, db) - issues(ra, da)), "({ra}, {da}) → ({rb}, {db})");
        }
    }
}

fn model(op: &str, shape: &[u64], extra: &str, outputs: &str) -> String {
    let mut out = shape.to_vec();
    *out.last_mut().unwrap() = 1;
    format!(
        "name = \"r\"\noutputs = [{outputs}]\n[inputs.X]\ndtype = \"f16\"\nshape = {shape:?}\n[[ops]]\nop = \"{op}\"\n\
         input = \"X\"\noutput = \"M\"\ndtype = \"f16\"\n{extra}"
    )
}

/// Build, run twice, require bit-exactness and the f64 bound; (simulated, predicted) cycles.
fn run(src: &str, tiles: usize) -> (u64, u64) {
    let (out, pkg) = build_and_run(src, tiles, None, 3, 2);
    assert!(out.max_abs_error_f64 <= out.bound_f64 && out.worst_ratio_f64 <= 1.0, "{out:?}");
    assert!(out.compared_elements > 0, "{out:?}");
    (out.cycles[1], pkg.plan.predicted_cycles)
}

#[test]
fn reductions_of_any_rows_are_exact_and_costed() {
    let mut report = String::new();
    for (op, shape, tiles) in [
        ("reduce_sum", &[13u64, 37][..], 1),
        ("reduce_mean", &[3, 1152][..], 4),
        ("reduce_mean", &[2, 5, 96][..], 64),
        ("reduce_sum", &[40, 3][..], 3),
        ("reduce_mean", &[1, 7][..], 1),
    ] {
        let (sim, pred) = run(&model(op, shape, "", "\"M\""), tiles);
        report.push_str(&format!("{op} {shape:?} on {tiles}: simulated {sim} predicted {pred}\n"));
        assert!(sim.abs_diff(pred) <= 6, "{report}");
        let g = ipu_host::model::parse("r.toml", &model(op, shape, "", "\"M\"")).unwrap();
        let mut want = shape.to_vec();
        *want.last_mut().unwrap() = 1;
        assert_eq!(g.tensor(g.find("M").unwrap()).shape, want);
    }
    println!("{report}");
}

#[test]
fn a_mean_feeds_a_broadcast_operand_and_follows_a_matmul() {
    // x − mean(x): the mean is read where it is, one value per word (the splat kernels).
    let centred = "[[ops]]\nop = \"sub\"\na = \"X\"\nb = \"M\"\noutput = \"Y\"\ndtype = \"f16\"\n";
    for tiles in [1, 7, 64] {
        run(&model("reduce_mean", &[29, 72], centred, "\"Y\""), tiles);
    }
    // reduce_sum of a matmul's result (a redistribution from the grid into rows).
    let src = "name = \"mm\"\noutputs = [\"S\"]\n[inputs.A]\ndtype = \"f16\"\nshape = [33, 40]\n[inputs.W]\n\
               dtype = \"f16\"\nshape = [40, 24]\n[[ops]]\nop = \"matmul\"\na = \"A\"\nb = \"W\"\noutput = \"C\"\n\
               dtype = \"f16\"\naccumulate = \"f16\"\n[[ops]]\nop = \"reduce_sum\"\ninput = \"C\"\noutput = \"S\"\n\
               dtype = \"f16\"\n";
    run(src, 8);
}

#[test]
fn wrong_dtypes_are_refused_naming_the_op() {
    let src = model("reduce_sum", &[4, 8], "", "\"M\"")
        .replace("output = \"M\"\ndtype = \"f16\"", "output = \"M\"\ndtype = \"f32\"");
    let e = ipu_host::model::parse("r.toml", &src).unwrap_err().to_string();
    assert!(
        e.contains("op 0 (reduce_sum)") && e.contains("reduce_sum f16 → f32") && e.contains("the sum in f32"),
        "{e}"
    );
}
