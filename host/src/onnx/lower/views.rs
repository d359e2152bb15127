//! Reshapes, transposes and slices of computed tensors, written in held shapes.

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

    /// The box `starts .. ends` (ONNX shape `full`, steps of 1) of the runtime value `r`: a
    /// `slice` op in held shapes (the leading unit axes the tensor is held without are whole), a
    /// reshape after it when the box has more leading unit axes. The value's tensor and shape.
    pub(super) fn slice_box(
        &mut self,
        r: &Run,
        starts: &[u64],
        ends: &[u64],
        base: &str,
        at: &str,
    ) -> Result<(String, Vec<u64>), String> {
        let t = self.tensor(r, at)?;
        let out: Vec<u64> = starts.iter().zip(ends).map(|(s, e)| e - s).collect();
        if out == r.shape {
            return Ok((t, out));
        }
        let lead = r.shape.len() - strip(&r.shape).len();
        let ints = |v: &[u64]| Field::Ints(v[lead..].iter().map(|x| *x as i64).collect());
        let sliced = self.emit.fresh(&format!("{base}_slice"));
        self.emit.op(
            "slice",
            &[
                ("input", Field::S(t)),
                ("starts", ints(starts)),
                ("ends", ints(ends)),
                ("output", Field::S(sliced.clone())),
                ("dtype", s("f16")),
            ],
        );
        let held = strip(&out);
        let t = if held.len() == out.len() - lead {
            sliced
        } else {
            self.write_view(&sliced, "reshape", &held, base)
        };
        Ok((t, out))
    }

    /// A `Slice` (steps of 1) or a `Gather` of one index of a computed tensor, as a box; `None`
    /// when it is neither.
    pub(super) fn select_box(
        &mut self,
        node: &NodeProto,
        r: &Run,
        attrs: &Attrs,
        c: &[Option<Rc<Const>>],
        at: &str,
    ) -> Result<Option<()>, String> {
        let arg = |k: usize| c.get(k).cloned().flatten();
        let shape = &r.shape;
        let (mut starts, mut ends) = (vec![0u64; shape.len()], shape.clone());
        let mut view_shape = None;
        match node.op_type.as_str() {
            "Slice" => {
                let (from, to) = (Self::const_ints(&arg(1), "starts")?, Self::const_ints(&arg(2), "ends")?);
                let axes = match arg(3) {
                    Some(a) => a.as_i64()?,
                    None => (0..from.len() as i64).collect(),
                };
                let steps = match arg(4) {
                    Some(a) => a.as_i64()?,
                    None => vec![1; from.len()],
                };
                for k in 0..from.len().min(to.len()).min(axes.len()).min(steps.len()) {
                    let ax = fold::axis(axes[k], shape.len())?;
                    let picks = fold::slice_range(shape[ax], from[k], to[k], steps[k])?;
                    let (Some(&first), Some(&last)) = (picks.first(), picks.last()) else {
                        return Err(format!("{at}: the slice of axis {ax} is empty"));
                    };
                    if steps[k] != 1 {
                        return Ok(None);
                    }
                    (starts[ax], ends[ax]) = (first as u64, last as u64 + 1);
                }
            }
            "Gather" => {
                let idx = arg(1).ok_or("indices must be constant")?;
                let ax = fold::axis(attrs.int("axis").unwrap_or(0), shape.len())?;
                let i = idx.as_i64()?;
                if i.len() != 1 {
                    return Ok(None);
                }
                let k = if i[0] < 0 { i[0] + shape[ax] as i64 } else { i[0] };
                if !(0..shape[ax] as i64).contains(&k) {
                    return Err(format!("{at}: index {} is outside axis {ax} of size {}", i[0], shape[ax]));
                }
                (starts[ax], ends[ax]) = (k as u64, k as u64 + 1);
                let mut v = shape[..ax].to_vec();
                v.extend(&idx.shape);
                v.extend(&shape[ax + 1..]);
                view_shape = Some(v);
            }
            _ => return Ok(None),
        }
        let base = node.output.first().cloned().unwrap_or_default();
        let (t, out) = self.slice_box(r, &starts, &ends, &base, at)?;
        let run = Run { t, shape: out, e: Rc::new(Expr::X), prov: None };
        match view_shape {
            Some(v) => self.view(node, run, v, None, at)?,
            None => self.define(node, 0, Val::R(run)),
        }
        Ok(Some(()))
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
