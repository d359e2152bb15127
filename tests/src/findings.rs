//! Open findings of the random-graph oracle (tests/data/fuzz/FINDINGS.md): compiler bugs found and
//! not fixed yet. The CI test (`tests/tests/graph_fuzz.rs`) and the driver report a bug that one
//! of these matches as *known* instead of failing — each with the reason printed — so that a fix
//! is re-enabled by deleting its entry here. Each predicate looks at the graph and the failure,
//! narrowly: an unrelated bug of the same class must still fail.

use crate::oracle::Failure;
use ipu_core::graph::Graph;

/// One open finding.
pub struct Open {
    /// Its id in FINDINGS.md.
    pub id: &'static str,
    /// What is wrong, printed when a run is excused by it.
    pub why: &'static str,
    /// Whether a failure of a graph is this finding.
    pub matches: fn(&Graph, &Failure) -> bool,
}

/// The open findings.
pub const OPEN: &[Open] = &[];

/// The open finding that excuses `f` on the model `text`, if any.
pub fn known(text: &str, f: &Failure) -> Option<&'static Open> {
    let g = ipu_host::model::parse("m.toml", text).ok()?;
    OPEN.iter().find(|o| (o.matches)(&g, f))
}
