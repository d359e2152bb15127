//! `Where(c, x, y)` with a constant condition `c` (a fixed mask: causal attention, padding known
//! when the model is exported) and `x`, `y` computed on the chip or constant.
//!
//! The chip has no select kernel; with `c` known, the selection is written with the elementwise
//! ops as `x·c + y·(1 − c)`, `c` and `1 − c` f16 params of 0/1 (a constant branch `k` is folded on
//! the host into the one param `k` where `c` is false, 0 elsewhere, clamped to ±65504 as the
//! masks of `masks.rs` are: a −3.4e38 fill would be −∞ in f16). For finite values this is exact:
//! `x·1 = x`, `y·0 = ±0`, `v + ±0 = v` (a zero result may change sign: `−0 + 0 = +0`). A non-finite
//! value in the branch **not** selected is not ignored: `∞·0` and `NaN·0` are NaN, so the result
//! there is NaN where ONNX gives the other branch (the verdict counts non-finite outputs). A mask
//! fill of −∞ as a constant branch is never multiplied but is clamped to −65504, as above: after a
//! softmax the weight is 0 either way, except in a row masked everywhere, where ONNX gives NaN and
//! the chip a uniform row. A condition that is
//! true (or false) everywhere is the branch itself, nothing written; a constant branch of zeros
//! adds nothing (the product alone).

use super::*;

impl Lower<'_, '_> {
    /// `Where` whose condition is the constant `c` (module doc).
    pub(super) fn where_const(
        &mut self,
        node: &NodeProto,
        c: &Const,
        ins: &[Option<Val>],
        at: &str,
    ) -> Result<(), String> {
        let (Some(Some(x)), Some(Some(y))) = (ins.get(1), ins.get(2)) else {
            return Err(format!("{at}: Where needs three inputs"));
        };
        let shape_of = |v: &Val| match v {
            Val::R(r) => r.shape.clone(),
            Val::C(k) => k.shape.clone(),
        };
        let shape = ipu_core::graph::broadcast_shape(&c.shape, &shape_of(x))
            .and_then(|s| ipu_core::graph::broadcast_shape(&s, &shape_of(y)))
            .ok_or_else(|| {
                format!(
                    "{at}: Where shapes {:?}, {:?} and {:?} do not broadcast",
                    c.shape,
                    shape_of(x),
                    shape_of(y)
                )
            })?;
        fold::fold_elements(&shape).map_err(|e| format!("{at}: {e}"))?;
        let picks: Vec<bool> = c.as_f64().iter().map(|v| *v != 0.0).collect();
        // True (or false) everywhere: the branch itself, when it is computed and already of the
        // result's shape.
        for (all, branch) in [(picks.iter().all(|p| *p), x), (picks.iter().all(|p| !*p), y)] {
            if let (true, Val::R(r)) = (all, branch) {
                if r.shape == shape {
                    self.define(node, 0, branch.clone());
                    return Ok(());
                }
            }
        }
        let mask =
            |keep: bool| Const::f(c.shape.clone(), picks.iter().map(|p| (*p == keep) as u8 as f32).collect());
        let out = node.output.first().cloned().unwrap_or_default();
        let mut terms = Vec::new();
        for (k, (branch, keep)) in [(x, true), (y, false)].into_iter().enumerate() {
            let term = match branch {
                Val::R(_) => {
                    // A name of its own for the product, taken back out of the values below.
                    let mut name = format!("{out}_sel{k}");
                    while self.vals.contains_key(&name) {
                        name.push('_');
                    }
                    let mul = NodeProto {
                        op_type: "Mul".into(),
                        input: vec![],
                        output: vec![name.clone()],
                        name: node.name.clone(),
                        ..Default::default()
                    };
                    let m = Val::C(Rc::new(mask(keep)));
                    self.elementwise(&mul, &[Some(branch.clone()), Some(m)], at)?;
                    self.vals.remove(&name).ok_or_else(|| format!("{at}: Where: no product written"))?
                }
                // The constant where it is selected, 0 elsewhere.
                Val::C(v) => {
                    let at_shape =
                        |s: &[u64]| format!("{at}: Where shapes {:?} and {s:?} do not broadcast", v.shape);
                    let m = ipu_core::graph::broadcast_shape(&v.shape, &c.shape)
                        .ok_or_else(|| at_shape(&c.shape))?;
                    let (iv, ic) =
                        (fold::broadcast_index(&m, &v.shape)?, fold::broadcast_index(&m, &c.shape)?);
                    let ks = v.as_f32();
                    let data = iv
                        .iter()
                        .zip(&ic)
                        .map(|(i, j)| if picks[*j] == keep { ks[*i].clamp(-65504.0, 65504.0) } else { 0.0 })
                        .collect();
                    Val::C(Rc::new(Const::f(m, data)))
                }
            };
            terms.push(term);
        }
        // A constant branch of zeros (`masked_fill(m, 0)`): the product alone, no add.
        let zero = |t: &Val| matches!(t, Val::C(k) if k.as_f64().iter().all(|v| *v == 0.0));
        for (r, z) in [(&terms[0], &terms[1]), (&terms[1], &terms[0])] {
            if let (Val::R(p), true) = (r, zero(z)) {
                if p.shape == shape {
                    self.define(node, 0, r.clone());
                    return Ok(());
                }
            }
        }
        let add = NodeProto { op_type: "Add".into(), ..node.clone() };
        self.elementwise(&add, &[Some(terms[0].clone()), Some(terms[1].clone())], at)
    }
}
