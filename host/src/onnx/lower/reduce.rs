//! `ReduceMean` and `ReduceSum` of a computed tensor over its last axis: one `reduce_mean` /
//! `reduce_sum` op (a value per row, the sum in f32; docs/model-format.md). The written-out
//! LayerNorm's two `ReduceMean`s are a pattern of their own (`patterns.rs`); these are the others
//! (an RMS norm's `mean(x²)`, a pooling over the features).
//!
//! The planner holds the result one value per word (what a broadcast operand reads). With
//! `keepdims = 0` the results are one row of the next axis (`[…, R]`), read as packed rows by a
//! later op: the same op, then a `transpose` of the last two axes (`[…, R, 1] → […, 1, R]`, the
//! `transpose_f16` kernel, a value per `ldh16`/`sth16`) and a reshape dropping the unit axis.
//! Any axis but the last, several axes, or an empty `axes` (all axes) is refused naming the
//! node and the axes.

use super::*;

impl Lower<'_, '_> {
    /// `ReduceMean`/`ReduceSum` of the computed `r`.
    pub(super) fn reduce(
        &mut self,
        node: &NodeProto,
        attrs: &Attrs,
        ins: &[Option<Val>],
        at: &str,
    ) -> Result<(), String> {
        let op = node.op_type.as_str();
        let Some(Some(Val::R(r))) = ins.first() else {
            return Err(format!("{at}: the data input must be computed on the chip"));
        };
        // `axes`: an input from opset 18 (ReduceSum: 13), an attribute before.
        let axes = match ins.get(1) {
            Some(Some(Val::C(c))) => c.as_i64().map_err(|e| format!("{at}: axes: {e}"))?,
            Some(Some(Val::R(_))) => {
                return Err(format!("{at}: {op} axes computed on the chip are not supported"))
            }
            _ => attrs.ints("axes").unwrap_or_default(),
        };
        if axes.is_empty() && attrs.int("noop_with_empty_axes") == Some(1) {
            self.define(node, 0, Val::R(r.clone()));
            return Ok(());
        }
        let rank = r.shape.len();
        let last = axes.len() == 1 && fold::axis(axes[0], rank).is_ok_and(|a| a == rank - 1);
        if !last {
            let which = if axes.is_empty() {
                "every axis (no axes given)".to_string()
            } else {
                format!("axes {axes:?}")
            };
            return Err(format!(
                "{at}: {op} over {which} of a computed tensor of rank {rank} is not supported: only the last axis \
                 (axes = [-1] or [{}])",
                rank - 1
            ));
        }
        let t = self.tensor(r, at)?;
        let base = node.output.first().cloned().unwrap_or_default();
        let out = self.emit.fresh(&base);
        let kind = if op == "ReduceMean" { "reduce_mean" } else { "reduce_sum" };
        self.emit.op(kind, &[("input", Field::S(t)), ("output", Field::S(out.clone())), ("dtype", s("f16"))]);
        let mut kept = r.shape.clone();
        kept[rank - 1] = 1;
        if attrs.int("keepdims") != Some(0) {
            self.define(node, 0, Val::R(Run { t: out, shape: kept, e: Rc::new(Expr::X), prov: None }));
            return Ok(());
        }
        // keepdims = 0: the column of results turned into a row (a `transpose` of the last two
        // axes, `[…, R, 1] → […, 1, R]`), then viewed without the unit axis.
        if rank < 2 {
            return Err(format!("{at}: {op} with keepdims = 0 of a computed tensor of rank {rank} (a scalar result) is not supported"));
        }
        let n = strip(&kept).len();
        let mut perm: Vec<i64> = (0..n as i64).collect();
        perm.swap(n - 2, n - 1);
        let row = self.write_view_ints(&out, "transpose", perm, &format!("{base}_row"));
        let mut swapped = kept.clone();
        swapped.swap(rank - 2, rank - 1);
        let run = Run { t: row, shape: swapped, e: Rc::new(Expr::X), prov: None };
        self.view(node, run, kept[..rank - 1].to_vec(), None, at)
    }
}
