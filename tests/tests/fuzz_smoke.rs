//! The fuzz harnesses (`ipu_host::fuzz`) run here on deterministic mutations of valid inputs, so
//! they are exercised on every `cargo test`: no input may panic, and the unmodified seeds must be
//! accepted (so the harnesses test something). `scripts/fuzz.sh` runs them under libFuzzer.

mod common;
use common::Rng;
use ipu_host::fuzz;

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            1 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] = [0, 0xFF, b'9', b'[', b'"', b'\n', b'-'][rng.below(7)];
            }
            2 => b.truncate(rng.below(b.len() + 1)),
            3 if !b.is_empty() => {
                let i = rng.below(b.len());
                let n = rng.below(16).min(b.len() - i);
                let chunk = b[i..i + n].to_vec();
                let j = rng.below(b.len());
                b.splice(j..j, chunk);
            }
            4 => {
                let i = rng.below(b.len() + 1);
                let digits = ["99999999999", "-1", "0", "4294967296", "1e308"][rng.below(5)];
                b.splice(i..i, digits.bytes());
            }
            _ => {
                let i = rng.below(b.len() + 1);
                b.splice(i..i, std::iter::repeat_n(rng.next() as u8, rng.below(8)));
            }
        }
    }
    b
}

fn run(name: &str, target: fn(&[u8]) -> bool, seeds: &[Vec<u8>], iterations: usize) {
    let mut rng = Rng(0xF00D ^ name.len() as u64);
    for s in seeds {
        assert!(target(s), "{name}: an unmodified seed is rejected");
    }
    let mut accepted = 0;
    for i in 0..iterations {
        let input = mutate(&mut rng, &seeds[i % seeds.len()]);
        let r = std::panic::catch_unwind(|| target(&input));
        match r {
            Ok(ok) => accepted += usize::from(ok),
            Err(_) => panic!("{name}: panic on input {:?}", String::from_utf8_lossy(&input)),
        }
    }
    println!("fuzz smoke {name}: {iterations} mutated inputs, {accepted} accepted, no panic");
}

fn examples() -> Vec<Vec<u8>> {
    ["matmul", "attention", "qk"]
        .iter()
        .map(|n| std::fs::read(format!("{}/../examples/{n}.toml", env!("CARGO_MANIFEST_DIR"))).unwrap())
        .collect()
}

#[test]
fn model_parser_and_planner() {
    run("model", fuzz::model, &examples(), 3000);
}

#[test]
fn package_reader() {
    let src = String::from_utf8(examples()[1].clone()).unwrap();
    let b = ipu_host::build::build(
        "a.toml",
        &src,
        &ipu_host::build::BuildOptions { threads: 1, grid: None, ..ipu_host::build::BuildOptions::new(4) },
    )
    .unwrap();
    run("package", fuzz::package, &[b.bytes], 1500);
}

#[test]
fn npy_reader() {
    let t = |dtype, shape: Vec<u64>| ipu_host::reference::HostTensor {
        dtype,
        data: vec![1.5; shape.iter().product::<u64>() as usize],
        shape,
    };
    let seeds = vec![
        ipu_host::npy::to_bytes(&t(ipu_schema::DType::F16, vec![3, 5])).unwrap(),
        ipu_host::npy::to_bytes(&t(ipu_schema::DType::F32, vec![2, 2, 2])).unwrap(),
        ipu_host::npy::to_bytes(&t(ipu_schema::DType::F8E4M3, vec![7])).unwrap(),
    ];
    run("npy", fuzz::npy, &seeds, 5000);
}

#[test]
fn assembler() {
    let seeds: Vec<Vec<u8>> =
        ["int_loop", "vector_fp", "fp8_convert", "amp_block", "host_page", "exch_sender"]
            .iter()
            .map(|n| {
                let s = std::fs::read_to_string(format!("{}/programs/{n}.s", env!("CARGO_MANIFEST_DIR")))
                    .unwrap();
                s.replace("DRAIN", "1").into_bytes()
            })
            .collect();
    run("asm", fuzz::asm, &seeds, 5000);
}

#[test]
fn search_state_loader() {
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("s.json");
    let src = String::from_utf8(examples()[0].clone()).unwrap();
    let opts = ipu_host::build::BuildOptions {
        search_attempts: 2,
        search_state: Some(state.clone()),
        ..ipu_host::build::BuildOptions::new(64)
    };
    ipu_host::build::build("m.toml", &src, &opts).unwrap();
    // And a cast-placement state (Q·Kᵀ).
    let cast_state = d.path().join("c.json");
    let qk = String::from_utf8(examples()[2].clone()).unwrap();
    let opts = ipu_host::build::BuildOptions {
        search_state: Some(cast_state.clone()),
        ..ipu_host::build::BuildOptions::new(16)
    };
    ipu_host::build::build("qk.toml", &qk, &opts).unwrap();
    let seeds = [std::fs::read(&state).unwrap(), std::fs::read(&cast_state).unwrap()];
    run("search_state", fuzz::search_state, &seeds, 5000);
}

#[test]
fn profile_reader() {
    let src = String::from_utf8(examples()[2].clone()).unwrap();
    let opts = ipu_host::build::BuildOptions { profile: true, ..ipu_host::build::BuildOptions::new(3) };
    let b = ipu_host::build::build("qk.toml", &src, &opts).unwrap();
    let mut dev =
        ipu_host::sim::SimDevice::new(ipu_host::sim::SimConfig { tiles: 3, threads: 1, max_cycles: 1 << 30 })
            .unwrap();
    let opts = ipu_host::session::RunOptions {
        package_path: "qk.ipuexe".into(),
        inputs: Default::default(),
        output_dir: None,
        save_inputs: None,
        seed: 1,
        iterations: 1,
        profile: true,
    };
    let out = ipu_host::session::run(&b.package, &mut dev, &opts).unwrap();
    let p =
        ipu_host::profile::Profile::from_run(&b.package, "qk.ipuexe", "00", "sim", &out.captured.unwrap())
            .unwrap();
    run("profile", fuzz::profile, &[p.to_capnp()], 3000);
}

/// Found by libFuzzer: nested lists in an npy header made npyz's parser take exponential time.
#[test]
fn npy_nested_lists_are_refused_quickly() {
    let header = format!(
        "{{'descr': {}'<f2'{}, 'fortran_order': False, 'shape': (1,), }}",
        "[".repeat(40),
        "]".repeat(40)
    );
    let mut h = header.into_bytes();
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(b' ');
    }
    h.push(b'\n');
    let mut file = b"\x93NUMPY\x01\x00".to_vec();
    file.extend((h.len() as u16).to_le_bytes());
    file.extend(h);
    let t = std::time::Instant::now();
    let err = ipu_host::npy::from_bytes(&file).unwrap_err();
    assert!(err.contains("structured dtypes are not supported"), "{err}");
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
}

/// Inputs libFuzzer found (tests/data/npy-regressions): exponential header parsing on nested
/// braces, and a shape whose element count overflows inside npyz. Each must fail fast, no panic.
#[test]
fn npy_fuzzer_findings_are_refused_quickly() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/data/npy-regressions");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        let t = std::time::Instant::now();
        assert!(ipu_host::npy::from_bytes(&bytes).is_err());
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        n += 1;
    }
    assert_eq!(n, 3);
}

/// Found by libFuzzer (tests/data/asm-regressions): `.org 0x-1` wrapped the address counter.
#[test]
fn asm_fuzzer_findings_are_refused() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/data/asm-regressions");
    for entry in std::fs::read_dir(dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        assert!(!fuzz::asm(&bytes));
    }
    let e = ipu_host::program::TileProgram::from_asm(".org 0x1ffffc\n.word 1, 2\n").unwrap_err();
    assert_eq!(e.to_string(), "line 2: address 0x200004 outside the 21-bit tile address space");
    assert!(ipu_host::program::TileProgram::from_asm(".org 0x-1\n").is_err());
}

/// A small model in the forms torch writes (weights, bias, shape arithmetic, heads, scaled
/// scores, softmax, a tanh GeLU), encoded with the importer's own protobuf messages.
fn onnx_seed() -> Vec<u8> {
    use ipu_host::onnx::proto::*;
    use prost::Message;
    let value = ValueInfoProto::float_tensor;
    let floats = |name: &str, dims: &[i64], v: f32| TensorProto {
        dims: dims.to_vec(),
        data_type: 1,
        float_data: vec![v; dims.iter().product::<i64>() as usize],
        name: name.into(),
        ..Default::default()
    };
    let ints = |name: &str, v: &[i64]| TensorProto {
        dims: vec![v.len() as i64],
        data_type: 7,
        int64_data: v.to_vec(),
        name: name.into(),
        ..Default::default()
    };
    let node = |op: &str, i: &[&str], o: &str, attrs: Vec<AttributeProto>| NodeProto {
        input: i.iter().map(|s| s.to_string()).collect(),
        output: vec![o.into()],
        name: format!("n_{o}"),
        op_type: op.into(),
        attribute: attrs,
        ..Default::default()
    };
    let perm = |p: &[i64]| {
        vec![AttributeProto { name: "perm".into(), r#type: 7, ints: p.to_vec(), ..Default::default() }]
    };
    let graph = GraphProto {
        node: vec![
            node("MatMul", &["x", "w"], "m", vec![]),
            node("Add", &["m", "b"], "a", vec![]),
            node("Shape", &["a"], "s", vec![]),
            node("Gather", &["s", "zero"], "batch", vec![]),
            node("Unsqueeze", &["batch", "zero1"], "batch1", vec![]),
            node(
                "Concat",
                &["batch1", "rest"],
                "target",
                vec![AttributeProto { name: "axis".into(), r#type: 2, ..Default::default() }],
            ),
            node("Reshape", &["a", "target"], "r", vec![]),
            node("Transpose", &["r"], "q", perm(&[0, 2, 1, 3])),
            node("Transpose", &["r"], "k", perm(&[0, 2, 3, 1])),
            node("MatMul", &["q", "k"], "sc", vec![]),
            node("Mul", &["sc", "half"], "ss", vec![]),
            node("Softmax", &["ss"], "y", vec![]),
            node("Tanh", &["a"], "t", vec![]),
            node("Add", &["t", "half"], "z", vec![]),
        ],
        name: "seed".into(),
        initializer: vec![
            floats("w", &[8, 8], 0.25),
            floats("b", &[8], 0.5),
            floats("half", &[], 0.5),
            TensorProto {
                dims: vec![],
                data_type: 7,
                int64_data: vec![0],
                name: "zero".into(),
                ..Default::default()
            },
            ints("zero1", &[0]),
            ints("rest", &[4, 2, 4]),
        ],
        input: vec![value("x", &[1, 4, 8])],
        output: vec![value("y", &[1, 2, 4, 4]), value("a", &[1, 4, 8])],
    };
    let model = ModelProto {
        ir_version: 9,
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 18 }],
        producer_name: "fuzz seed".into(),
        graph: Some(graph),
    };
    model.encode_to_vec()
}

#[test]
fn onnx_importer() {
    run("onnx", fuzz::onnx, &[onnx_seed()], 3000);
}
