//! Open findings of the random-graph oracle (tests/data/fuzz/FINDINGS.md): compiler bugs found and
//! not fixed yet. The CI test (`tests/tests/graph_fuzz.rs`) and the driver report a bug that one
//! of these matches as *known* instead of failing — each with the reason printed — so that a fix
//! is re-enabled by deleting its entry here. Each predicate looks at the graph and the failure,
//! narrowly: an unrelated bug of the same class must still fail.

use crate::oracle::Failure;
use ipu_core::graph::{Graph, OpKind};
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

/// The open findings.
pub const OPEN: &[Open] = &[
    Open {
        id: "F1",
        why: "a param that no op reads builds, then `run` refuses the package (lead: core/src/plan)",
        matches: |g, f| {
            f.class == "run-refused"
                && f.message.contains("the model has params")
                && g.params.iter().any(|&p| !g.ops.iter().any(|op| op.kind.operands().contains(&p)))
        },
    },
    Open {
        id: "F2",
        why: "a row-chain matmul with accumulate = \"f32\" and an f16 result writes past its buffer (lead: core/src/plan)",
        matches: |g, f| matches!(f.class, "wrong-result" | "f64-bound" | "device-error") && chain_f32_to_f16(g),
    },
];

/// The open finding that excuses `f` on the model `text`, if any.
pub fn known(text: &str, f: &Failure) -> Option<&'static Open> {
    let g = ipu_host::model::parse("m.toml", text).ok()?;
    OPEN.iter().find(|o| (o.matches)(&g, f))
}
