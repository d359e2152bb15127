//! Canonical forms the planners need, made before planning (docs/graph-planner.md "Levels", the
//! canonical graph): today, transposed reads of a tensor the chip holds, and the transposed `a` of
//! a matmul planned in a row chain (which cannot take it), become explicit transposes.
//!
//! A matmul reads `transpose_a`/`transpose_b` operands as the host lays them out: the host
//! transposes a model input before writing it. A tensor an earlier op made (or an input an earlier
//! op already placed) has no host step to do that, so the read is rewritten as a `transpose` of the
//! last two axes (`transpose.rs`, a stage of its own) followed by an untransposed read. Where the
//! operand is an FP8 cast of such a tensor read only by this matmul, the transpose goes before the
//! cast (the cast is elementwise: `cast(xᵀ) = cast(x)ᵀ` bit for bit, and `transpose_f16` moves
//! f16). The host reference evaluates the model as written; the values are the same.

use alloc::format;
use alloc::vec::Vec;
use ipu_schema::DType;

use crate::graph::{Graph, Op, OpKind, Tensor, TensorId};

/// A graph with explicit transposes, and how its ops map to the model's.
pub struct Canonical {
    /// The rewritten graph.
    pub graph: Graph,
    /// Per op of [`Canonical::graph`], the model op it is (`None` for an inserted transpose).
    pub orig: Vec<Option<usize>>,
    /// Per model op, its index in [`Canonical::graph`].
    pub new_of: Vec<usize>,
}

impl Canonical {
    /// The model op an op of the rewritten graph stands for: an inserted transpose stands for
    /// the op that reads its result (so refusals name an op the user wrote).
    pub fn model_op(&self, op: usize) -> usize {
        (op..self.orig.len()).find_map(|i| self.orig[i]).unwrap_or(self.new_of.len().saturating_sub(1))
    }
}

/// The tensor a transposed matmul operand must be transposed from, and the cast between them:
/// `(base, cast op)` — the operand itself, or the f16 input of the cast that makes it when only
/// this matmul reads that cast.
fn base_of(g: &Graph, operand: TensorId) -> (TensorId, Option<usize>) {
    let producer = g.ops.iter().position(|o| o.output == operand);
    if let Some(c) = producer {
        if let OpKind::Cast { input } = g.ops[c].kind {
            let readers = g.ops.iter().filter(|o| o.kind.operands().contains(&operand)).count();
            if readers == 1 && !g.outputs.contains(&operand) && g.tensor(input).dtype == DType::F16 {
                return (input, Some(c));
            }
        }
    }
    (operand, None)
}

/// Whether the host can lay out `base` transposed for op `reader`: a model input or param that no
/// other op reads (a source is bound once, where it is first read, and every later reader is
/// served from those bytes: a transposed copy would give them transposed values).
fn host_transposes(g: &Graph, base: TensorId, reader: usize) -> bool {
    g.is_source(base)
        && !g.ops.iter().enumerate().any(|(i, o)| i != reader && o.kind.operands().contains(&base))
        && !g.outputs.contains(&base)
}

/// `None` when no matmul reads a chip-held tensor transposed (the graph is planned as written);
/// otherwise the graph with a transpose inserted before each such read.
pub fn explicit_transposes(g: &Graph) -> Option<Canonical> {
    // (op reading it, operand slot 0 = a / 1 = b, base tensor, cast between)
    let mut rewrites: Vec<(usize, usize, TensorId, Option<usize>)> = Vec::new();
    for (i, op) in g.ops.iter().enumerate() {
        let OpKind::MatMul { a, b, transpose_a, transpose_b, .. } = op.kind else { continue };
        for (slot, t, on) in [(0, a, transpose_a), (1, b, transpose_b)] {
            if !on {
                continue;
            }
            let (base, cast) = base_of(g, t);
            let bt = g.tensor(base);
            // A matmul no grid stage takes (batched; alpha with f32 partial sums; FP8 with a
            // transpose) is planned in a row chain, which spreads the rows of `a` over tiles: it
            // cannot take `a` transposed, wherever `a` comes from.
            let in_chain = !super::stages::grid_matmul(g, i);
            let host = host_transposes(g, base, cast.unwrap_or(i)) && !(slot == 0 && in_chain);
            // The transpose kernel moves f16 of rank ≥ 2; anything else keeps the planner's refusal.
            if host || bt.dtype != DType::F16 || bt.shape.len() < 2 {
                continue;
            }
            rewrites.push((i, slot, base, cast));
        }
    }
    if rewrites.is_empty() {
        return None;
    }
    let mut graph = Graph { ops: Vec::new(), ..g.clone() };
    let (mut orig, mut new_of) = (Vec::new(), Vec::new());
    for (i, op) in g.ops.iter().enumerate() {
        let mut op = op.clone();
        // Transposes go right before the op that reads them (the matmul, or the cast before it).
        for &(reader, slot, base, cast) in rewrites.iter().filter(|r| r.3.unwrap_or(r.0) == i) {
            let bt = g.tensor(base);
            let r = bt.shape.len();
            let mut shape = bt.shape.clone();
            shape.swap(r - 2, r - 1);
            let id = TensorId(graph.tensors.len() as u32);
            graph.tensors.push(Tensor {
                name: format!("{}ᵀ{}", bt.name, id.0),
                dtype: bt.dtype,
                shape,
                scale: bt.scale,
            });
            let mut perm: Vec<usize> = (0..r).collect();
            perm.swap(r - 2, r - 1);
            graph.ops.push(Op { kind: OpKind::Transpose { input: base, perm }, output: id });
            orig.push(None);
            match (&mut op.kind, cast) {
                (OpKind::Cast { input }, Some(_)) => {
                    *input = id;
                    // The cast's result is now the transposed operand: its shape swaps too, and
                    // the matmul (later) reads it untransposed.
                    let out = op.output.0 as usize;
                    let s = &mut graph.tensors[out].shape;
                    let n = s.len();
                    s.swap(n - 2, n - 1);
                }
                (OpKind::MatMul { a, b, .. }, None) => *(if slot == 0 { a } else { b }) = id,
                _ => unreachable!("a rewrite is read by its matmul or its cast"),
            }
            let _ = reader;
        }
        // The matmul reads each rewritten operand untransposed.
        if let OpKind::MatMul { transpose_a, transpose_b, .. } = &mut op.kind {
            for &(_, slot, ..) in rewrites.iter().filter(|r| r.0 == i) {
                *(if slot == 0 { &mut *transpose_a } else { &mut *transpose_b }) = false;
            }
        }
        new_of.push(graph.ops.len());
        orig.push(Some(i));
        graph.ops.push(op);
    }
    Some(Canonical { graph, orig, new_of })
}
