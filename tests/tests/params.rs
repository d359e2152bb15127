//! Params (weights in the model, docs/model-format.md "Params"): read from `.npy` or
//! `.safetensors` next to the model file, converted to the param's dtype, resident in the package,
//! read back from the tile images for the reference, and refused clearly when wrong.

use half::f16;
use ipu_host::build::{build, BuildOptions};
use ipu_host::package::Package;
use ipu_host::reference::HostTensor;
use ipu_host::session::{self, RunOptions};
use ipu_host::sim::{SimConfig, SimDevice};
use ipu_schema::{DType, Direction};
use std::collections::BTreeMap;
use std::path::Path;

mod common;
use common::Rng;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng(seed);
    (0..n).map(|_| (r.next() % 100_000) as f32 / 50_000.0 - 1.0 + 1e-4).collect()
}

fn npy(dir: &Path, name: &str, dtype: DType, shape: &[u64], data: Vec<f32>) {
    let t = HostTensor { dtype, shape: shape.to_vec(), data };
    std::fs::write(dir.join(name), ipu_host::npy::to_bytes(&t).unwrap()).unwrap();
}

/// A `.safetensors` file with one F32 tensor (8-byte header length, JSON header, data).
fn safetensors(dir: &Path, name: &str, key: &str, shape: &[u64], data: &[f32]) {
    let header = format!(
        "{{\"{key}\":{{\"dtype\":\"F32\",\"shape\":{shape:?},\"data_offsets\":[0,{}]}}}}",
        4 * data.len()
    );
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(data.iter().flat_map(|v| v.to_le_bytes()));
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn run(pkg: &Package, tiles: usize) -> session::RunOutcome {
    let mut dev = SimDevice::new(SimConfig { tiles, threads: 2, max_cycles: 50_000_000 }).unwrap();
    let opts = RunOptions {
        package_path: "p.ipuexe".into(),
        inputs: BTreeMap::new(),
        output_dir: None,
        save_inputs: None,
        seed: 7,
        iterations: 2,
        profile: false,
    };
    let out = session::run(pkg, &mut dev, &opts).expect("runs");
    assert!(out.numerical_pass && out.max_abs_error == 0.0, "{out:?}");
    assert!(out.max_abs_error_f64 <= out.bound_f64);
    out
}

const XW: &str = r#"name = "xw"
outputs = ["Y"]
[inputs.X]
dtype = "f16"
shape = [33, 40]
[params.W]
dtype = "f16"
shape = [40, 24]
file = "w.npy"
[[ops]]
op = "matmul"
a = "X"
b = "W"
output = "Y"
dtype = "f16"
accumulate = "f16"
"#;

#[test]
fn an_f16_param_from_an_f32_npy_is_rounded_to_nearest_even_and_resident() {
    let d = tempfile::tempdir().unwrap();
    let w = values(40 * 24, 3);
    npy(d.path(), "w.npy", DType::F32, &[40, 24], w.clone());
    let model = d.path().join("xw.toml");
    std::fs::write(&model, XW).unwrap();
    let built =
        build(model.to_str().unwrap(), XW, &BuildOptions { threads: 1, ..BuildOptions::new(8) }).unwrap();
    let pkg = Package::from_bytes(&built.bytes).unwrap();
    let b = pkg.bindings.iter().find(|b| b.name == "W").unwrap();
    assert_eq!(b.direction, Direction::Param);
    // What the tile images hold is the RNE f16 of every file value.
    let held = session::param_values(&pkg).unwrap();
    let want: Vec<f32> = w.iter().map(|x| f16::from_f32(*x).to_f32()).collect();
    assert_eq!(held["W"].data, want);
    assert!(w.iter().zip(&want).any(|(a, b)| a != b), "the conversion rounds");
    run(&pkg, 8);
    // inspect counts the param bytes per tile: every tile of the grid holds its share of W.
    let text = ipu_host::inspect::render(&pkg, &built.bytes, false);
    let json: serde_json::Value =
        serde_json::from_str(&ipu_host::inspect::render(&pkg, &built.bytes, true)).unwrap();
    let per_tile: u64 = b.slices.iter().map(|s| s.rows as u64 * s.row_bytes as u64).sum();
    assert_eq!(json["memory_bytes"]["params"], per_tile);
    assert!(per_tile >= 40 * 24 * 2, "every byte of W at least once: {per_tile}");
    assert!(
        text.contains(&format!("(params {per_tile})")) && text.contains("most params on one tile"),
        "{text}"
    );
    // A param is not an input: `--input W=…` is refused, naming it.
    let mut dev = SimDevice::new(SimConfig { tiles: 8, threads: 1, max_cycles: 1_000_000 }).unwrap();
    let opts = RunOptions {
        package_path: "p.ipuexe".into(),
        inputs: BTreeMap::from([("W".to_string(), d.path().join("w.npy"))]),
        output_dir: None,
        save_inputs: None,
        seed: 7,
        iterations: 1,
        profile: false,
    };
    let e = session::run(&pkg, &mut dev, &opts).unwrap_err().to_string();
    assert!(e.contains("`W` is a param: its values are resident in the package"), "{e}");
    // Changing a param byte in an image changes the package's checksums: the reader refuses a
    // flipped byte (the images are sealed like everything else).
    let mut bytes = built.bytes.clone();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    assert!(Package::from_bytes(&bytes).is_err());
}

const QK: &str = r#"name = "qk"
outputs = ["S"]
[inputs.Q]
dtype = "f16"
shape = [2, 17, 72]
[params.K]
dtype = "f16"
shape = [2, 19, 72]
safetensors = "m.safetensors"
key = "layer.k"
[[ops]]
op = "cast"
input = "Q"
output = "Q8"
dtype = "f8e4m3"
[[ops]]
op = "cast"
input = "K"
output = "K8"
dtype = "f8e4m3"
[[ops]]
op = "matmul"
a = "Q8"
b = "K8"
transpose_b = true
output = "S"
dtype = "f16"
accumulate = "f16"
alpha = 0.125
"#;

#[test]
fn a_param_from_safetensors_feeds_an_fp8_chain() {
    let d = tempfile::tempdir().unwrap();
    let k = values(2 * 19 * 72, 5);
    safetensors(d.path(), "m.safetensors", "layer.k", &[2, 19, 72], &k);
    let model = d.path().join("qk.toml");
    for tiles in [4, 16] {
        let built =
            build(model.to_str().unwrap(), QK, &BuildOptions { threads: 1, ..BuildOptions::new(tiles) })
                .unwrap();
        let pkg = Package::from_bytes(&built.bytes).unwrap();
        let held = session::param_values(&pkg).unwrap();
        assert_eq!(held["K"].data, k.iter().map(|x| f16::from_f32(*x).to_f32()).collect::<Vec<_>>());
        run(&pkg, tiles);
    }
}

#[test]
fn params_are_refused_clearly() {
    let d = tempfile::tempdir().unwrap();
    let model = d.path().join("xw.toml");
    let path = model.to_str().unwrap();
    let err = |src: &str| {
        build(path, src, &BuildOptions { threads: 1, ..BuildOptions::new(4) }).unwrap_err().to_string()
    };
    let e = err(XW);
    assert!(e.contains("xw.toml:6: param `W`") && e.contains("w.npy") && e.contains("No such file"), "{e}");
    npy(d.path(), "w.npy", DType::F32, &[24, 40], values(960, 1));
    let e = err(XW);
    assert!(e.contains("holds shape [24, 40], the param is [40, 24]"), "{e}");
    let e = err(&XW.replace("file = \"w.npy\"", "file = \"w.npy\"\nsafetensors = \"m.safetensors\""));
    assert!(e.contains("give either `file"), "{e}");
    safetensors(d.path(), "m.safetensors", "other", &[40, 24], &values(960, 2));
    let e = err(&XW.replace("file = \"w.npy\"", "safetensors = \"m.safetensors\"\nkey = \"w\""));
    assert!(e.contains("no tensor `w` (it has other)"), "{e}");
    let e = err(&XW.replace("[params.W]\ndtype = \"f16\"", "[params.W]\ndtype = \"f16\"\nscale = 2"));
    assert!(e.contains("`scale` is a power of two in -32..=31 for FP8 params only"), "{e}");
    // Not a regular file, or far larger than the param: refused before reading.
    let e = err(&XW.replace("file = \"w.npy\"", "file = \".\""));
    assert!(e.contains("not a regular file"), "{e}");
    std::fs::write(d.path().join("big.npy"), vec![0u8; 40 * 24 * 4 + (1 << 16) + 1]).unwrap();
    let e = err(&XW.replace("file = \"w.npy\"", "file = \"big.npy\""));
    assert!(e.contains("more than the 69376 this param can need"), "{e}");
    let e = err(&XW.replace("outputs = [\"Y\"]", "outputs = [\"W\"]"));
    assert!(e.contains("output `W` is a model input or param"), "{e}");
}

const X8W8: &str = r#"name = "x8w8"
outputs = ["Y"]
[inputs.X]
dtype = "f16"
shape = [20, 64]
[params.W8]
dtype = "f8e4m3"
shape = [64, 32]
scale = -2
file = "w8.npy"
[[ops]]
op = "cast"
input = "X"
output = "X8"
dtype = "f8e4m3"
[[ops]]
op = "matmul"
a = "X8"
b = "W8"
output = "Y"
dtype = "f16"
accumulate = "f16"
"#;

#[test]
fn an_fp8_param_with_a_scale_is_cast_by_the_cast_rules() {
    // The f64 check caught the first version of this: the reference read FP8 sources at scale 0.
    let d = tempfile::tempdir().unwrap();
    let w = values(64 * 32, 9);
    npy(d.path(), "w8.npy", DType::F32, &[64, 32], w.clone());
    let model = d.path().join("f8.toml");
    let built =
        build(model.to_str().unwrap(), X8W8, &BuildOptions { threads: 1, ..BuildOptions::new(4) }).unwrap();
    let pkg = Package::from_bytes(&built.bytes).unwrap();
    let held = session::param_values(&pkg).unwrap();
    let want: Vec<f32> = w
        .iter()
        .map(|x| ipu_core::fp8::from_f32_scaled(*x, ipu_core::fp8::Fp8Format::E4M3, -2) as f32)
        .collect();
    assert_eq!(held["W8"].data, want);
    let out = run(&pkg, 4);
    assert!(out.max_abs_error_f64 > 0.0);
}

#[test]
fn a_transposed_param_is_placed_and_read_back_in_its_own_order() {
    // W stored [N, K] with transpose_b: the host transposes the values before placing them, and
    // reads them back untransposed for the reference.
    let d = tempfile::tempdir().unwrap();
    let w = values(24 * 40, 11);
    npy(d.path(), "w.npy", DType::F32, &[24, 40], w.clone());
    let src = XW
        .replace("shape = [40, 24]", "shape = [24, 40]")
        .replace("accumulate = \"f16\"\n", "accumulate = \"f16\"\ntranspose_b = true\n");
    assert!(src.contains("transpose_b = true"), "{src}");
    let model = d.path().join("xwt.toml");
    for tiles in [1, 8] {
        let built =
            build(model.to_str().unwrap(), &src, &BuildOptions { threads: 1, ..BuildOptions::new(tiles) })
                .unwrap();
        let pkg = Package::from_bytes(&built.bytes).unwrap();
        assert!(pkg.bindings.iter().any(|b| b.name == "W" && b.transpose && b.direction == Direction::Param));
        let held = session::param_values(&pkg).unwrap();
        assert_eq!(held["W"].shape, vec![24, 40]);
        assert_eq!(held["W"].data, w.iter().map(|x| f16::from_f32(*x).to_f32()).collect::<Vec<_>>());
        run(&pkg, tiles);
    }
}
