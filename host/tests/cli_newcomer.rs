//! What a new user ran into (issue "What a new user ran into"): each item as the user met it,
//! through the real binary.

use ipu_host::reference::HostTensor;
use ipu_schema::DType;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ipu-codegen"));
    c.env("RUST_LOG", "warn");
    c
}

fn run(c: &mut Command) -> (i32, String, String) {
    let o = c.output().expect("runs");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/{name}.toml"))
}

fn build(dir: &Path, model: &Path, tiles: usize) -> PathBuf {
    let out = dir.join("m.ipuexe");
    let (code, _, err) =
        run(bin().arg("build").arg(model).arg("-o").arg(&out).args(["--tiles", &tiles.to_string()]));
    assert_eq!(code, 0, "{err}");
    out
}

fn write_npy(path: &Path, dtype: DType, shape: &[u64], data: Vec<f32>) {
    let t = HostTensor { dtype, shape: shape.to_vec(), data };
    std::fs::write(path, ipu_host::npy::to_bytes(&t).unwrap()).unwrap();
}

/// Item 2: a closed stdout (`| head -1`) is the end of the output, never a panic; the outputs
/// are written first.
#[test]
fn a_closed_stdout_is_not_a_panic_and_outputs_are_written() {
    let d = tempfile::tempdir().unwrap();
    let pkg = build(d.path(), &example("matmul"), 8);
    let out_dir = d.path().join("o");
    let cases: Vec<Vec<std::ffi::OsString>> = vec![
        vec!["run".into(), pkg.clone().into(), "--output-dir".into(), out_dir.clone().into()],
        vec!["run".into(), pkg.clone().into(), "--json".into()],
        vec!["inspect".into(), pkg.clone().into()],
        vec![
            "build".into(),
            example("matmul").into(),
            "-o".into(),
            d.path().join("b.ipuexe").into(),
            "--tiles".into(),
            "4".into(),
        ],
        vec!["--help".into()],
    ];
    for args in cases {
        let mut child = bin().args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take()); // the reader is gone before anything is written
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{args:?}: {err}");
    }
    assert!(out_dir.join("C.npy").exists(), "outputs are written before anything is printed");
}

/// Item 3: with --json, stdout is exactly one JSON object, also when the run fails.
#[test]
fn json_stdout_is_one_document() {
    let d = tempfile::tempdir().unwrap();
    let pkg = build(d.path(), &example("matmul"), 8);
    let (code, out, err) = run(bin().arg("run").arg(&pkg).args(["--json", "--iterations", "2"]));
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON document");
    assert_eq!(v["iterations"], 2);
    assert!(err.contains("referenceInference=2 numericalTest=PASS"), "{err}");
    let (_, out, _) = run(bin().arg("inspect").arg(&pkg).arg("--json"));
    serde_json::from_str::<serde_json::Value>(&out).expect("inspect --json is one document");
}

const SMALL_MATMUL: &str = r#"name = "overflow"
outputs = ["C"]
[inputs.A]
dtype = "f16"
shape = [2, 16]
[inputs.B]
dtype = "f16"
shape = [16, 16]
[[ops]]
op = "matmul"
a = "A"
b = "B"
output = "C"
dtype = "f16"
accumulate = "f16"
"#;

/// Item 4: f16 overflow (60000·2) is reported with the tensor, element, device and reference
/// values, and counted as non-finite; a NaN where f64 is finite is never "0 error".
#[test]
fn overflow_names_the_first_mismatching_element() {
    let d = tempfile::tempdir().unwrap();
    let model = d.path().join("ov.toml");
    std::fs::write(&model, SMALL_MATMUL).unwrap();
    let pkg = build(d.path(), &model, 2);
    let mut a = vec![0.0f32; 32];
    a[16] = 60000.0; // row 1, k 0
    let mut b = vec![0.0f32; 256];
    b[3] = 2.0; // k 0, column 3
    write_npy(&d.path().join("a.npy"), DType::F16, &[2, 16], a);
    write_npy(&d.path().join("b.npy"), DType::F16, &[16, 16], b);
    let inputs = |c: &mut Command| {
        c.arg("--input").arg(format!("A={}", d.path().join("a.npy").display()));
        c.arg("--input").arg(format!("B={}", d.path().join("b.npy").display()));
    };
    let mut c = bin();
    c.arg("run").arg(&pkg);
    inputs(&mut c);
    let (code, out, err) = run(&mut c);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("referenceInference=1 numericalTest=FAIL"), "{out}");
    assert!(out.contains("nonFiniteOutputs=1"), "{out}");
    assert!(
        out.contains("firstMismatch=C[1,3] inference=1 check=\"f64\" device=inf reference=120000"),
        "{out}"
    );
    assert!(err.contains("first mismatch C[1,3]"), "{err}");
    let mut c = bin();
    c.arg("run").arg(&pkg).arg("--json");
    inputs(&mut c);
    let (code, out, _) = run(&mut c);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["non_finite_outputs"]["C"], 1);
    assert_eq!(v["max_abs_error_vs_f64"], "inf", "never null, never 0: {v}");
    assert_eq!(v["first_mismatch"]["index"], serde_json::json!([1, 3]));
    assert_eq!(v["first_mismatch"]["device"], "inf");
    assert_eq!(v["first_mismatch"]["reference"], 120000.0);
}

/// Item 5: demo --profile builds with a profile plan.
#[test]
fn demo_writes_a_profile_when_asked() {
    let d = tempfile::tempdir().unwrap();
    let prof = d.path().join("a.capnp");
    let (code, out, err) =
        run(bin().arg("demo").arg("--dir").arg(d.path()).arg("--profile").arg(&prof).current_dir(d.path()));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("numericalTest=PASS") && out.contains("profile="), "{out}");
    assert!(std::fs::metadata(&prof).unwrap().len() > 0);
}

/// Item 9: `--top` with a phase table is refused; a trace JSON is named for what it is.
#[test]
fn profile_refusals_say_what_is_wrong() {
    let d = tempfile::tempdir().unwrap();
    let trace = d.path().join("t.json");
    std::fs::write(&trace, "{\"traceEvents\": []}").unwrap();
    let (code, _, err) = run(bin().arg("profile").arg(&trace));
    assert_eq!(code, 2);
    assert!(err.contains("not a profile file (it looks like JSON"), "{err}");
    let (code, _, err) = run(bin().arg("profile").arg(&trace).args(["--group-by", "phase", "--top", "3"]));
    assert_eq!(code, 2);
    assert!(err.contains("--top applies to --group-by tile or kernel"), "{err}");
}

/// Item 11: duplicate inputs are refused; --save-inputs writes the inputs a run used, and running
/// again from them gives the same outputs.
#[test]
fn duplicate_inputs_refused_and_generated_inputs_saved() {
    let d = tempfile::tempdir().unwrap();
    let pkg = build(d.path(), &example("matmul"), 8);
    let (code, _, err) = run(bin().arg("run").arg(&pkg).args(["--input", "A=x.npy", "--input", "A=y.npy"]));
    assert_eq!(code, 2);
    assert!(err.contains("--input A is given twice (x.npy and y.npy)"), "{err}");
    let saved = d.path().join("in");
    let (code, _, err) = run(bin()
        .arg("run")
        .arg(&pkg)
        .args(["--seed", "9", "--save-inputs"])
        .arg(&saved)
        .arg("--output-dir")
        .arg(d.path().join("o1")));
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(bin()
        .arg("run")
        .arg(&pkg)
        .arg("--input")
        .arg(format!("A={}", saved.join("A.npy").display()))
        .arg("--input")
        .arg(format!("B={}", saved.join("B.npy").display()))
        .arg("--output-dir")
        .arg(d.path().join("o2")));
    assert_eq!(code, 0, "{err}");
    let c1 = std::fs::read(d.path().join("o1/C.npy")).unwrap();
    let c2 = std::fs::read(d.path().join("o2/C.npy")).unwrap();
    assert_eq!(c1, c2, "the saved inputs reproduce the run");
}

/// Item 12: output files get the mode a plain create would give (0644 under umask 022).
#[test]
fn output_files_follow_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let bin_path = env!("CARGO_BIN_EXE_ipu-codegen");
    let script = format!(
        "umask 022 && {bin_path} build {} -o {}/m.ipuexe --tiles 4 && {bin_path} run {}/m.ipuexe --output-dir {}/o",
        example("matmul").display(),
        d.path().display(),
        d.path().display(),
        d.path().display()
    );
    let (code, _, err) = run(Command::new("sh").args(["-c", &script]));
    assert_eq!(code, 0, "{err}");
    for f in ["m.ipuexe", "o/C.npy"] {
        let mode = std::fs::metadata(d.path().join(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "{f}: {mode:o}");
    }
    let script = format!(
        "umask 077 && {bin_path} build {} -o {}/p.ipuexe --tiles 4",
        example("matmul").display(),
        d.path().display()
    );
    assert_eq!(run(Command::new("sh").args(["-c", &script])).0, 0);
    let mode = std::fs::metadata(d.path().join("p.ipuexe")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

/// Item 13: by default a successful command logs nothing on stderr (no TTY: no progress line);
/// `-v` shows the INFO log.
#[test]
fn default_logging_is_quiet_and_v_is_verbose() {
    let d = tempfile::tempdir().unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_ipu-codegen"));
    c.env_remove("RUST_LOG").arg("build").arg(example("matmul")).arg("-o").arg(d.path().join("m.ipuexe"));
    let (code, out, err) = run(c.args(["--tiles", "4"]));
    assert_eq!(code, 0);
    assert!(err.is_empty(), "stderr should be empty by default: {err}");
    assert!(out.starts_with("package="), "{out}");
    let mut c = Command::new(env!("CARGO_BIN_EXE_ipu-codegen"));
    c.env_remove("RUST_LOG")
        .arg("-v")
        .arg("build")
        .arg(example("matmul"))
        .arg("-o")
        .arg(d.path().join("m.ipuexe"));
    let (_, _, err) = run(c.args(["--tiles", "4"]));
    assert!(err.contains("INFO") && err.contains("package build phase finished"), "{err}");
}

/// Item 14: the hardware line names the device, in text and JSON.
#[test]
fn hardware_line_names_the_device() {
    let d = tempfile::tempdir().unwrap();
    let pkg = build(d.path(), &example("matmul"), 4);
    let (code, out, _) = run(bin().arg("run").arg(&pkg));
    assert_eq!(code, 0);
    let last = out.lines().last().unwrap();
    assert!(last.starts_with("package=") && last.ends_with("tiles=4 device=sim hardwareTest=PASS"), "{last}");
}

/// Item 15: an `.org` gap disassembles as one line.
#[test]
fn disasm_collapses_zero_runs() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("gap.s");
    std::fs::write(&src, "main:\n setzi $m1, 1\n halt\n.org 0x60000\nx: .word 7\n").unwrap();
    let img = d.path().join("gap.bin");
    assert_eq!(run(bin().arg("asm").arg(&src).arg("-o").arg(&img)).0, 0);
    let (code, out, _) = run(bin().arg("disasm").arg(&img));
    assert_eq!(code, 0);
    assert!(out.lines().count() < 10, "{} lines", out.lines().count());
    assert!(out.contains(".space"), "{out}");
    assert!(out.contains("halt") && out.contains(".word 0x7"), "{out}");
}

/// Item 16: `--column-groups 0` is refused; help has examples and lists the ops.
#[test]
fn column_groups_zero_refused_and_help_has_examples() {
    let d = tempfile::tempdir().unwrap();
    let (code, _, err) = run(bin()
        .arg("build")
        .arg(example("qk"))
        .arg("-o")
        .arg(d.path().join("q"))
        .args(["--column-groups", "0"]));
    assert_eq!(code, 2);
    assert!(err.contains("--column-groups"), "{err}");
    let (_, out, _) = run(bin().args(["build", "--help"]));
    assert!(out.contains("EXAMPLES:") && out.contains("SUPPORTED OPS") && out.contains("softmax"), "{out}");
    for sub in ["run", "inspect", "profile", "report", "demo", "asm", "disasm", "sim"] {
        let (_, out, _) = run(bin().args([sub, "--help"]));
        assert!(out.contains("EXAMPLES:"), "{sub} --help has no examples");
    }
}

/// Items 7 and 8: `transpose_a` with `alpha` on one matmul builds and passes; a planner refusal
/// names file, line, op and kind, and says what would be accepted.
#[test]
fn transpose_a_with_alpha_passes_and_planner_refusals_name_the_line() {
    let d = tempfile::tempdir().unwrap();
    let model = d.path().join("ta.toml");
    let one = "name = \"ta\"\noutputs = [\"C\"]\n[inputs.A]\ndtype = \"f16\"\nshape = [96, 64]\n[inputs.B]\n\
               dtype = \"f16\"\nshape = [96, 48]\n[[ops]]\nop = \"matmul\"\na = \"A\"\nb = \"B\"\noutput = \"C\"\n\
               dtype = \"f16\"\naccumulate = \"f16\"\ntranspose_a = true\nalpha = 0.5\n";
    for shape in ["[96, 64]", "[96, 96]"] {
        std::fs::write(&model, one.replace("[96, 64]", shape)).unwrap();
        let pkg = build(d.path(), &model, 8);
        let (code, out, err) = run(bin().arg("run").arg(&pkg));
        assert_eq!(code, 0, "A {shape}: {out}{err}");
        assert!(out.contains("referenceMaximumAbsoluteError=0 numericalTest=PASS"), "{out}");
    }
    // Followed by a softmax, the rank-2 matmul is a stage of its own (it takes transpose_a) and
    // the softmax another: it builds and passes.
    let chain = format!("{}[[ops]]\nop = \"softmax\"\ninput = \"C\"\noutput = \"P\"\ndtype = \"f16\"\n", one)
        .replace("outputs = [\"C\"]", "outputs = [\"P\"]");
    std::fs::write(&model, &chain).unwrap();
    let pkg = build(d.path(), &model, 8);
    let (code, out, err) = run(bin().arg("run").arg(&pkg));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("referenceMaximumAbsoluteError=0 numericalTest=PASS"), "{out}");
    // Batched, it is a row chain: `a` is transposed by an explicit transpose first; it builds and
    // passes.
    let batched = chain
        .replace("shape = [96, 64]", "shape = [2, 96, 64]")
        .replace("shape = [96, 48]", "shape = [2, 96, 48]");
    std::fs::write(&model, &batched).unwrap();
    let pkg = build(d.path(), &model, 8);
    let (code, out, err) = run(bin().arg("run").arg(&pkg));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("referenceMaximumAbsoluteError=0 numericalTest=PASS"), "{out}");
    // With more batch entries than tiles the chain is refused, with the line and what it needs.
    std::fs::write(&model, batched.replace("shape = [2, ", "shape = [16, ")).unwrap();
    let (code, _, err) =
        run(bin().arg("build").arg(&model).arg("-o").arg(d.path().join("x")).args(["--tiles", "8"]));
    assert_eq!(code, 2);
    assert!(
        err.contains("ta.toml:9: op 0 (matmul): 16 batch entries need at least as many tiles (target has 8)"),
        "{err}"
    );
}
