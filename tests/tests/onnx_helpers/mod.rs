//! Helpers of the ONNX family tests (`onnx_family.rs`, `onnx_ops.rs`): the committed fixtures,
//! building and running on the simulator, and hand-written ONNX graphs.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use crate::common;
use ipu_host::build::{build_model, BuildOptions};
use ipu_host::onnx::{import, proto, ImportOptions, Weights};
use ipu_host::package::Package;
use ipu_host::session::{run, RunOptions};
use prost::Message;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/onnx/family")
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

/// The files `NAME.KIND.X.npy` of a model, by `X`.
pub fn files(name: &str, kind: &str) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir()).expect("fixtures") {
        let p = e.expect("entry").path();
        let f = p.file_name().unwrap().to_string_lossy().to_string();
        if let Some(x) = f.strip_prefix(&format!("{name}.{kind}.")).and_then(|r| r.strip_suffix(".npy")) {
            out.insert(x.to_string(), p.clone());
        }
    }
    assert!(!out.is_empty(), "{name}: no {kind} files");
    out
}

/// How many ops of each kind the import of `name` writes.
pub fn op_counts(toml: &str) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for l in toml.lines() {
        if let Some(k) = l.strip_prefix("op = ") {
            *m.entry(k.trim_matches('"').to_string()).or_insert(0) += 1;
        }
    }
    m
}

/// Import `model`, build for 64 tiles, run once on the simulator on `inputs` (random ones when
/// empty): the verdict must pass bit-exact. The outcome, the predicted cycles and the model text.
pub fn simulate(
    model: &Path,
    inputs: BTreeMap<String, PathBuf>,
    out_dir: &Path,
) -> (ipu_host::session::RunOutcome, u64, String) {
    simulate_with(model, &ImportOptions::new(), inputs, out_dir)
}

pub fn simulate_with(
    model: &Path,
    io: &ImportOptions,
    inputs: BTreeMap<String, PathBuf>,
    out_dir: &Path,
) -> (ipu_host::session::RunOutcome, u64, String) {
    let (pkg, toml) = package_with(model, io);
    let out = run(&pkg, &mut common::device(64, 2), &run_options(inputs, out_dir)).expect("runs");
    assert!(out.numerical_pass && out.max_abs_error == 0.0, "{}: {out:?}", model.display());
    (out, pkg.plan.predicted_cycles, toml)
}

/// Import `model` and build it for 64 tiles: the package and the model text.
pub fn package(model: &Path) -> (Package, String) {
    package_with(model, &ImportOptions::new())
}

pub fn package_with(model: &Path, io: &ImportOptions) -> (Package, String) {
    let name = model.display();
    let imp = import(model, io).unwrap_or_else(|e| panic!("{name}: import: {e}"));
    let opts = BuildOptions { threads: 2, ..BuildOptions::new(64) };
    let built = build_model(model.to_str().unwrap(), &imp.toml, Some(imp.params), &opts)
        .unwrap_or_else(|e| panic!("{name}: build: {e}"));
    (Package::from_bytes(&built.bytes).expect("reads back"), imp.toml)
}

pub fn run_options(inputs: BTreeMap<String, PathBuf>, out_dir: &Path) -> RunOptions {
    RunOptions {
        package_path: "m.ipuexe".into(),
        inputs,
        output_dir: Some(out_dir.to_path_buf()),
        save_inputs: None,
        seed: 1,
        iterations: 1,
        profile: false,
    }
}

/// Build and run fixture `name` on 64 tiles (bit-exact verdict); each output's cosine against
/// onnxruntime, with the import's op counts.
pub fn build_and_run(name: &str, weights: Weights) -> (BTreeMap<String, f64>, BTreeMap<String, usize>) {
    let out_dir = tempfile::tempdir().unwrap();
    let model = dir().join(format!("{name}.onnx"));
    let mut io = ImportOptions::new();
    if weights == Weights::Fp8 {
        // Calibrated on the fixture's input: the default calibration input (uniform in [−1, 1))
        // is narrower than these images (|x| up to 4.4), and an FP8 value past the format's
        // largest is NaN.
        io.weights = weights;
        io.activation_ranges = ipu_host::onnx::calibrate::ranges(&model, &io, &files(name, "in"), 0)
            .expect("calibration")
            .expect("given inputs");
    }
    let (out, predicted, toml) = simulate_with(&model, &io, files(name, "in"), out_dir.path());
    let mut cos = BTreeMap::new();
    for (o, file) in files(name, "ref") {
        let want = ipu_host::npy::read(&file).expect("reference");
        let got = ipu_host::npy::read(&out_dir.path().join(format!("{o}.npy"))).expect("output written");
        assert_eq!(got.shape, want.shape, "{name} {o}: the output keeps the ONNX shape");
        cos.insert(o, cosine(&got.data, &want.data));
    }
    eprintln!(
        "{name} ({weights:?}) on 64 tiles: simulated {} predicted {predicted} cosine vs onnxruntime {cos:?}",
        out.cycles[0]
    );
    (cos, op_counts(&toml))
}

pub fn check(name: &str, floor: f64) -> BTreeMap<String, usize> {
    check_weights(name, Weights::F16, floor)
}

pub fn check_weights(name: &str, weights: Weights, floor: f64) -> BTreeMap<String, usize> {
    let (cos, ops) = build_and_run(name, weights);
    for (o, c) in cos {
        assert!(c >= floor, "{name} {o}: cosine {c} < {floor}");
    }
    ops
}

// Hand-written graphs: which ops each new ONNX op imports to, its values in device precision,
// and the refusals, each naming the node.

pub fn info(name: &str, dims: &[i64]) -> proto::ValueInfoProto {
    proto::ValueInfoProto {
        name: name.into(),
        r#type: Some(proto::TypeProto {
            tensor_type: Some(proto::TensorTypeProto {
                elem_type: 1,
                shape: Some(proto::TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| proto::Dimension { dim_value: Some(*d), dim_param: None })
                        .collect(),
                }),
            }),
        }),
    }
}

pub fn node(
    op: &str,
    name: &str,
    ins: &[&str],
    out: &str,
    attrs: Vec<proto::AttributeProto>,
) -> proto::NodeProto {
    proto::NodeProto {
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: vec![out.into()],
        name: name.into(),
        op_type: op.into(),
        attribute: attrs,
        ..Default::default()
    }
}

pub fn float_attr(name: &str, f: f32) -> proto::AttributeProto {
    proto::AttributeProto { name: name.into(), r#type: 1, f, ..Default::default() }
}

pub fn int_attr(name: &str, i: i64) -> proto::AttributeProto {
    proto::AttributeProto { name: name.into(), r#type: 2, i, ..Default::default() }
}

pub fn init(name: &str, dims: &[i64], v: Vec<f32>) -> proto::TensorProto {
    proto::TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 1,
        float_data: v,
        ..Default::default()
    }
}

pub fn init_i64(name: &str, dims: &[i64], v: Vec<i64>) -> proto::TensorProto {
    proto::TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 7,
        int64_data: v,
        ..Default::default()
    }
}

/// A BOOL initializer (ONNX keeps booleans in `int32_data`).
pub fn init_bool(name: &str, dims: &[i64], v: Vec<i64>) -> proto::TensorProto {
    proto::TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 9,
        int32_data: v.into_iter().map(|b| b as i32).collect(),
        ..Default::default()
    }
}

/// An opset-18 model: nodes, initializers, inputs and one output `y`.
pub fn model(
    nodes: Vec<proto::NodeProto>,
    inits: Vec<proto::TensorProto>,
    inputs: &[(&str, &[i64])],
    y: &[i64],
) -> Vec<u8> {
    proto::ModelProto {
        ir_version: 9,
        opset_import: vec![proto::OperatorSetIdProto { domain: String::new(), version: 18 }],
        producer_name: "test".into(),
        graph: Some(proto::GraphProto {
            node: nodes,
            name: "g".into(),
            initializer: inits,
            input: inputs.iter().map(|(n, d)| info(n, d)).collect(),
            output: vec![info("y", y)],
        }),
    }
    .encode_to_vec()
}

/// Import `bytes`, evaluate `y` in device precision (what the simulator matches bit for bit) on
/// the given inputs; the model text and `y`'s values.
pub fn evaluate(bytes: &[u8], inputs: &[(&str, Vec<u64>, Vec<f32>)]) -> Result<(String, Vec<f32>), String> {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("m.onnx");
    std::fs::write(&path, bytes).unwrap();
    let imp = import(&path, &ImportOptions::new())?;
    let g = ipu_host::model::parse("m", &imp.toml).map_err(|e| e.to_string())?;
    let mut vals = ipu_host::params::from_values(&g, imp.params).map_err(|e| e.to_string())?;
    for (n, shape, v) in inputs {
        let dtype = g.find(n).map(|t| g.tensor(t).dtype).ok_or(format!("no input `{n}`"))?;
        let t = ipu_host::reference::HostTensor { dtype, shape: shape.clone(), data: v.clone() };
        vals.insert(n.to_string(), t);
    }
    let ev = ipu_host::reference::evaluate(&g, &vals, &[], &[])?;
    Ok((imp.toml, ev.device["y"].data.clone()))
}

/// 64 f16 values over [−8, 8) (each exact in f16), as a [2, 32] input.
pub fn ramp() -> Vec<f32> {
    (0..64).map(|i| -8.0 + 0.25 * i as f32).collect()
}

pub fn import_bytes(bytes: &[u8]) -> Result<String, String> {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("m.onnx");
    std::fs::write(&path, bytes).unwrap();
    import(&path, &ImportOptions::new()).map(|i| i.toml)
}
