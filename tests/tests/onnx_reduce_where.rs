//! `ReduceMean` / `ReduceSum` over the last axis of a computed tensor and `Where` with a constant
//! condition, as torch exports them (`scripts/export_ops.py`, committed in `tests/data/onnx/ops/`
//! with onnxruntime's outputs): an RMS norm, a centring and a sum after a Linear; causal
//! attention whose mask is `masked_fill` of a constant, and `torch.where` of a constant mask
//! between two Linears. Each is imported, built for 64 tiles, run on the simulator (bit-exact
//! device-precision verdict) and compared with onnxruntime (cosine ≥ 0.999); which ops each
//! imports to is checked. Hand-written graphs check values in device precision against values
//! computed here, and the refusals, each naming the node.

mod common;
mod onnx_helpers;

use onnx_helpers::*;
use std::path::{Path, PathBuf};

fn ops_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/onnx/ops")
}

/// Import, build for 64 tiles and run fixture `name` on its input; the cosine against
/// onnxruntime and the import's op counts.
fn check(name: &str) -> (f64, std::collections::BTreeMap<String, usize>) {
    let out = tempfile::tempdir().unwrap();
    let inputs = [("x".to_string(), ops_dir().join(format!("{name}.in.x.npy")))].into_iter().collect();
    let (run, predicted, toml) = simulate(&ops_dir().join(format!("{name}.onnx")), inputs, out.path());
    let want = ipu_host::npy::read(&ops_dir().join(format!("{name}.ref.y.npy"))).unwrap();
    let got = ipu_host::npy::read(&out.path().join("y.npy")).unwrap();
    assert_eq!(got.shape, want.shape, "{name}: the output keeps the ONNX shape");
    let c = cosine(&got.data, &want.data);
    eprintln!(
        "{name} on 64 tiles: simulated {} predicted {predicted} cosine vs onnxruntime {c}",
        run.cycles[0]
    );
    assert!(c >= 0.999, "{name}: cosine {c}");
    (c, op_counts(&toml))
}

#[test]
fn torch_reductions_over_the_last_axis_run_and_match_onnxruntime() {
    let (_, ops) = check("reduce");
    // mean(h²) and mean(h): reduce_mean; sum(h): reduce_sum; nothing refused or folded away.
    assert_eq!(ops.get("reduce_mean"), Some(&2), "{ops:?}");
    assert_eq!(ops.get("reduce_sum"), Some(&1), "{ops:?}");
}

#[test]
fn torch_where_with_constant_masks_runs_and_matches_onnxruntime() {
    let (_, ops) = check("where");
    // masked_fill: scores·(1 − mask) + (−65504 where masked); torch.where: a·c + b·(1 − c).
    assert_eq!(ops.get("mul"), Some(&3), "{ops:?}");
    assert_eq!(ops.get("add").copied().unwrap_or(0), 4 + 2, "biases and the two selections: {ops:?}");
    assert_eq!(ops.get("softmax"), Some(&1), "{ops:?}");
}

#[test]
fn reduce_values_are_the_row_sums_and_means_in_device_precision() {
    let x = ramp();
    for (op, keep, mean) in [("ReduceSum", 1, false), ("ReduceMean", 1, true)] {
        let axes = init_i64("axes", &[1], vec![-1]);
        let bytes = model(
            vec![node(op, "red", &["x", "axes"], "y", vec![int_attr("keepdims", keep)])],
            vec![axes],
            &[("x", &[2, 32])],
            &[2, 1],
        );
        let (toml, got) =
            evaluate(&bytes, &[("x", vec![2, 32], x.clone())]).unwrap_or_else(|e| panic!("{op}: {e}"));
        assert!(op_counts(&toml).contains_key(if mean { "reduce_mean" } else { "reduce_sum" }), "{toml}");
        for (r, g) in got.iter().enumerate() {
            // Rows of −8..−0.25 and 0..7.75 (exact in f32): sums −132 and 124, means /32.
            let sum: f32 = x[32 * r..32 * (r + 1)].iter().sum();
            let want = if mean { sum / 32.0 } else { sum };
            assert_eq!(*g, want, "{op} row {r}");
        }
    }
}

#[test]
fn reductions_over_other_axes_are_refused_naming_the_node_and_axes() {
    for (op, axes, want) in [
        ("ReduceMean", Some(vec![1i64]), "ReduceMean over axes [1] of a computed tensor of rank 3"),
        ("ReduceSum", Some(vec![1, 2]), "ReduceSum over axes [1, 2]"),
        ("ReduceSum", None, "ReduceSum over every axis (no axes given)"),
    ] {
        let mut ins = vec!["x"];
        let mut inits = Vec::new();
        if let Some(a) = &axes {
            ins.push("axes");
            inits.push(init_i64("axes", &[a.len() as i64], a.clone()));
        }
        let bytes =
            model(vec![node(op, "the_reduce", &ins, "y", vec![])], inits, &[("x", &[1, 4, 8])], &[1, 1, 8]);
        let e = import_bytes(&bytes).unwrap_err();
        assert!(
            e.contains("node `the_reduce`") && e.contains(want) && e.contains("only the last axis"),
            "{e}"
        );
    }
}

#[test]
fn where_of_a_constant_condition_selects_exactly() {
    // Where(c, x, −1e30) and Where(c, x, relu(x)) for a constant c: the values of x where c,
    // the other branch elsewhere (−1e30 as f16's −65504, the masks' clamp).
    let x = ramp();
    let c: Vec<i64> = (0..64).map(|i| (i % 3 == 0) as i64).collect();
    let cond = || init_bool("c", &[2, 32], c.clone());
    let fill = init("k", &[], vec![-1e30]);
    let bytes = model(
        vec![node("Where", "sel", &["c", "x", "k"], "y", vec![])],
        vec![cond(), fill],
        &[("x", &[2, 32])],
        &[2, 32],
    );
    let (toml, got) = evaluate(&bytes, &[("x", vec![2, 32], x.clone())]).expect("imports");
    for (i, g) in got.iter().enumerate() {
        assert_eq!(*g, if c[i] == 1 { x[i] } else { -65504.0 }, "element {i}:\n{toml}");
    }
    let nodes =
        vec![node("Relu", "r", &["x"], "h", vec![]), node("Where", "sel", &["c", "x", "h"], "y", vec![])];
    let bytes = model(nodes, vec![cond()], &[("x", &[2, 32])], &[2, 32]);
    let (_, got) = evaluate(&bytes, &[("x", vec![2, 32], x.clone())]).expect("imports");
    for (i, g) in got.iter().enumerate() {
        assert_eq!(*g, if c[i] == 1 { x[i] } else { x[i].max(0.0) }, "element {i}");
    }
    // A fill of zeros (`masked_fill(m, 0)`): the product alone, one `mul`, no `add`.
    let zero = init("z", &[], vec![0.0]);
    let bytes = model(
        vec![node("Where", "sel", &["c", "x", "z"], "y", vec![])],
        vec![cond(), zero],
        &[("x", &[2, 32])],
        &[2, 32],
    );
    let (toml, got) = evaluate(&bytes, &[("x", vec![2, 32], x.clone())]).expect("imports");
    let counts = op_counts(&toml);
    assert!(counts.get("mul") == Some(&1) && !counts.contains_key("add"), "{toml}");
    for (i, g) in got.iter().enumerate() {
        assert_eq!(*g, if c[i] == 1 { x[i] } else { 0.0 }, "element {i}");
    }
    // A condition true everywhere is the branch itself: no op written.
    let all = init_bool("c", &[2, 32], vec![1; 64]);
    let nodes =
        vec![node("Relu", "r", &["x"], "h", vec![]), node("Where", "sel", &["c", "h", "x"], "y", vec![])];
    let toml = import_bytes(&model(nodes, vec![all], &[("x", &[2, 32])], &[2, 32])).unwrap();
    assert!(!toml.contains("op = \"mul\""), "{toml}");
    // Shapes that do not broadcast are refused naming the node.
    let odd = init_bool("c", &[3, 32], vec![1; 96]);
    let inits = vec![odd, init("k", &[], vec![0.0])];
    let bytes = model(
        vec![node("Where", "bad_where", &["c", "x", "k"], "y", vec![])],
        inits,
        &[("x", &[2, 32])],
        &[2, 32],
    );
    let e = import_bytes(&bytes).unwrap_err();
    assert!(e.contains("node `bad_where`") && e.contains("do not broadcast"), "{e}");
}

#[test]
fn keepdims_0_is_a_row_of_results_on_the_chip() {
    // ReduceSum(keepdims = 0) of [1, 6, 32] is [1, 6], and ReduceMean of [2, 3, 32] is [2, 3]:
    // the results transposed into rows, built for 64 tiles and run (bit-exact verdict), each
    // value the row's sum of the ramp (exact in f32 and in f16) or its mean.
    let x = ramp();
    for (op, shape, out) in
        [("ReduceSum", [1i64, 6, 32], vec![1i64, 6]), ("ReduceMean", [2, 3, 32], vec![2, 3])]
    {
        let axes = init_i64("axes", &[1], vec![2]);
        let bytes = model(
            vec![node(op, "red", &["x", "axes"], "y", vec![int_attr("keepdims", 0)])],
            vec![axes],
            &[("x", &shape)],
            &out,
        );
        let d = tempfile::tempdir().unwrap();
        let (path, xs) = (d.path().join("m.onnx"), d.path().join("x.npy"));
        std::fs::write(&path, &bytes).unwrap();
        let values: Vec<f32> = (0..192).map(|i| x[i % 64] + (i / 64) as f32).collect();
        let dims: Vec<u64> = shape.iter().map(|v| *v as u64).collect();
        let t = ipu_host::reference::HostTensor {
            dtype: ipu_schema::DType::F32,
            shape: dims,
            data: values.clone(),
        };
        std::fs::write(&xs, ipu_host::npy::to_bytes(&t).unwrap()).unwrap();
        let (_, _, toml) = simulate(&path, [("x".to_string(), xs)].into_iter().collect(), d.path());
        assert!(toml.contains("op = \"transpose\""), "{toml}");
        let got = ipu_host::npy::read(&d.path().join("y.npy")).unwrap();
        assert_eq!(got.shape, out.iter().map(|v| *v as u64).collect::<Vec<_>>());
        for (r, g) in got.data.iter().enumerate() {
            let sum: f32 = values[32 * r..32 * (r + 1)].iter().sum();
            let want = if op == "ReduceMean" { sum / 32.0 } else { sum };
            assert_eq!(*g, half::f16::from_f32(want).to_f32(), "{op} row {r}");
        }
    }
}
