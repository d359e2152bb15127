//! ONNX import (docs/onnx.md), checked against references we did not write:
//! - a tiny SigLIP vision tower (56×56 image, width 96, 2 layers, 4 heads, MAP head; random
//!   weights with randomised biases and LayerNorm affine) exported from transformers by both torch
//!   exporters (`scripts/export_siglip.py`, committed in `tests/data/onnx/siglip_tiny/` with
//!   torch's FP32 outputs), built on 64 tiles in f16 and FP8 weights;
//! - small models in the forms torch writes (`scripts/onnx_models.py`: MLP with erf GeLU,
//!   decomposed LayerNorm, tanh GeLU, attention with the reshape/transpose dance and shape
//!   arithmetic on external data, patch-embedding Conv with and without a cropped border, Gemm with
//!   a constant B and with a transposed constant A, and elementwise compositions no fused kernel
//!   computes — SiLU, softplus, x^1.5, a division by a computed tensor — written step by step,
//!   and a Slice and a Gather of computed tensors),
//!   against onnxruntime;
//! - the patterns the importer fuses (`scripts/onnx_pattern_cases.py`, committed in
//!   `tests/data/onnx/patterns/` with onnxruntime's outputs), each in its exact form and with a
//!   constant or attribute changed: which ops each imports to, and its values;
//! - which ops every model imports to (kinds with the fields that decide values: gelu's
//!   `approximate`, layernorm's `eps`, matmul's `alpha`, …), since a cosine floor cannot tell
//!   the two GeLUs apart;
//! - refusals of what the importer does not take, each naming the node, op and opset.
//!
//! The imports are also evaluated by the host reference in device precision without a build (what
//! the simulator must match bit for bit), so that `scripts/mutants.sh` can run these checks in
//! seconds per mutant. Every simulated run must also pass the bit-exact device-precision verdict. Python (onnx, onnxruntime)
//! is skipped with a message when absent, unless `IPU_CODEGEN_REQUIRE_TOOLS=1` (`.ci/run`).

mod common;

use ipu_host::build::{build_model, BuildOptions};
use ipu_host::onnx::{import, proto, ImportOptions, Weights};
use ipu_host::package::Package;
use ipu_host::session::{run, RunOptions};
use prost::Message;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python_onnx() -> bool {
    common::python_with("numpy, onnx, onnxruntime")
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

/// Import, build for `tiles`, run once on the given inputs; require the bit-exact verdict and
/// return each output's cosine against `refs` (output name → reference file), plus a line.
fn build_and_compare(
    model: &Path,
    weights: Weights,
    tiles: usize,
    inputs: BTreeMap<String, PathBuf>,
    refs: &BTreeMap<String, PathBuf>,
) -> (BTreeMap<String, f64>, String) {
    let mut io = ImportOptions::new();
    io.weights = weights;
    if weights == Weights::Fp8 {
        io.activation_ranges = ipu_host::onnx::calibrate::ranges(model, &io, &BTreeMap::new(), u64::MAX)
            .expect("calibration")
            .expect("a run for any size");
    }
    let imp = import(model, &io).unwrap_or_else(|e| panic!("import: {e}"));
    let opts = BuildOptions { threads: 2, ..BuildOptions::new(tiles) };
    let built = build_model(model.to_str().unwrap(), &imp.toml, Some(imp.params), &opts)
        .unwrap_or_else(|e| panic!("{}: build: {e}", model.display()));
    let pkg = Package::from_bytes(&built.bytes).expect("reads back");
    let dir = tempfile::tempdir().unwrap();
    let ro = RunOptions {
        package_path: "onnx.ipuexe".into(),
        inputs,
        output_dir: Some(dir.path().to_path_buf()),
        save_inputs: None,
        seed: 1,
        iterations: 1,
        profile: false,
    };
    let mut dev = common::device(tiles, 2);
    let out = run(&pkg, &mut dev, &ro).expect("runs");
    assert!(out.numerical_pass && out.max_abs_error == 0.0, "{}: {out:?}", model.display());
    let mut cos = BTreeMap::new();
    for (name, file) in refs {
        let want = ipu_host::npy::read(file).expect("reference");
        let got = ipu_host::npy::read(&dir.path().join(format!("{name}.npy"))).expect("output written");
        assert_eq!(got.shape, want.shape, "{name}: the output keeps the ONNX shape");
        cos.insert(name.clone(), cosine(&got.data, &want.data));
    }
    let line = format!(
        "{} ({weights:?}) on {tiles} tiles: simulated {} predicted {} cosine {cos:?}",
        model.file_name().unwrap().to_string_lossy(),
        out.cycles[0],
        pkg.plan.predicted_cycles
    );
    (cos, line)
}

/// Import and evaluate with the host reference in device precision (what the simulator computes
/// bit for bit, so no build or run is needed): for each output of `refs`, its cosine and its
/// largest |error| over the largest |reference|.
fn reference_compare(
    model: &Path,
    weights: Weights,
    inputs: &BTreeMap<String, PathBuf>,
    refs: &BTreeMap<String, PathBuf>,
) -> BTreeMap<String, (f64, f64)> {
    let mut io = ImportOptions::new();
    io.weights = weights;
    if weights == Weights::Fp8 {
        io.activation_ranges = ipu_host::onnx::calibrate::ranges(model, &io, &BTreeMap::new(), u64::MAX)
            .expect("calibration")
            .expect("a run for any size");
    }
    let imp = import(model, &io).unwrap_or_else(|e| panic!("import: {e}"));
    let g = ipu_host::model::parse("imported", &imp.toml).expect("parses");
    let mut vals = ipu_host::params::from_values(&g, imp.params).expect("params");
    for (name, file) in inputs {
        vals.insert(name.clone(), ipu_host::npy::read(file).expect("input"));
    }
    let ev = ipu_host::reference::evaluate(&g, &vals, &[], &[]).expect("evaluates");
    refs.iter()
        .map(|(name, file)| {
            let want = ipu_host::npy::read(file).expect("reference");
            let got = &ev.device[name];
            assert_eq!(got.shape, want.shape, "{name}: the output keeps the ONNX shape");
            let top = want.data.iter().fold(0f64, |m, x| m.max(x.abs() as f64));
            let err = got.data.iter().zip(&want.data).fold(0f64, |m, (g, w)| m.max((g - w).abs() as f64));
            (name.clone(), (cosine(&got.data, &want.data), err / top))
        })
        .collect()
}

/// A model to check: its name, file, inputs and reference outputs (name → `.npy`).
type Fixture = (String, PathBuf, BTreeMap<String, PathBuf>, BTreeMap<String, PathBuf>);

#[test]
fn fp8_activation_scales_fit_twice_the_calibrated_range() {
    // Each activation cast before an FP8 matmul gets the smallest power-of-two scale that puts
    // twice the activation's largest magnitude in the calibration run inside E4M3's largest value
    // (240: the device's format has no infinities and one NaN). The
    // ranges are measured here on the f16 import, independently of `calibrate.rs`.
    let (_, model, inputs, _) = siglip_fixtures().remove(0);
    let f16 = import(&model, &ImportOptions::new()).expect("imports");
    let g = ipu_host::model::parse("f16", &f16.toml).expect("parses");
    let mut vals = ipu_host::params::from_values(&g, f16.params).expect("params");
    for (name, file) in &inputs {
        vals.insert(name.clone(), ipu_host::npy::read(file).expect("input"));
    }
    let ev = ipu_host::reference::evaluate(&g, &vals, &[], &[]).expect("evaluates");
    let mut io = ImportOptions { weights: Weights::Fp8, ..ImportOptions::new() };
    io.activation_ranges = ipu_host::onnx::calibrate::ranges(&model, &io, &inputs, 0)
        .expect("calibration")
        .expect("given inputs");
    let fp8 = import(&model, &io).expect("imports");
    let mut casts = 0;
    for op in op_fields(&fp8.toml) {
        if op["op"] != "cast" || op["dtype"] != "f8e4m3" {
            continue;
        }
        let range = ev.device[op["input"]].data.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
        let max = ipu_core::fp8::Fp8Format::E4M3.max_value() as f64;
        let want = (2.0 * range / max).log2().ceil() as i64;
        assert_eq!(op["scale"].parse::<i64>().unwrap(), want, "cast of `{}` (range {range})", op["input"]);
        // The scales reported (logged, `build -v`) are the ones written.
        assert!(fp8.scales.contains(&(op["output"].to_string(), want as i8)), "{:?}", fp8.scales);
        casts += 1;
    }
    // The patch embedding, per layer Q/K/V (one cast), O, MLP in and out, and the head's K/V, O and MLP.
    assert_eq!(casts, 13, "{}", fp8.toml);
}

/// The committed SigLIP fixtures.
fn siglip_fixtures() -> Vec<Fixture> {
    [("siglip_tiny", "dynamo.onnx"), ("siglip_tiny", "legacy.onnx"), ("siglip_tiny_sdpa", "dynamo.onnx")]
        .iter()
        .map(|(fixture, file)| {
            let dir = repo().join("tests/data/onnx").join(fixture);
            let inputs = BTreeMap::from([("pixel_values".to_string(), dir.join("pixel_values.npy"))]);
            let refs = ["last_hidden_state", "pooler_output"]
                .iter()
                .map(|o| (o.to_string(), dir.join(format!("ref.{o}.npy"))))
                .collect();
            (format!("{fixture}/{file}"), dir.join(file), inputs, refs)
        })
        .collect()
}

#[test]
fn imported_models_evaluated_in_device_precision_match_torch_and_onnxruntime() {
    // The values of each import, without a build: the simulator tests below run the same models
    // and must match this evaluation bit for bit. A floor on the largest error as well as the
    // cosine: a wrong scale keeps the cosine of a softmax or a tanh near 1.
    for (name, model, inputs, refs) in siglip_fixtures() {
        for (weights, floor, worst) in [(Weights::F16, 0.99999, 4e-3), (Weights::Fp8, 0.995, 0.1)] {
            for (output, (cos, err)) in reference_compare(&model, weights, &inputs, &refs) {
                eprintln!("{name} {weights:?} {output}: cosine {cos:.7} error {err:.2e}");
                assert!(
                    cos >= floor && err <= worst,
                    "{name} {weights:?} {output}: cosine {cos}, error {err:.3e}"
                );
            }
        }
    }
    if !python_onnx() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_small_models(dir.path());
    for (stem, model, inputs, refs) in small_models(dir.path()) {
        // Which op each pattern became (the erf GeLU of `mlp`, the tanh GeLU of `gelu`, the
        // score scale 1/√12 of `attention`, Gemm's alpha 0.5, …).
        let toml = import(&model, &ImportOptions::new()).expect("imports").toml;
        assert_eq!(op_kinds(&toml), kinds(small_model_ops(&stem)), "{stem}");
        if stem == "layernorm" {
            // The written-out LayerNorm is one op with its affine folded in: no mul/add left.
            let ops: Vec<&str> =
                toml.lines().filter(|l| l.starts_with("op = ") && !l.contains("reshape")).collect();
            assert_eq!(
                ops,
                ["op = \"cast\"", "op = \"layernorm\"", "op = \"matmul\"", "op = \"add\"", "op = \"cast\""],
                "{toml}"
            );
            assert!(toml.contains("gamma = ") && toml.contains("beta = "), "{toml}");
        }
        if stem == "patch_crop" || stem == "select" {
            // Crops and boxes are slices read where the bytes are: one matmul per projection.
            let matmuls = toml.matches("op = \"matmul\"").count();
            assert!(
                toml.contains("op = \"slice\"") && matmuls == if stem == "select" { 3 } else { 1 },
                "{toml}"
            );
        }
        if stem == "unfamiliar" {
            // Compositions no fused kernel computes are written step by step, each function an op.
            for f in ["sigmoid", "tanh", "reciprocal", "sqrt", "exp", "abs", "erf", "log", "pow"] {
                assert!(toml.contains(&format!("op = \"{f}\"")), "{f} missing:\n{toml}");
            }
        }
        for (output, (cos, err)) in reference_compare(&model, Weights::F16, &inputs, &refs) {
            eprintln!("{stem} {output}: cosine {cos:.7} error {err:.2e}");
            assert!(cos >= 0.99999 && err <= 4e-3, "{stem} {output}: cosine {cos}, error {err:.3e}");
        }
    }
}

/// Run `scripts/onnx_models.py` into `dir`.
fn write_small_models(dir: &Path) {
    let o = Command::new("python3")
        .arg(repo().join("scripts/onnx_models.py"))
        .arg(dir)
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The models `scripts/onnx_models.py` wrote to `dir`.
fn small_models(dir: &Path) -> Vec<Fixture> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let models: Vec<&PathBuf> = files.iter().filter(|p| p.extension().is_some_and(|e| e == "onnx")).collect();
    assert_eq!(models.len(), 10, "{files:?}");
    models
        .into_iter()
        .map(|model| {
            let stem = model.file_stem().unwrap().to_string_lossy().to_string();
            let pick = |kind: &str| -> BTreeMap<String, PathBuf> {
                files
                    .iter()
                    .filter_map(|p| {
                        let n = p.file_name()?.to_str()?;
                        let rest = n.strip_prefix(&format!("{stem}.{kind}."))?.strip_suffix(".npy")?;
                        Some((rest.to_string(), p.clone()))
                    })
                    .collect()
            };
            let (inputs, refs) = (pick("in"), pick("ref"));
            assert!(!inputs.is_empty() && !refs.is_empty(), "{stem}");
            (stem, model.clone(), inputs, refs)
        })
        .collect()
}

#[test]
fn tiny_siglip_from_both_torch_exporters_matches_torch_in_f16_and_fp8_weights() {
    // Eager attention from both exporters, and transformers' default SDPA attention (its √scale
    // on Q and on K folds into the score matmul's alpha) from torch's default exporter.
    let fixtures =
        [("siglip_tiny", "dynamo.onnx"), ("siglip_tiny", "legacy.onnx"), ("siglip_tiny_sdpa", "dynamo.onnx")];
    for (fixture, file) in fixtures {
        let dir = repo().join("tests/data/onnx").join(fixture);
        let inputs = BTreeMap::from([("pixel_values".to_string(), dir.join("pixel_values.npy"))]);
        let refs: BTreeMap<String, PathBuf> = ["last_hidden_state", "pooler_output"]
            .iter()
            .map(|o| (o.to_string(), dir.join(format!("ref.{o}.npy"))))
            .collect();
        for (weights, floor) in [(Weights::F16, 0.9999), (Weights::Fp8, 0.99)] {
            let (cos, line) = build_and_compare(&dir.join(file), weights, 64, inputs.clone(), &refs);
            eprintln!("{fixture}/{line}");
            for (name, c) in cos {
                assert!(c >= floor, "{fixture}/{file} {weights:?}: {name} cosine {c} < {floor}");
            }
        }
    }
}

/// The op kinds ([`op_kinds`]) each model of `scripts/onnx_models.py` imports to.
fn small_model_ops(stem: &str) -> &'static [(&'static str, usize)] {
    match stem {
        "attention" => &[
            ("add", 5),
            ("cast f16", 1),
            ("cast f32", 1),
            ("layernorm eps=0.000001 gamma beta", 1),
            ("matmul", 5),
            ("matmul alpha=0.28867513", 1),
            ("reshape", 6),
            ("softmax", 1),
            ("transpose", 5),
        ],
        "gelu" => &[
            ("add", 1),
            ("cast f16", 1),
            ("cast f32", 1),
            ("gelu approximate=tanh", 1),
            ("matmul", 1),
            ("reshape", 2),
        ],
        "gemm" => &[("add", 1), ("cast f16", 1), ("cast f32", 1), ("matmul alpha=0.5", 1)],
        "gemm_const_a" => &[("add", 1), ("cast f16", 1), ("cast f32", 1), ("matmul", 1)],
        "layernorm" => &[
            ("add", 1),
            ("cast f16", 1),
            ("cast f32", 1),
            ("layernorm eps=0.000001 gamma beta", 1),
            ("matmul", 1),
            ("reshape", 2),
        ],
        "mlp" => &[
            ("add", 2),
            ("cast f16", 1),
            ("cast f32", 1),
            ("gelu approximate=none", 1),
            ("matmul", 2),
            ("reshape", 2),
        ],
        "patch" => &[
            ("add", 2),
            ("cast f16", 1),
            ("cast f32", 1),
            ("layernorm eps=0.000001 gamma beta", 1),
            ("matmul", 1),
            ("reshape", 4),
            ("transpose", 1),
        ],
        "patch_crop" => &[
            ("add", 2),
            ("cast f16", 1),
            ("cast f32", 1),
            ("layernorm eps=0.000001 gamma beta", 1),
            ("matmul", 1),
            ("reshape", 4),
            ("slice", 1),
            ("transpose", 1),
        ],
        "select" => {
            &[("add", 3), ("cast f16", 1), ("cast f32", 2), ("matmul", 3), ("reshape", 2), ("slice", 2)]
        }
        "unfamiliar" => &[
            ("abs", 2),
            ("add", 15),
            ("cast f16", 1),
            ("cast f32", 1),
            ("erf", 1),
            ("exp", 2),
            ("log", 1),
            ("matmul", 3),
            ("mul", 9),
            ("pow exponent=1.5", 1),
            ("reciprocal", 2),
            ("reshape", 2),
            ("sigmoid", 1),
            ("sqrt", 1),
            ("tanh", 1),
        ],
        other => panic!("no expected ops for `{other}`"),
    }
}

#[test]
fn small_models_in_torch_forms_match_onnxruntime() {
    // Built and run on the simulator (bit-exact against the device-precision reference), against
    // onnxruntime; the op kinds are checked without a build in
    // `imported_models_evaluated_in_device_precision_match_torch_and_onnxruntime`.
    if !python_onnx() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_small_models(dir.path());
    for (stem, model, inputs, refs) in small_models(dir.path()) {
        let (cos, line) = build_and_compare(&model, Weights::F16, 64, inputs, &refs);
        eprintln!("{line}");
        for (name, c) in cos {
            assert!(c >= 0.9999, "{stem}: {name} cosine {c}");
        }
    }
}

/// The fields of each `[[ops]]` entry of a model text, as written (strings unquoted).
fn op_fields(toml: &str) -> Vec<BTreeMap<&str, &str>> {
    toml.split("[[ops]]")
        .skip(1)
        .map(|block| {
            block
                .lines()
                .map_while(|l| if l.starts_with('[') { None } else { Some(l) })
                .filter_map(|l| l.split_once(" = "))
                .map(|(k, v)| (k.trim(), v.trim().trim_matches('"')))
                .collect()
        })
        .collect()
}

/// Each op of an imported model as its kind and the fields that decide its values: gelu's
/// `approximate`, layernorm's `eps` and whether it has a `gamma` and a `beta`, matmul's `alpha`
/// and transposes, a power's `exponent`, a cast's `dtype` and `scale` (numbers as the f32 they
/// were in the file); counted.
fn op_kinds(toml: &str) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    for fields in op_fields(toml) {
        let mut kind = fields["op"].to_string();
        for key in ["approximate", "eps", "alpha", "transpose_a", "transpose_b", "exponent", "scale"] {
            if let Some(v) = fields.get(key) {
                let v = match key {
                    "eps" | "alpha" | "exponent" => format!("{}", v.parse::<f64>().unwrap() as f32),
                    _ => v.to_string(),
                };
                kind += &format!(" {key}={v}");
            }
        }
        if kind == "cast" {
            kind += &format!(" {}", fields["dtype"]);
        }
        for key in ["gamma", "beta"] {
            if fields.contains_key(key) {
                kind += &format!(" {key}");
            }
        }
        *kinds.entry(kind).or_insert(0) += 1;
    }
    kinds
}

fn kinds(list: &[(&str, usize)]) -> BTreeMap<String, usize> {
    list.iter().map(|(k, n)| (k.to_string(), *n)).collect()
}

/// The tiny SigLIP (both exporters, eager and SDPA attention): its 24 matmuls (the 2 score
/// matmuls carry 1/√24), the tanh GeLU of its 3 MLPs (`gelu_pytorch_tanh`), 6 LayerNorms with
/// eps 1e-6 and their affine, 3 softmaxes.
const SIGLIP_TINY_OPS: &[(&str, usize)] = &[
    ("add", 24),
    ("cast f16", 1),
    ("cast f32", 2),
    ("gelu approximate=tanh", 3),
    ("layernorm eps=0.000001 gamma beta", 6),
    ("matmul", 22),
    ("matmul alpha=0.20412415", 2),
    ("reshape", 19),
    ("softmax", 3),
    ("transpose", 17),
];

#[test]
fn committed_onnx_fixtures_import_to_the_expected_op_kinds() {
    // Which op each pattern became, not only how close the output is: the two GeLUs differ by
    // 4.7e-4 at most, which no cosine floor of a whole model sees.
    for (fixture, file) in
        [("siglip_tiny", "dynamo.onnx"), ("siglip_tiny", "legacy.onnx"), ("siglip_tiny_sdpa", "dynamo.onnx")]
    {
        let model = repo().join("tests/data/onnx").join(fixture).join(file);
        let toml = import(&model, &ImportOptions::new()).expect("imports").toml;
        assert_eq!(op_kinds(&toml), kinds(SIGLIP_TINY_OPS), "{fixture}/{file}");
    }
}

/// What a pattern case (`scripts/onnx_pattern_cases.py`) must import to.
enum Expect {
    /// These op kinds ([`op_kinds`]), with the imported model's values (the host reference's
    /// f64 evaluation, f16 params) within 0.2% of onnxruntime's largest output.
    Ops(&'static [(&'static str, usize)]),
    /// A refusal whose message holds each of these.
    Refused(&'static [&'static str]),
}

/// Largest |imported − onnxruntime| over the largest |onnxruntime|, over the outputs of a
/// committed pattern case; the imported model is evaluated by the host reference in f64 on the
/// case's input (so only the import, and its f16 params, can make it differ).
fn import_error(name: &str) -> Result<(BTreeMap<String, usize>, f64), String> {
    let dir = repo().join("tests/data/onnx/patterns");
    let imp = import(&dir.join(format!("{name}.onnx")), &ImportOptions::new())?;
    let kinds = op_kinds(&imp.toml);
    let g = ipu_host::model::parse(name, &imp.toml).map_err(|e| e.to_string())?;
    let mut vals = ipu_host::params::from_values(&g, imp.params)?;
    let mut refs = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        if let Some(input) = file.strip_prefix(&format!("{name}.in.")).and_then(|f| f.strip_suffix(".npy")) {
            vals.insert(input.to_string(), ipu_host::npy::read(&path)?);
        }
        if let Some(output) = file.strip_prefix(&format!("{name}.ref.")).and_then(|f| f.strip_suffix(".npy"))
        {
            refs.push((output.to_string(), ipu_host::npy::read(&path)?));
        }
    }
    assert!(!refs.is_empty(), "{name}: no reference outputs");
    let ev = ipu_host::reference::evaluate(&g, &vals, &[], &[])?;
    let mut worst = 0f64;
    for (output, want) in refs {
        let got = &ev.exact[&output];
        let shape = g.outputs.iter().map(|o| g.tensor(*o)).find(|t| t.name == output).map(|t| &t.shape);
        if got.len() != want.data.len() || shape != Some(&want.shape) {
            // Another shape than onnxruntime's: as wrong as it gets.
            return Ok((kinds, f64::INFINITY));
        }
        let top = want.data.iter().fold(0f64, |m, x| m.max(x.abs() as f64));
        let err = got.iter().zip(&want.data).fold(0f64, |m, (g, w)| m.max((g - *w as f64).abs()));
        worst = worst.max(err / top);
    }
    Ok((kinds, worst))
}

/// Check each case against its expectation; every case of the directory must be listed.
fn check_pattern_cases(prefix: &str, cases: &[(&str, Expect)]) {
    let dir = repo().join("tests/data/onnx/patterns");
    let mut committed: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().to_string_lossy().to_string();
            n.strip_suffix(".onnx").filter(|n| n.starts_with(prefix)).map(str::to_string)
        })
        .collect();
    committed.sort();
    let mut listed: Vec<String> = cases.iter().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    assert_eq!(listed, committed, "every committed `{prefix}*` case is checked");
    let mut wrong = Vec::new();
    for (name, expect) in cases {
        match (expect, import_error(name)) {
            (Expect::Ops(want), Ok((got, err))) => {
                eprintln!("{name}: imported as {got:?}, error {err:.2e} of the largest output");
                if got != kinds(want) {
                    wrong.push(format!("{name}: imported as {got:?}, expected {:?}", kinds(want)));
                }
                if err.is_nan() || err >= 2e-3 {
                    wrong.push(format!("{name}: the imported model is {err:.3e} away from onnxruntime"));
                }
            }
            (Expect::Refused(parts), Err(e)) => {
                for part in *parts {
                    if !e.contains(part) {
                        wrong.push(format!("{name}: `{part}` missing from the refusal: {e}"));
                    }
                }
            }
            (Expect::Ops(_), Err(e)) => wrong.push(format!("{name}: refused: {e}")),
            (Expect::Refused(_), Ok((got, err))) => wrong.push(format!(
                "{name}: imported as {got:?} ({err:.3e} away from onnxruntime), a refusal was expected"
            )),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The ops of a case that is `x` (f32 [1, 6, 16]) cast and held as [6, 16], one op, and `y` cast
/// back and viewed as [1, 6, 16].
const LN_FUSED: &[(&str, usize)] =
    &[("cast f16", 1), ("cast f32", 1), ("layernorm eps=0.00001", 1), ("reshape", 2)];

#[test]
fn layernorm_pattern_is_taken_only_for_the_square_over_the_kept_last_axis() {
    // Issue #38: `d / sqrt(mean(d⁴) + eps)` was imported as a LayerNorm (`Pow(d, c)` for any c
    // was taken as the square), passed the verdict, and differed from torch by up to 1.54. Not
    // a LayerNorm, it is lowered op by op: two `reduce_mean`s and the elementwise steps, within
    // 0.2% of onnxruntime.
    let op_by_op = |square: &'static [(&'static str, usize)]| {
        let mut v = vec![
            ("add", 1),
            ("cast f16", 1),
            ("cast f32", 1),
            ("reciprocal", 1),
            ("reduce_mean", 2),
            ("reshape", 2),
            ("sqrt", 1),
            ("sub", 1),
        ];
        v.extend_from_slice(square);
        v.sort();
        &*Vec::leak(v)
    };
    check_pattern_cases(
        "ln_",
        &[
            ("ln_pow2", Expect::Ops(LN_FUSED)),
            ("ln_mul", Expect::Ops(LN_FUSED)),
            // Exponent, axes and eps from `Constant` nodes; an integer 2 cast to float.
            ("ln_nodes", Expect::Ops(LN_FUSED)),
            ("ln_cast", Expect::Ops(LN_FUSED)),
            ("ln_identity", Expect::Ops(LN_FUSED)),
            // d⁴ = (d·d)·(d·d), then the division by the root (a mul by its reciprocal).
            ("ln_pow4", Expect::Ops(op_by_op(&[("mul", 3)]))),
            ("ln_pow_near2", Expect::Ops(op_by_op(&[("mul", 1), ("pow exponent=2.0000002", 1)]))),
            // An exponent other nodes compute is not stated in the file: not fused.
            ("ln_computed_exponent", Expect::Ops(op_by_op(&[("mul", 2)]))),
            ("ln_axis1", Expect::Refused(&["over axes [1] of rank 3", "only the last axis"])),
            ("ln_keepdims0", Expect::Refused(&["keepdims = 0"])),
            ("ln_eps_rank4", Expect::Refused(&["eps has more axes"])),
            // The affine read through Identity while the LayerNorm's value is an output too: not
            // folded into the op (the output would have been scaled by gamma and shifted).
            (
                "ln_affine_alias",
                Expect::Ops(&[
                    ("add", 1),
                    ("cast f16", 1),
                    ("cast f32", 2),
                    ("layernorm eps=0.00001", 1),
                    ("mul", 1),
                    ("reshape", 3),
                ]),
            ),
        ],
    );
}

/// A LayerNorm of `x` ([1, 4, 8]) written out as torch's legacy exporter does, squaring with
/// `Pow(d, exponent)`; the nodes of `pre` come first.
fn written_layernorm(pre: Vec<proto::NodeProto>, exponent: &str) -> Vec<u8> {
    let node = |op: &str, input: &[&str], output: &str| proto::NodeProto {
        input: input.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        name: format!("{op}_{output}"),
        op_type: op.into(),
        ..Default::default()
    };
    let mut nodes = pre;
    nodes.extend([
        node("ReduceMean", &["x", "axes"], "m"),
        node("Sub", &["x", "m"], "d"),
        node("Pow", &["d", exponent], "sq"),
        node("ReduceMean", &["sq", "axes"], "v"),
        node("Add", &["v", "eps"], "ve"),
        node("Sqrt", &["ve"], "s"),
        node("Div", &["d", "s"], "y"),
    ]);
    let init = vec![
        proto::TensorProto {
            dims: vec![1],
            data_type: proto::data_type::INT64,
            name: "axes".into(),
            int64_data: vec![-1],
            ..Default::default()
        },
        proto::TensorProto {
            data_type: proto::data_type::FLOAT,
            name: "eps".into(),
            float_data: vec![1e-5],
            ..Default::default()
        },
    ];
    let value = |name: &str| proto::ValueInfoProto::float_tensor(name, &[1, 4, 8]);
    let mut m = model_of(nodes.remove(0), init, value("x"), value("y"));
    m.graph.as_mut().unwrap().node.extend(nodes);
    m.encode_to_vec()
}

#[test]
fn a_layernorm_exponent_behind_a_loop_of_identities_is_refused_or_lowered_without_hanging() {
    let opts = ImportOptions::new();
    let identity = |i: &str, o: &str| proto::NodeProto {
        input: vec![i.into()],
        output: vec![o.into()],
        name: format!("id_{o}"),
        op_type: "Identity".into(),
        ..Default::default()
    };
    // a = Identity(b), b = Identity(a): the exponent is never stated.
    let err = import_bytes(&written_layernorm(vec![identity("b", "a"), identity("a", "b")], "a"), &opts)
        .unwrap_err();
    assert!(err.contains("not defined before it is used"), "{err}");
    // The same graph with the exponent 2 behind eight Identities is a LayerNorm; behind nine
    // the exponent is not followed (a value other nodes compute) and it is lowered op by op.
    let chain = |n: usize| {
        let mut nodes = vec![proto::NodeProto {
            output: vec!["e0".into()],
            name: "two".into(),
            op_type: "Constant".into(),
            attribute: vec![proto::AttributeProto {
                name: "value_float".into(),
                f: 2.0,
                r#type: 1,
                ..Default::default()
            }],
            ..Default::default()
        }];
        nodes.extend((0..n).map(|k| identity(&format!("e{k}"), &format!("e{}", k + 1))));
        written_layernorm(nodes, &format!("e{n}"))
    };
    let toml = import_bytes(&chain(8), &opts).expect("a LayerNorm");
    assert!(toml.contains("op = \"layernorm\""), "{toml}");
    let toml = import_bytes(&chain(9), &opts).expect("op by op");
    assert!(toml.contains("op = \"reduce_mean\"") && !toml.contains("op = \"layernorm\""), "{toml}");
}

/// A linear layer then the step-by-step composition of a GeLU with one constant changed.
const GELU_TANH_STEPS: &[(&str, usize)] =
    &[("add", 3), ("cast f16", 1), ("cast f32", 1), ("matmul", 1), ("mul", 6), ("reshape", 2), ("tanh", 1)];
const GELU_ERF_STEPS: &[(&str, usize)] =
    &[("add", 2), ("cast f16", 1), ("cast f32", 1), ("erf", 1), ("matmul", 1), ("mul", 3), ("reshape", 2)];

#[test]
fn gelu_forms_are_recognised_only_with_their_constants_on_the_whole_f16_range() {
    check_pattern_cases(
        "gelu_",
        &[
            (
                "gelu_tanh",
                Expect::Ops(&[
                    ("add", 1),
                    ("cast f16", 1),
                    ("cast f32", 1),
                    ("gelu approximate=tanh", 1),
                    ("matmul", 1),
                    ("reshape", 2),
                ]),
            ),
            (
                "gelu_erf",
                Expect::Ops(&[
                    ("add", 1),
                    ("cast f16", 1),
                    ("cast f32", 1),
                    ("gelu approximate=none", 1),
                    ("matmul", 1),
                    ("reshape", 2),
                ]),
            ),
            // √(2/π) → 0.8, 0.044715 → 0.045, the outer 0.5 → 0.49, the 1 → 1.01.
            ("gelu_tanh_sqrt_2_over_pi", Expect::Ops(GELU_TANH_STEPS)),
            ("gelu_tanh_cubic", Expect::Ops(GELU_TANH_STEPS)),
            ("gelu_tanh_half", Expect::Ops(GELU_TANH_STEPS)),
            ("gelu_tanh_one", Expect::Ops(GELU_TANH_STEPS)),
            // √2 → 1.4, 0.5 → 0.51, 1 → 0.99.
            ("gelu_erf_sqrt_2", Expect::Ops(GELU_ERF_STEPS)),
            ("gelu_erf_half", Expect::Ops(GELU_ERF_STEPS)),
            ("gelu_erf_one", Expect::Ops(GELU_ERF_STEPS)),
            // A GeLU plus a bump that is zero at every sample point of [-8, 8]: the GeLU part is
            // one op, the bump is written step by step.
            (
                "gelu_bump",
                Expect::Ops(&[
                    ("abs", 2),
                    ("add", 4),
                    ("cast f16", 1),
                    ("cast f32", 1),
                    ("gelu approximate=tanh", 1),
                    ("matmul", 1),
                    ("mul", 1),
                    ("reshape", 2),
                    ("sub", 1),
                ]),
            ),
        ],
    );
}

#[test]
fn a_scaling_folds_into_the_matmul_alpha_only_when_no_other_reader_sees_the_tensor() {
    // Attention's scale after the score matmul goes into `alpha`. Before, the fold was decided
    // by the matmul's ONNX readers: a reader through `Identity` then read the scaled tensor as
    // if unscaled (`z = h + b` became `h/8 + b`), and a second scaling of the scaled value was
    // applied to the unscaled one.
    check_pattern_cases(
        "scale_",
        &[
            (
                "scale_softmax",
                Expect::Ops(&[
                    ("cast f16", 1),
                    ("cast f32", 1),
                    ("matmul alpha=0.125", 1),
                    ("reshape", 2),
                    ("softmax", 1),
                ]),
            ),
            // (x/2)·W then /4: both in alpha.
            (
                "scale_operand_and_output",
                Expect::Ops(&[
                    ("cast f16", 1),
                    ("cast f32", 1),
                    ("matmul alpha=0.125", 1),
                    ("reshape", 2),
                    ("softmax", 1),
                ]),
            ),
            // softmax(h/8) and tanh(h/8): both read the scaled matmul.
            (
                "scale_two_readers",
                Expect::Ops(&[
                    ("cast f16", 1),
                    ("cast f32", 2),
                    ("matmul alpha=0.125", 1),
                    ("reshape", 3),
                    ("softmax", 1),
                    ("tanh", 1),
                ]),
            ),
            // softmax(h/8) and h + b with h read through Identity: no fold, a `mul`.
            (
                "scale_alias",
                Expect::Ops(&[
                    ("add", 1),
                    ("cast f16", 1),
                    ("cast f32", 2),
                    ("matmul", 1),
                    ("mul", 1),
                    ("reshape", 3),
                    ("softmax", 1),
                ]),
            ),
            // softmax(h/2) and softmax(h/4) written as softmax((h/2)/2): the first folds, the
            // second is a `mul` by 1/2 of the folded matmul.
            (
                "scale_twice",
                Expect::Ops(&[
                    ("cast f16", 1),
                    ("cast f32", 2),
                    ("matmul alpha=0.5", 1),
                    ("mul", 1),
                    ("reshape", 3),
                    ("softmax", 2),
                ]),
            ),
        ],
    );
}

#[test]
fn a_projection_is_narrowed_only_for_its_own_columns() {
    // Selecting columns of x·W (+ b) projects them alone; these are selections where that would
    // be wrong, so they stay slices of the computed tensor.
    check_pattern_cases(
        "select_",
        &[
            // A bias along the tokens of the transposed projection is not a per-column bias.
            (
                "select_transposed_bias",
                Expect::Ops(&[
                    ("add", 1),
                    ("cast f16", 1),
                    ("cast f32", 1),
                    ("matmul", 1),
                    ("reshape", 1),
                    ("slice", 1),
                    ("transpose", 1),
                ]),
            ),
            // A weight per batch (rank 3) is not a projection's matrix.
            (
                "select_batched_weight",
                Expect::Ops(&[("cast f16", 1), ("cast f32", 1), ("matmul", 1), ("slice", 1)]),
            ),
        ],
    );
}

#[test]
fn shapes_are_read_with_negative_starts_and_ends() {
    check_pattern_cases(
        "shape_",
        &[("shape_slices", Expect::Ops(&[("cast f16", 1), ("cast f32", 2), ("matmul", 1), ("reshape", 1)]))],
    );
}

#[test]
fn patch_embedding_takes_auto_pad_only_where_it_pads_nothing() {
    let patch =
        &[("add", 1), ("cast f16", 1), ("cast f32", 1), ("matmul", 1), ("reshape", 4), ("transpose", 1)];
    check_pattern_cases(
        "patch_",
        &[
            // Shape(conv) and Shape(flatten) read by the legacy exporter's shape arithmetic.
            ("patch_shapes", Expect::Ops(patch)),
            // VALID drops the border as the crop does; SAME_UPPER on whole patches pads nothing.
            (
                "patch_valid",
                Expect::Ops(&[
                    ("add", 1),
                    ("cast f16", 1),
                    ("cast f32", 1),
                    ("matmul", 1),
                    ("reshape", 4),
                    ("slice", 1),
                    ("transpose", 1),
                ]),
            ),
            ("patch_same_whole", Expect::Ops(patch)),
            // SAME_UPPER on 31 pixels pads to 3 × 3 patches: not the 2 × 2 the crop would make.
            ("patch_same_padded", Expect::Refused(&["Conv is supported as a patch embedding", "no padding"])),
        ],
    );
}

/// A one-node model written with the importer's own protobuf messages.
fn one_node(op: &str, dims: Vec<proto::Dimension>) -> Vec<u8> {
    let value = |name: &str| proto::ValueInfoProto {
        name: name.into(),
        r#type: Some(proto::TypeProto {
            tensor_type: Some(proto::TensorTypeProto {
                elem_type: 1,
                shape: Some(proto::TensorShapeProto { dim: dims.clone() }),
            }),
        }),
    };
    let node = proto::NodeProto {
        input: vec!["x".into()],
        output: vec!["y".into()],
        name: "the_node".into(),
        op_type: op.into(),
        ..Default::default()
    };
    model_of(node, vec![], value("x"), value("y")).encode_to_vec()
}

/// An opset-18 model of one node, its initializers and one input and output.
fn model_of(
    node: proto::NodeProto,
    initializer: Vec<proto::TensorProto>,
    input: proto::ValueInfoProto,
    output: proto::ValueInfoProto,
) -> proto::ModelProto {
    proto::ModelProto {
        ir_version: 9,
        opset_import: vec![proto::OperatorSetIdProto { domain: String::new(), version: 18 }],
        producer_name: "test".into(),
        graph: Some(proto::GraphProto {
            node: vec![node],
            name: "g".into(),
            initializer,
            input: vec![input],
            output: vec![output],
        }),
    }
}

fn dim(v: i64) -> proto::Dimension {
    proto::Dimension { dim_value: Some(v), dim_param: None }
}

fn import_bytes(bytes: &[u8], opts: &ImportOptions) -> Result<String, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.onnx");
    std::fs::write(&path, bytes).unwrap();
    import(&path, opts).map(|i| i.toml)
}

#[test]
fn refusals_name_the_node_the_op_and_the_opset_and_nothing_panics() {
    let opts = ImportOptions::new();
    let err = import_bytes(&one_node("Sin", vec![dim(2), dim(8)]), &opts).unwrap_err();
    for part in ["node `the_node`", "Sin", "opset 18", "supported ops", "MatMul"] {
        assert!(err.contains(part), "{err}");
    }
    // The default opset is found under either of its names, after other domains.
    let mut m = proto::ModelProto::decode(one_node("Sin", vec![dim(2), dim(8)]).as_slice()).unwrap();
    m.opset_import = vec![
        proto::OperatorSetIdProto { domain: "com.microsoft".into(), version: 1 },
        proto::OperatorSetIdProto { domain: "ai.onnx".into(), version: 17 },
    ];
    let err = import_bytes(&m.encode_to_vec(), &opts).unwrap_err();
    assert!(err.contains("Sin, opset 17"), "{err}");
    m.opset_import.remove(1);
    let err = import_bytes(&m.encode_to_vec(), &opts).unwrap_err();
    assert!(err.contains("imports no version of the default ONNX opset"), "{err}");
    // A node of the default domain under its long name is taken; of another domain, refused.
    let mut m = proto::ModelProto::decode(one_node("Identity", vec![dim(2), dim(8)]).as_slice()).unwrap();
    m.graph.as_mut().unwrap().node[0].domain = "ai.onnx".into();
    import_bytes(&m.encode_to_vec(), &opts).expect("ai.onnx is the default domain");
    m.graph.as_mut().unwrap().node[0].domain = "com.microsoft".into();
    let err = import_bytes(&m.encode_to_vec(), &opts).unwrap_err();
    assert!(err.contains("domain `com.microsoft` is not supported"), "{err}");
    // Told from a model text by the first byte.
    assert!(ipu_host::onnx::looks_like_onnx(&one_node("Identity", vec![dim(2)])));
    assert!(!ipu_host::onnx::looks_like_onnx(b"name = \"m\"\n"));
    assert!(!ipu_host::onnx::looks_like_onnx(b""));
    // A symbolic batch size: refused with the flag that fixes it; then accepted with it.
    let sym = vec![proto::Dimension { dim_value: None, dim_param: Some("batch".into()) }, dim(8)];
    let err = import_bytes(&one_node("Relu", sym.clone()), &opts).unwrap_err();
    assert!(err.contains("--input-shape x=") && err.contains("[\"batch\", \"8\"]"), "{err}");
    let mut fixed = ImportOptions::new();
    fixed.input_shapes.insert("x".into(), vec![2, 8]);
    let toml = import_bytes(&one_node("Relu", sym.clone()), &fixed).expect("the shape was taken");
    assert!(toml.contains("shape = [2, 8]") && toml.contains("op = \"max\""), "{toml}");
    // A shape of another rank, or that contradicts a fixed size, is not taken.
    for wrong in [vec![2, 8, 1], vec![2], vec![2, 9]] {
        let mut o = ImportOptions::new();
        o.input_shapes.insert("x".into(), wrong.clone());
        let err = import_bytes(&one_node("Relu", sym.clone()), &o).unwrap_err();
        assert!(err.contains("does not match the file's"), "{wrong:?}: {err}");
    }
    // A size of 0 (some exporters' way of writing an unknown size) is not fixed.
    let err = import_bytes(&one_node("Relu", vec![dim(0), dim(8)]), &opts).unwrap_err();
    assert!(err.contains("--input-shape x="), "{err}");
    // Truncated and hostile bytes: an error, never a panic.
    let good = one_node("Identity", vec![dim(2), dim(8)]);
    for cut in [1, good.len() / 2, good.len() - 1] {
        assert!(import_bytes(&good[..cut], &opts).is_err(), "cut at {cut}");
    }
    let mut rng = common::Rng(0x5eed);
    for _ in 0..200 {
        let mut b = good.clone();
        for _ in 0..4 {
            let i = rng.below(b.len());
            b[i] = rng.next() as u8;
        }
        let _ = import_bytes(&b, &opts);
    }
}

#[test]
fn odd_patch_convolutions_are_refused_without_a_panic() {
    // Conv → Reshape → Transpose with an image of `x` dims and weights of `w` dims; Shape nodes
    // read the Conv and the Reshape (so their shapes are asked for before the pattern is lowered).
    let model = |x: &[i64], w: &[i64]| {
        let node = |op: &str, input: &[&str], output: &str| proto::NodeProto {
            input: input.iter().map(|s| s.to_string()).collect(),
            output: vec![output.into()],
            name: format!("{op}_{output}"),
            op_type: op.into(),
            ..Default::default()
        };
        let ints = |name: &str, v: &[i64]| proto::TensorProto {
            dims: vec![v.len() as i64],
            data_type: proto::data_type::INT64,
            name: name.into(),
            int64_data: v.to_vec(),
            ..Default::default()
        };
        let weight = proto::TensorProto {
            dims: w.to_vec(),
            data_type: proto::data_type::FLOAT,
            name: "w".into(),
            float_data: vec![0.5; w.iter().product::<i64>() as usize],
            ..Default::default()
        };
        let mut conv = node("Conv", &["x", "w"], "c");
        conv.attribute = vec![proto::AttributeProto {
            name: "strides".into(),
            ints: w[2..].to_vec(),
            r#type: 7,
            ..Default::default()
        }];
        let mut transpose = node("Transpose", &["f"], "t");
        transpose.attribute = vec![proto::AttributeProto {
            name: "perm".into(),
            ints: vec![0, 2, 1],
            r#type: 7,
            ..Default::default()
        }];
        let nodes = vec![
            conv,
            node("Shape", &["c"], "sc"),
            node("Reshape", &["c", "target"], "f"),
            node("Shape", &["f"], "sf"),
            transpose,
        ];
        let mut m = model_of(
            nodes[0].clone(),
            vec![weight, ints("target", &[1, w[0], -1])],
            proto::ValueInfoProto::float_tensor("x", x),
            proto::ValueInfoProto::float_tensor("t", &[1, 1, w[0]]),
        );
        m.graph.as_mut().unwrap().node = nodes;
        m.encode_to_vec()
    };
    let opts = ImportOptions::new();
    for (x, w) in [
        (&[1, 3, 28][..], &[8, 3, 14][..]),
        (&[1, 3, 28, 28][..], &[8, 3, 14][..]),
        (&[1, 3, 28][..], &[8, 3, 14, 14][..]),
        (&[1, 3, 28, 28][..], &[8, 3, 0, 0][..]),
        (&[1, 3, 28, 28][..], &[8, 3, 14, 0][..]),
    ] {
        let err = import_bytes(&model(x, w), &opts).unwrap_err();
        assert!(err.contains("Conv"), "{x:?} {w:?}: {err}");
    }
    import_bytes(&model(&[1, 3, 28, 28], &[8, 3, 14, 14]), &opts).expect("a patch embedding");
}

#[test]
fn float16_inputs_and_outputs_stay_f16() {
    let value = |name: &str| proto::ValueInfoProto {
        name: name.into(),
        r#type: Some(proto::TypeProto {
            tensor_type: Some(proto::TensorTypeProto {
                elem_type: proto::data_type::FLOAT16,
                shape: Some(proto::TensorShapeProto { dim: vec![dim(2), dim(8)] }),
            }),
        }),
    };
    let node = proto::NodeProto {
        input: vec!["x".into()],
        output: vec!["y".into()],
        name: "id".into(),
        op_type: "Identity".into(),
        ..Default::default()
    };
    let toml =
        import_bytes(&model_of(node, vec![], value("x"), value("y")).encode_to_vec(), &ImportOptions::new())
            .expect("imports");
    // No cast: the output is the input viewed under the output's name, in f16.
    assert_eq!(op_kinds(&toml), kinds(&[("reshape", 1)]), "{toml}");
    assert!(toml.contains("[inputs.\"x\"]\ndtype = \"f16\""), "{toml}");
}

/// Import `bytes` and evaluate it with the host reference in f64 (f16 params) on `inputs`: the
/// values of each output.
fn evaluate_bytes(bytes: &[u8], inputs: &[(&str, Vec<u64>, Vec<f32>)]) -> BTreeMap<String, Vec<f64>> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.onnx");
    std::fs::write(&path, bytes).unwrap();
    let imp = import(&path, &ImportOptions::new()).unwrap_or_else(|e| panic!("{e}"));
    let g = ipu_host::model::parse("m", &imp.toml).expect("parses");
    let mut vals = ipu_host::params::from_values(&g, imp.params).expect("params");
    for (name, shape, data) in inputs {
        let t = ipu_host::reference::HostTensor {
            dtype: ipu_schema::DType::F32,
            shape: shape.clone(),
            data: data.clone(),
        };
        vals.insert(name.to_string(), t);
    }
    let ev = ipu_host::reference::evaluate(&g, &vals, &[], &[]).expect("evaluates");
    g.outputs.iter().map(|o| g.tensor(*o).name.clone()).map(|n| (n.clone(), ev.exact[&n].clone())).collect()
}

#[test]
fn constant_nodes_of_every_attribute_kind_are_read() {
    // y = reshape(x, value_ints) · value_float + value_floats + cast(value_int) + value (tensor).
    let constant = |out: &str, attr: proto::AttributeProto| proto::NodeProto {
        output: vec![out.into()],
        name: out.into(),
        op_type: "Constant".into(),
        attribute: vec![attr],
        ..Default::default()
    };
    let attr = |name: &str| proto::AttributeProto { name: name.into(), ..Default::default() };
    let node = |op: &str, input: &[&str], output: &str| proto::NodeProto {
        input: input.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        name: output.into(),
        op_type: op.into(),
        ..Default::default()
    };
    let mut cast = node("Cast", &["i"], "fi");
    cast.attribute = vec![proto::AttributeProto { name: "to".into(), i: 1, r#type: 2, ..Default::default() }];
    let tensor = proto::TensorProto {
        dims: vec![1],
        data_type: proto::data_type::FLOAT,
        float_data: vec![0.25],
        ..Default::default()
    };
    let nodes = vec![
        constant("s", proto::AttributeProto { ints: vec![2, 4], ..attr("value_ints") }),
        constant("f", proto::AttributeProto { f: 3.0, ..attr("value_float") }),
        constant("fs", proto::AttributeProto { floats: vec![1.0, 2.0, 3.0, 4.0], ..attr("value_floats") }),
        constant("i", proto::AttributeProto { i: 5, ..attr("value_int") }),
        constant("t", proto::AttributeProto { t: Some(tensor), ..attr("value") }),
        node("Reshape", &["x", "s"], "r"),
        node("Mul", &["r", "f"], "m"),
        node("Add", &["m", "fs"], "a"),
        cast,
        node("Add", &["a", "fi"], "b"),
        node("Add", &["b", "t"], "y"),
    ];
    let mut m = model_of(
        nodes[0].clone(),
        vec![],
        proto::ValueInfoProto::float_tensor("x", &[8]),
        proto::ValueInfoProto::float_tensor("y", &[2, 4]),
    );
    m.graph.as_mut().unwrap().node = nodes;
    let x: Vec<f32> = (0..8).map(|v| v as f32 * 0.5).collect();
    let out = evaluate_bytes(&m.encode_to_vec(), &[("x", vec![8], x.clone())]);
    let want: Vec<f64> =
        x.iter().enumerate().map(|(k, v)| 3.0 * *v as f64 + (k % 4 + 1) as f64 + 5.25).collect();
    assert_eq!(out["y"], want);
}

#[test]
fn dropout_is_taken_as_the_identity_only_in_inference_mode() {
    // Dropout(x, ratio, training_mode): random when training_mode is true.
    let model = |training: bool| {
        let scalar = |name: &str, t: i32, f: Vec<f32>, b: Vec<i32>| proto::TensorProto {
            data_type: t,
            name: name.into(),
            float_data: f,
            int32_data: b,
            ..Default::default()
        };
        let node = proto::NodeProto {
            input: vec!["x".into(), "ratio".into(), "training".into()],
            output: vec!["y".into()],
            name: "drop".into(),
            op_type: "Dropout".into(),
            ..Default::default()
        };
        let init = vec![
            scalar("ratio", proto::data_type::FLOAT, vec![0.5], vec![]),
            scalar("training", proto::data_type::BOOL, vec![], vec![training as i32]),
        ];
        let value = |name: &str| proto::ValueInfoProto::float_tensor(name, &[2, 8]);
        let mut m = model_of(node, vec![], value("x"), value("y"));
        m.graph.as_mut().unwrap().initializer = init;
        m.encode_to_vec()
    };
    let opts = ImportOptions::new();
    let toml = import_bytes(&model(false), &opts).expect("inference mode");
    assert_eq!(op_kinds(&toml), kinds(&[("cast f16", 1), ("cast f32", 1)]), "{toml}");
    let err = import_bytes(&model(true), &opts).unwrap_err();
    assert!(err.contains("node `drop`") && err.contains("training mode"), "{err}");
}

#[test]
fn protobuf_bombs_are_refused_before_anything_large_is_allocated() {
    let opts = ImportOptions::new();
    // ir_version 9, then the graph field (7, length-delimited) claiming 2^62 bytes.
    let mut bomb = vec![0x08, 0x09, 0x3a];
    let mut len = 1u64 << 62;
    while len >= 0x80 {
        bomb.push((len as u8 & 0x7f) | 0x80);
        len >>= 7;
    }
    bomb.push(len as u8);
    let err = import_bytes(&bomb, &opts).unwrap_err();
    assert!(err.contains("not a valid ONNX model"), "{err}");
    // An initializer that claims 2^40 elements with 8 bytes of data, and a folded tensor of
    // 2^40 elements (`ConstantOfShape`): refused by their sizes, not by running out of memory.
    let huge = |name: &str| proto::TensorProto {
        dims: vec![1 << 20, 1 << 20],
        data_type: proto::data_type::FLOAT,
        name: name.into(),
        raw_data: vec![0u8; 8].into(),
        ..Default::default()
    };
    let shape = proto::TensorProto {
        dims: vec![2],
        data_type: proto::data_type::INT64,
        name: "shape".into(),
        int64_data: vec![1 << 20, 1 << 20],
        ..Default::default()
    };
    let node = |op: &str, input: &str| proto::NodeProto {
        input: vec!["x".into(), input.into()],
        output: vec!["y".into()],
        name: "bomb".into(),
        op_type: op.into(),
        ..Default::default()
    };
    let model = |node: proto::NodeProto, init: proto::TensorProto| {
        let value = |name: &str| proto::ValueInfoProto::float_tensor(name, &[2, 8]);
        model_of(node, vec![init], value("x"), value("y"))
    };
    let err = import_bytes(&model(node("Add", "w"), huge("w")).encode_to_vec(), &opts).unwrap_err();
    assert!(err.contains("initializer `w`") && err.contains("too many elements"), "{err}");
    let fill = proto::NodeProto { input: vec!["shape".into()], ..node("ConstantOfShape", "") };
    let err = import_bytes(&model(fill, shape).encode_to_vec(), &opts).unwrap_err();
    assert!(
        err.contains("node `bomb` (ConstantOfShape") && err.contains("larger than the 33554432"),
        "{err}"
    );
}

#[test]
fn external_data_must_lie_inside_its_file_below_the_model() {
    let weight = |location: &str, offset: &str, length: &str| proto::TensorProto {
        dims: vec![2, 2],
        data_type: 1,
        name: "w".into(),
        external_data: vec![
            proto::StringStringEntryProto { key: "location".into(), value: location.into() },
            proto::StringStringEntryProto { key: "offset".into(), value: offset.into() },
            proto::StringStringEntryProto { key: "length".into(), value: length.into() },
        ],
        data_location: 1,
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.onnx.data"), [0u8; 20]).unwrap();
    let try_with = |t: proto::TensorProto| {
        let mut m = proto::ModelProto::decode(one_node("MatMul", vec![dim(2), dim(2)]).as_slice()).unwrap();
        let g = m.graph.as_mut().unwrap();
        g.initializer.push(t);
        g.node[0].input.push("w".into());
        let path = dir.path().join("m.onnx");
        std::fs::write(&path, m.encode_to_vec()).unwrap();
        import(&path, &ImportOptions::new()).map(|i| i.toml)
    };
    let toml = try_with(weight("m.onnx.data", "4", "16")).expect("in range");
    assert!(toml.contains("op = \"matmul\""), "{toml}");
    let err = try_with(weight("m.onnx.data", "8", "16")).unwrap_err();
    assert!(err.contains("outside the file's 20 bytes"), "{err}");
    let err = try_with(weight("../m.onnx.data", "0", "16")).unwrap_err();
    assert!(err.contains("relative path below"), "{err}");
    let err = try_with(weight("m.onnx.data", "0", "12")).unwrap_err();
    assert!(err.contains("12 bytes of data for 4 elements"), "{err}");
}
