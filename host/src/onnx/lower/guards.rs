//! What torch's default exporter writes around `scaled_dot_product_attention` (transformers'
//! default `sdpa` attention in ViT, DINOv2, BERT): an additive mask of zeros before the softmax,
//! and after it `Where(IsNaN(p), 0, p)`, which turns the NaN rows of fully masked queries into
//! zeros.
//! - `Add` of a constant that is zero everywhere and does not widen the tensor is the tensor
//!   itself (exact: x + 0 = x for every x, and −0 + 0 = +0 is the same value).
//! - `Where(IsNaN(x), c, x)` with a constant `c` is `x` where `x` is not NaN; it is taken as
//!   `x`, so a NaN stays NaN on the chip (the verdict counts non-finite outputs) where the model
//!   would write `c`. A softmax of finite scores is never NaN, and only a mask of −∞ over a whole
//!   row makes one. `IsNaN` read by anything else is refused; a `Where` of a constant condition
//!   is a selection (`select.rs`), any other a mask's (`masks.rs`).

use super::*;

impl Lower<'_, '_> {
    /// `Add(x, zeros)` or `Add(zeros, x)` that keeps x's shape: defines the output as `x`.
    /// Returns whether the node was taken.
    pub(super) fn adds_zero(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> bool {
        let (r, c) = match ins {
            [Some(Val::R(r)), Some(Val::C(c))] | [Some(Val::C(c)), Some(Val::R(r))] => (r, c),
            _ => return false,
        };
        let zero = c.as_f64().iter().all(|v| *v == 0.0);
        let same = ipu_core::graph::broadcast_shape(&r.shape, &c.shape).is_some_and(|s| s == r.shape);
        if zero && same {
            self.define(node, 0, Val::R(r.clone()));
        }
        zero && same
    }

    /// `IsNaN(x)`: remembered for the `Where` that reads it; its value cannot be read.
    pub(super) fn is_nan(&mut self, node: &NodeProto, ins: &[Option<Val>], at: &str) -> Result<(), String> {
        let Some(Some(Val::R(r))) = ins.first() else {
            return Err(format!("{at}: IsNaN of a constant"));
        };
        let (x, out) = (node.input[0].clone(), node.output.first().cloned().unwrap_or_default());
        self.nan_tests.insert(out, x);
        let shape = r.shape.clone();
        self.define(node, 0, Val::R(Run { t: String::new(), shape, e: Rc::new(Expr::X), prov: None }));
        Ok(())
    }

    /// `Where(IsNaN(x), c, x)` with a constant `c`: `x` (module doc). Any other `Where` of a
    /// computed tensor is refused.
    pub(super) fn where_node(
        &mut self,
        node: &NodeProto,
        ins: &[Option<Val>],
        at: &str,
    ) -> Result<(), String> {
        let cond = node.input.first().and_then(|c| self.nan_tests.get(c));
        let guard =
            cond.is_some_and(|x| node.input.get(2) == Some(x)) && matches!(ins.get(1), Some(Some(Val::C(_))));
        match (guard, ins.get(2), ins.first()) {
            (true, Some(Some(Val::R(x))), _) => {
                self.define(node, 0, Val::R(x.clone()));
                Ok(())
            }
            (_, _, Some(Some(Val::C(c)))) => {
                let c = c.clone();
                self.where_const(node, &c, ins, at)
            }
            _ => self.where_mask(node, ins, at),
        }
    }
}
