//! Runs of kernel launches as supervisor loops (docs/runtime.md "Launch loops"): the same
//! outputs and the same simulated and predicted cycles as straight-line launches, in less code.

use ipu_host::build::{build, BuildOptions};
use ipu_host::package::Package;
use ipu_host::session::{self, RunOptions};
use ipu_host::sim::{SimConfig, SimDevice};
use std::collections::BTreeMap;

/// Build with or without loops and run once: (package, device cycles, output bytes).
fn build_and_run(file: &str, src: &str, tiles: usize, loops: bool) -> (Package, Vec<u64>, Vec<Vec<u8>>) {
    let opts = BuildOptions { threads: 1, launch_loops: loops, ..BuildOptions::new(tiles) };
    let built = build(file, src, &opts).expect("builds");
    let pkg = Package::from_bytes(&built.bytes).expect("reads back");
    let mut dev = SimDevice::new(SimConfig { tiles, threads: 2, max_cycles: 100_000_000 }).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = RunOptions {
        package_path: "x.ipuexe".into(),
        inputs: BTreeMap::new(),
        output_dir: Some(dir.path().to_path_buf()),
        save_inputs: None,
        seed: 11,
        iterations: 2,
        profile: false,
    };
    let out = session::run(&pkg, &mut dev, &opts).expect("runs");
    assert!(out.numerical_pass && out.max_abs_error == 0.0, "{file} on {tiles} tiles: not bit exact");
    let mut files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let outputs = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    (pkg, out.cycles, outputs)
}

fn launch_code(pkg: &Package) -> u32 {
    pkg.plan.memory.iter().map(|m| m.code_launches).max().unwrap_or(0)
}

fn example(path: &str) -> (String, String) {
    let file = format!("{}/../examples/{path}", env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(&file).unwrap();
    (file, src)
}

/// Loops on and off: identical outputs, identical cycles (simulated and predicted); with loops the
/// launch code of the largest tile is never larger, and smaller where a tile runs four or more
/// equally spaced launches (`shrinks`).
#[test]
fn loops_take_the_cycles_of_straight_line_launches() {
    let cases = [
        ("matmul.toml", 1, true),
        ("qk.toml", 7, false),
        ("mlp/mlp.toml", 7, false),
        ("encoder_block/encoder_block.toml", 7, true),
        ("attention.toml", 1472, false),
    ];
    for (path, tiles, shrinks) in cases {
        let (file, src) = example(path);
        let (straight, c0, o0) = build_and_run(&file, &src, tiles, false);
        let (looped, c1, o1) = build_and_run(&file, &src, tiles, true);
        assert_eq!(c0, c1, "{path} on {tiles} tiles: simulated cycles differ");
        assert_eq!(straight.plan.predicted_cycles, looped.plan.predicted_cycles, "{path} on {tiles} tiles");
        assert_eq!(o0, o1, "{path} on {tiles} tiles: outputs differ");
        let (a, b) = (launch_code(&straight), launch_code(&looped));
        assert!(
            b < a || (!shrinks && b == a),
            "{path} on {tiles} tiles: launch code {a} B straight, {b} B looped"
        );
    }
}
