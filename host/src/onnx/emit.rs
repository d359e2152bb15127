//! Writing the imported graph as a model file (docs/model-format.md): the TOML text that the
//! package carries as its model source, so an imported model is planned, checked and read back
//! exactly like a hand-written one. Params are declared as keys of a `params.safetensors` next to
//! the model (what `ipu-codegen import` writes); `build` hands their values over in memory.

use crate::reference::HostTensor;
use ipu_schema::DType;
use std::collections::BTreeSet;
use std::fmt::Write;

/// A field value of an `[[ops]]` entry.
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
    params_text: String,
    ops: String,
    /// Param values in declaration order (f32 values; converted to the param's dtype by the build).
    pub params: Vec<(String, HostTensor, i8)>,
    /// Ops emitted so far.
    pub op_count: usize,
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

impl Emit {
    /// An empty model.
    pub fn new() -> Emit {
        Emit {
            names: BTreeSet::new(),
            inputs: String::new(),
            params_text: String::new(),
            ops: String::new(),
            params: Vec::new(),
            op_count: 0,
        }
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
    pub fn param(&mut self, base: &str, dtype: DType, scale: i8, shape: Vec<u64>, values: Vec<f32>) -> String {
        let name = self.fresh(base);
        let scale_line = if scale != 0 { format!("scale = {scale}\n") } else { String::new() };
        let _ = writeln!(
            self.params_text,
            "[params.{}]\ndtype = \"{}\"\nshape = {:?}\n{scale_line}safetensors = \"params.safetensors\"\nkey = {}\n",
            quote(&name),
            dtype.name(),
            shape,
            quote(&name)
        );
        self.params.push((name.clone(), HostTensor { dtype: DType::F32, shape, data: values }, scale));
        name
    }

    /// Append an op; `fields` in the order they are written.
    pub fn op(&mut self, kind: &str, fields: &[(&str, Field)]) {
        let _ = writeln!(self.ops, "[[ops]]\nop = \"{kind}\"");
        for (k, v) in fields {
            let _ = match v {
                Field::S(s) => writeln!(self.ops, "{k} = {}", quote(s)),
                Field::Ints(v) => writeln!(self.ops, "{k} = {v:?}"),
                Field::F(x) => writeln!(self.ops, "{k} = {x:?}"),
                Field::I(x) => writeln!(self.ops, "{k} = {x}"),
            };
        }
        self.ops.push('\n');
        self.op_count += 1;
    }

    /// The model file text.
    pub fn finish(&self, name: &str, outputs: &[String], header: &str) -> String {
        let outs: Vec<String> = outputs.iter().map(|o| quote(o)).collect();
        format!(
            "{header}name = {}\noutputs = [{}]\n\n{}{}{}",
            quote(name),
            outs.join(", "),
            self.inputs,
            self.params_text,
            self.ops
        )
    }
}
