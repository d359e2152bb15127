//! The ONNX ops the everyday models need, on hand-written graphs (the models themselves are in
//! `onnx_family.rs`): which ops each imports to, its values in device precision (what the
//! simulator matches bit for bit) against values computed here, the simulator for the
//! concatenations, and the refusals, each naming the node: `Relu`, `LeakyRelu`, `Clip`,
//! `Max`/`Min`, `HardSigmoid`, `HardSwish`; integer inputs (token ids and values); SDPA's guards
//! (`Add` of zeros, `Where(IsNaN(x), c, x)`); `Concat` of computed tensors.

mod common;
mod onnx_helpers;

use ipu_host::onnx::proto;
use onnx_helpers::*;
use prost::Message;
use std::collections::BTreeMap;

#[test]
fn activations_with_constants_are_map_ops_with_their_values() {
    let x = ramp();
    let one = |op: &str, ins: &[&str], attrs, inits| {
        model(vec![node(op, "act", ins, "y", attrs)], inits, &[("x", &[2, 32])], &[2, 32])
    };
    let c = |n: &str, v: f32| init(n, &[], vec![v]);
    let f16 = |v: f32| half::f16::from_f32(v).to_f32();
    type Want = fn(f32) -> f32;
    let cases: Vec<(&str, Vec<u8>, &[&str], Want)> = vec![
        ("relu", one("Relu", &["x"], vec![], vec![]), &["max"], |v| v.max(0.0)),
        ("leaky", one("LeakyRelu", &["x"], vec![float_attr("alpha", 0.25)], vec![]), &["leaky_relu"], |v| {
            if v < 0.0 {
                0.25 * v
            } else {
                v
            }
        }),
        (
            "clip",
            one("Clip", &["x", "lo", "hi"], vec![], vec![c("lo", -1.5), c("hi", 2.25)]),
            &["max", "min"],
            |v| v.clamp(-1.5, 2.25),
        ),
        ("clip_max_only", one("Clip", &["x", "", "hi"], vec![], vec![c("hi", 0.5)]), &["min"], |v| {
            v.min(0.5)
        }),
        ("max", one("Max", &["k", "x"], vec![], vec![c("k", -0.75)]), &["max"], |v| v.max(-0.75)),
        ("min", one("Min", &["x", "k"], vec![], vec![c("k", 3.0)]), &["min"], |v| v.min(3.0)),
        // HardSigmoid and HardSwish: x/6 + 1/2 clamped to [0, 1], each step rounded to f16.
        (
            "hard_sigmoid",
            one("HardSigmoid", &["x"], vec![float_attr("alpha", 0.5)], vec![]),
            &["max", "min"],
            |v| (0.5 * v + 0.5).clamp(0.0, 1.0),
        ),
    ];
    for (name, bytes, ops, want) in cases {
        let (toml, got) =
            evaluate(&bytes, &[("x", vec![2, 32], x.clone())]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let counts = op_counts(&toml);
        for op in ops {
            assert!(counts.contains_key(*op), "{name}: no {op}:\n{toml}");
        }
        for (v, g) in x.iter().zip(&got) {
            assert_eq!(*g, f16(want(*v)), "{name}({v})");
        }
    }
    let (toml, got) = evaluate(&one("HardSwish", &["x"], vec![], vec![]), &[("x", vec![2, 32], x.clone())])
        .expect("hard swish");
    for (v, g) in x.iter().zip(&got) {
        let want = *v as f64 * (*v as f64 / 6.0 + 0.5).clamp(0.0, 1.0);
        assert!(
            (*g as f64 - want).abs() <= 4e-3 * (1.0 + want.abs()),
            "hardswish({v}) = {g}, not {want}:\n{toml}"
        );
    }
}

#[test]
fn activations_the_kernels_do_not_compute_are_refused_naming_the_node() {
    let two = model(
        vec![node("Max", "the_max", &["x", "z"], "y", vec![])],
        vec![],
        &[("x", &[2, 32]), ("z", &[2, 32])],
        &[2, 32],
    );
    let e = evaluate(&two, &[]).unwrap_err();
    assert!(
        e.contains("node `the_max` (Max, opset 18)") && e.contains("two tensors computed on the chip"),
        "{e}"
    );
    let steep = model(
        vec![node("LeakyRelu", "steep", &["x"], "y", vec![float_attr("alpha", 2.0)])],
        vec![],
        &[("x", &[2, 32])],
        &[2, 32],
    );
    let e = evaluate(&steep, &[]).unwrap_err();
    assert!(e.contains("node `steep`") && e.contains("LeakyRelu slope above 1"), "{e}");
    let wide = model(
        vec![node("Max", "wide", &["x", "k"], "y", vec![])],
        vec![init("k", &[32], vec![0.0; 32])],
        &[("x", &[2, 32])],
        &[2, 32],
    );
    let e = evaluate(&wide, &[]).unwrap_err();
    assert!(e.contains("node `wide`") && e.contains("only one-value constants"), "{e}");
}

#[test]
fn integer_inputs_are_taken_only_as_ids_of_embedding_lookups() {
    let ids = |n: &str| proto::ValueInfoProto {
        r#type: Some(proto::TypeProto {
            tensor_type: Some(proto::TensorTypeProto {
                elem_type: 7,
                shape: Some(proto::TensorShapeProto {
                    dim: [1, 4]
                        .iter()
                        .map(|d| proto::Dimension { dim_value: Some(*d), dim_param: None })
                        .collect(),
                }),
            }),
        }),
        ..info(n, &[])
    };
    let with = |nodes: Vec<proto::NodeProto>| {
        let bytes = model(nodes, vec![init("table", &[10, 8], vec![0.5; 80])], &[], &[1, 4, 8]);
        let mut m = proto::ModelProto::decode(bytes.as_slice()).unwrap();
        m.graph.as_mut().unwrap().input = vec![ids("ids")];
        m.encode_to_vec()
    };
    let lookup = with(vec![node("Gather", "emb", &["table", "ids"], "y", vec![])]);
    // Rows of ids 3, 0, 9, 3 of a table whose row k holds k + j/8.
    let table: Vec<f32> = (0..80).map(|i| (i / 8) as f32 + (i % 8) as f32 / 8.0).collect();
    let mut rows = vec![0f32; 40];
    for (k, id) in [3, 0, 9, 3].iter().enumerate() {
        rows[k * 10 + id] = 1.0;
    }
    let mut m = proto::ModelProto::decode(lookup.as_slice()).unwrap();
    m.graph.as_mut().unwrap().initializer[0].float_data = table.clone();
    let (toml, got) = evaluate(&m.encode_to_vec(), &[("ids", vec![1, 4, 10], rows)]).expect("a lookup");
    assert!(toml.contains("one_hot = [1, 4]") && op_counts(&toml).get("matmul") == Some(&1), "{toml}");
    let want: Vec<f32> = [3, 0, 9, 3].iter().flat_map(|id| table[id * 8..id * 8 + 8].to_vec()).collect();
    assert_eq!(got, want);
    // Read by a lookup and by another node: refused; read by no lookup: its values.
    let both = with(vec![
        node("Gather", "emb", &["table", "ids"], "e", vec![]),
        node("Cast", "c", &["ids"], "f", vec![int_attr("to", 1)]),
        node("Add", "a", &["e", "f"], "y", vec![]),
    ]);
    let e = evaluate(&both, &[]).unwrap_err();
    assert!(e.contains("input `ids`: read by node `c` (Cast) and by embedding lookups"), "{e}");
    let values = with(vec![node("Cast", "c", &["ids"], "y", vec![int_attr("to", 1)])]);
    let toml = import_bytes(&values).expect("integer values");
    assert!(toml.contains("shape = [1, 4]\ninteger = true"), "{toml}");
    let e =
        evaluate(&with(vec![node("Gather", "g1", &["table", "ids"], "y", vec![int_attr("axis", 1)])]), &[])
            .unwrap_err();
    assert!(e.contains("node `g1` (Gather") && e.contains("embedding lookup"), "{e}");
}

#[test]
fn sdpa_guards_are_taken_only_in_their_exact_form() {
    // Where(IsNaN(x), 0, x) is x; Add of zeros that keeps the shape is the tensor itself.
    let x = ramp();
    let zero = |n: &str, dims: &[i64]| init(n, dims, vec![0.0; dims.iter().product::<i64>() as usize]);
    let guard = |else_: &str, zeros: &[i64]| {
        model(
            vec![
                node("Add", "z", &["x", "zeros"], "xz", vec![]),
                node("Exp", "e", &["xz"], "p", vec![]),
                node("IsNaN", "nan", &["p"], "bad", vec![]),
                node("Where", "guard", &["bad", "zero", else_], "y", vec![]),
            ],
            vec![init("zero", &[], vec![0.0]), zero("zeros", zeros)],
            &[("x", &[2, 32])],
            &[2, 32],
        )
    };
    let (toml, got) = evaluate(&guard("p", &[1, 32]), &[("x", vec![2, 32], x.clone())]).expect("the guard");
    assert_eq!(op_counts(&toml).get("add"), None, "{toml}");
    for (v, g) in x.iter().zip(&got) {
        let want = half::f16::from_f32(v.exp()).to_f32();
        assert!((g - want).abs() <= 1e-3 * want, "exp({v}) = {g}, not {want}");
    }
    // The guard of another value, and zeros that widen the tensor, are not taken.
    let e = evaluate(&guard("xz", &[1, 32]), &[]).unwrap_err();
    assert!(e.contains("node `guard` (Where, opset 18)") && e.contains("NaN guard"), "{e}");
    let e = evaluate(&guard("p", &[3, 2, 32]), &[]).unwrap_err();
    assert!(!e.contains("panicked"), "{e}");
    // IsNaN read by anything but its guard is refused.
    let read = model(
        vec![node("IsNaN", "nan", &["x"], "bad", vec![]), node("Neg", "n", &["bad"], "y", vec![])],
        vec![],
        &[("x", &[2, 32])],
        &[2, 32],
    );
    let e = evaluate(&read, &[]).unwrap_err();
    assert!(e.contains("an intermediate of a recognised pattern"), "{e}");
}

#[test]
fn concat_of_computed_tensors_places_every_value_exactly() {
    // [1, 2, 32] computed + [1, 1, 32] constant + [1, 2, 32] computed along the token axis
    // (rows), and [2, 32] + [2, 32] computed along the last axis (columns).
    let x = ramp();
    let cls: Vec<f32> = (0..32).map(|i| 100.0 + i as f32).collect();
    let rows = model(
        vec![
            node("Reshape", "r", &["x", "s"], "x3", vec![]),
            node("Neg", "n", &["x3"], "nx", vec![]),
            node("Concat", "cat", &["x3", "cls", "nx"], "y", vec![int_attr("axis", 1)]),
        ],
        vec![
            init("cls", &[1, 1, 32], cls.clone()),
            proto::TensorProto {
                name: "s".into(),
                dims: vec![3],
                data_type: 7,
                int64_data: vec![1, 2, 32],
                ..Default::default()
            },
        ],
        &[("x", &[2, 32])],
        &[1, 5, 32],
    );
    let (toml, got) = evaluate(&rows, &[("x", vec![2, 32], x.clone())]).expect("rows");
    let neg: Vec<f32> = x.iter().map(|v| -v).collect();
    let want: Vec<f32> = x.iter().chain(&cls).chain(&neg).copied().collect();
    assert_eq!(got, want, "{toml}");
    assert_eq!(op_counts(&toml).get("matmul"), Some(&2), "one placement per computed part:\n{toml}");
    let cols = model(
        vec![
            node("Neg", "n", &["x"], "nx", vec![]),
            node("Concat", "cat", &["nx", "x"], "y", vec![int_attr("axis", -1)]),
        ],
        vec![],
        &[("x", &[2, 32])],
        &[2, 64],
    );
    let (toml, got) = evaluate(&cols, &[("x", vec![2, 32], x.clone())]).expect("columns");
    let want: Vec<f32> = (0..2)
        .flat_map(|r| {
            let row = &x[r * 32..(r + 1) * 32];
            row.iter().map(|v| -v).chain(row.iter().copied()).collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(got, want, "{toml}");
    // Both forms on the simulator, bit-exact against the evaluation above.
    let d = tempfile::tempdir().unwrap();
    for (k, bytes) in [rows, cols].iter().enumerate() {
        let path = d.path().join(format!("cat{k}.onnx"));
        std::fs::write(&path, bytes).unwrap();
        simulate(&path, BTreeMap::new(), d.path());
    }
    // Along the last axis of many rows, the placement matrix would be too large: refused.
    let big = model(
        vec![
            node("Neg", "n", &["x"], "nx", vec![]),
            node("Concat", "big_cat", &["nx", "x"], "y", vec![int_attr("axis", -1)]),
        ],
        vec![],
        &[("x", &[4, 2048])],
        &[4, 4096],
    );
    let e = evaluate(&big, &[]).unwrap_err();
    assert!(e.contains("node `big_cat` (Concat, opset 18)") && e.contains("placement matrix"), "{e}");
}

#[test]
fn mutated_family_models_are_imported_or_refused_without_a_panic() {
    // Bytes of each committed model's graph (its nodes come first in the file, before the
    // weights) changed at random: every import returns a model or an error; none panics, and
    // each error names the file. 150 mutants per model, 4 bytes each, in the first 8 KB.
    let mut rng = common::Rng(0x4040);
    let d = tempfile::tempdir().unwrap();
    let (mut taken, mut refused) = (0, 0);
    // The family, and the reduce and Where fixtures (tests/data/onnx/ops).
    let ops = dir().join("../ops");
    let models =
        ["mlp", "acts", "vit_sdpa", "clip", "dinov2", "bert_mask"].map(|n| dir().join(format!("{n}.onnx")));
    let models = models.into_iter().chain(["reduce", "where"].map(|n| ops.join(format!("{n}.onnx"))));
    for path in models {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let good = std::fs::read(&path).unwrap();
        let span = good.len().min(8192);
        for _ in 0..150 {
            let mut b = good.clone();
            for _ in 0..4 {
                let i = rng.below(span);
                b[i] = rng.next() as u8;
            }
            let path = d.path().join("m.onnx");
            std::fs::write(&path, &b).unwrap();
            match ipu_host::onnx::import(&path, &ipu_host::onnx::ImportOptions::new()) {
                Ok(_) => taken += 1,
                Err(e) => {
                    assert!(e.contains("m.onnx"), "{name}: an error that names no file: {e}");
                    refused += 1;
                }
            }
        }
    }
    eprintln!("mutants: {taken} imported, {refused} refused");
    assert!(refused > 0 && taken > 0, "{taken} imported, {refused} refused");
}
