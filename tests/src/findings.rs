//! Open findings of the random-graph oracle (tests/data/fuzz/FINDINGS.md): compiler bugs found and
//! not fixed yet. The CI test (`tests/tests/graph_fuzz.rs`) and the driver report a bug that one
//! of these matches as *known* instead of failing — each with the reason printed — so that a fix
//! is re-enabled by deleting its entry here. Each predicate looks at the graph and the failure,
//! narrowly: an unrelated bug of the same class must still fail.

use crate::oracle::Failure;
use ipu_core::graph::{Graph, MapFn, OpKind, TensorId};
use ipu_schema::DType;

/// One open finding.
pub struct Open {
    /// Its id in FINDINGS.md.
    pub id: &'static str,
    /// What is wrong, printed when a run is excused by it.
    pub why: &'static str,
    /// Whether a failure of a graph is this finding.
    pub matches: fn(&Graph, &Failure) -> bool,
}

/// A matmul of f16 operands whose f32 sums are rounded to an f16 result and that the stage
/// planner puts in a row chain (batched, or with alpha — the grid takes neither with f32 sums).
fn chain_f32_to_f16(g: &Graph) -> bool {
    g.ops.iter().any(|op| {
        matches!(op.kind, OpKind::MatMul { a, b, accumulate: DType::F32, alpha, .. }
            if g.tensor(op.output).dtype == DType::F16
                && (g.tensor(a).shape.len() > 2 || g.tensor(b).shape.len() > 2 || alpha.is_some()))
    })
}

/// Whether some source is read by no op whose result reaches a model output (unread, or read
/// only by dead code).
fn unread_source(g: &Graph, sources: &[TensorId]) -> bool {
    let mut live: Vec<TensorId> = g.outputs.clone();
    for op in g.ops.iter().rev() {
        if live.contains(&op.output) {
            live.extend(op.kind.operands());
        }
    }
    sources.iter().any(|s| !live.contains(s))
}

/// Whether a model output is a reshape (or a chain of reshapes) of a model input or param.
fn output_reshapes_an_input(g: &Graph) -> bool {
    g.outputs.iter().any(|&o| {
        let mut t = o;
        let mut reshaped = false;
        while let Some(OpKind::Reshape { input }) = g.ops.iter().find(|op| op.output == t).map(|op| &op.kind)
        {
            (t, reshaped) = (*input, true);
        }
        reshaped && g.is_source(t)
    })
}

/// Whether a source is read transposed by a matmul and untransposed by another op.
fn source_read_both_ways(g: &Graph) -> bool {
    let transposed: Vec<_> = g
        .ops
        .iter()
        .flat_map(|op| match op.kind {
            OpKind::MatMul { a, b, transpose_a, transpose_b, .. } => {
                [(a, transpose_a), (b, transpose_b)].into_iter().filter(|x| x.1).map(|x| x.0).collect()
            }
            _ => Vec::new(),
        })
        // A source, or an FP8 cast of one (the row chain binds the source and casts it on the tiles).
        .filter_map(|t| match g.ops.iter().find(|op| op.output == t).map(|op| &op.kind) {
            Some(OpKind::Cast { input }) if g.is_source(*input) => Some(*input),
            _ => g.is_source(t).then_some(t),
        })
        .collect();
    transposed.iter().any(|&t| {
        g.ops.iter().any(|op| match op.kind {
            OpKind::MatMul { a, b, transpose_a, transpose_b, .. } => {
                (a == t && !transpose_a) || (b == t && !transpose_b)
            }
            // The FP8 cast a transposed read goes through is not another reader.
            OpKind::Cast { .. }
                if g.ops.iter().any(|m| {
                    matches!(m.kind, OpKind::MatMul { a, b, transpose_a, transpose_b, .. }
                    if (a == op.output && transpose_a) || (b == op.output && transpose_b))
                }) =>
            {
                false
            }
            ref k => k.operands().contains(&t),
        })
    })
}

/// The open findings.
pub const OPEN: &[Open] = &[
    Open {
        id: "F1",
        why: "a param that no op reads (or only dead code) builds, then `run` refuses the package (lead: core/src/plan)",
        matches: |g, f| {
            f.class == "run-refused" && f.message.contains("the model has params") && unread_source(g, &g.params)
        },
    },
    Open {
        id: "F2",
        why: "a row-chain matmul with accumulate = \"f32\" and an f16 result writes past its buffer (lead: core/src/plan)",
        matches: |g, f| matches!(f.class, "wrong-result" | "f64-bound" | "device-error") && chain_f32_to_f16(g),
    },
    Open {
        id: "F3",
        why: "a model input that no op reads (or only dead code) builds, then `run` refuses the package (as F1, for inputs)",
        matches: |g, f| {
            f.class == "run-refused" && f.message.contains("the model has inputs") && unread_source(g, &g.inputs)
        },
    },
    Open {
        id: "F4",
        why: "a model output that is a reshape (chain) of a model input or param shares its bytes: `run` poisons it before the call, so it and the ops that read the source compute on NaN",
        matches: |g, f| f.class == "wrong-result" && output_reshapes_an_input(g),
    },
    Open {
        id: "F5",
        why: "a model output that is a reshape of a model input bound on several tiles gets every copy's slices: `run` refuses the package (slices hold more bytes than the tensor)",
        matches: |g, f| f.class == "run-refused" && f.message.contains("slices hold") && output_reshapes_an_input(g),
    },
    Open {
        id: "F6",
        why: "a model input or param read transposed by a matmul (directly or through an FP8 cast) and untransposed by another op: the other op reads the transposed bytes",
        matches: |g, f| f.class == "wrong-result" && source_read_both_ways(g),
    },
    Open {
        id: "F7",
        why: "an FP8 cast that feeds a matmul in a row chain, also named as a model output, gets no output binding: `run` refuses the package",
        matches: |g, f| {
            f.class == "run-refused"
                && f.message.contains("the model has outputs")
                && g.ops.iter().any(|op| matches!(op.kind, OpKind::Cast { .. }) && g.outputs.contains(&op.output)
                    && g.ops.iter().any(|m| matches!(m.kind, OpKind::MatMul { a, b, .. } if a == op.output || b == op.output)))
        },
    },
    Open {
        id: "F9",
        why: "a matmul with alpha whose left operand another op also reads: alpha is applied to that operand in place (alpha on A), so the other reader sees it scaled",
        matches: |g, f| {
            f.class == "wrong-result"
                && g.ops.iter().enumerate().any(|(i, op)| {
                    matches!(op.kind, OpKind::MatMul { a, alpha: Some(_), .. }
                        if g.ops.iter().enumerate().any(|(j, o)| j != i && o.kind.operands().contains(&a)))
                })
        },
    },
    Open {
        id: "F8",
        why: "an op whose result nothing reads (dead code) beside live ops: another op's result is wrong",
        matches: |g, f| {
            f.class == "wrong-result"
                && g.ops.iter().any(|op| {
                    !g.outputs.contains(&op.output) && !g.ops.iter().any(|o| o.kind.operands().contains(&op.output))
                })
        },
    },
    Open {
        id: "F10",
        why: "pow of a negative value: device and device-precision reference give NaN (e^{c·ln x}, as documented), the f64 reference `powf` a finite value for an integer exponent, and the element's bound is NaN (ln x), which no comparison fails: the verdict passes NaN (host/src/reference/map.rs)",
        matches: |g, f| {
            f.class == "nan-passed"
                && f.message.contains("NaN on the device")
                && g.ops.iter().any(|op| matches!(op.kind, OpKind::Map { func: MapFn::Pow, .. }))
        },
    },
    Open {
        id: "F11",
        why: "an infinite per-element f64 bound (a pole of log or reciprocal within the carried error, an f16 rounding that may overflow) passes a device inf or NaN against a finite f64 value, where docs/reliability.md says that is an infinite error",
        matches: |_, f| f.class == "nan-passed",
    },
];

/// The open finding that excuses `f` on the model `text`, if any.
pub fn known(text: &str, f: &Failure) -> Option<&'static Open> {
    let g = ipu_host::model::parse("m.toml", text).ok()?;
    OPEN.iter().find(|o| (o.matches)(&g, f))
}
