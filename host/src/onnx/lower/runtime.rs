//! Lowering a node with at least one computed input onto ops of the graph IR.

use super::*;

impl Lower<'_, '_> {
    /// A node with at least one runtime input.
    pub(super) fn runtime(
        &mut self,
        node: &NodeProto,
        attrs: &Attrs,
        ins: &[Option<Val>],
        consts: &[Option<Rc<Const>>],
        at: &str,
    ) -> Result<(), String> {
        let op = node.op_type.as_str();
        let r0 = match ins.first() {
            Some(Some(Val::R(r))) => Some(r.clone()),
            _ => None,
        };
        let need_r0 =
            || r0.clone().ok_or_else(|| format!("{at}: the first input must be computed on the chip"));
        match op {
            "Identity" | "Dropout" => self.define(node, 0, Val::R(need_r0()?)),
            "Cast" if attrs.int("to") == Some(data_type::BOOL as i64) => self.cast_bool(node, need_r0()?, at)?,
            "GatherND" => self.gather_nd_node(node, attrs, ins, at)?,
            "And" => self.and(node, ins, at)?,
            "Cast" => {
                let to = attrs.int("to").unwrap_or(0) as i32;
                if !matches!(to, data_type::FLOAT | data_type::FLOAT16 | data_type::DOUBLE) {
                    return Err(format!("{at}: a cast of a computed tensor to {} is not supported", data_type::name(to)));
                }
                self.define(node, 0, Val::R(need_r0()?));
            }
            "MatMul" => {
                let (a, b) = (ins[0].clone().unwrap(), ins.get(1).cloned().flatten().ok_or(format!("{at}: one input"))?);
                let out = self.out_name(node);
                let prov = projection(&a, &b, 1.0, None);
                let (t, shape) = self.matmul(a, b, 1.0, &out, at)?;
                let prov = prov
                    .filter(|_| fold::fold_elements(&shape).is_ok())
                    .map(|p| Rc::new(Prov { idx: Rc::new(iota(&shape)), ..p }));
                self.define(node, 0, Val::R(Run { t, shape, e: Rc::new(Expr::X), prov }));
            }
            "Gemm" => {
                let (a, b) = (ins[0].clone().unwrap(), ins.get(1).cloned().flatten().ok_or(format!("{at}: one input"))?);
                let a = match (a, attrs.int("transA")) {
                    (Val::C(c), Some(1)) => Val::C(Rc::new(fold::transpose(&c, &[])?)),
                    (Val::R(_), Some(1)) => return Err(format!("{at}: transA on a computed tensor is not supported")),
                    (v, _) => v,
                };
                let b = match (b, attrs.int("transB")) {
                    (Val::C(c), Some(1)) => Val::C(Rc::new(fold::transpose(&c, &[])?)),
                    (Val::R(_), Some(1)) => return Err(format!("{at}: transB on a computed tensor is not supported")),
                    (v, _) => v,
                };
                let alpha = attrs.float("alpha").unwrap_or(1.0) as f64;
                let mm = self.emit.fresh(&format!("{}_mm", node.output[0]));
                let (mut t, shape) = self.matmul(a, b, alpha, &mm, at)?;
                if let Some(c) = consts.get(2).cloned().flatten() {
                    let beta = attrs.float("beta").unwrap_or(1.0);
                    let c = Rc::new(fold::binary("Mul", &c, &Const::f(vec![], vec![beta]))?);
                    let p = self.param(&c, &format!("{}_bias", node.output[0]), strip(&c.shape));
                    let out = self.out_name(node);
                    self.binary("add", &t, &p, &out);
                    t = out;
                } else if matches!(ins.get(2), Some(Some(Val::R(_)))) {
                    return Err(format!("{at}: a computed C operand is not supported"));
                }
                self.run(node, t, shape);
            }
            "Add" if self.adds_zero(node, ins) => {}
            "IsNaN" => self.is_nan(node, ins, at)?,
            "Where" => self.where_node(node, ins, at)?,
            "Add" | "Mul" if self.fuse_affine(node, ins) => {}
            "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Tanh" | "Erf" | "Sqrt" | "Exp" | "Neg" | "Abs" | "Reciprocal"
            | "Log" | "Sigmoid" => {
                self.elementwise(node, ins, at)?
            }
            "Concat" => self.concat(node, attrs, ins, at)?,
            "ReduceMean" | "ReduceSum" => self.reduce(node, attrs, ins, at)?,
            "Relu" | "LeakyRelu" | "Clip" | "Max" | "Min" | "HardSigmoid" | "HardSwish" => {
                self.activation(node, attrs, ins, at)?
            }
            "Gelu" => {
                let r = need_r0()?;
                let t = self.tensor(&r, at)?;
                let form = match attrs.string("approximate").as_deref() {
                    None | Some("none") => "none",
                    Some("tanh") => "tanh",
                    Some(o) => return Err(format!("{at}: approximate = `{o}`")),
                };
                let out = self.out_name(node);
                self.emit.op(
                    "gelu",
                    &[("input", Field::S(t)), ("output", Field::S(out.clone())), ("dtype", s("f16")), ("approximate", s(form))],
                );
                self.run(node, out, r.shape);
            }
            "LayerNormalization" => {
                let r = need_r0()?;
                let rank = r.shape.len();
                if fold::axis(attrs.int("axis").unwrap_or(-1), rank)? != rank - 1 {
                    return Err(format!("{at}: normalising over axes other than the last is not supported"));
                }
                let t = self.tensor(&r, at)?;
                let d = *r.shape.last().unwrap_or(&1);
                let mut fields = vec![("input", Field::S(t))];
                for (k, field) in [(1, "gamma"), (2, "beta")] {
                    match ins.get(k) {
                        Some(Some(Val::C(c))) => {
                            if c.len() as u64 != d {
                                return Err(format!("{at}: {field} has {} values for rows of {d}", c.len()));
                            }
                            let p = self.param(c, &format!("{}_{field}", node.name_or(k)), vec![d]);
                            fields.push((field, Field::S(p)));
                        }
                        Some(Some(Val::R(_))) => return Err(format!("{at}: a computed {field} is not supported")),
                        _ => {}
                    }
                }
                let out = self.out_name(node);
                fields.push(("eps", Field::F(attrs.float("epsilon").unwrap_or(1e-5) as f64)));
                fields.push(("output", Field::S(out.clone())));
                fields.push(("dtype", s("f16")));
                self.emit.op("layernorm", &fields);
                self.run(node, out, r.shape);
            }
            "Softmax" => {
                let r = need_r0()?;
                let default = if self.opset >= 13 { -1 } else { 1 };
                if fold::axis(attrs.int("axis").unwrap_or(default), r.shape.len())? != r.shape.len() - 1 {
                    return Err(format!("{at}: softmax over an axis other than the last is not supported"));
                }
                let t = self.tensor(&r, at)?;
                let out = self.out_name(node);
                self.emit.op("softmax", &[("input", Field::S(t)), ("output", Field::S(out.clone())), ("dtype", s("f16"))]);
                self.run(node, out, r.shape);
            }
            "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => {
                let r = need_r0()?;
                let shape = if op == "Reshape" {
                    let spec = Self::const_ints(&consts.get(1).cloned().flatten(), "the target shape").map_err(|e| format!("{at}: {e}"))?;
                    fold::reshape_shape(&r.shape, &spec, attrs.int("allowzero") == Some(1)).map_err(|e| format!("{at}: {e}"))?
                } else {
                    self.view_shape(op, attrs, &r.shape, consts.get(1).cloned().flatten()).map_err(|e| format!("{at}: {e}"))?
                };
                self.view(node, r, shape, None, at)?;
            }
            "Transpose" => {
                let r = need_r0()?;
                let rank = r.shape.len();
                let perm: Vec<usize> = match attrs.ints("perm") {
                    Some(p) if !p.is_empty() => p.iter().map(|a| fold::axis(*a, rank)).collect::<Result<_, _>>()?,
                    _ => (0..rank).rev().collect(),
                };
                let shape = perm.iter().map(|p| r.shape.get(*p).copied().unwrap_or(0)).collect();
                self.view(node, r, shape, Some(perm), at)?;
            }
            "Gather" if matches!(ins.first(), Some(Some(Val::C(_)))) => self.lookup(node, attrs, ins, at)?,
            "Gather" | "Slice" | "Expand" => {
                let r = need_r0()?;
                let same = self.selects_everything(op, attrs, &r.shape, consts).map_err(|e| format!("{at}: {e}"))?;
                match (same, &r.prov) {
                    (Some(shape), _) => self.view(node, r, shape, None, at)?,
                    (None, Some(p)) if *r.e == Expr::X && op != "Expand" => {
                        let mut cs = consts.to_vec();
                        cs[0] = Some(p.idx.clone());
                        let idx = self.fold(node, attrs, &cs).map_err(|e| format!("{at}: {e}"))?.remove(0);
                        if columns_of(p, &idx)?.is_some() {
                            let v = self.select(node, 0, p.clone(), idx, at)?;
                            self.define(node, 0, v);
                        } else if self.select_box(node, &r, attrs, consts, at)?.is_none() {
                            return Err(format!(
                                "{at}: this selection of a projection's output is neither a set of its columns \
                                 nor a box (a Slice with steps of 1, a Gather of one index)"
                            ));
                        }
                    }
                    (None, _) if op != "Expand" && self.select_box(node, &r, attrs, consts, at)?.is_some() => {}
                    (None, _) => {
                        return Err(format!(
                            "{at}: selecting part of a computed tensor is supported as a box (a Slice with steps \
                             of 1, a Gather of one index) or as columns of a projection by constant weights"
                        ))
                    }
                }
            }
            "Split" => {
                let r = need_r0()?;
                let p = r.prov.clone().filter(|_| *r.e == Expr::X).ok_or_else(|| {
                    format!("{at}: Split of a computed tensor is supported for a projection by constant weights")
                })?;
                let mut cs = consts.to_vec();
                cs[0] = Some(p.idx.clone());
                let parts = self.fold(node, attrs, &cs).map_err(|e| format!("{at}: {e}"))?;
                for (k, idx) in parts.into_iter().enumerate() {
                    let v = self.select(node, k, p.clone(), idx, at)?;
                    self.define(node, k, v);
                }
            }
            "Conv" => {
                return Err(format!(
                    "{at}: Conv is supported as a patch embedding: stride equal to the kernel, no padding, followed by \
                     Flatten/Reshape to [N, C, patches] and Transpose(0, 2, 1)"
                ))
            }
            _ => return Err(format!("{at}: not supported on a computed tensor; supported ops: {SUPPORTED}")),
        }
        Ok(())
    }

    /// The part `idx` (flat indices into the projection's output, in the shape of the result)
    /// of a projection: when it is whole rows of a subset of the columns, that subset projected
    /// on its own and viewed in the result's shape.
    pub(super) fn select(
        &mut self,
        node: &NodeProto,
        k: usize,
        p: Rc<Prov>,
        idx: Const,
        at: &str,
    ) -> Result<Val, String> {
        let Some(cols) = columns_of(&p, &idx)? else {
            return Err(format!("{at}: this selection of a projection's output is not a set of its columns"));
        };
        let w = Rc::new(fold::slice_axis(&p.w, 1, &cols));
        let n = p.w.shape[1];
        let bias = p.bias.as_ref().map(|b| Rc::new(fold::slice_axis(&b.reshaped(vec![n]), 0, &cols)));
        let base = node.output.get(k).cloned().unwrap_or_default();
        let out = self.emit.fresh(&format!("{base}_proj"));
        let (mut t, shape) = self.matmul(Val::R(p.x.clone()), Val::C(w.clone()), p.alpha, &out, at)?;
        if let Some(b) = &bias {
            let name = self.param(b, &format!("{base}_bias"), vec![cols.len() as u64]);
            let o = self.emit.fresh(&format!("{base}_biased"));
            self.binary("add", &t, &name, &o);
            t = o;
        }
        let t = self.emit_view(&t, &shape, &idx.shape, None, &base)?;
        let prov = Prov {
            x: p.x.clone(),
            w,
            bias,
            alpha: p.alpha,
            idx: Rc::new(iota(&shape).reshaped(idx.shape.clone())),
        };
        Ok(Val::R(Run { t, shape: idx.shape.clone(), e: Rc::new(Expr::X), prov: Some(Rc::new(prov)) }))
    }

    /// `Gather`/`Slice`/`Expand` that keep every element: the output shape, else `None`.
    pub(super) fn selects_everything(
        &self,
        op: &str,
        attrs: &Attrs,
        shape: &[u64],
        c: &[Option<Rc<Const>>],
    ) -> Result<Option<Vec<u64>>, String> {
        let arg = |k: usize| c.get(k).cloned().flatten();
        match op {
            "Gather" => {
                let idx = arg(1).ok_or("indices must be constant")?;
                let ax = fold::axis(attrs.int("axis").unwrap_or(0), shape.len())?;
                let i = idx.as_i64()?;
                if shape[ax] != 1 || i.len() != 1 || !(i[0] == 0 || i[0] == -1) {
                    return Ok(None);
                }
                let mut out = shape[..ax].to_vec();
                out.extend(&idx.shape);
                out.extend(&shape[ax + 1..]);
                Ok(Some(out))
            }
            "Slice" => {
                let starts = Self::const_ints(&arg(1), "starts")?;
                let ends = Self::const_ints(&arg(2), "ends")?;
                let axes = match arg(3) {
                    Some(a) => a.as_i64()?,
                    None => (0..starts.len() as i64).collect(),
                };
                let steps = match arg(4) {
                    Some(a) => a.as_i64()?,
                    None => vec![1; starts.len()],
                };
                for k in 0..starts.len().min(ends.len()).min(axes.len()).min(steps.len()) {
                    let ax = fold::axis(axes[k], shape.len())?;
                    let picks = fold::slice_range(shape[ax], starts[k], ends[k], steps[k])?;
                    if picks != (0..shape[ax] as usize).collect::<Vec<_>>() {
                        return Ok(None);
                    }
                }
                Ok(Some(shape.to_vec()))
            }
            _ => {
                let want: Vec<u64> = arg(1)
                    .ok_or("shape must be constant")?
                    .as_i64()?
                    .iter()
                    .map(|d| (*d).max(0) as u64)
                    .collect();
                Ok(ipu_core::graph::broadcast_shape(shape, &want).filter(|s| s == shape))
            }
        }
    }

    pub(super) fn elementwise(
        &mut self,
        node: &NodeProto,
        ins: &[Option<Val>],
        at: &str,
    ) -> Result<(), String> {
        let op = node.op_type.as_str();
        let op: &'static str = [
            "Add",
            "Sub",
            "Mul",
            "Div",
            "Pow",
            "Tanh",
            "Erf",
            "Sqrt",
            "Exp",
            "Neg",
            "Abs",
            "Reciprocal",
            "Log",
            "Sigmoid",
        ]
        .into_iter()
        .find(|o| *o == op)
        .unwrap_or("Add");
        let runs: Vec<&Run> =
            ins.iter().filter_map(|v| if let Some(Val::R(r)) = v { Some(r) } else { None }).collect();
        let base = runs[0];
        let symbolic = runs.iter().all(|r| r.t == base.t && r.shape == base.shape)
            && ins.iter().all(|v| match v {
                Some(Val::C(c)) => c.len() == 1 && c.shape.len() <= base.shape.len(),
                _ => true,
            });
        if symbolic {
            let term = |v: &Option<Val>| match v {
                Some(Val::R(r)) => r.e.clone(),
                Some(Val::C(c)) => Rc::new(Expr::C(c.scalar().unwrap_or(0.0))),
                None => Rc::new(Expr::C(0.0)),
            };
            let e = if ins.len() == 1 {
                Expr::Un(op, term(&ins[0]))
            } else {
                Expr::Bin(op, term(&ins[0]), term(&ins[1]))
            };
            self.define(
                node,
                0,
                Val::R(Run { t: base.t.clone(), shape: base.shape.clone(), e: Rc::new(e), prov: None }),
            );
            return Ok(());
        }
        if !matches!(op, "Add" | "Sub" | "Mul" | "Div") || ins.len() != 2 {
            return Err(format!(
                "{at}: {op} of tensors computed on the chip is supported only as part of a recognised composition"
            ));
        }
        let mut names = Vec::new();
        let mut shapes = Vec::new();
        for (k, v) in ins.iter().enumerate() {
            match v {
                Some(Val::R(r)) => {
                    let t = self.tensor(r, at)?;
                    // a / b = a · (1/b)
                    names.push(if op == "Div" && k == 1 { self.reciprocal(&t) } else { t });
                    shapes.push(r.shape.clone());
                }
                Some(Val::C(c)) => {
                    let c = if op == "Div" { Rc::new(fold::unary("Reciprocal", c)?) } else { c.clone() };
                    let shape = if c.shape.is_empty() { vec![1] } else { c.shape.clone() };
                    names.push(self.param(&c, &format!("{}_c{k}", node.output[0]), strip(&shape)));
                    shapes.push(shape);
                }
                None => return Err(format!("{at}: missing input")),
            }
        }
        let shape = ipu_core::graph::broadcast_shape(&shapes[0], &shapes[1])
            .ok_or_else(|| format!("{at}: shapes {:?} and {:?} do not broadcast", shapes[0], shapes[1]))?;
        let out = self.out_name(node);
        let ours = match op {
            "Add" => "add",
            "Sub" => "sub",
            _ => "mul",
        };
        self.binary(ours, &names[0], &names[1], &out);
        // A bias added to a projection's output (either operand order) stays part of it.
        let prov = match (op, &ins[0], &ins[1]) {
            ("Add", Some(Val::R(r)), Some(Val::C(c))) | ("Add", Some(Val::C(c)), Some(Val::R(r))) => {
                r.prov.as_ref().and_then(|p| {
                    let n = p.w.shape[1];
                    let per_column = c.len() as u64 == n
                        && c.shape.last() == Some(&n)
                        && shape == r.shape
                        && is_iota(&p.idx);
                    (per_column && p.bias.is_none() && *r.e == Expr::X).then(|| {
                        Rc::new(Prov {
                            x: p.x.clone(),
                            w: p.w.clone(),
                            bias: Some(c.clone()),
                            alpha: p.alpha,
                            idx: p.idx.clone(),
                        })
                    })
                })
            }
            _ => None,
        };
        self.define(node, 0, Val::R(Run { t: out, shape, e: Rc::new(Expr::X), prov }));
        Ok(())
    }
}

/// The columns of projection `p` that `idx` (flat indices into its output) selects, when it
/// selects whole rows of a set of columns.
fn columns_of(p: &Prov, idx: &Const) -> Result<Option<Vec<usize>>, String> {
    let n = p.w.shape[1] as usize;
    let rows = p.x.shape.iter().product::<u64>() as usize / (p.w.shape[0] as usize).max(1);
    let picked = idx.as_i64()?;
    let width = picked.len().checked_div(rows).unwrap_or(0);
    let cols: Vec<usize> = picked.iter().take(width).map(|i| *i as usize % n.max(1)).collect();
    let whole_rows = width > 0
        && width * rows == picked.len()
        && picked.iter().enumerate().all(|(j, i)| *i as usize == (j / width) * n + cols[j % width]);
    Ok(whole_rows.then_some(cols))
}
