//! ONNX import of a large model: time and peak memory (issue "Real models in"). The bench writes
//! a model the way torch's default exporter does — a small graph file plus ~1 GiB of f32
//! initializers as external data (16 projections of 4096 × 4096, each with a bias, and a GeLU
//! between them) — into a temporary directory, then imports it and reports the wall time, the
//! process's peak resident memory during the import (`VmHWM`, reset through `/proc/self/
//! clear_refs` after the file is written) and the size of what the import returns.
//! `cargo bench --bench onnx_import` (the file is made in the bench, never committed).

use ipu_host::onnx::{import, proto, ImportOptions};
use prost::Message;
use std::io::Write;
use std::time::Instant;

const WIDTH: usize = 4096;
const LAYERS: usize = 16;

/// The process's peak resident set in bytes (`VmHWM`).
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// An initializer whose values live at `offset..offset + length` of `weights.bin`.
fn external(name: &str, dims: &[usize], offset: usize) -> proto::TensorProto {
    let length = dims.iter().product::<usize>() * 4;
    let entry = |k: &str, v: String| proto::StringStringEntryProto { key: k.into(), value: v };
    proto::TensorProto {
        dims: dims.iter().map(|d| *d as i64).collect(),
        data_type: proto::data_type::FLOAT,
        name: name.into(),
        data_location: 1,
        external_data: vec![
            entry("location", "weights.bin".into()),
            entry("offset", offset.to_string()),
            entry("length", length.to_string()),
        ],
        ..Default::default()
    }
}

fn node(op: &str, inputs: &[&str], output: &str) -> proto::NodeProto {
    proto::NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        name: format!("{op}_{output}"),
        op_type: op.into(),
        ..Default::default()
    }
}

/// Write the model and its data file; the data file's size.
fn write_model(dir: &std::path::Path) -> usize {
    let mut data = std::io::BufWriter::new(std::fs::File::create(dir.join("weights.bin")).unwrap());
    let (mut inits, mut nodes) = (Vec::new(), Vec::new());
    let mut offset = 0;
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    // Small values, written a row at a time so the bench itself never holds a weight.
    let mut put = |n: usize, scale: f32, data: &mut dyn Write| {
        let mut row = Vec::with_capacity(4 * WIDTH);
        for k in 0..n {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale;
            row.extend_from_slice(&v.to_le_bytes());
            if row.len() == 4 * WIDTH || k + 1 == n {
                data.write_all(&row).unwrap();
                row.clear();
            }
        }
    };
    let mut x = "x".to_string();
    for l in 0..LAYERS {
        let (w, b) = (format!("w{l}"), format!("b{l}"));
        inits.push(external(&w, &[WIDTH, WIDTH], offset));
        put(WIDTH * WIDTH, 2.0 / (WIDTH as f32).sqrt(), &mut data);
        offset += WIDTH * WIDTH * 4;
        inits.push(external(&b, &[WIDTH], offset));
        put(WIDTH, 0.1, &mut data);
        offset += WIDTH * 4;
        let (mm, add, act) = (format!("mm{l}"), format!("add{l}"), format!("h{l}"));
        nodes.push(node("MatMul", &[&x, &w], &mm));
        nodes.push(node("Add", &[&mm, &b], &add));
        let last = l + 1 == LAYERS;
        let out = if last { "y".to_string() } else { act };
        nodes.push(node(if last { "Identity" } else { "Gelu" }, &[&add], &out));
        x = out;
    }
    data.flush().unwrap();
    let model = proto::ModelProto {
        ir_version: 9,
        opset_import: vec![proto::OperatorSetIdProto { domain: String::new(), version: 20 }],
        producer_name: "ipu-benches".into(),
        graph: Some(proto::GraphProto {
            node: nodes,
            name: "large".into(),
            initializer: inits,
            input: vec![proto::ValueInfoProto::float_tensor("x", &[1, 8, WIDTH as i64])],
            output: vec![proto::ValueInfoProto::float_tensor("y", &[1, 8, WIDTH as i64])],
        }),
    };
    std::fs::write(dir.join("large.onnx"), model.encode_to_vec()).unwrap();
    offset
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let bytes = write_model(dir.path());
    let write_s = t0.elapsed().as_secs_f64();
    let graph_bytes = std::fs::metadata(dir.path().join("large.onnx")).unwrap().len();
    // Peak memory from here on: the import's (clear_refs "5" resets VmHWM to the current RSS).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = peak_rss();
    let t1 = Instant::now();
    let imported = import(&dir.path().join("large.onnx"), &ImportOptions::new()).expect("imports");
    let import_s = t1.elapsed().as_secs_f64();
    let peak = peak_rss();
    let held: usize = imported.params.values().map(|t| t.data.len() * 4).sum();
    println!(
        "onnx import: {LAYERS} projections of {WIDTH}x{WIDTH} f32, graph file {graph_bytes} bytes + \
         external data {bytes} bytes ({:.2} GiB; written in {write_s:.1} s)",
        bytes as f64 / (1u64 << 30) as f64
    );
    println!(
        "import {import_s:.2} s ({:.0} MB/s of initializers), peak RSS {:.0} MiB during the import \
         (RSS before {:.0} MiB); params returned {:.0} MiB f32 in {} tensors, {} ops written",
        bytes as f64 / import_s / 1e6,
        peak as f64 / (1u64 << 20) as f64,
        before as f64 / (1u64 << 20) as f64,
        held as f64 / (1u64 << 20) as f64,
        imported.params.len(),
        imported.toml.matches("[[ops]]").count()
    );
    assert_eq!(imported.params.len(), 2 * LAYERS);
}
