//! `ReduceMean` and `ReduceSum` of a computed tensor over its last axis: one `reduce_mean` /
//! `reduce_sum` op (a value per row, the sum in f32; docs/model-format.md). The written-out
//! LayerNorm's two `ReduceMean`s are a pattern of their own (`patterns.rs`); these are the others
//! (an RMS norm's `mean(x²)`, a pooling over the features).
//!
//! `keepdims = 0` is the same op and then a reshape that drops the unit axis; the planner holds
//! the result one value per word (what a broadcast operand reads), so a later op that reads the
//! dropped-axis tensor as rows of several values is refused by the planner naming the tensor
//! (its runs are not whole words). Any axis but the last, several axes, or an empty `axes`
//! (all axes) is refused naming the node and the axes.

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
        let run = Run { t: out, shape: kept.clone(), e: Rc::new(Expr::X), prov: None };
        if attrs.int("keepdims") == Some(0) {
            return self.view(node, run, kept[..rank - 1].to_vec(), None, at);
        }
        self.define(node, 0, Val::R(run));
        Ok(())
    }
}
