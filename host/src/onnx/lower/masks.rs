//! Attention masks as transformers' BERT exports them: an integer input (`attention_mask`,
//! `[1, T]` of 0/1) that no embedding lookup reads is declared `integer = true` (the host writes
//! its values as f32, `crate::ids`; cast to f16 on the chip, exact up to 2048), then
//! `Cast(to = BOOL)`, `GatherND` (a reshape), `And` with a constant, and
//! `Where(mask, 0, −3.4e38)` added to the scores.
//!
//! Values known to hold integers (`ints`: those inputs and views of them) and booleans (`bools`:
//! 0 or 1) are tracked by ONNX name:
//! - `Cast` of an integer tensor to BOOL is `min(|x|, 1)` (x ≠ 0 for integers), a boolean;
//! - `GatherND` of a computed tensor with constant indices is taken when it keeps every element
//!   in order (a reshape); views of booleans are booleans;
//! - `And` of booleans is their product (constants of 0/1 as params);
//! - `Where(b, p, q)` with `b` boolean and one-value constants is `(p − q)·b + q`, with `p` and
//!   `q` clamped to f16's finite range (±65504): a mask's −3.4e38 becomes −65504, whose softmax
//!   weight is 0 all the same (e^{−65504} is 0 in f32), where −∞ would make 0·∞ = NaN.

use super::*;

/// `GatherND` with `batch_dims` = 0: each index tuple of the last axis of `indices` selects a
/// slice of `data`.
pub(super) fn gather_nd(data: &Const, indices: &Const) -> Result<Const, String> {
    let r = *indices.shape.last().ok_or("GatherND indices of rank 0")? as usize;
    if r == 0 || r > data.shape.len() {
        return Err(format!("GatherND index tuples of {r} into data of rank {}", data.shape.len()));
    }
    let inner: usize = data.shape[r..].iter().product::<u64>() as usize;
    let strides: Vec<usize> = (0..r).map(|k| data.shape[k + 1..].iter().product::<u64>() as usize).collect();
    let ids = indices.as_i64()?;
    let mut idx = Vec::with_capacity(ids.len() / r * inner);
    for tuple in ids.chunks(r) {
        let mut base = 0;
        for (k, &i) in tuple.iter().enumerate() {
            let d = data.shape[k] as i64;
            let i = if i < 0 { i + d } else { i };
            if !(0..d).contains(&i) {
                return Err(format!("GatherND index {i} is out of range for an axis of {d}"));
            }
            base += i as usize * strides[k];
        }
        idx.extend(base..base + inner);
    }
    let mut shape = indices.shape[..indices.shape.len() - 1].to_vec();
    shape.extend(&data.shape[r..]);
    fold::fold_elements(&shape)?;
    Ok(data.pick(shape, &idx))
}

impl Lower<'_, '_> {
    /// Whether ONNX value `name` holds booleans (0 or 1).
    fn is_bool(&self, name: &str) -> bool {
        self.bools.contains(name)
    }

    /// `Cast(to = BOOL)` of a computed tensor that holds integers or booleans.
    pub(super) fn cast_bool(&mut self, node: &NodeProto, r: Run, at: &str) -> Result<(), String> {
        let x = &node.input[0];
        if !(self.ints.contains(x) || self.is_bool(x)) {
            return Err(format!(
                "{at}: a cast to BOOL is supported of integer inputs (an attention mask), not of `{x}`"
            ));
        }
        let c = |v: f64| Rc::new(Expr::C(v));
        let e = Rc::new(Expr::Bin("Min", Rc::new(Expr::Un("Abs", r.e.clone())), c(1.0)));
        self.define(node, 0, Val::R(Run { t: r.t, shape: r.shape, e, prov: None }));
        self.mark_bool(node);
        Ok(())
    }

    fn mark_bool(&mut self, node: &NodeProto) {
        if let Some(o) = node.output.first() {
            self.bools.insert(o.clone());
        }
    }

    /// `GatherND` of a computed tensor: taken when it keeps every element in order.
    pub(super) fn gather_nd_node(
        &mut self,
        node: &NodeProto,
        attrs: &Attrs,
        ins: &[Option<Val>],
        at: &str,
    ) -> Result<(), String> {
        let (Some(Some(Val::R(r))), Some(Some(Val::C(ids)))) = (ins.first(), ins.get(1)) else {
            return Err(format!("{at}: GatherND of a computed tensor needs constant indices"));
        };
        let n = fold::fold_elements(&r.shape).map_err(|e| format!("{at}: {e}"))?;
        let all = Const::i(r.shape.clone(), (0..n as i64).collect());
        let picked = gather_nd(&all, ids).map_err(|e| format!("{at}: {e}"))?;
        if attrs.int("batch_dims").unwrap_or(0) != 0 || !is_iota(&picked) || picked.len() != n {
            return Err(format!(
                "{at}: GatherND of a computed tensor is supported when it keeps every element in order (a reshape)"
            ));
        }
        self.view(node, r.clone(), picked.shape.clone(), None, at)
    }

    /// `And` of booleans: their product.
    pub(super) fn and(&mut self, node: &NodeProto, ins: &[Option<Val>], at: &str) -> Result<(), String> {
        for (k, v) in ins.iter().enumerate() {
            let ok = match v {
                Some(Val::R(_)) => self.is_bool(&node.input[k]),
                Some(Val::C(c)) => c.as_f64().iter().all(|x| *x == 0.0 || *x == 1.0),
                None => false,
            };
            if !ok {
                return Err(format!(
                    "{at}: And is supported of booleans (a cast of an attention mask, constants)"
                ));
            }
        }
        let mul = NodeProto { op_type: "Mul".into(), ..node.clone() };
        self.elementwise(&mul, ins, at)?;
        self.mark_bool(node);
        Ok(())
    }

    /// `Where(b, p, q)` of a boolean `b` and one-value constants: `(p − q)·b + q` (module doc).
    pub(super) fn where_mask(
        &mut self,
        node: &NodeProto,
        ins: &[Option<Val>],
        at: &str,
    ) -> Result<(), String> {
        let scalar = |v: Option<&Option<Val>>| match v {
            Some(Some(Val::C(c))) if c.len() == 1 => c.scalar().map(|x| x.clamp(-65504.0, 65504.0)),
            _ => None,
        };
        let (Some(Some(Val::R(b))), Some(p), Some(q)) = (ins.first(), scalar(ins.get(1)), scalar(ins.get(2)))
        else {
            return Err(format!(
                "{at}: Where of computed tensors is supported as the NaN guard Where(IsNaN(x), constant, x) that \
                 torch writes after an attention's softmax, or of a mask with one-value constants"
            ));
        };
        if !self.is_bool(&node.input[0]) {
            return Err(format!("{at}: Where of a condition not known to hold booleans"));
        }
        let c = |v: f64| Rc::new(Expr::C(v));
        let e = Rc::new(Expr::Bin("Add", Rc::new(Expr::Bin("Mul", b.e.clone(), c(p - q))), c(q)));
        self.define(node, 0, Val::R(Run { t: b.t.clone(), shape: b.shape.clone(), e, prov: None }));
        Ok(())
    }

    /// After a view of a computed tensor: its output holds booleans (or integers) if its input
    /// does.
    pub(super) fn carry_kinds(&mut self, node: &NodeProto) {
        let views =
            ["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity", "Expand", "GatherND"];
        let Some(x) = node.input.first() else { return };
        if !views.contains(&node.op_type.as_str()) {
            return;
        }
        for set in [&mut self.bools, &mut self.ints] {
            if set.contains(x) {
                set.extend(node.output.iter().cloned());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_nd_follows_the_onnx_examples() {
        let data = Const::i(vec![2, 2], vec![0, 1, 2, 3]);
        let g = gather_nd(&data, &Const::i(vec![2, 2], vec![0, 0, 1, 1])).unwrap();
        assert_eq!((g.shape.clone(), g.as_i64().unwrap()), (vec![2], vec![0, 3]));
        let g = gather_nd(&data, &Const::i(vec![2, 1], vec![1, 0])).unwrap();
        assert_eq!((g.shape.clone(), g.as_i64().unwrap()), (vec![2, 2], vec![2, 3, 0, 1]));
        // Negative indices count from the end; out of range and too-long tuples are errors.
        let g = gather_nd(&data, &Const::i(vec![1, 2], vec![-1, -2])).unwrap();
        assert_eq!(g.as_i64().unwrap(), vec![2]);
        assert!(gather_nd(&data, &Const::i(vec![1, 2], vec![2, 0])).is_err());
        assert!(gather_nd(&data, &Const::i(vec![1, 3], vec![0, 0, 0])).is_err());
    }
}
