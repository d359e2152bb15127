//! Reshapes and transposes of computed tensors, written in held shapes.

use super::*;

impl Lower<'_, '_> {
    /// A reshape or transpose of a runtime value. A pure scaling travels through the view (so a
    /// scale on K before its transpose still folds into the matmul's `alpha`).
    pub(super) fn view(
        &mut self,
        node: &NodeProto,
        r: Run,
        shape: Vec<u64>,
        perm: Option<Vec<usize>>,
        at: &str,
    ) -> Result<(), String> {
        let (t, e) = match r.e.form() {
            Form::Affine(_, 0.0) | Form::Identity => (r.t.clone(), r.e.clone()),
            _ => (self.tensor(&r, at)?, Rc::new(Expr::X)),
        };
        let base = node.output.first().cloned().unwrap_or_default();
        let t =
            self.emit_view(&t, &r.shape, &shape, perm.as_deref(), &base).map_err(|e| format!("{at}: {e}"))?;
        let prov = match (&r.prov, *e == Expr::X) {
            (Some(p), true) => Some(Rc::new(Prov {
                x: p.x.clone(),
                w: p.w.clone(),
                bias: p.bias.clone(),
                alpha: p.alpha,
                idx: match &perm {
                    Some(perm) => {
                        Rc::new(fold::transpose(&p.idx, &perm.iter().map(|x| *x as i64).collect::<Vec<_>>())?)
                    }
                    None => Rc::new(p.idx.reshaped(shape.clone())),
                },
            })),
            _ => None,
        };
        self.define(node, 0, Val::R(Run { t, shape, e, prov }));
        Ok(())
    }

    /// Write the views that turn tensor `t` (ONNX shape `from`, held as `strip(from)`) into ONNX
    /// shape `to` (held as `strip(to)`): a reshape, or a transpose by `perm` (ONNX axes). The
    /// device's transposes keep the last axis (a view) or swap the last two; a permutation that
    /// brings the last axis to the second-to-last place is written as one of each.
    pub(super) fn emit_view(
        &mut self,
        t: &str,
        from: &[u64],
        to: &[u64],
        perm: Option<&[usize]>,
        base: &str,
    ) -> Result<String, String> {
        let (held_in, held_out) = (strip(from), strip(to));
        let Some(perm) = perm else {
            return Ok(if held_in == held_out {
                t.to_string()
            } else {
                self.write_view(t, "reshape", &held_out, base)
            });
        };
        let (lead_in, lead_out) = (from.len() - held_in.len(), to.len() - held_out.len());
        // The permutation of the held axes; when a leading unit axis moves, work at full rank.
        let ours: Option<Vec<usize>> = (lead_in == lead_out)
            .then(|| perm[lead_out..].iter().map(|p| p.checked_sub(lead_in)).collect::<Option<Vec<_>>>())
            .flatten()
            .filter(|p| {
                let mut q = p.clone();
                q.sort_unstable();
                q.iter().enumerate().all(|(k, v)| k == *v)
            });
        let (t, perm, out_full) = match ours {
            Some(p) => (t.to_string(), p, false),
            None => {
                let full = if held_in.len() == from.len() {
                    t.to_string()
                } else {
                    self.write_view(t, "reshape", from, base)
                };
                (full, perm.to_vec(), held_out.len() != to.len())
            }
        };
        let r = perm.len();
        if perm.iter().enumerate().all(|(k, v)| k == *v) {
            return Ok(t);
        }
        let mut t = t;
        let mut perm = perm;
        if r >= 2 && perm[r - 1] != r - 1 && perm[r - 2] == r - 1 {
            let mut first = perm.clone();
            first.swap(r - 2, r - 1);
            if !first.iter().enumerate().all(|(k, v)| k == *v) {
                let ints: Vec<i64> = first.iter().map(|x| *x as i64).collect();
                t = self.write_view_ints(&t, "transpose", ints, &format!("{base}_lead"));
            }
            perm = (0..r).collect();
            perm.swap(r - 2, r - 1);
        }
        let ints: Vec<i64> = perm.iter().map(|x| *x as i64).collect();
        let out = self.write_view_ints(&t, "transpose", ints, base);
        Ok(if out_full { self.write_view(&out, "reshape", &held_out, base) } else { out })
    }

    pub(super) fn write_view(&mut self, t: &str, kind: &str, shape: &[u64], base: &str) -> String {
        self.write_view_ints(t, kind, shape.iter().map(|x| *x as i64).collect(), base)
    }

    pub(super) fn write_view_ints(&mut self, t: &str, kind: &str, ints: Vec<i64>, base: &str) -> String {
        let out = self.emit.fresh(base);
        let f = if kind == "transpose" { "perm" } else { "shape" };
        self.emit.op(
            kind,
            &[
                ("input", Field::S(t.into())),
                (f, Field::Ints(ints)),
                ("output", Field::S(out.clone())),
                ("dtype", s("f16")),
            ],
        );
        out
    }
}
