//! The spine end to end through the library: model text → package bytes → simulator → outputs,
//! compared with the device-precision reference and with an independent f64 reference computed
//! here from the same inputs.

use ipu_host::build::{build, BuildOptions};
use ipu_host::package::Package;
use ipu_host::session::{self, RunOptions};
use ipu_host::sim::{SimConfig, SimDevice};
use std::collections::BTreeMap;

fn model(m: u64, k: u64, n: u64, acc: &str, ta: bool, tb: bool) -> String {
    let a = if ta { [k, m] } else { [m, k] };
    let b = if tb { [n, k] } else { [k, n] };
    format!(
        "name = \"mm\"\noutputs = [\"C\"]\n[inputs.A]\ndtype = \"f16\"\nshape = [{}, {}]\n[inputs.B]\ndtype = \"f16\"\n\
         shape = [{}, {}]\n[[ops]]\nop = \"matmul\"\na = \"A\"\nb = \"B\"\noutput = \"C\"\ndtype = \"{acc}\"\n\
         accumulate = \"{acc}\"\ntranspose_a = {ta}\ntranspose_b = {tb}\n",
        a[0], a[1], b[0], b[1]
    )
}

/// Build and run; returns (device cycles, predicted cycles, largest |device − f64| / bound).
/// The bound of each element is derived here from the device's rounding points
/// (docs/target.md §4.4): the partial sums are rounded to the accumulation type once per K block
/// (16 values) and once per K-split piece, and the AMP's f32 sums add at most K + 8 f32 roundings,
/// so |C − C₆₄| ≤ γ(blocks + tk, u_acc)·Σ|a||b| + γ(K + 8, 2⁻²⁴)·Σ|a||b|.
fn run(src: &str, tiles: usize, grid: Option<[u32; 3]>) -> (u64, u64, f64) {
    let built = build("mm.toml", src, &BuildOptions { threads: 1, grid, ..BuildOptions::new(tiles) })
        .expect("builds");
    let pkg = Package::from_bytes(&built.bytes).expect("reads back");
    assert_eq!(pkg, built.package);
    let mut dev = SimDevice::new(SimConfig { tiles, threads: 2, max_cycles: 100_000_000 }).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = RunOptions {
        package_path: "mm.ipuexe".into(),
        inputs: BTreeMap::new(),
        output_dir: Some(dir.path().to_path_buf()),
        save_inputs: None,
        seed: 3,
        iterations: 2,
        profile: false,
    };
    let out = session::run(&pkg, &mut dev, &opts).expect("runs");
    assert!(out.numerical_pass, "device result differs from the device-precision reference");
    assert_eq!(out.max_abs_error, 0.0, "device-precision reference should be bit exact");
    assert_eq!(out.cycles.len(), 2);
    // The second call starts at another barrel phase (release cycle mod 6), so worker slots line
    // up differently: the same work within one barrel round.
    assert!(out.cycles[0].abs_diff(out.cycles[1]) < 6, "{:?}", out.cycles);
    // Independent check: recompute C in f64 from the generated inputs and the written output.
    let graph = ipu_host::model::parse("mm.toml", src).unwrap();
    // The output files hold the last (second) inference, whose inputs come from its own seed.
    let seed = session::iteration_seed(3, 2);
    let a = session::generated(pkg.bindings.iter().find(|b| b.name == "A").unwrap(), seed);
    let b = session::generated(pkg.bindings.iter().find(|b| b.name == "B").unwrap(), seed);
    let c = ipu_host::npy::read(&dir.path().join("C.npy")).unwrap();
    let ipu_core::graph::OpKind::MatMul { transpose_a: ta, transpose_b: tb, accumulate, .. } =
        graph.ops[0].kind
    else {
        panic!("a matmul model")
    };
    let u_acc = if accumulate == ipu_schema::DType::F16 { 2f64.powi(-11) } else { 2f64.powi(-24) };
    let tk = pkg.plan.grids[0][2] as u64;
    let rounded_once = graph.tensor(graph.ops[0].output).dtype != accumulate;
    let (m, k) = if ta { (a.shape[1], a.shape[0]) } else { (a.shape[0], a.shape[1]) };
    let n = c.shape[1];
    let mut worst = 0f64;
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut mag) = (0f64, 0f64);
            for kk in 0..k {
                let av = if ta { a.data[(kk * m + i) as usize] } else { a.data[(i * k + kk) as usize] };
                let bv = if tb { b.data[(j * k + kk) as usize] } else { b.data[(kk * n + j) as usize] };
                s += av as f64 * bv as f64;
                mag += (av as f64 * bv as f64).abs();
            }
            let mut bound = (gamma(k.div_ceil(16) + tk, u_acc) + gamma(k + 8, 2f64.powi(-24))) * mag;
            if rounded_once {
                // f16 output of an f32 accumulation: one more rounding, of the finished sum.
                bound += 2f64.powi(-11) * (s.abs() + bound) + 2f64.powi(-25);
            }
            let err = (c.data[(i * n + j) as usize] as f64 - s).abs();
            assert!(err <= bound, "C[{i},{j}]: error {err} over the derived bound {bound}");
            worst = worst.max(err / bound);
        }
    }
    // The verdict derived the same kind of bound from the reference and gated on it.
    assert!(out.max_abs_error_f64 <= out.bound_f64 && out.worst_ratio_f64 <= 1.0, "{out:?}");
    (out.cycles[0], pkg.plan.predicted_cycles, worst)
}

fn gamma(n: u64, u: f64) -> f64 {
    n as f64 * u / (1.0 - n as f64 * u)
}

#[test]
fn odd_shapes_on_37_tiles_f16() {
    let (cycles, predicted, ratio) = run(&model(45, 37, 29, "f16", false, false), 37, None);
    assert!(ratio > 0.0, "f16 partial sums round: some error is expected");
    assert!(cycles > 0 && predicted > 0);
}

#[test]
fn f32_accumulate_with_both_transposes() {
    let (_, _, ratio) = run(&model(33, 50, 20, "f32", true, true), 16, None);
    assert!(ratio <= 1.0);
}

#[test]
fn transpose_a_only_and_transpose_b_only() {
    let (_, _, e1) = run(&model(24, 40, 18, "f16", true, false), 8, None);
    let (_, _, e2) = run(&model(24, 40, 18, "f16", false, true), 8, None);
    assert!(e1 <= 1.0 && e2 <= 1.0);
}

#[test]
fn k_split_reduces_partials_over_the_exchange() {
    // K = 100 → 7 blocks over tk = 3 tiles per output block; partial sums travel over the fabric.
    let built = build(
        "mm.toml",
        &model(40, 100, 24, "f16", false, false),
        &BuildOptions { threads: 1, grid: Some([4, 2, 3]), ..BuildOptions::new(24) },
    )
    .unwrap();
    assert_eq!(built.package.run_call().phases, 3, "compute, exchange, reduce: all partials in one round");
    assert!(built.package.plan.predicted_exchange_cycles > 0);
    let (cycles, predicted, err) = run(&model(40, 100, 24, "f16", false, false), 24, Some([4, 2, 3]));
    assert!(err <= 1.0);
    let (c32, _, e32) = run(&model(40, 100, 24, "f32", false, false), 24, Some([2, 3, 4]));
    assert!(e32 <= 1.0);
    assert!(cycles > 0 && predicted > 0 && c32 > 0);
}

#[test]
fn single_tile_and_whole_chip() {
    let (_, _, e1) = run(&model(7, 16, 16, "f16", false, false), 1, None);
    let (_, _, e2) = run(&model(64, 64, 64, "f16", false, false), 1472, None);
    assert!(e1 <= 1.0 && e2 <= 1.0);
}

#[test]
fn k_split_reduces_in_rounds_when_the_partials_do_not_fit_at_once() {
    // 16 K pieces of a 256×(16 blocks) output: the root cannot hold 15 partial sums beside its
    // operands, so it takes fewer per round, in a tree (docs/kernels.md "K split").
    let src = model(512, 512, 512, "f16", false, false);
    let graph = ipu_host::model::parse("mm.toml", &src).unwrap();
    let mm = f16_matmul(&graph);
    let grid = ipu_core::plan::matmul::Grid { tm: 2, tn: 2, tk: 16 };
    let f = ipu_core::plan::matmul::fan_in(&mm, grid);
    let rounds = ipu_core::plan::matmul::reduction_rounds(16, f);
    assert!((2..15).contains(&f), "fan-in {f}");
    assert!(rounds.len() >= 2, "{rounds:?}");
    let built =
        build("mm.toml", &src, &BuildOptions { threads: 1, grid: Some([2, 2, 16]), ..BuildOptions::new(64) })
            .unwrap();
    assert_eq!(
        built.package.run_call().phases,
        1 + 2 * rounds.len() as u32,
        "compute, then exchange + add per round"
    );
    let (cycles, predicted, ratio) = run(&src, 64, Some([2, 2, 16]));
    assert!(ratio <= 1.0);
    assert!(cycles.abs_diff(predicted) * 100 <= cycles, "cost model within 1%: {cycles} vs {predicted}");
}

#[test]
fn reduction_rounds_cover_every_piece_once() {
    use ipu_core::plan::matmul::reduction_rounds;
    assert_eq!(reduction_rounds(1, 2), Vec::<Vec<(u64, Vec<u64>)>>::new());
    assert_eq!(reduction_rounds(3, 3), vec![vec![(0, vec![1, 2])]], "all at once: the sequential order");
    assert_eq!(reduction_rounds(4, 2), vec![vec![(0, vec![1]), (2, vec![3])], vec![(0, vec![2])]]);
    assert_eq!(reduction_rounds(5, 3), vec![vec![(0, vec![1, 2]), (3, vec![4])], vec![(0, vec![3])]]);
    for tk in 1..40u64 {
        for f in 2..=tk.max(2) {
            // Every piece but 0 is sent exactly once, after it has received everything it will.
            let rounds = reduction_rounds(tk, f);
            let mut sent = vec![false; tk as usize];
            for round in &rounds {
                for (recv, senders) in round {
                    assert!(!sent[*recv as usize], "tk {tk} f {f}: {recv} receives after sending");
                    for s in senders {
                        assert!(!sent[*s as usize] && *s != 0);
                        sent[*s as usize] = true;
                    }
                }
            }
            assert!(sent[1..].iter().all(|x| *x), "tk {tk} f {f}: {rounds:?}");
        }
    }
}

fn with_alpha(src: &str, alpha: f32) -> String {
    format!("{src}alpha = {alpha}\n")
}

#[test]
fn alpha_with_transposed_operands_and_a_k_split() {
    // A single matmul with alpha goes to the matmul planner: any transpose, any grid; alpha
    // scales the finished sums on each K-group root.
    for (ta, tb, tiles, grid) in
        [(true, false, 8, None), (false, true, 8, None), (true, true, 24, Some([2, 2, 3]))]
    {
        let src = with_alpha(&model(64, 96, 40, "f16", ta, tb), 0.5);
        let graph = ipu_host::model::parse("mm.toml", &src).unwrap();
        assert!(matches!(graph.ops[0].kind, ipu_core::graph::OpKind::MatMul { alpha: Some(_), .. }));
        let built = build("mm.toml", &src, &BuildOptions { threads: 1, grid, ..BuildOptions::new(tiles) })
            .unwrap_or_else(|e| panic!("ta={ta} tb={tb}: {e}"));
        let pkg = Package::from_bytes(&built.bytes).unwrap();
        let mut dev = SimDevice::new(SimConfig { tiles, threads: 2, max_cycles: 10_000_000 }).unwrap();
        let opts = RunOptions {
            package_path: "mm.ipuexe".into(),
            inputs: BTreeMap::new(),
            output_dir: None,
            save_inputs: None,
            seed: 4,
            iterations: 1,
            profile: false,
        };
        let out = session::run(&pkg, &mut dev, &opts).unwrap();
        assert!(out.numerical_pass && out.max_abs_error == 0.0, "ta={ta} tb={tb}: {out:?}");
        assert!(out.cycles[0].abs_diff(pkg.plan.predicted_cycles) * 100 <= out.cycles[0]);
    }
}

#[test]
fn a_matmul_too_large_for_one_pass_is_refused_with_what_the_smallest_mapping_needs() {
    let src = model(4096, 4096, 4096, "f16", false, false);
    let e = build("big.toml", &src, &BuildOptions { threads: 1, ..BuildOptions::new(1472) })
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("big.toml:9: op 0 (matmul): no tile mapping of this 4096×4096·4096×4096 matmul fits"),
        "{e}"
    );
    assert!(
        e.contains(
            "needs 1092832 bytes on one tile (`A` 374144 bytes, `B` 303104, `C` 165632), which has 638976"
        ),
        "{e}"
    );
}

#[test]
fn a_3072_cubed_matmul_is_split_until_it_fits() {
    // 3 × 18.9 MB of f16 operands and result: the output is split over tiles, K over 6 or more
    // tiles per output block, and the partial sums reduced in a tree that fits beside them.
    let src = model(3072, 3072, 3072, "f16", false, false);
    let opts = BuildOptions { threads: 2, search_attempts: 0, ..BuildOptions::new(1472) };
    let built = build("big.toml", &src, &opts).expect("a mapping that fits");
    let [tm, tn, tk] = built.package.plan.grids[0];
    let cycles = built.package.plan.predicted_cycles;
    let bound = 3072u64.pow(3) / (1472 * 64);
    println!("3072³ f16 on 1472 tiles: grid {tm}×{tn}×{tk}, predicted {cycles} cycles, compute bound {bound} ({:.1}%)", 100.0 * bound as f64 / cycles as f64);
    assert!(tk > 1 && (tm * tn * tk) as usize <= 1472);
    assert!(cycles > bound && cycles < 3 * bound, "{cycles} vs {bound}");
}

fn f16_out_f32_acc(m: u64, k: u64, n: u64, ta: bool, tb: bool) -> String {
    model(m, k, n, "f32", ta, tb).replacen("dtype = \"f32\"\naccumulate", "dtype = \"f16\"\naccumulate", 1)
}

#[test]
fn f16_output_with_f32_accumulation_is_rounded_once() {
    let src = f16_out_f32_acc(45, 100, 29, false, false);
    assert!(src.contains("dtype = \"f16\"\naccumulate = \"f32\""), "{src}");
    for (tiles, grid) in [(1, None), (37, None), (24, Some([2, 2, 3])), (1472, None)] {
        let (cycles, predicted, ratio) = run(&src, tiles, grid);
        assert!(ratio <= 1.0);
        assert!(cycles.abs_diff(predicted) * 100 <= cycles, "{tiles} tiles: {cycles} vs {predicted}");
    }
    let (_, _, ratio) = run(&f16_out_f32_acc(33, 50, 20, true, true), 16, None);
    assert!(ratio <= 1.0);
    // Followed by a softmax, the matmul is a stage and the softmax another (the softmax kernel
    // does not read packed f16 rows): bit-exact (it was refused before).
    let chain = format!("{src}[[ops]]\nop = \"softmax\"\ninput = \"C\"\noutput = \"P\"\ndtype = \"f16\"\n")
        .replace("outputs = [\"C\"]", "outputs = [\"P\"]");
    for tiles in [1, 8] {
        let built = build("mm.toml", &chain, &BuildOptions { threads: 1, ..BuildOptions::new(tiles) })
            .unwrap_or_else(|e| panic!("{tiles} tiles: {e}"));
        let mut dev = SimDevice::new(SimConfig { tiles, threads: 2, max_cycles: 100_000_000 }).unwrap();
        let opts = RunOptions {
            package_path: "mm.ipuexe".into(),
            inputs: BTreeMap::new(),
            output_dir: None,
            save_inputs: None,
            seed: 2,
            iterations: 1,
            profile: false,
        };
        let out = session::run(&built.package, &mut dev, &opts).expect("runs");
        assert!(out.numerical_pass && out.max_abs_error == 0.0, "{out:?}");
        assert!(out.max_abs_error_f64 <= out.bound_f64, "{out:?}");
        assert_eq!(out.compared_elements, 45 * 29);
    }
}

#[test]
fn grid_groups_start_on_the_tiles_that_hold_their_rows() {
    // 12 rows of A, held 2 per tile on tiles 20..25 (as an earlier row stage left them); a 3×2×2
    // grid: row block i (rows 4i..4i+4) gets its holders first, then the lowest free tiles.
    let src = model(12, 64, 64, "f16", false, false);
    let graph = ipu_host::model::parse("mm.toml", &src).unwrap();
    let mut mm = f16_matmul(&graph);
    let grid = ipu_core::plan::matmul::Grid { tm: 3, tn: 2, tk: 2 };
    assert_eq!(ipu_core::plan::matmul::tile_order(&mm, grid, 64), (0..12).collect::<Vec<u16>>());
    mm.a_home = (0..12).map(|r| 20 + r / 2).collect();
    let order = ipu_core::plan::matmul::tile_order(&mm, grid, 64);
    assert_eq!(order, [20, 21, 0, 1, 22, 23, 2, 3, 24, 25, 4, 5]);
    // A row without a holder (u16::MAX) and a holder past the target's tiles are skipped.
    mm.a_home[4] = u16::MAX;
    mm.a_home[5] = u16::MAX;
    mm.a_home[8] = 70;
    mm.a_home[9] = 70;
    let order = ipu_core::plan::matmul::tile_order(&mm, grid, 64);
    assert_eq!(order, [20, 21, 0, 1, 23, 2, 3, 4, 25, 5, 6, 7]);
    // The plan runs bit-exact with the order the stage planner gives it (a layernorm before the
    // matmul leaves A's rows on their own tiles): see graph_stages and encoder_block.
}

/// The matmul planner's view of a one-matmul graph, untransposed, f16 accumulation.
fn f16_matmul(graph: &ipu_core::graph::Graph) -> ipu_core::plan::matmul::MatMul {
    let ipu_core::graph::OpKind::MatMul { a, b, .. } = graph.ops[0].kind else { panic!("op 0 is a matmul") };
    ipu_core::plan::matmul::MatMul::new(
        graph,
        a,
        b,
        graph.ops[0].output,
        false,
        false,
        ipu_schema::DType::F16,
    )
}

#[test]
fn a_tail_band_takes_the_last_rows_on_the_spare_tiles() {
    // 100×64·64×64 on 10 tiles: the grid 2×4 leaves 2 tiles spare, and 4 rows moved to them (2
    // column groups of 2 blocks) shorten the main tiles' rows from 50 to 48 (docs/kernels.md
    // "Tail band"). 200×64·64×128 on 20 tiles: 2×8 and a band of 20 rows on 4 tiles.
    for (m, n, tiles, band) in
        [(100, 64, 10, "tail band rows=4 tn=2"), (200, 128, 20, "tail band rows=20 tn=4")]
    {
        for src in [
            model(m, 64, n, "f16", false, false),
            model(m, 64, n, "f32", false, true),
            f16_out_f32_acc(m, 64, n, true, false),
        ] {
            let built =
                build("mm.toml", &src, &BuildOptions { threads: 1, ..BuildOptions::new(tiles) }).unwrap();
            let mapping = format!("{m}x64x{n} on {tiles} tiles, grid {:?}", built.package.plan.grids);
            // (f32 partials have 8-column blocks, so their grids differ: checked for exactness only.)
            if src.contains("accumulate = \"f16\"") {
                assert_eq!(built.package.info.tiles_used as usize, tiles, "{mapping}");
            }
            let (cycles, predicted, ratio) = run(&src, tiles, None);
            assert!(ratio <= 1.0);
            assert!(cycles.abs_diff(predicted) * 100 <= cycles, "{mapping}: {cycles} vs {predicted}");
        }
        // The band beats the same grid without it, by the estimate the search screens with.
        let graph = ipu_host::model::parse("mm.toml", &model(m, 64, n, "f16", false, false)).unwrap();
        let mm = f16_matmul(&graph);
        let grid = ipu_core::plan::matmul::choose_grid(&mm, tiles).unwrap();
        let tail = ipu_core::plan::tail::tail_band(&mm, grid, tiles).expect("a band");
        assert_eq!(format!("tail band rows={} tn={}", tail.rows, tail.tn), band);
        assert!(tail.estimate < ipu_core::plan::matmul::estimate(&mm, grid), "{tail:?}");
        // Every row is in exactly one row group, the band's last.
        let groups = ipu_core::plan::tail::row_groups(&mm, grid, Some(tail));
        assert_eq!(groups.len() as u64, grid.tm + 1);
        assert!(groups.windows(2).all(|w| w[0].1 == w[1].0) && groups[0].0 == 0);
        assert_eq!(*groups.last().unwrap(), (m - tail.rows, m, tail.tn));
    }
}
