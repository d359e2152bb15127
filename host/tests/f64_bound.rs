//! The verdict's f64 bound means something (docs/reliability.md "The f64 bound", issue 38 item
//! 5): on every example and every committed ONNX test model (f16 and `--weights fp8`), built
//! for a small tile count and run on the simulator, the f64 error is within its bound (the run
//! passes), the bound is finite, and the largest bound is within 100× of the largest error.
//!
//! The cases whose bound is not yet there carry the full assertion in `#[ignore]`d tests
//! (`cargo test -p ipu-host --test f64_bound -- --ignored` shows how far each is); the tests
//! that always run check what holds today, so that a looser bound fails.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// What `run --json` reports about the f64 check.
#[derive(Debug)]
struct Check {
    error: f64,
    bound: f64,
    ratio: f64,
}

/// Build `model` for `tiles` tiles (extra build arguments `build`), run it once (extra run
/// arguments `run`) and return the f64 check of the run.
fn build_and_run(model: &Path, tiles: u32, build: &[&str], run: &[&str]) -> Check {
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("m.ipuexe");
    let out = Command::new(env!("CARGO_BIN_EXE_ipu-codegen"))
        .arg("build")
        .arg(model)
        .arg("-o")
        .arg(&pkg)
        .args(["--tiles", &tiles.to_string()])
        .args(build)
        .output()
        .unwrap();
    assert!(out.status.success(), "build {}: {}", model.display(), String::from_utf8_lossy(&out.stderr));
    let out = Command::new(env!("CARGO_BIN_EXE_ipu-codegen"))
        .arg("run")
        .arg(&pkg)
        .arg("--json")
        .args(run)
        .output()
        .unwrap();
    assert!(out.status.success(), "run {}: {}", model.display(), String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let num = |k: &str| match &v[k] {
        serde_json::Value::String(s) if s == "inf" => f64::INFINITY,
        x => x.as_f64().unwrap_or_else(|| panic!("{k} in {v}")),
    };
    let c = Check {
        error: num("max_abs_error_vs_f64"),
        bound: num("f64_error_bound"),
        ratio: num("f64_error_to_bound"),
    };
    assert!(
        c.error <= c.bound && c.ratio <= 1.0,
        "{}: the f64 error is over its bound: {c:?}",
        model.display()
    );
    assert!(c.error > 0.0, "{}: no error at all to compare: {c:?}", model.display());
    eprintln!("{}: error {:.4e} bound {:.4e} ratio {:.4e}", model.display(), c.error, c.bound, c.ratio);
    c
}

fn example(path: &str, tiles: u32) -> Check {
    build_and_run(&repo().join(path), tiles, &[], &[])
}

fn onnx(dir: &str, file: &str, fp8: bool) -> Check {
    let model = repo().join("tests/data/onnx").join(dir).join(file);
    let input = format!(
        "pixel_values={}",
        repo().join("tests/data/onnx").join(dir).join("pixel_values.npy").display()
    );
    let weights: &[&str] = if fp8 { &["--weights", "fp8"] } else { &[] };
    build_and_run(&model, 64, weights, &["--input", &input])
}

/// Finite, and within 100×: the largest bound at most 100 times the largest error.
fn tight(c: &Check) {
    assert!(c.bound.is_finite(), "the f64 bound is not finite: {c:?}");
    assert!(c.bound <= 100.0 * c.error, "the f64 bound is not within 100× of the error: {c:?}");
}

#[test]
fn matmul_example_bound_is_tight() {
    tight(&example("examples/matmul.toml", 16));
}

#[test]
fn qk_example_bound_is_tight() {
    tight(&example("examples/qk.toml", 16));
}

#[test]
fn attention_example_bound_is_tight() {
    tight(&example("examples/attention.toml", 16));
}

#[test]
fn mlp_example_bound_is_tight() {
    tight(&example("examples/mlp/mlp.toml", 16));
}

const SIGLIP: [(&str, &str); 3] =
    [("siglip_tiny", "dynamo.onnx"), ("siglip_tiny", "legacy.onnx"), ("siglip_tiny_sdpa", "dynamo.onnx")];

// The deep models hold their bound (the run passes, checked in `build_and_run`) and it is
// finite (docs/reliability.md has the table and why these are not within 100× yet).

#[test]
fn encoder_block_bound_is_finite_and_holds() {
    let c = example("examples/encoder_block/encoder_block.toml", 64);
    assert!(c.bound.is_finite(), "{c:?}");
}

#[test]
fn siglip_tiny_bounds_are_finite_and_hold() {
    for (dir, file) in SIGLIP {
        for fp8 in [false, true] {
            let c = onnx(dir, file, fp8);
            assert!(c.bound.is_finite() && c.error <= c.bound, "{dir}/{file} fp8={fp8}: {c:?}");
        }
    }
}

#[test]
#[ignore = "the f64 bound of the encoder block is not yet within 100x (docs/reliability.md)"]
fn encoder_block_bound_is_tight() {
    tight(&example("examples/encoder_block/encoder_block.toml", 64));
}

#[test]
#[ignore = "the f64 bound of the SigLIP models is not yet within 100x (docs/reliability.md)"]
fn siglip_tiny_bounds_are_tight() {
    for (dir, file) in SIGLIP {
        for fp8 in [false, true] {
            tight(&onnx(dir, file, fp8));
        }
    }
}
