//! Column groups for row chains (docs/search.md, "column groups"): `S = A · B` whose result is a
//! graph output is split into `n` groups of result columns, each planned as one entry of a batch —
//! the row tensors are broadcast to every group, `B` and `S` are cut along their columns. Every
//! tile then holds more rows for fewer columns, so the AMP launches carry more rows each and every
//! tile needs only its group's share of `B`. The planner itself is unchanged: the graph is rewritten
//! with a leading batch dimension, and the bindings are mapped back to the model's tensors.

use alloc::vec;
use alloc::vec::Vec;

use super::{Plan, PlanError};
use crate::graph::{Graph, OpKind, TensorId};

/// How each tensor of the rewritten graph maps back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    /// Groups.
    pub groups: u64,
    /// Per tensor: `Some((rows, cols))` of the model's 2-D view (after the binding's transpose) if
    /// it is cut along its columns, `None` if it is broadcast.
    cut: Vec<Option<(u64, u64)>>,
}

/// Rewrite `g` into `groups` column groups, or say why it cannot be.
pub fn split(g: &Graph, groups: u64) -> Result<(Graph, Split), PlanError> {
    let no = |why: &str| Err(PlanError::Unsupported(0, alloc::format!("column groups: {why}")));
    if g.tensors.iter().any(|t| t.shape.len() != 2) {
        return no("every tensor must be 2-D");
    }
    let matmuls: Vec<usize> =
        (0..g.ops.len()).filter(|&i| matches!(g.ops[i].kind, OpKind::MatMul { .. })).collect();
    let [mm] = matmuls[..] else { return no("exactly one matmul") };
    let OpKind::MatMul { b, transpose_a: false, transpose_b, .. } = g.ops[mm].kind else {
        return no("transpose_a is not supported");
    };
    let out = g.ops[mm].output;
    if !g.outputs.contains(&out) || g.ops.iter().any(|o| reads(&o.kind, out)) {
        return no("the matmul result must be an output that no op reads");
    }
    // The side operand and, if it is a cast, the input it casts: cut along N.
    let src = g.ops.iter().find(|o| o.output == b).and_then(|o| {
        if let OpKind::Cast { input } = o.kind {
            Some(input)
        } else {
            None
        }
    });
    let n = g.tensor(out).shape[1];
    if groups < 2 || !n.is_multiple_of(groups) || !(n / groups).is_multiple_of(16) {
        return no("the result's columns must split into groups of whole 16-column blocks");
    }
    let mut h = g.clone();
    let mut cut = vec![None; g.tensors.len()];
    for (i, t) in h.tensors.iter_mut().enumerate() {
        let id = TensorId(i as u32);
        let s = t.shape.clone();
        if id == out {
            t.shape = vec![groups, s[0], s[1] / groups];
            cut[i] = Some((s[0], s[1]));
        } else if id == b || Some(id) == src {
            // Stored [N, K] when transposed: its rows are the result's columns.
            if transpose_b {
                t.shape = vec![groups, s[0] / groups, s[1]];
                cut[i] = Some((s[1], s[0]));
            } else {
                t.shape = vec![groups, s[0], s[1] / groups];
                cut[i] = Some((s[0], s[1]));
            }
        } else {
            t.shape = vec![groups, s[0], s[1]];
        }
    }
    Ok((h, Split { groups, cut }))
}

fn reads(k: &OpKind, t: TensorId) -> bool {
    k.operands().contains(&t)
}

/// Map the bindings of a plan of the rewritten graph back onto the model's tensors: a broadcast
/// tensor's slices read the same rows for every group; a cut tensor's slices move to their
/// group's columns.
pub fn remap(plan: &mut Plan, g: &Graph, s: &Split) {
    for bp in plan.bindings.iter_mut() {
        let t = g.tensor(bp.tensor);
        let elt = t.dtype.size() as u64;
        let whole = t.elements() * elt;
        for sl in bp.slices.iter_mut() {
            match s.cut[bp.tensor.0 as usize] {
                None => sl.tensor_offset %= whole,
                Some((rows, cols)) => {
                    let part = cols / s.groups;
                    let (group, rest) =
                        (sl.tensor_offset / (rows * part * elt), sl.tensor_offset % (rows * part * elt));
                    let (r, c) = (rest / (part * elt), rest % (part * elt));
                    sl.tensor_offset = r * cols * elt + group * part * elt + c;
                    sl.tensor_stride = cols * elt;
                }
            }
        }
    }
}
