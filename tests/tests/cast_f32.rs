//! f32 ↔ f16 casts on the device (`cast_f32_f16`, `cast_f16_f32`): f32 inputs reach the AMP
//! through a cast on the chip, bit-exact with the reference's round-to-nearest-even, on odd shapes
//! and tile counts; the kernels are costed exactly.

use ipu_host::build::{build, BuildOptions};

mod common;

fn run(src: &str, tiles: usize) -> (u64, u64) {
    let (out, pkg) = common::build_and_run(src, tiles, None, 3, 2);
    assert!(out.max_abs_error_f64 > 0.0 && out.max_abs_error_f64 <= out.bound_f64, "{out:?}");
    (out.cycles[0], pkg.plan.predicted_cycles)
}

fn f32_in(rows: u64, k: u64, n: u64) -> String {
    format!(
        "name = \"c32\"\noutputs = [\"Y\"]\n[inputs.X]\ndtype = \"f32\"\nshape = [{rows}, {k}]\n[inputs.W]\n\
         dtype = \"f16\"\nshape = [{k}, {n}]\n[[ops]]\nop = \"cast\"\ninput = \"X\"\noutput = \"X16\"\ndtype = \"f16\"\n\
         [[ops]]\nop = \"matmul\"\na = \"X16\"\nb = \"W\"\noutput = \"Y\"\ndtype = \"f16\"\naccumulate = \"f16\"\n"
    )
}

#[test]
fn an_f32_input_is_cast_on_the_chip_before_the_amp() {
    for (rows, k, n, tiles) in [(33, 40, 24, 8), (5, 37, 19, 3), (64, 100, 48, 64), (7, 16, 16, 1)] {
        let (cycles, predicted) = run(&f32_in(rows, k, n), tiles);
        assert!(
            cycles.abs_diff(predicted) * 100 <= cycles,
            "{rows}x{k}x{n} on {tiles}: {cycles} vs {predicted}"
        );
    }
}

#[test]
fn an_f16_tensor_is_cast_to_f32_exactly() {
    let src =
        "name = \"c16\"\noutputs = [\"X32\"]\n[inputs.X]\ndtype = \"f16\"\nshape = [3, 21, 37]\n[[ops]]\n\
               op = \"cast\"\ninput = \"X\"\noutput = \"X32\"\ndtype = \"f32\"\n";
    // Exact: the f64 error is 0 (the run asserts the device matches the reference bit for bit).
    let (out, pkg) = common::build_and_run(src, 5, None, 1, 1);
    assert_eq!(out.max_abs_error_f64, 0.0, "{out:?}");
    assert!(out.cycles[0].abs_diff(pkg.plan.predicted_cycles) * 100 <= out.cycles[0]);
}

#[test]
fn an_f32_weight_cast_on_the_chip_feeds_a_grid_matmul_and_a_row_chain_refuses_it() {
    let with_f32_w = |src: String| {
        src.replace("[inputs.W]\ndtype = \"f16\"", "[inputs.W]\ndtype = \"f32\"").replace("b = \"W\"", "b = \"W16\"").replace(
            "[[ops]]\nop = \"matmul\"",
            "[[ops]]\nop = \"cast\"\ninput = \"W\"\noutput = \"W16\"\ndtype = \"f16\"\n[[ops]]\nop = \"matmul\"",
        )
    };
    // A rank-2 matmul is a grid stage of its own: the cast is a stage before it.
    let src = with_f32_w(f32_in(8, 16, 16));
    for tiles in [1, 4] {
        run(&src, tiles);
    }
    // A batched matmul is planned in a row chain, whose side operands are f16 → FP8 casts only.
    let batched = with_f32_w(f32_in(8, 16, 16))
        .replace("shape = [8, 16]", "shape = [2, 8, 16]")
        .replace("shape = [16, 16]", "shape = [2, 16, 16]");
    let e = build("c.toml", &batched, &BuildOptions { threads: 1, ..BuildOptions::new(4) })
        .unwrap_err()
        .to_string();
    assert!(e.contains("op 1 (cast): a cast feeding a matmul's `b` must be f16 → FP8"), "{e}");
}
