//! The command line as a user meets it: exit codes, messages that name the problem, JSON fields,
//! no package left behind by a failed build, and byte-identical packages across threads and
//! directories.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ipu-codegen"));
    c.env("RUST_LOG", "warn");
    c
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/matmul.toml")
}

fn run(c: &mut Command) -> (i32, String, String) {
    let o: Output = c.output().expect("runs");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

fn build_to(dir: &Path, threads: usize, tiles: usize) -> PathBuf {
    let out = dir.join("m.ipuexe");
    let (code, _, err) = run(bin().args(["build"]).arg(example()).arg("-o").arg(&out).args([
        "--tiles",
        &tiles.to_string(),
        "--threads",
        &threads.to_string(),
    ]));
    assert_eq!(code, 0, "{err}");
    out
}

#[test]
fn build_json_and_run_json_report_the_contract_fields() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("m.ipuexe");
    let (code, stdout, err) =
        run(bin().arg("build").arg(example()).arg("-o").arg(&out).args(["--tiles", "64", "--json"]));
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    for f in [
        "package",
        "sha256",
        "tiles_used",
        "target_tiles",
        "predicted_cycles",
        "predicted_exchange_cycles",
        "baseline_cycles",
        "search_attempts",
    ] {
        assert!(v.get(f).is_some(), "build --json lacks {f}: {v}");
    }
    assert_eq!(v["target_tiles"], 64);
    let (code, stdout, err) = run(bin()
        .arg("run")
        .arg(&out)
        .args(["--device", "sim", "--json", "--output-dir"])
        .arg(d.path().join("out")));
    assert_eq!(code, 0, "{err}");
    // With --json, stdout is exactly one JSON document; the result lines go to stderr.
    let r: serde_json::Value = serde_json::from_str(&stdout).expect("stdout is one JSON object");
    assert!(r.is_object());
    for f in [
        "device",
        "cycles",
        "predicted_cycles",
        "max_abs_error",
        "numerical_test",
        "hardware_test",
        "outputs",
        "non_finite_outputs",
        "max_abs_error_vs_f64",
        "f64_error_bound",
        "compared_elements",
        "device_seconds",
        "device_instructions",
        "device_instructions_per_second",
        "reference_seconds",
    ] {
        assert!(r.get(f).is_some(), "run --json lacks {f}: {r}");
    }
    assert_eq!(r["non_finite_outputs"]["C"], 0);
    assert!(r["compared_elements"].as_u64().unwrap() > 0);
    assert!(r["device_instructions"].as_u64().unwrap() > 0);
    let (e, b) = (r["max_abs_error_vs_f64"].as_f64().unwrap(), r["f64_error_bound"].as_f64().unwrap());
    assert!(b > 0.0 && e <= b, "f64 error {e} within its bound {b}");
    assert_eq!(r["device"], "sim");
    assert_eq!(r["numerical_test"], "PASS");
    assert!(d.path().join("out/C.npy").exists());
    assert!(err.contains("referenceInference=1 numericalTest=PASS"), "{err}");
    assert!(err.contains("tiles=64 device=sim hardwareTest=PASS"), "{err}");
}

#[test]
fn packages_are_identical_across_threads_and_directories() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = std::fs::read(build_to(d1.path(), 1, 1472)).unwrap();
    let b = std::fs::read(build_to(d2.path(), 2, 1472)).unwrap();
    assert!(a == b, "package bytes differ between --threads 1 and 2 in different directories");
}

#[test]
fn bad_packages_are_refused_with_exit_2() {
    let d = tempfile::tempdir().unwrap();
    let good = std::fs::read(build_to(d.path(), 2, 16)).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", good[..good.len() / 2].to_vec(), "file size field does not match"),
        ("corrupt", {
            let mut b = good.clone();
            let i = b.len() - 100;
            b[i] ^= 0x40;
            b
        }, "SHA-256 mismatch"),
        ("not-a-package", b"hello, this is not a package at all; it is long enough for a header, so the magic is what fails.".to_vec(), "bad magic"),
        ("empty", vec![], "smaller than the 80-byte package header"),
    ];
    for (name, bytes, needle) in cases {
        let p = d.path().join(format!("{name}.ipuexe"));
        std::fs::write(&p, bytes).unwrap();
        for cmd in ["run", "inspect"] {
            let (code, _, err) =
                run(bin().arg(cmd).arg(&p).args(if cmd == "run" { vec!["--device", "sim"] } else { vec![] }));
            assert_eq!(code, 2, "{cmd} {name}: {err}");
            assert!(err.contains(needle) && err.contains(&format!("{name}.ipuexe")), "{cmd} {name}: {err}");
        }
    }
}

#[test]
fn malformed_models_name_file_line_and_problem_and_leave_no_package() {
    let d = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(example()).unwrap();
    let cases = [
        (base.replace("b = \"B\"", "b = \"Bx\""), "field `b`: unknown tensor `Bx`"),
        (base.replace("op = \"matmul\"", "op = \"conv\""), "unknown op `conv`"),
        (base.replace("shape = [100, 72]", "shape = [99, 72]"), "shape mismatch"),
        // f16 output with f32 accumulation is supported; f32 output of f16 partial sums is not.
        (
            base.replace("dtype = \"f16\"\naccumulate = \"f16\"", "dtype = \"f32\"\naccumulate = \"f16\""),
            "unsupported dtype combination: output f32 with accumulate f16",
        ),
        (
            base.replace("dtype = \"f16\"\nshape = [200, 100]", "dtype = \"f32\"\nshape = [200, 100]"),
            "unsupported dtype combination",
        ),
        (base.replace("name = \"matmul\"", "name = \"matmul\"\nbogus = 1"), "unknown field `bogus`"),
        (
            base.replace("b = \"B\"", "b = \"B\"\ninput = \"A\""),
            "op 0 (matmul): field `input` does not apply to this op",
        ),
        ("name = [".to_string(), "m.toml:1:"),
    ];
    for (src, needle) in cases {
        let model = d.path().join("m.toml");
        std::fs::write(&model, &src).unwrap();
        let out = d.path().join("bad.ipuexe");
        let (code, _, err) = run(bin().arg("build").arg(&model).arg("-o").arg(&out));
        assert_eq!(code, 2, "{needle}: {err}");
        assert!(
            err.contains(needle) && err.contains("m.toml:"),
            "expected `{needle}` with file:line in: {err}"
        );
        assert!(!out.exists(), "a failed build left a package behind");
    }
    let leftovers: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn missing_and_mismatched_inputs_exit_2() {
    let d = tempfile::tempdir().unwrap();
    let pkg = build_to(d.path(), 2, 16);
    let (code, _, err) =
        run(bin().arg("run").arg(&pkg).args(["--device", "sim", "--input", "A=/nonexistent/a.npy"]));
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/a.npy"), "{err}");
    let (code, _, err) = run(bin().arg("run").arg(&pkg).args(["--device", "sim", "--input", "Q=x.npy"]));
    assert_eq!(code, 2, "{err}");
    // A real .npy with the wrong shape: write one through a run's output directory.
    let out = d.path().join("o");
    let (code, _, err) = run(bin().arg("run").arg(&pkg).args(["--device", "sim", "--output-dir"]).arg(&out));
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(bin()
        .arg("run")
        .arg(&pkg)
        .args(["--device", "sim", "--input"])
        .arg(format!("A={}", out.join("C.npy").display())));
    assert_eq!(code, 2);
    assert!(err.contains("input `A` must be f16 [200, 100]"), "{err}");
}

#[test]
fn inputs_from_files_round_trip() {
    let d = tempfile::tempdir().unwrap();
    let pkg = build_to(d.path(), 2, 32);
    let out = d.path().join("o");
    assert_eq!(
        run(bin().arg("run").arg(&pkg).args(["--device", "sim", "--seed", "9", "--output-dir"]).arg(&out)).0,
        0
    );
    let first = std::fs::read(out.join("C.npy")).unwrap();
    // Same seed → same generated inputs → same output bytes.
    assert_eq!(
        run(bin().arg("run").arg(&pkg).args(["--device", "sim", "--seed", "9", "--output-dir"]).arg(&out)).0,
        0
    );
    assert_eq!(std::fs::read(out.join("C.npy")).unwrap(), first);
}

#[test]
fn real_device_absent_is_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    let pkg = build_to(d.path(), 2, 8);
    let (code, _, err) = run(bin().arg("run").arg(&pkg).args(["--device", "/dev/ipu0"]));
    assert_eq!(code, 2);
    assert!(err.contains("cannot open IPU device /dev/ipu0"), "{err}");
}

#[test]
fn asm_and_disasm_round_trip() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("p.s");
    std::fs::write(&src, "main:\n  setzi $m1, 10\n  { nop ; fnop }\n").unwrap();
    let (code, _, err) = run(bin().arg("asm").arg(&src).arg("-o").arg(d.path().join("x.bin")));
    assert_eq!(code, 2);
    assert!(err.contains("line 3: bundle at 0x4c004 is not 8-byte aligned"), "{err}");
    std::fs::write(
        &src,
        "main:\n  setzi $m1, 10\n  nop\n  { ld64pi $a0, $m1, 8 ; f16v4add $a2, $a0, $a0 }\n  sync 15\n",
    )
    .unwrap();
    let bin_path = d.path().join("p.bin");
    let (code, _, err) = run(bin().arg("asm").arg(&src).arg("-o").arg(&bin_path));
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = run(bin().arg("disasm").arg(&bin_path));
    assert_eq!(code, 0);
    assert!(out.contains("setzi $m1, 10"), "{out}");
    assert!(out.contains("{ ld64pi $a0, $m1, 8 ; f16v4add $a2, $a0, $a0 }"), "{out}");
    assert!(out.contains("sync 15"), "{out}");
}

#[test]
fn resource_limits_are_refused_with_names() {
    let d = tempfile::tempdir().unwrap();
    let model = d.path().join("huge.toml");
    std::fs::write(
        &model,
        "name = \"huge\"\noutputs = [\"C\"]\n[inputs.Big]\ndtype = \"f16\"\nshape = [4096, 4096]\n[inputs.W]\ndtype = \"f16\"\n\
         shape = [4096, 64]\n[[ops]]\nop = \"matmul\"\na = \"Big\"\nb = \"W\"\noutput = \"C\"\ndtype = \"f16\"\naccumulate = \"f16\"\n",
    )
    .unwrap();
    let out = d.path().join("huge.ipuexe");
    let (code, _, err) = run(bin().arg("build").arg(&model).arg("-o").arg(&out).args(["--tiles", "2"]));
    assert_eq!(code, 2);
    assert!(
        err.contains("huge.toml:9: op 0 (matmul): no tile mapping of this 4096×4096·4096×64 matmul fits")
            && err.contains("(`Big` 16777216 bytes,"),
        "{err}"
    );
    assert!(!out.exists());
    // A run that cannot finish within its cycle budget stops with a clear message (exit 1).
    let pkg = build_to(d.path(), 2, 16);
    let (code, _, err) = run(bin().arg("run").arg(&pkg).args(["--device", "sim", "--max-cycles", "500"]));
    assert_eq!(code, 1);
    assert!(err.contains("cycle budget of 500 cycles exceeded"), "{err}");
}

/// An ONNX model is told by its content (here under a name without `.onnx`), keeps its input and
/// output names, reports its params by dtype, and one too large for the tiles says how much of
/// their memory its f16 weights take and to try FP8.
#[test]
fn onnx_models_are_told_by_content_and_keep_their_names() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/onnx/siglip_tiny");
    let d = tempfile::tempdir().unwrap();
    // The external data keeps the name the model gives it.
    std::fs::copy(fixture.join("dynamo.onnx.data"), d.path().join("dynamo.onnx.data")).unwrap();
    let model = d.path().join("vision-tower.bin");
    std::fs::copy(fixture.join("dynamo.onnx"), &model).unwrap();
    let pkg = d.path().join("s.ipuexe");
    let (code, out, err) =
        run(bin().arg("build").arg(&model).arg("-o").arg(&pkg).args(["--tiles", "64", "--json"]));
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert!(j["param_bytes"]["f16"].as_u64().unwrap() > 500_000, "{j}");
    // The imported model as written by --emit-model (into a directory made for it) builds the
    // same package byte for byte.
    let emitted = d.path().join("emitted/sub/model.toml");
    let pkg2 = d.path().join("s2.ipuexe");
    let (code, _, err) = run(bin()
        .arg("build")
        .arg(&model)
        .arg("-o")
        .arg(&pkg2)
        .args(["--tiles", "64"])
        .arg("--emit-model")
        .arg(&emitted));
    assert_eq!(code, 0, "{err}");
    let (code, out2, err) =
        run(bin().arg("build").arg(&emitted).arg("-o").arg(&pkg2).args(["--tiles", "64", "--json"]));
    assert_eq!(code, 0, "{err}");
    let j2: serde_json::Value = serde_json::from_str(out2.trim()).expect("one JSON object");
    assert_eq!(j["sha256"], j2["sha256"], "the emitted model is the imported one");
    let outdir = d.path().join("out");
    let (code, _, err) = run(bin()
        .arg("run")
        .arg(&pkg)
        .arg("--input")
        .arg(format!("pixel_values={}", fixture.join("pixel_values.npy").display()))
        .arg("--output-dir")
        .arg(&outdir));
    assert_eq!(code, 0, "{err}");
    for name in ["last_hidden_state", "pooler_output"] {
        assert!(outdir.join(format!("{name}.npy")).is_file(), "{name}");
    }
    // One matmul whose f16 weights (1 MiB) cannot fit two tiles.
    use ipu_host::onnx::proto::*;
    use prost::Message;
    let value = ValueInfoProto::float_tensor;
    let w = TensorProto {
        dims: vec![512, 1024],
        data_type: 1,
        float_data: vec![0.01; 512 * 1024],
        name: "w".into(),
        ..Default::default()
    };
    let node = NodeProto {
        input: vec!["x".into(), "w".into()],
        output: vec!["y".into()],
        name: "proj".into(),
        op_type: "MatMul".into(),
        ..Default::default()
    };
    let big = ModelProto {
        ir_version: 9,
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 18 }],
        producer_name: "test".into(),
        graph: Some(GraphProto {
            node: vec![node],
            name: "big".into(),
            initializer: vec![w],
            input: vec![value("x", &[16, 512])],
            output: vec![value("y", &[16, 1024])],
        }),
    };
    let big_path = d.path().join("big.onnx");
    std::fs::write(&big_path, big.encode_to_vec()).unwrap();
    let (code, _, err) = run(bin().arg("build").arg(&big_path).arg("-o").arg(&pkg).args(["--tiles", "2"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("tile memory of 2 tiles: try --weights fp8"), "{err}");
    assert!(err.contains("[imported model"), "{err}");
    let garbage = d.path().join("garbage.onnx");
    std::fs::write(&garbage, b"not a model\x08").unwrap();
    let (code, _, err) = run(bin().arg("build").arg(&garbage).arg("-o").arg(&pkg));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a valid ONNX model"), "{err}");
    let (code, _, err) =
        run(bin().arg("build").arg(example()).arg("-o").arg(&pkg).args(["--weights", "fp8"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("apply to ONNX models"), "{err}");
}
