//! Plan search for the matmul planner (docs/search.md): candidates are screened by the analytic
//! estimate, then evaluated in screening order with the full planner and cost model. Evaluation
//! is a pure function of (model, target, grid), so a caller may evaluate a batch concurrently;
//! improvements are accepted in screening order, so the result never depends on thread count.

use alloc::vec::Vec;

use super::matmul::{self, Grid, MatMul};
use super::{Plan, PlanError};

/// Grids in screening order (best estimate first), with the estimate and the exchange pressure
/// (largest number of words a tile receives over the exchange in one `run` call).
pub fn screen(mm: &MatMul, tiles: usize) -> Vec<(Grid, u64, u64)> {
    let mut c: Vec<(Grid, u64, u64)> = matmul::candidates(mm, tiles)
        .into_iter()
        .map(|g| (g, matmul::estimate_on(mm, g, tiles), pressure(mm, g)))
        .collect();
    c.sort_by_key(|(g, est, _)| (*est, g.tm * g.tn * g.tk, *g));
    c
}

/// Words the busiest tile receives: in a reduce-scatter (`reduce.rs`) each tile of a K group takes
/// its share of the other `tk − 1` partials; in a tree the group's first tile takes `tk − 1`
/// partial blocks.
pub fn pressure(mm: &MatMul, g: Grid) -> u64 {
    let rows = mm.m.div_ceil(g.tm);
    let nbt = mm.nb().div_ceil(g.tn);
    if g.tk > 1 && matmul::fan_in(mm, g) == g.tk {
        return (g.tk - 1).saturating_mul(nbt).saturating_mul(rows.div_ceil(g.tk) * 32) / 4;
    }
    (g.tk - 1).saturating_mul(nbt).saturating_mul(240 + rows * 32) / 4
}

/// Evaluate one grid with the full planner: its predicted cycles (exchange schedules not
/// validated word by word: the chosen grid is planned again, with the validation, to be built).
pub fn evaluate(mm: &MatMul, g: Grid, tiles: usize) -> Result<(u64, Plan), PlanError> {
    let p = matmul::plan_for_cost(mm, g, tiles)?;
    Ok((p.cost.cycles, p))
}
