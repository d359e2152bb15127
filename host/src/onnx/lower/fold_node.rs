//! Folding a node whose inputs are all constants (`fold.rs` does the arithmetic), and the
//! output shapes of the reshaping ops.

use super::*;

impl Lower<'_, '_> {
    pub(super) fn const_ints(c: &Option<Rc<Const>>, what: &str) -> Result<Vec<i64>, String> {
        c.as_ref().ok_or_else(|| format!("{what} must be a constant"))?.as_i64()
    }

    /// Evaluate a node whose inputs are all constants.
    pub(super) fn fold(
        &mut self,
        node: &NodeProto,
        attrs: &Attrs,
        c: &[Option<Rc<Const>>],
    ) -> Result<Vec<Const>, String> {
        let op = node.op_type.as_str();
        let x = || c.first().cloned().flatten().ok_or_else(|| "missing input".to_string());
        let y = || c.get(1).cloned().flatten().ok_or_else(|| "missing second input".to_string());
        Ok(vec![match op {
            "Identity" | "Dropout" => (*x()?).clone(),
            "Cast" => fold::cast(&*x()?, attrs.int("to").unwrap_or(1))?,
            // `fmod = 1`: the remainder takes the dividend's sign (C's fmod), else the divisor's.
            "Mod" if attrs.int("fmod") == Some(1) => fold::binary("Fmod", &*x()?, &*y()?)?,
            "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "Equal" | "Less" | "Greater" | "Max" | "Min"
            | "And" | "Or" => fold::binary(op, &*x()?, &*y()?)?,
            "Sqrt" | "Neg" | "Abs" | "Exp" | "Log" | "Sigmoid" | "Tanh" | "Reciprocal" | "Erf" | "Floor"
            | "Ceil" | "Not" => fold::unary(op, &*x()?)?,
            "Transpose" => fold::transpose(&*x()?, &attrs.ints("perm").unwrap_or_default())?,
            "Gather" => fold::gather(&*x()?, &*y()?, attrs.int("axis").unwrap_or(0))?,
            "Concat" => {
                let parts: Vec<&Const> = c.iter().flatten().map(|r| r.as_ref()).collect();
                fold::concat(&parts, attrs.int("axis").unwrap_or(0))?
            }
            "Reshape" => {
                let a = x()?;
                let shape =
                    fold::reshape_shape(&a.shape, &y()?.as_i64()?, attrs.int("allowzero") == Some(1))?;
                a.reshaped(shape)
            }
            "Unsqueeze" | "Squeeze" | "Flatten" => {
                let a = x()?;
                let shape = self.view_shape(op, attrs, &a.shape, c.get(1).cloned().flatten())?;
                a.reshaped(shape)
            }
            "ConstantOfShape" => {
                let shape: Vec<u64> = x()?.as_i64()?.iter().map(|d| (*d).max(0) as u64).collect();
                let n = fold::fold_elements(&shape)?;
                let v = match attrs.tensor("value") {
                    Some(t) => crate::onnx::consts::decode(t, self.ext)?,
                    None => Const::f(vec![1], vec![0.0]),
                };
                match v.data {
                    crate::onnx::consts::Data::F(f) => Const::f(shape, vec![*f.first().unwrap_or(&0.0); n]),
                    crate::onnx::consts::Data::I(i) => Const::i(shape, vec![*i.first().unwrap_or(&0); n]),
                }
            }
            "Expand" => {
                let a = x()?;
                let want: Vec<u64> = y()?.as_i64()?.iter().map(|d| (*d).max(0) as u64).collect();
                let shape = ipu_core::graph::broadcast_shape(&a.shape, &want)
                    .ok_or_else(|| format!("Expand of {:?} to {want:?}", a.shape))?;
                a.pick(shape.clone(), &fold::broadcast_index(&shape, &a.shape)?)
            }
            "Tile" => {
                let a = x()?;
                let reps = y()?.as_i64()?;
                if reps.len() != a.shape.len() || reps.iter().any(|r| *r < 1) {
                    return Err(format!("Tile repeats {reps:?} for shape {:?}", a.shape));
                }
                let tiled: Vec<u64> =
                    a.shape.iter().zip(&reps).map(|(d, r)| d.saturating_mul(*r as u64)).collect();
                fold::fold_elements(&tiled)?;
                let mut cur = (*a).clone();
                for (ax, r) in reps.iter().enumerate() {
                    let d = cur.shape[ax] as usize;
                    let picks: Vec<usize> = (0..*r as usize * d).map(|i| i % d).collect();
                    cur = fold::slice_axis(&cur, ax, &picks);
                }
                cur
            }
            "Slice" => {
                let mut a = (*x()?).clone();
                let starts = Self::const_ints(&c.get(1).cloned().flatten(), "starts")?;
                let ends = Self::const_ints(&c.get(2).cloned().flatten(), "ends")?;
                let axes = match c.get(3).cloned().flatten() {
                    Some(v) => v.as_i64()?,
                    None => (0..starts.len() as i64).collect(),
                };
                let steps = match c.get(4).cloned().flatten() {
                    Some(v) => v.as_i64()?,
                    None => vec![1; starts.len()],
                };
                if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
                    return Err("Slice: starts, ends, axes and steps differ in length".into());
                }
                for k in 0..starts.len() {
                    let ax = fold::axis(axes[k], a.shape.len())?;
                    let picks = fold::slice_range(a.shape[ax], starts[k], ends[k], steps[k])?;
                    a = fold::slice_axis(&a, ax, &picks);
                }
                a
            }
            "Split" => return self.split(node, attrs, c),
            "Range" => {
                let (s, l, d) = (
                    x()?.as_f64(),
                    y()?.as_f64(),
                    c.get(2).cloned().flatten().ok_or("Range: no delta")?.as_f64(),
                );
                let (s, l, d) = (s[0], l[0], d[0]);
                let n = if d == 0.0 { 0.0 } else { ((l - s) / d).ceil().max(0.0) };
                if n.is_nan() || n > fold::FOLD_MAX as f64 {
                    return Err(format!("Range of more than {} values", fold::FOLD_MAX));
                }
                let v: Vec<f64> = (0..n as usize).map(|i| s + i as f64 * d).collect();
                match x()?.data {
                    crate::onnx::consts::Data::I(_) => {
                        Const::i(vec![v.len() as u64], v.iter().map(|x| *x as i64).collect())
                    }
                    crate::onnx::consts::Data::F(_) => {
                        Const::f(vec![v.len() as u64], v.iter().map(|x| *x as f32).collect())
                    }
                }
            }
            "Where" => {
                let (cond, a, b) = (x()?, y()?, c.get(2).cloned().flatten().ok_or("Where: 3 inputs")?);
                let s1 = ipu_core::graph::broadcast_shape(&cond.shape, &a.shape).ok_or("Where: shapes")?;
                let shape = ipu_core::graph::broadcast_shape(&s1, &b.shape).ok_or("Where: shapes")?;
                let (ic, ia, ib) = (
                    fold::broadcast_index(&shape, &cond.shape)?,
                    fold::broadcast_index(&shape, &a.shape)?,
                    fold::broadcast_index(&shape, &b.shape)?,
                );
                let cv = cond.as_f64();
                match (&a.data, &b.data) {
                    (crate::onnx::consts::Data::I(p), crate::onnx::consts::Data::I(q)) => Const::i(
                        shape,
                        (0..ic.len()).map(|k| if cv[ic[k]] != 0.0 { p[ia[k]] } else { q[ib[k]] }).collect(),
                    ),
                    _ => {
                        let (p, q) = (a.as_f32(), b.as_f32());
                        Const::f(
                            shape,
                            (0..ic.len())
                                .map(|k| if cv[ic[k]] != 0.0 { p[ia[k]] } else { q[ib[k]] })
                                .collect(),
                        )
                    }
                }
            }
            "MatMul" => fold::matmul(&*x()?, &*y()?)?,
            "Gemm" => {
                let (mut a, mut b) = ((*x()?).clone(), (*y()?).clone());
                if attrs.int("transA") == Some(1) {
                    a = fold::transpose(&a, &[])?;
                }
                if attrs.int("transB") == Some(1) {
                    b = fold::transpose(&b, &[])?;
                }
                let mut p = fold::matmul(&a, &b)?;
                let alpha = attrs.float("alpha").unwrap_or(1.0);
                p = fold::binary("Mul", &p, &Const::f(vec![], vec![alpha]))?;
                if let Some(cc) = c.get(2).cloned().flatten() {
                    let beta = attrs.float("beta").unwrap_or(1.0);
                    p = fold::binary("Add", &p, &fold::binary("Mul", &cc, &Const::f(vec![], vec![beta]))?)?;
                }
                p
            }
            _ => return Err(format!("this op is not supported; supported ops: {SUPPORTED}")),
        }])
    }

    pub(super) fn split(
        &mut self,
        node: &NodeProto,
        attrs: &Attrs,
        c: &[Option<Rc<Const>>],
    ) -> Result<Vec<Const>, String> {
        let a = c.first().cloned().flatten().ok_or("missing input")?;
        let ax = fold::axis(attrs.int("axis").unwrap_or(0), a.shape.len())?;
        let d = a.shape[ax];
        let parts = node.output.len() as u64;
        let sizes: Vec<u64> = match (c.get(1).cloned().flatten(), attrs.ints("split")) {
            (Some(s), _) => s.as_i64()?.iter().map(|v| (*v).max(0) as u64).collect(),
            (None, Some(s)) if !s.is_empty() => s.iter().map(|v| (*v).max(0) as u64).collect(),
            _ => {
                let n = attrs.int("num_outputs").map(|n| n as u64).unwrap_or(parts).max(1);
                let each = d.div_ceil(n);
                (0..n).map(|k| each.min(d.saturating_sub(k * each))).collect()
            }
        };
        if sizes.iter().sum::<u64>() != d || sizes.len() as u64 != parts {
            return Err(format!("Split of an axis of {d} into {sizes:?} for {parts} outputs"));
        }
        let mut start = 0usize;
        Ok(sizes
            .iter()
            .map(|n| {
                let picks: Vec<usize> = (start..start + *n as usize).collect();
                start += *n as usize;
                fold::slice_axis(&a, ax, &picks)
            })
            .collect())
    }

    /// Output shape of `Squeeze`, `Unsqueeze` and `Flatten`.
    pub(super) fn view_shape(
        &self,
        op: &str,
        attrs: &Attrs,
        shape: &[u64],
        axes_in: Option<Rc<Const>>,
    ) -> Result<Vec<u64>, String> {
        let axes = match (axes_in, attrs.ints("axes")) {
            (Some(a), _) => Some(a.as_i64()?),
            (None, a) => a,
        };
        match op {
            "Flatten" => {
                let ax = attrs.int("axis").unwrap_or(1);
                let ax = if ax < 0 { ax + shape.len() as i64 } else { ax } as usize;
                if ax > shape.len() {
                    return Err(format!("Flatten axis {ax} of rank {}", shape.len()));
                }
                Ok(vec![shape[..ax].iter().product(), shape[ax..].iter().product()])
            }
            "Squeeze" => {
                let axes: Vec<usize> = match axes {
                    Some(a) => a.iter().map(|x| fold::axis(*x, shape.len())).collect::<Result<_, _>>()?,
                    None => (0..shape.len()).filter(|k| shape[*k] == 1).collect(),
                };
                if axes.iter().any(|k| shape[*k] != 1) {
                    return Err(format!("Squeeze of axes {axes:?} of {shape:?}: not of size 1"));
                }
                Ok(shape.iter().enumerate().filter(|(k, _)| !axes.contains(k)).map(|(_, d)| *d).collect())
            }
            _ => {
                let axes = axes.ok_or("Unsqueeze without axes")?;
                let r = shape.len() + axes.len();
                let mut ax: Vec<usize> = axes.iter().map(|x| fold::axis(*x, r)).collect::<Result<_, _>>()?;
                ax.sort_unstable();
                let mut out = Vec::with_capacity(r);
                let mut it = shape.iter();
                for k in 0..r {
                    out.push(if ax.contains(&k) { 1 } else { *it.next().ok_or("Unsqueeze axes repeat")? });
                }
                Ok(out)
            }
        }
    }
}
