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

/// Outputs that are only views of a model input (no op reads the input otherwise): the input is
/// placed in rows of its own and each output gathered from it. Checked against the input itself,
/// element by element, on 1, 5 and 1472 tiles (was refused: "a view of `X`, which no op reads").
#[test]
fn outputs_that_are_views_of_an_unread_input_are_its_bytes() {
    use ipu_host::build::{build, BuildOptions};
    use ipu_host::session::{self, RunOptions};
    let src = format!(
        "name = \"views\"\noutputs = [\"Z\", \"Z2\"]\n{}[[ops]]\nop = \"reshape\"\ninput = \"X\"\nshape = [3, 20]\n\
         output = \"Z\"\ndtype = \"f16\"\n[[ops]]\nop = \"slice\"\ninput = \"X\"\nstarts = [0, 2]\nends = [6, 8]\n\
         output = \"Z2\"\ndtype = \"f16\"\n",
        input("X", "[6, 10]")
    );
    for tiles in [1, 5, 1472] {
        let built =
            build("views.toml", &src, &BuildOptions { threads: 1, ..BuildOptions::new(tiles) }).unwrap();
        let pkg = ipu_host::package::Package::from_bytes(&built.bytes).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let opts = RunOptions {
            package_path: "views.ipuexe".into(),
            inputs: Default::default(),
            output_dir: Some(dir.path().join("out")),
            save_inputs: Some(dir.path().join("in")),
            seed: 5,
            iterations: 1,
            profile: false,
        };
        let mut dev = common::device(tiles, 1);
        let out = session::run(&pkg, &mut dev, &opts).unwrap();
        assert!(out.numerical_pass, "{tiles} tiles");
        let x = ipu_host::npy::read(&dir.path().join("in/X.npy")).unwrap().data;
        let z = ipu_host::npy::read(&dir.path().join("out/Z.npy")).unwrap().data;
        let z2 = ipu_host::npy::read(&dir.path().join("out/Z2.npy")).unwrap().data;
        assert_eq!(z, x, "{tiles} tiles: a reshape is the same values in the same order");
        let want: Vec<f32> = (0..6).flat_map(|r| x[r * 10 + 2..r * 10 + 8].to_vec()).collect();
        assert_eq!(z2, want, "{tiles} tiles: columns 2..8 of every row");
    }
}

/// LayerNorm of `[m, d]` into a `[d, n]` matmul accumulating in `acc`.
fn ln_matmul(m: u64, d: u64, n: u64, acc: &str) -> String {
    [
        "name = \"ln_matmul\"\noutputs = [\"Y\"]\n".to_string(),
        input("X", &format!("[{m}, {d}]")),
        input("g", &format!("[{d}]")),
        input("be", &format!("[{d}]")),
        input("W", &format!("[{d}, {n}]")),
        op("op = \"layernorm\"\ninput = \"X\"\ngamma = \"g\"\nbeta = \"be\"\neps = 1e-6\noutput = \"N\""),
        op(&format!("op = \"matmul\"\na = \"N\"\nb = \"W\"\noutput = \"Y\"\naccumulate = \"{acc}\"")),
    ]
    .concat()
}

#[test]
fn rows_a_layernorm_leaves_are_held_row_major_by_the_grid_and_run_bit_exact() {
    // The LayerNorm leaves whole rows; the grid's tiles hold ≥ 32 rows × 32 K blocks of them, so
    // they hold A row-major and run the strided AMP kernel (`MatMul::a_row_major`,
    // docs/kernels.md "Row-major A"): each row arrives as one exchange piece, not 32.
    use ipu_core::plan::{Kernel, Step};
    for (m, d, n, acc, tiles) in
        [(128, 512, 64, "f16", 16), (150, 520, 40, "f32", 16), (256, 1024, 64, "f16", 64)]
    {
        let src = ln_matmul(m, d, n, acc);
        let graph = ipu_host::model::parse("m.toml", &src).unwrap();
        let plan = ipu_core::plan::plan(&graph, ipu_core::plan::PlanOptions::new(tiles)).unwrap();
        let strided = plan
            .tiles
            .distinct()
            .into_iter()
            .filter(|(_, t)| {
                t.steps
                    .iter()
                    .any(|s| matches!(s, Step::RunAll(Kernel::AmpF16Strided | Kernel::AmpF32Strided, ..)))
            })
            .count();
        assert!(strided > 0, "{m}x{d}x{n} {acc} on {tiles}: no tile runs the strided kernel");
        // f32 partials read half the weight store: the strided form loads half as the plain does.
        for (_, t) in plan.tiles.distinct() {
            if t.steps.iter().any(|s| matches!(s, Step::RunAll(Kernel::AmpF32Strided, ..))) {
                let loads = t.steps.iter().filter_map(|s| match s {
                    Step::LoadWeights(_, _, load) => Some(*load),
                    _ => None,
                });
                assert!(loads.into_iter().all(|l| l == ipu_core::plan::CweiLoad::Half), "{acc}: a full load");
            }
        }
        let (out, pkg) = common::build_and_run(&src, tiles, None, 3, 2);
        assert!(out.max_abs_error_f64 <= out.bound_f64, "{out:?}");
        let (sim, pred) = (out.cycles[1], pkg.plan.predicted_cycles);
        assert!(sim.abs_diff(pred) * 100 <= sim, "{tiles} tiles: simulated {sim} predicted {pred}");
    }
}

#[test]
fn a_long_transpose_is_cut_into_16_row_groups_and_runs_bit_exact() {
    // Kᵀ of attention: [heads, tokens, 72] → [heads, 72, tokens]. Cut by column groups, a tile
    // writes two output rows of 729 values (two workers busy); by 16-row groups it writes a
    // 72 × 16 column block of the output, the layout a row chain's weight blocks take.
    let src = "name = \"kt\"\noutputs = [\"Y\"]\n".to_string()
        + &input("X", "[2, 729, 72]")
        + &op("op = \"transpose\"\ninput = \"X\"\nperm = [0, 2, 1]\noutput = \"Y\"");
    let graph = ipu_host::model::parse("m.toml", &src).unwrap();
    let plan = ipu_core::plan::plan(&graph, ipu_core::plan::PlanOptions::new(64)).unwrap();
    assert!(plan.mapping.iter().any(|m| m.contains("16-row groups")), "{:?}", plan.mapping);
    let (out, pkg) = common::build_and_run(&src, 64, None, 7, 1);
    assert_eq!(out.compared_elements, 2 * 729 * 72);
    let (sim, pred) = (out.cycles[0], pkg.plan.predicted_cycles);
    assert!(sim.abs_diff(pred) * 100 <= sim, "simulated {sim} predicted {pred}");
    // The short matrices of the example encoder block keep column groups (more workers busy).
    let short = "name = \"kt\"\noutputs = [\"Y\"]\n".to_string()
        + &input("X", "[3, 50, 32]")
        + &op("op = \"transpose\"\ninput = \"X\"\nperm = [0, 2, 1]\noutput = \"Y\"");
    let graph = ipu_host::model::parse("m.toml", &short).unwrap();
    let plan = ipu_core::plan::plan(&graph, ipu_core::plan::PlanOptions::new(64)).unwrap();
    assert!(plan.mapping.iter().any(|m| m.contains("column groups")), "{:?}", plan.mapping);
    common::build_and_run(&short, 64, None, 7, 1);
}

/// `build --supersteps` (`plan::supersteps`): one figure per exchange superstep, each at or above
/// its floor (a tile sends and takes at most one word per cycle, so no schedule beats the most
/// words one tile moves), named by its phase; the words sent at least those any one tile takes.
#[test]
fn every_superstep_is_at_or_above_its_floor() {
    use ipu_core::plan::supersteps::exchange_figures;
    for tiles in [8, 64] {
        let g = ipu_host::model::parse("mlp.toml", &mlp_block(37, 48, 96, "f16")).unwrap();
        let p = ipu_core::plan::plan(&g, ipu_core::plan::PlanOptions::new(tiles)).unwrap();
        // Every tile has one exchange step per superstep: the k-th is superstep k.
        for t in 0..p.tiles.len() {
            let steps =
                p.tiles[t].steps.iter().filter(|s| matches!(s, ipu_core::plan::Step::Exchange(_))).count();
            assert_eq!(steps, p.horizons.len(), "{tiles} tiles: tile {t}");
        }
        let figures = exchange_figures(&p.tiles, &p.horizons);
        assert!(figures.iter().any(|f| f.phase.starts_with("redistribute")), "{figures:?}");
        for f in &figures {
            assert!(f.floor_words > 0 && f.cycles >= f.floor_words, "{tiles} tiles: {f:?}");
            assert!(f.bytes >= 4 * f.floor_words, "{f:?}");
        }
    }
}

/// A matmul planned in a row chain (alpha with f32 partial sums: no grid stage takes it) that reads
/// a model input transposed: the chain spreads rows of `a`, so the read becomes an explicit
/// transpose on the chip (`canon.rs`) instead of the chain's refusal ("transpose_a is not
/// supported in a chain"), and the result is bit-exact with the reference of the model as written.
#[test]
fn a_chain_matmul_reading_a_transposed_input_runs_bit_exact() {
    let src = [
        "name = \"ta_chain\"\noutputs = [\"P\"]\n".to_string(),
        input("X", "[24, 40]"),
        input("W", "[24, 32]"),
        op("op = \"matmul\"\na = \"X\"\nb = \"W\"\noutput = \"S\"\ntranspose_a = true\nalpha = 0.25\naccumulate = \"f32\""),
        op("op = \"softmax\"\ninput = \"S\"\noutput = \"P\""),
    ]
    .concat();
    for tiles in [8, 64] {
        let (out, pkg) = common::build_and_run(&src, tiles, None, 3, 1);
        assert_eq!(out.max_abs_error, 0.0, "{tiles} tiles: {out:?}");
        assert!(out.max_abs_error_f64 <= out.bound_f64 && out.compared_elements == 40 * 32, "{out:?}");
        let (sim, pred) = (out.cycles[0], pkg.plan.predicted_cycles);
        assert!(sim.abs_diff(pred) * 100 <= sim, "{tiles} tiles: simulated {sim} predicted {pred}");
    }
}

/// An FP8 cast of a matmul's `b` that is also a model output, right before a batched matmul whose
/// rows come from another cast: the partition starts the matmul's chain at the matmul (a matmul
/// follows the previous op only when it reads that result as its rows, `a`), so the output cast is
/// a stage of its own and `b` a stage input. The landed binary put cast and matmul in one chain and
/// refused ("a cast feeding a matmul's `b` is not also an output in a row chain").
#[test]
fn an_output_cast_of_b_before_a_batched_matmul_is_a_stage_of_its_own() {
    let cast = |x: &str, y: &str| {
        format!("[[ops]]\nop = \"cast\"\ninput = \"{x}\"\noutput = \"{y}\"\ndtype = \"f8e4m3\"\n")
    };
    let src = [
        "name = \"side_cast_output\"\noutputs = [\"Y\", \"W8\"]\n".to_string(),
        input("X", "[2, 20, 32]"),
        input("W", "[32, 24]"),
        cast("X", "X8"),
        cast("W", "W8"),
        op("op = \"matmul\"\na = \"X8\"\nb = \"W8\"\noutput = \"Y\"\naccumulate = \"f16\""),
    ]
    .concat();
    let (out, _) = common::build_and_run(&src, 8, None, 4, 1);
    assert_eq!(out.max_abs_error, 0.0, "{out:?}");
    assert_eq!(out.compared_elements, 2 * 20 * 24 + 32 * 24, "{out:?}");
}
