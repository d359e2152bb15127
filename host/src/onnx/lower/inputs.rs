//! The graph inputs: FLOAT and FLOAT16 inputs keep their names and shapes (FLOAT cast to f16 on
//! the chip), INT64/INT32 inputs are token ids or integer values (`lookup.rs`, `masks.rs`).

use super::*;

impl Lower<'_, '_> {
    /// Declare the graph inputs (those that are not initializers).
    pub fn inputs(&mut self, g: &GraphProto) -> Result<(), String> {
        self.uses =
            crate::onnx::patterns::consumers(g).into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        self.uses_total = self.uses.clone();
        for o in &g.output {
            self.emit.reserve(&o.name);
        }
        let mut given: BTreeSet<&String> = self.opts.input_shapes.keys().collect();
        for i in &g.input {
            if self.pending.contains_key(&i.name) {
                continue;
            }
            given.remove(&i.name);
            self.emit.reserve(&i.name);
            let at = format!("{}: input `{}`", self.file, i.name);
            let tt = i
                .r#type
                .as_ref()
                .and_then(|t| t.tensor_type.as_ref())
                .ok_or(format!("{at}: not a tensor"))?;
            let dims = tt.shape.as_ref().map(|s| s.dim.as_slice()).unwrap_or(&[]);
            let shape: Vec<u64> = match self.opts.input_shapes.get(&i.name) {
                Some(s) => {
                    if s.len() != dims.len() || dims.iter().zip(s).any(|(d, v)| d.dim_value.is_some_and(|x| x as u64 != *v)) {
                        return Err(format!("{at}: --input-shape {s:?} does not match the file's {:?}", dim_text(dims)));
                    }
                    s.clone()
                }
                None => dims
                    .iter()
                    .map(|d| d.dim_value.filter(|v| *v > 0).map(|v| v as u64))
                    .collect::<Option<_>>()
                    .ok_or_else(|| {
                        format!(
                            "{at}: shape {:?} is not fixed; give it with --input-shape {}=1,3,224,224 (the sizes you run)",
                            dim_text(dims),
                            i.name
                        )
                    })?,
            };
            crate::onnx::consts::elements(&shape).map_err(|e| format!("{at}: {e}"))?;
            let t = match tt.elem_type {
                data_type::FLOAT => {
                    self.emit.input(&i.name, DType::F32, &shape);
                    let t = self.emit.fresh(&format!("{}_f16", i.name));
                    self.emit.op(
                        "cast",
                        &[
                            ("input", Field::S(i.name.clone())),
                            ("output", Field::S(t.clone())),
                            ("dtype", s("f16")),
                        ],
                    );
                    t
                }
                data_type::FLOAT16 => {
                    self.emit.input(&i.name, DType::F16, &shape);
                    i.name.clone()
                }
                data_type::INT64 | data_type::INT32 => match self.ids_width(g, &i.name, &at)? {
                    Some(width) => {
                        let r = self.ids_input(&i.name, &shape, width);
                        self.vals.insert(i.name.clone(), Val::R(r));
                        continue;
                    }
                    None => {
                        // Values (an attention mask): f32 on the host, f16 on the chip.
                        self.emit.integer_input(&i.name, &shape);
                        self.ints.insert(i.name.clone());
                        let t = self.emit.fresh(&format!("{}_f16", i.name));
                        self.emit.op(
                            "cast",
                            &[
                                ("input", Field::S(i.name.clone())),
                                ("output", Field::S(t.clone())),
                                ("dtype", s("f16")),
                            ],
                        );
                        t
                    }
                },
                other => {
                    return Err(format!(
                        "{at}: element type {} (inputs are FLOAT, FLOAT16, or INT64/INT32 token ids)",
                        data_type::name(other)
                    ))
                }
            };
            let held = strip(&shape);
            let t = if held != shape {
                self.write_view(&t, "reshape", &held, &format!("{}_held", i.name))
            } else {
                t
            };
            self.vals.insert(i.name.clone(), Val::R(Run { t, shape, e: Rc::new(Expr::X), prov: None }));
        }
        if let Some(n) = given.first() {
            return Err(format!(
                "{}: --input-shape names `{n}`, which is not an input of the model",
                self.file
            ));
        }
        Ok(())
    }
}

fn dim_text(dims: &[crate::onnx::proto::Dimension]) -> Vec<String> {
    dims.iter()
        .map(|d| match (&d.dim_value, &d.dim_param) {
            (Some(v), _) => v.to_string(),
            (None, Some(p)) => p.clone(),
            _ => "?".into(),
        })
        .collect()
}
