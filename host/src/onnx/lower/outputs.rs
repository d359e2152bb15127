//! The graph outputs: each computed value cast to the output's element type under its ONNX name
//! and viewed in its ONNX shape; then the model text, the params and the FP8 scales.

use super::*;

impl Lower<'_, '_> {
    /// The graph outputs: each computed value cast to the output's element type under the ONNX
    /// name. Returns the model text, the param values and the FP8 scales chosen.
    pub fn finish(mut self, g: &GraphProto, name: &str) -> Result<Finished, String> {
        let mut outs = Vec::new();
        for o in &g.output {
            let at = format!("{}: output `{}`", self.file, o.name);
            let r = match self.vals.get(&o.name).cloned() {
                Some(Val::R(r)) => r,
                Some(Val::C(_)) => return Err(format!("{at}: a constant, not computed on the chip")),
                None => return Err(format!("{at}: no node computes it")),
            };
            let t = self.tensor(&r, &at)?;
            let elem = o
                .r#type
                .as_ref()
                .and_then(|t| t.tensor_type.as_ref())
                .map(|t| t.elem_type)
                .unwrap_or(data_type::FLOAT);
            // The ONNX dtype (a cast to f32 unless FLOAT16) under the ONNX name, viewed in the
            // ONNX shape when the tensor is held without leading unit axes.
            let (dtype, t) = match elem {
                data_type::FLOAT16 => ("f16", t),
                _ if strip(&r.shape) == r.shape => {
                    self.emit.op(
                        "cast",
                        &[("input", Field::S(t)), ("output", Field::S(o.name.clone())), ("dtype", s("f32"))],
                    );
                    outs.push(o.name.clone());
                    continue;
                }
                _ => {
                    let wide = self.emit.fresh(&format!("{}_f32", o.name));
                    self.emit.op(
                        "cast",
                        &[("input", Field::S(t)), ("output", Field::S(wide.clone())), ("dtype", s("f32"))],
                    );
                    ("f32", wide)
                }
            };
            let shape: Vec<i64> = r.shape.iter().map(|d| *d as i64).collect();
            let fields =
                [("input", Field::S(t)), ("shape", Field::Ints(shape)), ("output", Field::S(o.name.clone()))];
            let mut fields = fields.to_vec();
            fields.push(("dtype", s(dtype)));
            self.emit.op("reshape", &fields);
            outs.push(o.name.clone());
        }
        // The file's name only: the package must not depend on the directory it was built from.
        let name_only = std::path::Path::new(self.file).file_name().map(|n| n.to_string_lossy().into_owned());
        let header = format!(
            "# Imported from {} by ipu-codegen {}.\n",
            name_only.unwrap_or_default(),
            env!("CARGO_PKG_VERSION")
        );
        self.emit.prune(&outs);
        let toml = self.emit.finish(name, &outs, &header);
        let live: BTreeSet<&String> = self.emit.params.iter().map(|p| &p.0).collect();
        self.scales.retain(|(n, _)| {
            live.contains(n) || toml.contains(&format!("output = {}", crate::onnx::emit::quote(n)))
        });
        let params = self.emit.params.drain(..).map(|(n, _, _, t)| (n, t)).collect();
        Ok((toml, params, self.scales))
    }
}
