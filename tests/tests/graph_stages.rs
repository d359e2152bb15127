//! Graphs of several mappings (`ipu_core::plan::stages`, docs/graph-planner.md): a ViT MLP block
//! with its residual — `Y = gelu(X·W1 + b1)·W2 + b2 + X` — is two matmul stages joined by a
//! redistribution of `H` and of `X` (the residual, bound where the first matmul reads it). It runs
//! bit-exact against the device-precision reference on odd shapes from 1 to 1472 tiles, within the
//! f64 bound, and the cost model predicts the simulator within 1%.

mod common;

fn input(name: &str, shape: &str) -> String {
    format!("[inputs.{name}]\ndtype = \"f16\"\nshape = {shape}\n")
}

fn op(body: &str) -> String {
    format!("[[ops]]\n{body}\ndtype = \"f16\"\n")
}

/// The MLP block on `[m, d]` tokens with hidden width `h`; `acc` is the matmuls' accumulation.
fn mlp_block(m: u64, d: u64, h: u64, acc: &str) -> String {
    let mm = |a: &str, b: &str, out: &str| {
        op(&format!("op = \"matmul\"\na = \"{a}\"\nb = \"{b}\"\noutput = \"{out}\"\naccumulate = \"{acc}\""))
    };
    let add = |a: &str, b: &str, out: &str| {
        op(&format!("op = \"add\"\na = \"{a}\"\nb = \"{b}\"\noutput = \"{out}\""))
    };
    [
        "name = \"mlp_block\"\noutputs = [\"Y\"]\n".to_string(),
        input("X", &format!("[{m}, {d}]")),
        input("W1", &format!("[{d}, {h}]")),
        input("b1", &format!("[{h}]")),
        input("W2", &format!("[{h}, {d}]")),
        input("b2", &format!("[{d}]")),
        mm("X", "W1", "XW"),
        add("XW", "b1", "Y1"),
        op("op = \"gelu\"\ninput = \"Y1\"\noutput = \"H\"\napproximate = \"tanh\""),
        mm("H", "W2", "HW"),
        add("HW", "b2", "Z"),
        add("Z", "X", "Y"),
    ]
    .concat()
}

#[test]
fn mlp_block_runs_bit_exact_on_odd_shapes_and_tile_counts() {
    let mut report = String::new();
    for (m, d, h, tiles) in
        [(37, 48, 96, 64), (37, 48, 96, 1472), (29, 36, 100, 8), (5, 37, 19, 1), (50, 40, 72, 24)]
    {
        let (out, pkg) = common::build_and_run(&mlp_block(m, d, h, "f16"), tiles, None, 5, 2);
        assert!(out.max_abs_error_f64 <= out.bound_f64, "{m}x{d}x{h} on {tiles}: {out:?}");
        assert!(out.compared_elements == 2 * m * d, "{out:?}");
        let (sim, pred) = (out.cycles[1], pkg.plan.predicted_cycles);
        report.push_str(&format!("{m}x{d}x{h} on {tiles} tiles: simulated {sim} predicted {pred}\n"));
        assert!(sim.abs_diff(pred) * 100 <= sim, "{report}");
    }
    println!("{report}");
}

#[test]
fn pre_layernorm_mlp_block_runs_bit_exact() {
    // Y = X + W2·gelu(W1·LN(X) + b1) + b2: LN on its own rows, two matmul stages, X redistributed
    // to the LN and to the last stage's residual.
    let src = mlp_block(37, 48, 96, "f16")
        .replace("[inputs.b2]", "[inputs.g]\ndtype = \"f16\"\nshape = [48]\n[inputs.be]\ndtype = \"f16\"\nshape = [48]\n[inputs.b2]")
        .replacen("a = \"X\"", "a = \"N\"", 1)
        .replacen(
            "[[ops]]",
            "[[ops]]\nop = \"layernorm\"\ninput = \"X\"\ngamma = \"g\"\nbeta = \"be\"\neps = 1e-6\noutput = \"N\"\ndtype = \"f16\"\n[[ops]]",
            1,
        );
    for tiles in [1, 64, 1472] {
        let (out, pkg) = common::build_and_run(&src, tiles, None, 4, 1);
        assert!(out.max_abs_error_f64 <= out.bound_f64, "{out:?}");
        let (sim, pred) = (out.cycles[0], pkg.plan.predicted_cycles);
        assert!(sim.abs_diff(pred) * 100 <= sim, "{tiles} tiles: simulated {sim} predicted {pred}");
    }
}

#[test]
fn f16_results_of_f32_accumulation_feed_the_next_matmul() {
    // Refused before stages ("planned for a single rank-2 matmul"); now each matmul is a stage.
    let src = [
        "name = \"two\"\noutputs = [\"Z\"]\n".to_string(),
        input("X", "[21, 40]"),
        input("W1", "[40, 24]"),
        input("W2", "[24, 17]"),
        op("op = \"matmul\"\na = \"X\"\nb = \"W1\"\noutput = \"Y\"\naccumulate = \"f32\""),
        op("op = \"matmul\"\na = \"Y\"\nb = \"W2\"\noutput = \"Z\"\naccumulate = \"f32\""),
    ]
    .concat();
    let (out, _) = common::build_and_run(&src, 16, None, 3, 1);
    assert!(out.max_abs_error_f64 <= out.bound_f64, "{out:?}");
}

#[test]
fn an_intermediate_output_is_read_back_and_fed_on() {
    // `H` is both a model output and the next stage's operand.
    let src = mlp_block(19, 32, 48, "f16").replace("outputs = [\"Y\"]", "outputs = [\"Y\", \"H\"]");
    let (out, _) = common::build_and_run(&src, 12, None, 8, 1);
    assert_eq!(out.compared_elements, 19 * 32 + 19 * 48);
}

#[test]
fn a_transposed_read_of_a_tensor_made_on_the_chip_gets_a_transpose_stage() {
    // Refused before ("`K` is made on the chip and read transposed"); the planner now inserts a
    // transpose of the last two axes (`plan/canon.rs`) and the matmul reads its result as is.
    let src = [
        "name = \"qk\"\noutputs = [\"S\"]\n".to_string(),
        input("X", "[16, 32]"),
        input("W", "[32, 32]"),
        op("op = \"matmul\"\na = \"X\"\nb = \"W\"\noutput = \"K\"\naccumulate = \"f16\""),
        op("op = \"matmul\"\na = \"X\"\nb = \"K\"\ntranspose_b = true\noutput = \"S\"\naccumulate = \"f16\""),
    ]
    .concat();
    for tiles in [1, 8, 64] {
        let (out, _) = common::build_and_run(&src, tiles, None, 4, 1);
        assert!(out.max_abs_error_f64 <= out.bound_f64, "{out:?}");
        assert_eq!(out.compared_elements, 16 * 16);
    }
}
