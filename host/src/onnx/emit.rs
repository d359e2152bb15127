//! Writing the imported graph as a model file (docs/model-format.md): the TOML text that the
//! package carries as its model source, so an imported model is planned, checked and read back
//! exactly like a hand-written one. Params are declared as keys of a `params.safetensors` next to
//! the model (what `ipu-codegen import` writes); `build` hands their values over in memory.

use crate::reference::HostTensor;
use ipu_schema::DType;
use std::collections::BTreeSet;
use std::fmt::Write;

/// A field value of an `[[ops]]` entry.
#[derive(Clone, Debug)]
pub enum Field {
    /// A tensor or dtype name.
    S(String),
    /// A list of integers.
    Ints(Vec<i64>),
    /// A number.
    F(f64),
    /// An integer.
    I(i64),
}

/// The model being written.
pub struct Emit {
    names: BTreeSet<String>,
    inputs: String,
    ops: Vec<(String, Vec<(String, Field)>)>,
    /// Params in declaration order: name, dtype, scale, and f32 values (converted to the
    /// param's dtype by the build).
    pub params: Vec<(String, DType, i8, HostTensor)>,
}

/// A TOML basic string.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Default for Emit {
    fn default() -> Self {
        Self::new()
    }
}

impl Emit {
    /// An empty model.
    pub fn new() -> Emit {
        Emit { names: BTreeSet::new(), inputs: String::new(), ops: Vec::new(), params: Vec::new() }
    }

    /// Reserve a name the model keeps as it is (graph inputs and outputs).
    pub fn reserve(&mut self, name: &str) {
        self.names.insert(name.to_string());
    }

    /// A tensor name not used yet: `base` itself if free, else `base_1`, `base_2`, …
    pub fn fresh(&mut self, base: &str) -> String {
        let base = if base.is_empty() { "t" } else { base };
        let mut name = base.to_string();
        let mut k = 0;
        while self.names.contains(&name) {
            k += 1;
            name = format!("{base}_{k}");
        }
        self.names.insert(name.clone());
        name
    }

    /// Declare an input.
    pub fn input(&mut self, name: &str, dtype: DType, shape: &[u64]) {
        let _ = writeln!(
            self.inputs,
            "[inputs.{}]\ndtype = \"{}\"\nshape = {:?}\n",
            quote(name),
            dtype.name(),
            shape
        );
    }

    /// Declare a param with its values; returns its tensor name.
    pub fn param(
        &mut self,
        base: &str,
        dtype: DType,
        scale: i8,
        shape: Vec<u64>,
        values: Vec<f32>,
    ) -> String {
        let name = self.fresh(base);
        self.params.push((name.clone(), dtype, scale, HostTensor { dtype: DType::F32, shape, data: values }));
        name
    }

    /// Append an op; `fields` in the order they are written. Returns its index.
    pub fn op(&mut self, kind: &str, fields: &[(&str, Field)]) -> usize {
        self.ops.push((kind.to_string(), fields.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()));
        self.ops.len() - 1
    }

    /// Whether an op written so far reads tensor `t` (any field but its output names it).
    pub fn reads(&self, t: &str) -> bool {
        self.ops.iter().any(|(_, fields)| {
            fields.iter().any(|(k, v)| k != "output" && matches!(v, Field::S(s) if s == t))
        })
    }

    /// A numeric field of an emitted op, if it has one.
    pub fn number(&self, op: usize, field: &str) -> Option<f64> {
        self.ops[op].1.iter().find_map(|(k, v)| match v {
            Field::F(x) if k == field => Some(*x),
            _ => None,
        })
    }

    /// Set (or replace) a numeric field of an emitted op.
    pub fn set_number(&mut self, op: usize, field: &str, value: f64) {
        self.set_field(op, field, Field::F(value));
    }

    /// Set (or replace) a field of an emitted op (new fields go before `output`).
    pub fn set_field(&mut self, op: usize, field: &str, value: Field) {
        let fields = &mut self.ops[op].1;
        match fields.iter_mut().find(|(k, _)| k == field) {
            Some((_, v)) => *v = value,
            None => {
                let at = fields.iter().position(|(k, _)| k == "output").unwrap_or(fields.len());
                fields.insert(at, (field.to_string(), value));
            }
        }
    }

    fn ops_text(&self) -> String {
        let mut out = String::new();
        for (kind, fields) in &self.ops {
            let _ = writeln!(out, "[[ops]]\nop = \"{kind}\"");
            for (k, v) in fields {
                let _ = match v {
                    Field::S(s) => writeln!(out, "{k} = {}", quote(s)),
                    Field::Ints(v) => writeln!(out, "{k} = {v:?}"),
                    Field::F(x) => writeln!(out, "{k} = {x:?}"),
                    Field::I(x) => writeln!(out, "{k} = {x}"),
                };
            }
            out.push('\n');
        }
        out
    }

    /// Drop the ops whose results nothing reads (a projection replaced by narrower ones when
    /// part of it was selected, the matmul of a constant folded away) and the params only they
    /// read.
    pub fn prune(&mut self, outputs: &[String]) {
        let mut live: BTreeSet<String> = outputs.iter().cloned().collect();
        let mut keep = vec![false; self.ops.len()];
        for (i, (_, fields)) in self.ops.iter().enumerate().rev() {
            let out = fields.iter().find(|(k, _)| k == "output");
            if !matches!(out, Some((_, Field::S(o))) if live.contains(o)) {
                continue;
            }
            keep[i] = true;
            for (k, v) in fields {
                if let (true, Field::S(t)) = (matches!(k.as_str(), "a" | "b" | "input" | "gamma" | "beta"), v)
                {
                    live.insert(t.clone());
                }
            }
        }
        let mut k = keep.iter();
        self.ops.retain(|_| *k.next().unwrap_or(&true));
        self.params.retain(|p| live.contains(&p.0));
    }

    /// The model file text.
    pub fn finish(&self, name: &str, outputs: &[String], header: &str) -> String {
        let outs: Vec<String> = outputs.iter().map(|o| quote(o)).collect();
        let mut params = String::new();
        for (name, dtype, scale, t) in &self.params {
            let scale_line = if *scale != 0 { format!("scale = {scale}\n") } else { String::new() };
            let _ = writeln!(
                params,
                "[params.{}]\ndtype = \"{}\"\nshape = {:?}\n{scale_line}safetensors = \"params.safetensors\"\nkey = {}\n",
                quote(name),
                dtype.name(),
                t.shape,
                quote(name)
            );
        }
        format!(
            "{header}name = {}\noutputs = [{}]\n\n{}{}{}",
            quote(name),
            outs.join(", "),
            self.inputs,
            params,
            self.ops_text()
        )
    }
}

/// The param values as a `.safetensors` file (f32), the file the written model names.
pub fn safetensors_bytes(params: &std::collections::BTreeMap<String, HostTensor>) -> Result<Vec<u8>, String> {
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = params
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                t.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
                t.shape.iter().map(|d| *d as usize).collect(),
            )
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = bytes
        .iter()
        .map(|(n, b, s)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| format!("param `{n}`: {e}"))
        })
        .collect::<Result<_, _>>()?;
    safetensors::serialize(views, None).map_err(|e| e.to_string())
}
