//! The verdict must be impossible to get without the device computing every output element
//! (issue "A PASS that proves the program ran"). Each probe edits a valid package (re-encoded
//! with valid checksums, so only the semantic checks stand between it and a device) and runs the
//! real binary: the package is refused at load (exit 2), or the run prints `numericalTest=FAIL`
//! and exits 1.

use ipu_host::build::{build, BuildOptions};
use ipu_host::package::Package;
use ipu_schema::{Direction, SEG_EXEC};
use std::path::Path;
use std::process::Command;

const MATMUL: &str = include_str!("../../examples/matmul.toml");

const ALPHA: &str = r#"name = "scaled"
outputs = ["C"]
[inputs.A]
dtype = "f16"
shape = [40, 48]
[inputs.B]
dtype = "f16"
shape = [48, 24]
[[ops]]
op = "matmul"
a = "A"
b = "B"
output = "C"
dtype = "f16"
accumulate = "f16"
alpha = 0.125
"#;

fn package(src: &str, tiles: usize) -> Package {
    build("m.toml", src, &BuildOptions { threads: 1, grid: None, ..BuildOptions::new(tiles) })
        .unwrap()
        .package
}

/// Write `pkg` and run it; returns (exit code, stdout, stderr).
fn run(dir: &Path, pkg: &Package, extra: &[&str]) -> (i32, String, String) {
    let path = dir.join("p.ipuexe");
    std::fs::write(&path, pkg.to_bytes()).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_ipu-codegen"))
        .env("RUST_LOG", "warn")
        .arg("run")
        .arg(&path)
        .args(["--device", "sim"])
        .args(extra)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

fn must_fail_numerically(what: &str, dir: &Path, pkg: &Package) -> String {
    let (code, out, err) = run(dir, pkg, &[]);
    assert_eq!(code, 1, "{what}: exit code\n{out}\n{err}");
    assert!(out.contains("numericalTest=FAIL"), "{what}:\n{out}");
    assert!(!out.contains("numericalTest=PASS"), "{what}: no inference may pass:\n{out}");
    assert!(out.contains("firstMismatch=C["), "{what}: the first mismatch is named:\n{out}");
    assert!(err.contains("numerical test failed: first mismatch C["), "{what}:\n{err}");
    out
}

fn must_refuse(what: &str, dir: &Path, pkg: &Package, message: &str) {
    assert!(Package::from_bytes(&pkg.to_bytes()).is_err(), "{what}: the reader accepts it");
    let (code, out, err) = run(dir, pkg, &[]);
    assert_eq!(code, 2, "{what}: exit code\n{out}\n{err}");
    assert!(err.contains(message), "{what}: `{message}` not in\n{err}");
    assert!(!out.contains("PASS"), "{what}:\n{out}");
}

#[test]
fn the_unedited_package_passes() {
    let d = tempfile::tempdir().unwrap();
    let (code, out, err) = run(d.path(), &package(MATMUL, 8), &["--iterations", "2"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("referenceInference=2 numericalTest=PASS"), "{out}");
    assert!(out.contains("comparedElements=28800"), "200×72 elements × 2 inferences:\n{out}");
}

#[test]
fn removed_or_altered_output_bindings_are_refused_at_load() {
    let d = tempfile::tempdir().unwrap();
    let good = package(MATMUL, 8);
    let mut p = good.clone();
    p.bindings.retain(|b| b.direction != Direction::Output);
    must_refuse(
        "output binding removed",
        d.path(),
        &p,
        "the model has outputs [\"C\"] but the package binds []",
    );
    let mut p = good.clone();
    let out = p.bindings.iter_mut().find(|b| b.direction == Direction::Output).unwrap();
    out.slices.pop();
    must_refuse("one output slice removed", d.path(), &p, "are not covered by any slice");
    let mut p = good.clone();
    let out = p.bindings.iter_mut().find(|b| b.direction == Direction::Output).unwrap();
    let dup = out.slices[0];
    out.slices.push(dup);
    let twice = format!("slices hold {} bytes, more than the 28800", 28800 + dup.rows * dup.row_bytes);
    must_refuse("one output slice twice", d.path(), &p, &twice);
    let mut p = good.clone();
    let out = p.bindings.iter_mut().find(|b| b.direction == Direction::Output).unwrap();
    out.slices[1].tensor_offset = out.slices[0].tensor_offset;
    must_refuse("two output slices on the same bytes", d.path(), &p, "are read by more than one slice");
    let mut p = good.clone();
    let out = p.bindings.iter_mut().find(|b| b.direction == Direction::Output).unwrap();
    out.scale = 3;
    must_refuse(
        "output scale changed",
        d.path(),
        &p,
        "is f16 [200, 72] scale 3 but the model says f16 [200, 72] scale 0",
    );
    let mut p = good.clone();
    let out = p.bindings.iter_mut().find(|b| b.direction == Direction::Output).unwrap();
    out.shape = vec![100, 72];
    must_refuse("output shape changed", d.path(), &p, "binding `C` slice ");
    // (Which slice first reaches past the end depends on the mapping; the message names it.)
    must_refuse("output shape changed", d.path(), &p, " of a 14400-byte tensor");
    let mut p = good.clone();
    p.bindings.iter_mut().find(|b| b.direction == Direction::Output).unwrap().name = "D".into();
    must_refuse("output renamed", d.path(), &p, "model output `C` has no output binding");
    let mut p = good;
    p.bindings.retain(|b| b.name != "A");
    must_refuse("input binding removed", d.path(), &p, "the model has inputs");
}

#[test]
fn output_slices_shifted_by_a_row_fail() {
    // The slices still cover the tensor, but read each row from the next row's tile address.
    let d = tempfile::tempdir().unwrap();
    let mut p = package(MATMUL, 8);
    let out = p.bindings.iter_mut().find(|b| b.direction == Direction::Output).unwrap();
    for s in &mut out.slices {
        s.addr += s.tile_stride;
    }
    assert!(Package::from_bytes(&p.to_bytes()).is_ok(), "the edit keeps the package well-formed");
    must_fail_numerically("slices shifted by a row", d.path(), &p);
}

/// Replace the first `runall` (a kernel launch) in `tile`'s code with a `nop`.
const RUNALL: u32 = 0xA300_0000;
const NOP: u32 = 0x8000_0000;

fn remove_kernel_call(p: &mut Package, tile: usize) {
    let seg = std::sync::Arc::make_mut(&mut p.tiles[tile].segments)
        .iter_mut()
        .find(|s| s.flags & SEG_EXEC != 0)
        .unwrap();
    let at = seg
        .bytes
        .chunks_exact(4)
        .position(|w| u32::from_le_bytes(w.try_into().unwrap()) & 0xFF00_0000 == RUNALL)
        .expect("a kernel launch in the tile's code");
    seg.bytes[4 * at..4 * at + 4].copy_from_slice(&NOP.to_le_bytes());
}

/// Every kernel launch of the tile replaced by a `nop` (a tile may run several chains of
/// launches, one per column block).
fn remove_every_kernel_call(p: &mut Package, tile: usize) {
    for seg in
        std::sync::Arc::make_mut(&mut p.tiles[tile].segments).iter_mut().filter(|s| s.flags & SEG_EXEC != 0)
    {
        for w in seg.bytes.chunks_exact_mut(4) {
            if u32::from_le_bytes((&*w).try_into().unwrap()) & 0xFF00_0000 == RUNALL {
                w.copy_from_slice(&NOP.to_le_bytes());
            }
        }
    }
}

#[test]
fn one_kernel_call_removed_from_one_tile_fails() {
    // Its outputs keep the poison written before the call: they read as NaN.
    let d = tempfile::tempdir().unwrap();
    let mut p = package(MATMUL, 8);
    remove_kernel_call(&mut p, 0);
    let out = must_fail_numerically("kernel call removed", d.path(), &p);
    assert!(out.contains("device=NaN"), "{out}");
    assert!(out.contains("device=sim hardwareTest=PASS"), "the device itself ran without fault:\n{out}");
}

#[test]
fn every_kernel_removed_gives_an_all_nan_output_that_fails() {
    let d = tempfile::tempdir().unwrap();
    let mut p = package(MATMUL, 8);
    for t in 0..p.tiles.len() {
        if p.tiles[t]
            .segments
            .iter()
            .any(|s| s.flags & SEG_EXEC != 0 && s.bytes.chunks_exact(4).any(|w| w[3] == 0xA3))
        {
            remove_every_kernel_call(&mut p, t);
        }
    }
    let (code, out, _) = run(d.path(), &p, &["--json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["numerical_test"], "FAIL");
    assert_eq!(v["non_finite_outputs"]["C"], 200 * 72, "every element is NaN: {v}");
    assert_eq!(v["max_abs_error_vs_f64"], "inf");
}

#[test]
fn a_wrong_alpha_in_the_package_fails() {
    // The package's model says alpha = 0.25 while its code scales by 0.125.
    let d = tempfile::tempdir().unwrap();
    let mut p = package(ALPHA, 6);
    assert_eq!(run(d.path(), &p, &[]).0, 0, "the unedited package passes");
    p.info.model_source = p.info.model_source.replace("alpha = 0.125", "alpha = 0.25");
    assert!(p.info.model_source.contains("alpha = 0.25"));
    must_fail_numerically("wrong alpha", d.path(), &p);
}

#[test]
fn zero_iterations_is_bad_usage() {
    let d = tempfile::tempdir().unwrap();
    let (code, out, err) = run(d.path(), &package(MATMUL, 8), &["--iterations", "0"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(!out.contains("PASS"), "{out}");
    assert!(err.contains("--iterations"), "{err}");
}
