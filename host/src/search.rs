//! The plan search driver (docs/search.md): screening, concurrent evaluation with in-order
//! acceptance, and a resumable search state written atomically after every accepted improvement.

use ipu_core::graph::{Graph, OpKind};
use ipu_core::plan::matmul::{Grid, MatMul};
use ipu_core::plan::search;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::Path;
use tracing::info;

/// A candidate and its predicted cycles: a grid (matmul search) or a cast placement (row chains).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Point {
    /// `[tm, tn, tk]` of the grid search.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grid: Option<[u64; 3]>,
    /// Side-cast placement of the row-chain search (`SideCast::name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    /// Column groups of the row-chain search (absent: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column_groups: Option<u32>,
    /// Grids forced per matmul stage by the stage search, `[op, tm, tn, tk]` (`stage_search.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_grids: Option<Vec<[u64; 4]>>,
    /// Predicted cycles of a `run` call.
    pub cycles: u64,
}

/// The search state file (JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchState {
    /// `"ipu-codegen-search-state"`.
    pub format: String,
    /// 1.
    pub version: u32,
    /// SHA-256 of model text, target tiles and compiler version.
    pub digest: String,
    /// Candidates evaluated after the baseline.
    pub attempts: u32,
    /// The screening's first choice.
    pub baseline: Point,
    /// The best plan so far.
    pub incumbent: Point,
}

/// What the search chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Grid to build.
    pub grid: [u32; 3],
    /// Baseline cycles.
    pub baseline_cycles: u64,
    /// Attempts made in total (including resumed ones).
    pub attempts: u32,
}

pub(crate) fn digest(src: &str, tiles: usize) -> String {
    let mut h = Sha256::new();
    h.update(src.as_bytes());
    h.update(tiles.to_le_bytes());
    h.update(env!("CARGO_PKG_VERSION").as_bytes());
    crate::build::hex(&h.finalize())
}

fn to_grid(g: Grid) -> [u64; 3] {
    [g.tm, g.tn, g.tk]
}

fn grid_point(g: Grid, cycles: u64) -> Point {
    Point { grid: Some(to_grid(g)), placement: None, column_groups: None, stage_grids: None, cycles }
}

/// A cast placement by name.
fn placement(name: &str) -> Result<ipu_core::plan::chain::SideCast, String> {
    ipu_core::plan::chain::SideCast::from_name(name).ok_or_else(|| format!("unknown cast placement `{name}`"))
}

/// Load a state (if the file exists) for this model: format, digest, then `revalidate` must cost
/// the incumbent exactly as saved.
pub(crate) fn load_state(
    path: Option<&Path>,
    digest: &str,
    revalidate: impl Fn(&Point) -> Result<u64, String>,
) -> Result<Option<SearchState>, String> {
    let Some(p) = path.filter(|p| p.exists()) else { return Ok(None) };
    let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let s = parse_state(&text).map_err(|e| format!("{}: {e}", p.display()))?;
    if s.digest != digest {
        return Err(format!(
            "{}: search state was saved for another model, target or compiler version; delete it or use another path",
            p.display()
        ));
    }
    let again = revalidate(&s.incumbent).map_err(|e| format!("{}: {e}", p.display()))?;
    if again != s.incumbent.cycles {
        return Err(format!(
            "{}: incumbent re-costs to {again} cycles, state says {}",
            p.display(),
            s.incumbent.cycles
        ));
    }
    info!(path = %p.display(), attempts = s.attempts, "loaded mid-plan search state");
    info!(cycles = again, resuming = true, "validated search incumbent");
    Ok(Some(s))
}

/// Save the state atomically (when a path is given).
pub(crate) fn save_state(path: Option<&Path>, s: &SearchState) -> Result<(), String> {
    if let Some(p) = path {
        let text = serde_json::to_string_pretty(s).map_err(|e| e.to_string())?;
        crate::atomic::write_atomic(p, text.as_bytes()).map_err(|e| format!("{}: {e}", p.display()))?;
        info!(path = %p.display(), attempts = s.attempts, bytes = text.len(), "saved mid-plan search state");
    }
    Ok(())
}

pub(crate) fn new_state(digest: String, baseline: Point) -> SearchState {
    SearchState {
        format: "ipu-codegen-search-state".into(),
        version: 1,
        digest,
        attempts: 0,
        baseline: baseline.clone(),
        incumbent: baseline,
    }
}

/// Parse and check a search state (untrusted text): format, version and grid values.
pub fn parse_state(text: &str) -> Result<SearchState, String> {
    let s: SearchState = serde_json::from_str(text).map_err(|e| format!("not a search state: {e}"))?;
    if s.format != "ipu-codegen-search-state" || s.version != 1 {
        return Err(format!("unknown search state format {} v{}", s.format, s.version));
    }
    let grid_search = s.baseline.grid.is_some();
    for p in [&s.baseline, &s.incumbent] {
        match (&p.grid, &p.placement) {
            (Some(g), None) if grid_search => {
                if g.iter().any(|d| *d == 0 || *d > ipu_core::target::NUM_TILES as u64) {
                    return Err(format!("grid {g:?} out of range"));
                }
            }
            (None, Some(name)) if !grid_search => {
                placement(name)?;
                for g in p.stage_grids.iter().flatten() {
                    if g[1..].iter().any(|d| *d == 0 || *d > ipu_core::target::NUM_TILES as u64) {
                        return Err(format!("stage grid {:?} of op {} out of range", &g[1..], g[0]));
                    }
                }
                if p.column_groups.is_some_and(|g| g < 2 || g as usize > ipu_core::target::NUM_TILES) {
                    return Err(format!("column groups {:?} out of range", p.column_groups));
                }
            }
            _ => return Err("each point needs a grid or a cast placement, the same kind in both".into()),
        }
    }
    Ok(s)
}

/// The single-matmul graphs the search applies to (with their fused epilogue, if any), planned
/// exactly as the build will plan them.
pub fn searchable(g: &Graph) -> Option<MatMul> {
    let epilogue = ipu_core::plan::fused_epilogue(g);
    if g.ops.len() != 1 && epilogue.is_none() {
        return None;
    }
    match g.ops[0].kind {
        OpKind::MatMul { a, b, transpose_a, transpose_b, accumulate, alpha }
            if g.tensor(a).shape.len() == 2
                && g.tensor(b).shape.len() == 2
                && g.tensor(a).dtype == ipu_schema::DType::F16
                && g.tensor(b).dtype == ipu_schema::DType::F16
                && (alpha.is_none() || accumulate == ipu_schema::DType::F16) =>
        {
            let mut mm = MatMul::new(g, a, b, g.ops[0].output, transpose_a, transpose_b, accumulate);
            mm.alpha = alpha;
            mm.out = g.tensor(g.ops[0].output).dtype;
            mm.epilogue = epilogue;
            Some(mm)
        }
        _ => None,
    }
}

/// Run (or resume) the search. `pool` evaluates candidates concurrently.
pub fn run(
    mm: &MatMul,
    src: &str,
    tiles: usize,
    attempts: u32,
    state_path: Option<&Path>,
    pool: &rayon::ThreadPool,
) -> Result<Option<Outcome>, String> {
    let screened = search::screen(mm, tiles);
    let Some(&(first, _, first_pressure)) = screened.first() else {
        // Nothing fits: let the planner refuse it, naming the tensor and the bytes over.
        return Ok(None);
    };
    let eval = |g: Grid| search::evaluate(mm, g, tiles).map(|(c, _)| c).map_err(|e| e.to_string());
    let digest = digest(src, tiles);
    let revalidate = |p: &Point| match p.grid {
        Some([tm, tn, tk]) => eval(Grid { tm, tn, tk }),
        None => Err("the state is for a cast-placement search, not a grid search".into()),
    };
    let mut state = match load_state(state_path, &digest, revalidate)? {
        Some(s) => s,
        None => new_state(digest, grid_point(first, eval(first)?)),
    };
    let save = |s: &SearchState| save_state(state_path, s);
    let end = (attempts as usize).min(screened.len().saturating_sub(1));
    let start = state.attempts as usize;
    let batch = pool.current_num_threads().max(1);
    let mut next = start;
    while next < end {
        let upto = (next + batch).min(end);
        // Candidates 1..: evaluated concurrently, accepted in screening order.
        let results: Vec<Result<u64, String>> =
            pool.install(|| screened[next + 1..upto + 1].par_iter().map(|(g, _, _)| eval(*g)).collect());
        for (i, r) in results.into_iter().enumerate() {
            let (g, _, pr) = screened[next + 1 + i];
            state.attempts = (next + 1 + i) as u32;
            let cycles = r?;
            if cycles < state.incumbent.cycles {
                info!(
                    attempt = state.attempts,
                    before = state.incumbent.cycles,
                    after = cycles,
                    grid = ?to_grid(g),
                    pressure = pr,
                    "accepted local layout improvement"
                );
                state.incumbent = grid_point(g, cycles);
                save(&state)?;
            }
        }
        next = upto;
    }
    let inc = state.incumbent.clone();
    let inc_grid = inc.grid.unwrap_or([1, 1, 1]);
    let inc_pressure = screened.iter().find(|(g, _, _)| to_grid(*g) == inc_grid).map(|x| x.2).unwrap_or(0);
    info!(
        candidates = screened.len(),
        baseline_cycles = state.baseline.cycles,
        candidate_cycles = inc.cycles,
        baseline_pressure = first_pressure,
        candidate_pressure = inc_pressure,
        "screened tile mappings by exchange resource load"
    );
    save(&state)?;
    Ok(Some(Outcome {
        grid: [inc_grid[0] as u32, inc_grid[1] as u32, inc_grid[2] as u32],
        baseline_cycles: state.baseline.cycles,
        attempts: state.attempts,
    }))
}

/// What the row-chain layout search chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutOutcome {
    /// Placement to build.
    pub side_cast: ipu_core::plan::chain::SideCast,
    /// Column groups to build.
    pub column_groups: u32,
    /// Predicted cycles of the baseline (`Replicated`).
    pub baseline_cycles: u64,
    /// Candidates evaluated beyond the baseline.
    pub attempts: u32,
}

/// What the search keeps of a planned candidate.
struct Figures {
    cost: ipu_core::plan::cost::Cost,
    exchange_bytes: u64,
}

/// The casts whose result is some matmul's `b` (a side operand): the ops a cast placement moves.
pub(crate) fn side_casts(g: &Graph) -> Vec<usize> {
    (0..g.ops.len())
        .filter(|&i| {
            matches!(g.ops[i].kind, OpKind::Cast { .. })
                && g.ops.iter().any(|o| matches!(o.kind, OpKind::MatMul { b, .. } if b == g.ops[i].output))
        })
        .collect()
}

/// Local search over the layout of a row chain (docs/search.md): where the casts of matmul side
/// operands run (replicated on every tile — the baseline —, or a share cast on each tile before or
/// after an all-gather), and into how many column groups the final matmul is split. Candidates
/// are planned and costed concurrently and accepted in their fixed order, so the choice does not
/// depend on the thread count; the state is saved and resumed as for the grid search. `Ok(None)`
/// when neither applies (or the baseline cannot be planned: the build reports that itself).
pub fn chain_layout(
    g: &Graph,
    src: &str,
    tiles: usize,
    attempts: u32,
    state_path: Option<&Path>,
    pool: &rayon::ThreadPool,
) -> Result<Option<LayoutOutcome>, String> {
    use ipu_core::plan::{chain::SideCast, PlanOptions};
    let sides = side_casts(g);
    let groups: Vec<u32> = (1..=11)
        .map(|e| 1u32 << e)
        .take_while(|&n| n as usize <= tiles)
        .filter(|&n| ipu_core::plan::columns::split(g, n as u64).is_ok())
        .collect();
    if sides.is_empty() && groups.is_empty() {
        return Ok(None);
    }
    let placements: &[SideCast] = if sides.is_empty() { &[SideCast::Replicated] } else { &SideCast::ALL };
    // Each candidate's figures (`plan::figures`: the full plan's cost and exchange bytes); with a
    // budget, a candidate that provably costs more is refused before it is built.
    let figures = |(n, c): (u32, SideCast), budget: Option<u64>| {
        let opts = PlanOptions { side_cast: c, column_groups: n, budget, ..PlanOptions::new(tiles) };
        ipu_core::plan::figures(g, opts, &[]).map(|(cost, exchange_bytes)| Figures { cost, exchange_bytes })
    };
    let cost = |x: (u32, SideCast)| figures(x, None);
    let Ok(base) = cost((1, SideCast::Replicated)) else { return Ok(None) };
    let point = |(n, c): (u32, SideCast), cycles: u64| Point {
        grid: None,
        placement: Some(c.name().into()),
        column_groups: (n > 1).then_some(n),
        stage_grids: None,
        cycles,
    };
    let of = |p: &Point| -> Result<(u32, SideCast), String> {
        let name = p.placement.as_deref().ok_or("the state is for a grid search, not a row-chain search")?;
        Ok((p.column_groups.unwrap_or(1), placement(name)?))
    };
    let revalidate = |p: &Point| cost(of(p)?).map(|p| p.cost.cycles).map_err(|e| e.to_string());
    let digest = digest(src, tiles);
    let mut state = match load_state(state_path, &digest, revalidate)? {
        Some(s) => s,
        None => new_state(digest, point((1, SideCast::Replicated), base.cost.cycles)),
    };
    let candidates: Vec<(u32, SideCast)> = core::iter::once(1)
        .chain(groups.iter().copied())
        .flat_map(|n| placements.iter().map(move |&c| (n, c)))
        .filter(|&x| x != (1, SideCast::Replicated))
        .take(attempts as usize)
        .collect();
    let start = (state.attempts as usize).min(candidates.len());
    // Only the figures of each plan are kept: a full 1472-tile plan per candidate held at once
    // took over a GB for the Q·Kᵀ example. Two waves: the replicated candidates (no exchange),
    // then the others with the best cycles so far as their budget — a candidate whose exchange
    // alone must take longer is refused before it is built (`PlanError::OverBudget`). Refused
    // only when its bound is strictly above a cost already reached, it could never have been
    // accepted, so the choice is the one an evaluation of every candidate makes.
    let todo = &candidates[start..];
    let first_wave: Vec<_> = pool.install(|| {
        todo.par_iter().filter(|x| x.1 == SideCast::Replicated).map(|&x| (x, figures(x, None))).collect()
    });
    let budget = first_wave
        .iter()
        .filter_map(|(_, p)| p.as_ref().ok().map(|p| p.cost.cycles))
        .chain([state.incumbent.cycles])
        .min();
    let second_wave: Vec<_> = pool.install(|| {
        todo.par_iter().filter(|x| x.1 != SideCast::Replicated).map(|&x| (x, figures(x, budget))).collect()
    });
    // Back in candidate order.
    let mut evaluated: Vec<_> = first_wave.into_iter().chain(second_wave).collect();
    evaluated.sort_by_key(|(x, _)| todo.iter().position(|y| y == x));
    let names: Vec<String> = sides.iter().map(|&i| ipu_core::plan::op_phase(g, i).to_string()).collect();
    for (i, (x, p)) in evaluated.iter().enumerate() {
        let attempt = start + i + 1;
        state.attempts = attempt as u32;
        match p {
            Ok(p) => {
                info!(
                    attempt,
                    casts = ?names,
                    placement = x.1.name(),
                    column_groups = x.0,
                    cycles = p.cost.cycles,
                    exchange_cycles = p.cost.exchange,
                    exchange_bytes = p.exchange_bytes,
                    "evaluated local layout candidate"
                );
                if p.cost.cycles < state.incumbent.cycles {
                    info!(
                        attempt,
                        before = state.incumbent.cycles,
                        after = p.cost.cycles,
                        changed_casts = ?names,
                        placement = x.1.name(),
                        column_groups = x.0,
                        "accepted local layout improvement"
                    );
                    state.incumbent = point(*x, p.cost.cycles);
                    save_state(state_path, &state)?;
                }
            }
            Err(ipu_core::plan::PlanError::OverBudget { lower_bound, exchange_bytes }) => info!(
                attempt,
                placement = x.1.name(),
                column_groups = x.0,
                lower_bound,
                exchange_bytes,
                "skipped local layout candidate: its exchange alone exceeds the best cycles so far"
            ),
            Err(e) => {
                info!(attempt, placement = x.1.name(), column_groups = x.0, error = %e, "local layout candidate not plannable")
            }
        }
    }
    save_state(state_path, &state)?;
    let best = of(&state.incumbent)?;
    if !sides.is_empty() {
        // The seed's "cast order" figure: bytes the exchange moves with each cast before vs after it
        // (at the chosen column groups).
        // Plans the search already made are reused; only candidates it did not evaluate (outside
        // the attempts budget, or before a resume) are planned here.
        let bytes = |c: SideCast| match evaluated.iter().find(|(x, _)| *x == (best.0, c)) {
            Some((_, Ok(p))) => Some(p.exchange_bytes),
            Some((_, Err(ipu_core::plan::PlanError::OverBudget { exchange_bytes, .. }))) => {
                Some(*exchange_bytes)
            }
            Some((_, Err(_))) => None,
            None => cost((best.0, c)).ok().map(|p| p.exchange_bytes),
        };
        info!(
            casts = ?names,
            column_groups = best.0,
            exchange_bytes_cast_before = ?bytes(SideCast::BeforeExchange),
            exchange_bytes_cast_after = ?bytes(SideCast::AfterExchange),
            replicated_cycles = state.baseline.cycles,
            chosen = best.1.name(),
            cycles = state.incumbent.cycles,
            "compared cast placement relative to the exchange"
        );
    }
    Ok(Some(LayoutOutcome {
        side_cast: best.1,
        column_groups: best.0,
        baseline_cycles: state.baseline.cycles,
        attempts: state.attempts,
    }))
}
