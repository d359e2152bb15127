//! ONNX import (docs/onnx.md): an `.onnx` file (and its external data) → a model file in our
//! format plus param values, which `build` then plans like any model.
//!
//! Steps: decode the protobuf (`prost`, [`proto`]); resolve initializers, mapping external data
//! once ([`consts`]); keep only the nodes the graph outputs need; recognise the patterns torch
//! writes for one op (a decomposed LayerNorm, a patch-embedding `Conv` with its flatten and
//! transpose); then walk the nodes in order ([`lower`]): whatever depends only on constants is
//! folded ([`fold`]), scalar elementwise chains stay symbolic until used ([`expr`]), the rest
//! becomes ops of the graph IR ([`emit`]).

pub mod calibrate;
pub mod consts;
pub mod emit;
pub mod expr;
pub mod fold;
mod lower;
mod patterns;
pub mod proto;

pub use lower::DEFAULT_ACTIVATION_RANGE;

use crate::reference::HostTensor;
use prost::Message;
use std::collections::BTreeMap;
use std::path::Path;

/// How matmul weights are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weights {
    /// f16 (round to nearest even).
    F16,
    /// FP8 E4M3 with a power-of-two scale per weight; activations cast to FP8 before the matmul.
    Fp8,
}

/// Import settings.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// Matmul weight storage.
    pub weights: Weights,
    /// Shapes for inputs whose dimensions the file leaves symbolic (`--input-shape`).
    pub input_shapes: BTreeMap<String, Vec<u64>>,
    /// Largest absolute value of each matmul's activation operand, by the ONNX name of the
    /// matmul's output (FP8 scales; from a calibration run). Missing entries use a default.
    pub activation_ranges: BTreeMap<String, f32>,
}

impl ImportOptions {
    /// f16 weights, no input shapes given.
    pub fn new() -> ImportOptions {
        ImportOptions {
            weights: Weights::F16,
            input_shapes: BTreeMap::new(),
            activation_ranges: BTreeMap::new(),
        }
    }
}

impl Default for ImportOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// An imported model.
pub struct Imported {
    /// The model file text (docs/model-format.md).
    pub toml: String,
    /// Param values (f32), their dtype in the model text decides the conversion.
    pub params: BTreeMap<String, HostTensor>,
    /// One line per FP8 weight: its name and scale.
    pub scales: Vec<(String, i8)>,
    /// ONNX nodes in the file, and how many the outputs needed.
    pub nodes: (usize, usize),
}

/// Whether `bytes` look like an ONNX model rather than text: a protobuf whose first field is
/// `ir_version` (field 1, varint: byte 0x08). Model files in our format are UTF-8 text and never
/// start with a control byte.
pub fn looks_like_onnx(bytes: &[u8]) -> bool {
    bytes.first() == Some(&0x08)
}

/// Import `path` (external data is looked up beside it).
pub fn import(path: &Path, opts: &ImportOptions) -> Result<Imported, String> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| format!("{file}: {e}"))?;
    import_bytes(bytes, &file, path.parent().unwrap_or(Path::new(".")), opts)
}

/// Import a model's bytes; `file` names it in messages, external data is looked up in `dir`.
pub fn import_bytes(
    bytes: Vec<u8>,
    file: &str,
    dir: &Path,
    opts: &ImportOptions,
) -> Result<Imported, String> {
    let file = file.to_string();
    let model = proto::ModelProto::decode(bytes::Bytes::from(bytes))
        .map_err(|e| format!("{file}: not a valid ONNX model (protobuf: {e})"))?;
    let graph = model.graph.as_ref().ok_or_else(|| format!("{file}: the model has no graph"))?;
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .ok_or_else(|| format!("{file}: the model imports no version of the default ONNX opset"))?;
    let mut ext = consts::External { dir, maps: BTreeMap::new() };
    // Initializers are decoded when a node first reads them (and dropped after the last), so
    // a model's weights are not all held at once beside the params made of them.
    let init = graph.initializer.iter().map(|t| (t.name.clone(), t)).collect();
    let name = if graph.name.is_empty() { "onnx_model".to_string() } else { graph.name.clone() };
    let mut l = lower::Lower::new(&file, opset, opts, init, &mut ext);
    l.inputs(graph)?;
    let found = patterns::find(graph);
    let needed = patterns::needed(graph, &found);
    let mut used = 0;
    for (i, node) in graph.node.iter().enumerate() {
        if !needed[i] {
            continue;
        }
        used += 1;
        if found.get(&i) == Some(&patterns::Pattern::Inside) {
            l.placeholder(node);
        } else {
            l.node(graph, node, found.get(&i))?;
        }
    }
    let (toml, params, scales) = l.finish(graph, &name)?;
    Ok(Imported { toml, params, scales, nodes: (graph.node.len(), used) })
}
