//! The search over a graph of stages (docs/search.md step 7): where the side casts of its row
//! chains run (as `search::chain_layout`) and the tile grid of each matmul stage. Moves are
//! evaluated with the whole-graph planner and cost model (`plan::plan_with_grids`), so the
//! redistributions between stages are in every figure.
//!
//! Order (fixed, so the outcome never depends on the thread count): first each cast placement
//! against the baseline (independent points, accepted in order); then stage by stage, the next
//! `PER_STAGE` grids of the stage's screening (best estimate first, skipping the grid it has) as
//! alternatives to the incumbent — evaluated concurrently, the best strictly better one accepted
//! (ties: the earlier). `--search-attempts` bounds the moves evaluated, rounded up to whole
//! batches. The state is saved after
//! each batch, so a resumed search continues at the next batch and builds the same package.

use ipu_core::graph::Graph;
use ipu_core::plan::chain::SideCast;
use ipu_core::plan::{plan_with_grids, search, PlanOptions};
use rayon::prelude::*;
use std::path::Path;
use tracing::info;

use crate::search::{self as state, Point};

/// Grids tried per matmul stage after the one it has.
pub const PER_STAGE: usize = 3;

/// What the stage search chose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageOutcome {
    /// Cast placement of the row-chain stages.
    pub side_cast: SideCast,
    /// The grid per op (`None`: the estimate's), for `plan_with_grids`.
    pub grids: Grids,
    /// Predicted cycles of the baseline.
    pub baseline_cycles: u64,
    /// Moves evaluated.
    pub attempts: u32,
}

/// A grid forced per op (`None`: the estimate's), as `plan_with_grids` takes them.
type Grids = Vec<Option<[u32; 3]>>;

/// A point of this search: a placement and the grids forced per op.
fn point(cast: SideCast, grids: &[Option<[u32; 3]>], cycles: u64) -> Point {
    let forced: Vec<[u64; 4]> = grids
        .iter()
        .enumerate()
        .filter_map(|(op, g)| g.map(|[a, b, c]| [op as u64, a as u64, b as u64, c as u64]))
        .collect();
    Point {
        grid: None,
        placement: Some(cast.name().into()),
        column_groups: None,
        stage_grids: Some(forced),
        cycles,
    }
}

/// The placement and per-op grids of a point (`ops` ops in the graph).
fn of(p: &Point, ops: usize) -> Result<(SideCast, Grids), String> {
    let name = p.placement.as_deref().ok_or("the state is for another search")?;
    let cast = SideCast::from_name(name).ok_or_else(|| format!("unknown cast placement `{name}`"))?;
    let forced = p.stage_grids.as_ref().ok_or("the state is for another search, not a stage search")?;
    let mut grids = vec![None; ops];
    for &[op, a, b, c] in forced {
        let slot = grids.get_mut(op as usize).ok_or_else(|| format!("op {op} is not in the model"))?;
        *slot = Some([a as u32, b as u32, c as u32]);
    }
    Ok((cast, grids))
}

/// Run (or resume) the search; `Ok(None)` when the graph is not a graph of stages with a matmul
/// stage, or its baseline cannot be planned (the build then reports why).
pub fn stage_grids(
    g: &Graph,
    src: &str,
    tiles: usize,
    attempts: u32,
    state_path: Option<&Path>,
    pool: &rayon::ThreadPool,
) -> Result<Option<StageOutcome>, String> {
    let stages = ipu_core::plan::stages::matmul_stages(g, PlanOptions::new(tiles));
    if stages.is_empty() {
        return Ok(None);
    }
    let has_casts = !state::side_casts(g).is_empty();
    let cost = |cast: SideCast, grids: &[Option<[u32; 3]>]| {
        // Costing: exchanges are scheduled as the build schedules them but not validated (the
        // chosen layout is planned again, validated, by the build).
        plan_with_grids(g, PlanOptions { side_cast: cast, costing: true, ..PlanOptions::new(tiles) }, grids)
            .map(|p| p.cost.cycles)
            .map_err(|e| e.to_string())
    };
    let none = vec![None; g.ops.len()];
    info!(stages = stages.len(), "search: planning the baseline layout");
    let Ok(base) = cost(SideCast::Replicated, &none) else { return Ok(None) };
    let digest = state::digest(src, tiles);
    let revalidate = |p: &Point| {
        let (c, gr) = of(p, g.ops.len())?;
        cost(c, &gr)
    };
    let mut st = match state::load_state(state_path, &digest, revalidate)? {
        Some(s) => s,
        None => state::new_state(digest, point(SideCast::Replicated, &none, base)),
    };
    let (mut cast, mut grids) = of(&st.incumbent, g.ops.len())?;
    // The screening of each matmul stage, best estimate first.
    let screened: Vec<(usize, Vec<[u32; 3]>)> = stages
        .iter()
        .map(|(op, mm)| {
            let list = search::screen(mm, tiles)
                .into_iter()
                .take(PER_STAGE + 1)
                .map(|(gr, _, _)| [gr.tm as u32, gr.tn as u32, gr.tk as u32])
                .collect();
            (*op, list)
        })
        .collect();
    // Batches in their fixed order: the cast placements, then one per matmul stage.
    let placements: Vec<SideCast> = if has_casts {
        SideCast::ALL.iter().copied().filter(|&c| c != SideCast::Replicated).collect()
    } else {
        vec![]
    };
    let mut done = 0u32;
    let mut batches: Vec<Option<usize>> = vec![None];
    batches.extend((0..screened.len()).map(Some));
    for batch in batches {
        if done >= attempts {
            break;
        }
        // The moves of this batch, each a whole point.
        let moves: Vec<(SideCast, Grids)> = match batch {
            None => placements.iter().map(|&c| (c, grids.clone())).collect(),
            Some(s) => {
                let (op, list) = &screened[s];
                let has = grids[*op].or(list.first().copied());
                list.iter()
                    .filter(|&&gr| Some(gr) != has)
                    .take(PER_STAGE)
                    .map(|&gr| {
                        let mut next = grids.clone();
                        next[*op] = Some(gr);
                        (cast, next)
                    })
                    .collect()
            }
        };
        // Whole batches only (the budget is rounded up to one), so that every saved state lies
        // on a batch boundary and a resumed search makes the same moves as an uninterrupted one.
        let size = moves.len() as u32;
        if done + size <= st.attempts {
            // Evaluated before a resume: the incumbent already holds what this batch chose.
            done += size;
            continue;
        }
        // Each candidate is a whole-graph plan (minutes at SigLIP scale): say what is being tried.
        info!(
            attempts = done,
            of = attempts,
            candidates = size,
            stage_op = ?batch.map(|s| screened[s].0),
            "search: planning candidate layouts"
        );
        let results: Vec<Result<u64, String>> =
            pool.install(|| moves.par_iter().map(|(c, gr)| cost(*c, gr)).collect());
        let mut best: Option<(u64, usize)> = None;
        for (i, r) in results.iter().enumerate() {
            match r {
                Ok(cycles) if *cycles < best.map_or(st.incumbent.cycles, |b| b.0) => {
                    best = Some((*cycles, i))
                }
                Ok(_) => {}
                Err(e) => info!(attempt = done + i as u32 + 1, error = %e, "stage candidate not plannable"),
            }
        }
        done += size;
        st.attempts = done;
        if let Some((cycles, i)) = best {
            let (c, gr) = &moves[i];
            info!(
                attempt = done,
                before = st.incumbent.cycles,
                after = cycles,
                stage_op = ?batch.map(|s| screened[s].0),
                grid = ?batch.map(|s| gr[screened[s].0]),
                placement = c.name(),
                "accepted local layout improvement"
            );
            cast = *c;
            grids = gr.clone();
            st.incumbent = point(cast, &grids, cycles);
        }
        state::save_state(state_path, &st)?;
    }
    info!(
        stages = screened.len(),
        baseline_cycles = st.baseline.cycles,
        candidate_cycles = st.incumbent.cycles,
        attempts = st.attempts,
        "searched stage grids with the whole-graph cost"
    );
    Ok(Some(StageOutcome {
        side_cast: cast,
        grids,
        baseline_cycles: st.baseline.cycles,
        attempts: st.attempts,
    }))
}
