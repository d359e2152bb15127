//! Graphs of several mappings (docs/graph-planner.md, step 1 and the re-block redistribution):
//! the graph is cut into *stages*, each planned by one existing mapping — a matmul grid with its
//! fused epilogue (bias, residual, GeLU), a row op on its own rows (layernorm, `rows.rs`;
//! add/sub/mul/gelu, `elementwise.rs`), or a
//! row chain (casts, softmax, batched matmuls) — and a
//! tensor made by one stage and read by a later one is moved by a redistribution superstep from
//! the producer's output slices to the consumer's input slices. Sources (inputs, params) are bound
//! by the host where they are first read and redistributed from there to later readers.
//!
//! Memory: a buffer's bytes may be reused once its last reader has run (`liveness.rs`).

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use ipu_schema::{DType, Direction};

use super::exchange::Event;
use super::liveness;
use super::redistribute::{self, Move, View, ViewStep};
use super::{
    chain, cost, fused_epilogue, BindingPlan, Plan, PlanError, PlanOptions, SliceRef, Step, Sym, TilePlan,
};
use crate::graph::{Graph, OpKind, TensorId};

/// A rank-2 matmul the grid planner takes: f16 operands (alpha only with f16 partials), or FP8
/// operands untransposed with f16 partials (`f8amp`).
pub(super) fn grid_matmul(g: &Graph, op: usize) -> bool {
    let fp8 = |t: TensorId| matches!(g.tensor(t).dtype, DType::F8E4M3 | DType::F8E5M2);
    matches!(g.ops[op].kind, OpKind::MatMul { a, b, alpha, accumulate, transpose_a, transpose_b }
        if g.tensor(a).shape.len() == 2 && g.tensor(b).shape.len() == 2
        && ((g.tensor(a).dtype == DType::F16 && g.tensor(b).dtype == DType::F16
             && (alpha.is_none() || accumulate == DType::F16))
            || (fp8(a) && fp8(b) && !transpose_a && !transpose_b && accumulate == DType::F16)))
}

/// An op planned on its own rows: a layernorm (`rows.rs`), a last-two-axes transpose
/// (`transpose.rs`), or an elementwise op no matmul took into its epilogue (`elementwise.rs`).
pub(super) fn row_op(g: &Graph, op: usize) -> bool {
    matches!(g.ops[op].kind, OpKind::LayerNorm { .. } | OpKind::Reduce { .. })
        || super::transpose::swaps_last_two(g, op)
        || super::elementwise::is_elementwise(g, op)
}

/// Whether op `op` is one the row-chain planner never takes (a row op, a view) or one the partition
/// starts a stage with: the partition plans it apart, so a row chain's complaint about it is not
/// the graph's reason.
pub(super) fn planned_apart(g: &Graph, op: usize) -> bool {
    op < g.ops.len()
        && (row_op(g, op) || view_op(g, op) || (op > 0 && partition(g).iter().any(|s| s[0] == op)))
}

/// A reshape, or a transpose that keeps the last axis: no stage, only a different way to read
/// bytes that are already somewhere (`redistribute::View`).
pub(super) fn view_op(g: &Graph, op: usize) -> bool {
    g.ops[op].kind.is_view()
}

/// For every tensor a view op makes: the tensor whose bytes it reads and how.
fn views(g: &Graph) -> BTreeMap<TensorId, (TensorId, View)> {
    let mut v: BTreeMap<TensorId, (TensorId, View)> = BTreeMap::new();
    for (i, op) in g.ops.iter().enumerate() {
        if !view_op(g, i) {
            continue;
        }
        let input = op.kind.operands()[0];
        let elt = g.tensor(input).dtype.size() as u64;
        let (base, mut view) = v.get(&input).cloned().unwrap_or((input, View { steps: Vec::new(), elt }));
        let shape = g.tensor(input).shape.clone();
        match &op.kind {
            OpKind::Transpose { perm, .. } => {
                view.steps.push(ViewStep::Transpose { shape, perm: perm.clone() })
            }
            OpKind::Slice { starts, .. } => {
                let out = g.tensor(op.output).shape.clone();
                view.steps.push(ViewStep::Slice { shape, starts: starts.clone(), out })
            }
            _ => {}
        }
        v.insert(op.output, (base, view));
    }
    v
}

/// Cut the ops into stages in order: each grid matmul with the epilogue ops that follow it and can
/// be fused (their intermediate results read by nothing else), and the runs of other ops between
/// them as row chains.
pub fn partition(g: &Graph) -> Vec<Vec<usize>> {
    let mut stages = Vec::new();
    let mut chain: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < g.ops.len() {
        if view_op(g, i) {
            i += 1;
            continue;
        }
        if row_op(g, i) {
            if !chain.is_empty() {
                stages.push(core::mem::take(&mut chain));
            }
            stages.push(vec![i]);
            i += 1;
            continue;
        }
        if !grid_matmul(g, i) {
            // A row chain is a sequence where each op reads the previous one's result, beside
            // casts of matmul side operands (`chain.rs`); an op that does neither (two outputs
            // cast one after the other) starts a chain of its own.
            // (A cast read by a grid matmul is not a side cast: that matmul is a stage apart.)
            let side_cast = |j: usize| {
                matches!(g.ops[j].kind, OpKind::Cast { .. })
                    && !g.outputs.contains(&g.ops[j].output)
                    && g.ops.iter().enumerate().any(|(k, o)| {
                        matches!(o.kind, OpKind::MatMul { b, .. } if b == g.ops[j].output)
                            && !grid_matmul(g, k)
                    })
            };
            let last = chain.iter().rev().find(|&&l| !side_cast(l));
            // In a chain a matmul result feeds only a softmax, and not when it is an f16 result of
            // f32 partial sums (packed to 16-byte rows, which the softmax kernel does not read):
            // any other reader starts a chain of its own, reading the result as a stage input.
            let matmul_to_other = |l: usize| match g.ops[l].kind {
                OpKind::MatMul { accumulate, .. } => {
                    !matches!(g.ops[i].kind, OpKind::Softmax { .. })
                        || (accumulate == DType::F32 && g.tensor(g.ops[l].output).dtype == DType::F16)
                }
                _ => false,
            };
            // Each op reads the previous one's result as its rows: a matmul through `a` (its `b` is
            // a side operand every row tile reads whole, a stage input when an earlier op made it).
            let reads_rows = |l: usize| match g.ops[i].kind {
                OpKind::MatMul { a, .. } => a == g.ops[l].output,
                ref k => k.operands().contains(&g.ops[l].output),
            };
            let follows = side_cast(i) || last.is_none_or(|&l| reads_rows(l) && !matmul_to_other(l));
            if !follows {
                stages.push(core::mem::take(&mut chain));
            }
            chain.push(i);
            i += 1;
            continue;
        }
        if !chain.is_empty() {
            stages.push(core::mem::take(&mut chain));
        }
        let mut ops = vec![i];
        while let Some(j) = ops.last().map(|l| l + 1).filter(|&j| j < g.ops.len()) {
            let mut with = ops.clone();
            with.push(j);
            if !fusable(g, &with) {
                break;
            }
            ops = with;
        }
        i = ops.last().map_or(i, |l| l + 1);
        stages.push(ops);
    }
    if !chain.is_empty() {
        stages.push(chain);
    }
    stages
}

/// The matmul stages of a graph `plan` plans as stages, for the stage search: the op of each
/// stage's matmul and the matmul planner's view of it (with its fused epilogue). Empty when the
/// graph is planned as one mapping (`plan::single` takes it whole), where stage grids mean nothing.
pub fn matmul_stages(g: &Graph, opts: PlanOptions) -> Vec<(usize, super::matmul::MatMul)> {
    let cut = partition(g);
    if !cut.iter().any(|ops| grid_matmul(g, ops[0])) || super::single(g, opts).is_ok() {
        return Vec::new();
    }
    stage_matmuls(g, &cut)
}

/// The grid matmul stages of the partition `cut`: each stage's matmul op and the matmul planner's
/// view of it (with its fused epilogue).
pub fn stage_matmuls(g: &Graph, cut: &[Vec<usize>]) -> Vec<(usize, super::matmul::MatMul)> {
    cut.iter()
        .filter(|ops| grid_matmul(g, ops[0]))
        .filter_map(|ops| {
            let sub = subgraph(g, ops, false);
            super::matmul_of(&sub, fused_epilogue(&sub)).map(|mm| (ops[0], mm))
        })
        .collect()
}

/// For each row of the grid matmul `op`'s left operand, the tile an earlier stage left it on
/// (`u16::MAX` where no slice starts a row there); empty when A comes from the host, is read
/// transposed or through a view. The matmul planner puts each row block's grid group there.
fn a_home(g: &Graph, op: usize, held: &BTreeMap<TensorId, Vec<SliceRef>>) -> Vec<u16> {
    let OpKind::MatMul { a, transpose_a: false, .. } = g.ops[op].kind else { return Vec::new() };
    let Some(slices) = held.get(&a) else { return Vec::new() };
    let t = g.tensor(a);
    let Some((&cols, lead)) = t.shape.split_last() else { return Vec::new() };
    let row_bytes = cols * t.dtype.size() as u64;
    let rows: u64 = lead.iter().product();
    if row_bytes == 0 {
        return Vec::new();
    }
    let mut home = vec![u16::MAX; rows as usize];
    for sl in slices {
        let r0 = sl.tensor_offset / row_bytes;
        let n = if sl.tensor_stride == row_bytes || sl.rows <= 1 { sl.rows as u64 } else { 1 };
        for h in home.iter_mut().skip(r0 as usize).take(n as usize) {
            if *h == u16::MAX {
                *h = sl.tile;
            }
        }
    }
    home
}

/// Whether an earlier stage holds most of the grid matmul `op`'s left operand (or the tensor it
/// is a view of) as whole rows (slices whose rows span more than one K block, as a LayerNorm or
/// a row chain leaves them), not as a matmul's 16-column output blocks: then the matmul takes it
/// row-major (`MatMul::a_row_major`), a row (or a head's part of it) per exchange piece; from
/// output blocks, the blocked layout takes each block as one piece already.
fn a_rows_whole(
    g: &Graph,
    op: usize,
    held: &BTreeMap<TensorId, Vec<SliceRef>>,
    base_of: impl Fn(TensorId) -> TensorId,
) -> bool {
    let OpKind::MatMul { a, transpose_a: false, .. } = g.ops[op].kind else { return false };
    let Some(slices) = held.get(&a).or_else(|| held.get(&base_of(a))) else { return false };
    // Runs of bytes contiguous both in the tensor and on the tile: a slice's rows, or one-row
    // slices that continue each other (a row chain with one row per tile holds its row as
    // consecutive K blocks).
    let mut one_row: Vec<&SliceRef> = slices.iter().filter(|s| s.rows == 1).collect();
    one_row.sort_by_key(|s| (s.tile, s.buffer.clone(), s.tensor_offset));
    let mut runs: Vec<(u64, u64)> =
        slices.iter().filter(|s| s.rows != 1).map(|s| (s.row_bytes as u64, s.rows as u64)).collect();
    let mut prev: Option<&SliceRef> = None;
    for s in one_row {
        let continues = prev.is_some_and(|p| {
            p.tile == s.tile
                && p.buffer == s.buffer
                && p.tensor_offset + p.row_bytes as u64 == s.tensor_offset
                && p.offset + p.row_bytes == s.offset
        });
        match runs.last_mut() {
            Some(last) if continues => last.0 += s.row_bytes as u64,
            _ => runs.push((s.row_bytes as u64, 1)),
        }
        prev = Some(s);
    }
    let bytes = |long: bool| -> u64 { runs.iter().filter(|r| (r.0 > 32) == long).map(|r| r.0 * r.1).sum() };
    bytes(true) > bytes(false)
}

/// Whether `ops` (a matmul and what follows it) form a matmul with a fused epilogue whose
/// intermediate results nothing else reads.
fn fusable(g: &Graph, ops: &[usize]) -> bool {
    let inner = &ops[..ops.len() - 1];
    let private = inner.iter().all(|&k| {
        let t = g.ops[k].output;
        !g.outputs.contains(&t)
            && g.ops.iter().enumerate().all(|(r, o)| ops.contains(&r) || !o.kind.operands().contains(&t))
    });
    private && fused_epilogue(&subgraph(g, ops, true)).is_some()
}

/// The graph of one stage: its ops; its sources are what it reads and does not make (params stay
/// params); its outputs what it makes for later stages or the model (with `last_only`, its last
/// result, as the epilogue test wants).
fn subgraph(g: &Graph, ops: &[usize], last_only: bool) -> Graph {
    let made: Vec<TensorId> = ops.iter().map(|&i| g.ops[i].output).collect();
    let (mut inputs, mut params) = (Vec::new(), Vec::new());
    for &i in ops {
        for t in g.ops[i].kind.operands() {
            let list = if g.params.contains(&t) { &mut params } else { &mut inputs };
            if !made.contains(&t) && !list.contains(&t) {
                list.push(t);
            }
        }
    }
    let outputs = if last_only {
        made.last().copied().into_iter().collect()
    } else {
        made.iter()
            .copied()
            .filter(|t| {
                g.outputs.contains(t)
                    || g.ops
                        .iter()
                        .enumerate()
                        .any(|(r, o)| !ops.contains(&r) && o.kind.operands().contains(t))
            })
            .collect()
    };
    // A source another stage reads too, or the host reads back, may be given to this stage in
    // bytes the others then read (a model input is bound where it is first read) — directly or
    // through views of one base (a reshape of an input read here, the input itself read by a
    // matmul elsewhere: the same bytes).
    let views = views(g);
    let base = |t: TensorId| views.get(&t).map_or(t, |v| v.0);
    let shared = inputs
        .iter()
        .chain(&params)
        .copied()
        .filter(|&t| {
            let b = base(t);
            g.outputs.iter().any(|&o| base(o) == b)
                || g.ops.iter().enumerate().any(|(r, o)| {
                    !ops.contains(&r) && !view_op(g, r) && o.kind.operands().iter().any(|&x| base(x) == b)
                })
        })
        .collect();
    Graph {
        name: g.name.clone(),
        tensors: g.tensors.clone(),
        inputs,
        params,
        outputs,
        ops: ops.iter().map(|&i| g.ops[i].clone()).collect(),
        shared,
    }
}

/// Plan the stages and join them with redistributions. An error says whether a row-chain stage
/// refused (`true`): the caller may prefer the whole-graph planner's reason then.
pub fn plan(
    g: &Graph,
    opts: PlanOptions,
    stages: &[Vec<usize>],
    grids: &[Option<[u32; 3]>],
    mut whole: Option<Plan>,
) -> Result<Plan, (PlanError, bool)> {
    let mut merged = Plan {
        tiles: super::Tiles::empty(opts.tiles),
        bindings: Vec::new(),
        cost: cost::Cost::default(),
        tiles_used: 0,
        mapping: Vec::new(),
        grids: vec![[1, 1, 1]; g.ops.len()],
        alpha_on_a: Vec::new(),
        horizons: Vec::new(),
        profile: None,
        exchange_bytes: 0,
        eliminated_clears: 0,
        cleared_bytes: 0,
    };
    // Where each tensor is held once made or bound: its slices (buffer names already tagged).
    let mut held: BTreeMap<TensorId, Vec<SliceRef>> = BTreeMap::new();
    let views = views(g);
    let base_of = |t: TensorId| views.get(&t).map_or(t, |v| v.0);
    let last = liveness::last_reads(g, stages, base_of);
    // Per tile, the index of each stage's first step (where its clears go, `liveness::finish`).
    let mut starts: Vec<Vec<usize>> = vec![Vec::new(); opts.tiles];
    for (k, ops) in stages.iter().enumerate() {
        let sub = subgraph(g, ops, false);
        let global = |e: PlanError| match e {
            PlanError::Unsupported(i, w) => PlanError::Unsupported(ops.get(i).copied().unwrap_or(ops[0]), w),
            other => other,
        };
        if let Some(tell) = opts.progress {
            tell(
                k,
                stages.len(),
                &format!("{} ops from op {} ({})", ops.len(), ops[0], super::op_phase(g, ops[0])),
            );
        }
        let stage_opts = PlanOptions { grid: None, profile: false, progress: None, ..opts };
        // The stage's mapping; a row-chain stage's refusal is marked as such.
        let from_whole = whole.is_some();
        let (planned, chain_stage) = if let Some(p) = whole.take() {
            // The whole graph as one mapping (`plan::single`), planned by the caller.
            (Ok(p), false)
        } else if super::transpose::swaps_last_two(g, ops[0]) {
            (super::transpose::plan(&sub, 0, opts.tiles), false)
        } else if let OpKind::Binary { .. } = g.ops[ops[0]].kind {
            (super::elementwise::binary(&sub, 0, opts.tiles), false)
        } else if let OpKind::Gelu { .. } | OpKind::Map { .. } = g.ops[ops[0]].kind {
            (super::elementwise::unary(&sub, 0, opts.tiles), false)
        } else if let OpKind::Reduce { .. } = g.ops[ops[0]].kind {
            (super::row_reduce::plan(&sub, 0, opts.tiles), false)
        } else if row_op(g, ops[0]) {
            (super::rows::layernorm(&sub, 0, opts.tiles), false)
        } else if grid_matmul(g, ops[0]) {
            let grid = grids.get(ops[0]).copied().flatten();
            let home = a_home(g, ops[0], &held);
            let whole = a_rows_whole(g, ops[0], &held, base_of);
            let epilogue = fused_epilogue(&sub);
            (super::plan_matmul(&sub, PlanOptions { grid, ..stage_opts }, epilogue, home, whole), false)
        } else {
            (chain::plan(&sub, stage_opts), true)
        };
        let mut p = planned.map_err(|e| (global(e), chain_stage))?;
        let tag = format!("g{k}_");
        rename(&mut p, &tag);
        let mut moves: Vec<Move> = Vec::new();
        let mut moved: Vec<String> = Vec::new();
        // Per tile: which tensors each buffer holds once the stage ran, and the buffers the
        // host reads or writes (liveness).
        let mut holds: BTreeMap<u16, BTreeMap<String, Vec<TensorId>>> = BTreeMap::new();
        let first_host_binding = merged.bindings.len();
        for b in p.bindings {
            let name = &g.tensor(b.tensor).name;
            if b.direction == Direction::Output {
                for sl in &b.slices {
                    holds
                        .entry(sl.tile)
                        .or_default()
                        .entry(String::from(sl.buffer.as_str()))
                        .or_default()
                        .push(b.tensor);
                }
                if g.outputs.contains(&b.tensor) {
                    merged.bindings.push(b.clone());
                }
                held.insert(b.tensor, b.slices);
            } else if let Some(from) = held.get(&base_of(b.tensor)) {
                if b.transpose {
                    let reader = ops.iter().copied().find(|&i| g.ops[i].kind.operands().contains(&b.tensor));
                    return Err(unsupported(
                        reader.unwrap_or(ops[0]),
                        format!(
                            "`{name}` is made on the chip and read transposed here; transposing on the chip \
                             is not supported yet (give it as a model input, or read it untransposed)"
                        ),
                    ));
                }
                let view = views.get(&b.tensor).map(|v| v.1.clone()).unwrap_or_default();
                moves.extend(
                    redistribute::moves(name, from, &b.slices, &view).map_err(|e| unsupported(ops[0], e))?,
                );
                moved.push(name.clone());
            } else if let Some((base, view)) = views.get(&b.tensor) {
                // The host writes the input itself where this stage reads its view.
                let Some(slices) = redistribute::held_through(view, &b.slices).filter(|_| !b.transpose)
                else {
                    if b.transpose {
                        return Err(unsupported(
                            ops[0],
                            format!(
                                "`{name}` is a view of a model input read transposed; read the input itself"
                            ),
                        ));
                    }
                    // A slice: the input is placed in rows of its own (bound as any input) and
                    // the slice moved from there to where this stage reads it.
                    let rows = place_source(g, *base, opts.tiles, &mut merged);
                    moves.extend(
                        redistribute::moves(name, &rows, &b.slices, view)
                            .map_err(|e| unsupported(ops[0], e))?,
                    );
                    moved.push(name.clone());
                    held.insert(*base, rows);
                    continue;
                };
                held.insert(*base, slices.clone());
                merged.bindings.push(BindingPlan {
                    tensor: *base,
                    direction: b.direction,
                    transpose: false,
                    slices,
                });
            } else {
                held.insert(b.tensor, b.slices.clone());
                merged.bindings.push(b);
            }
        }
        let host = liveness::host_buffers(&merged.bindings[first_host_binding..]);
        for (t, st) in starts.iter_mut().enumerate() {
            st.push(merged.tiles[t].steps.len());
        }
        if !moves.is_empty() {
            let step = redistribute::superstep_with(&moves, &format!("x{k}_"), !opts.costing)
                .map_err(|e| unsupported(ops[0], e))?;
            merged.exchange_bytes += step.exchange_bytes;
            if !step.events.is_empty() {
                merged.horizons.push(step.horizon);
            }
            redistribute::append(
                &mut merged.tiles,
                step,
                // Unique per stage, so that a profile's phases do not merge stages.
                &format!("redistribute {} → {}", moved.join(" "), super::op_phase(g, ops[0])),
                &format!("x{k}_"),
            );
        }
        let limit = super::BUFFER_BYTES;
        // Lifetimes depend on a tile only through which tensors its buffers hold and which the
        // host binds: tiles that share a program and those get the same lifetimes keep sharing.
        let arcs = p.tiles.into_arcs();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        {
            type Key<'a> =
                (*const TilePlan, Option<&'a BTreeMap<String, Vec<TensorId>>>, Option<&'a BTreeSet<String>>);
            let mut group_of: BTreeMap<Key<'_>, usize> = BTreeMap::new();
            for (t, tp) in arcs.iter().enumerate() {
                let tile = t as u16;
                let n = groups.len();
                let g = *group_of.entry((Arc::as_ptr(tp), holds.get(&tile), host.get(&tile))).or_insert(n);
                if g == n {
                    groups.push(Vec::new());
                }
                groups[g].push(t);
            }
        }
        let mut arcs: Vec<Option<Arc<TilePlan>>> = arcs.into_iter().map(Some).collect();
        for members in groups {
            let first = members[0];
            let tile = first as u16;
            let mut tp = arcs[first].take().expect("each tile once");
            for &t in &members[1..] {
                arcs[t] = None;
            }
            let own = Arc::make_mut(&mut tp);
            liveness::assign(&mut own.buffers, k, holds.get(&tile), &last, host.get(&tile));
            for &t in &members {
                let tile = t as u16;
                // The peak at this stage's two positions, with every earlier buffer still live
                // there (lifetimes are known when a buffer is made: its readers are in the graph).
                for x in [2 * k as u32, 2 * k as u32 + 1] {
                    let (before, needed) = (
                        liveness::live_bytes(&merged.tiles[t].buffers, x),
                        liveness::live_bytes(&tp.buffers, x),
                    );
                    if before + needed > limit {
                        let free = limit.saturating_sub(before);
                        let held = super::Held::at(&merged.tiles[t].buffers, x);
                        return Err((PlanError::NoRoom { tile, op: ops[0], needed, free, held }, false));
                    }
                }
                // The first stage's program moves in whole (shared by the tiles that share it): at
                // SigLIP scale a copy per tile is 160 MB more at the peak.
                if merged.tiles[t].buffers.is_empty() && merged.tiles[t].steps.is_empty() {
                    merged.tiles.set_arc(t, tp.clone());
                } else {
                    let into = &mut merged.tiles[t];
                    into.buffers.extend(tp.buffers.iter().cloned());
                    into.steps.extend(tp.steps.iter().cloned());
                }
            }
        }
        merged.horizons.extend(p.horizons);
        merged.tiles_used = merged.tiles_used.max(p.tiles_used);
        merged.exchange_bytes += p.exchange_bytes;
        merged.eliminated_clears += p.eliminated_clears;
        if stages.len() == 1 {
            // One stage: the graph as one mapping, described as that mapping is. Planned whole,
            // its op indices are the graph's; planned on its subgraph (views left out), the
            // subgraph's, mapped as any stage's are.
            merged.mapping.extend(p.mapping);
            if from_whole {
                merged.grids = p.grids;
                merged.alpha_on_a = p.alpha_on_a;
            } else {
                for (i, grid) in p.grids.into_iter().enumerate() {
                    if let Some(&op) = ops.get(i) {
                        merged.grids[op] = grid;
                    }
                }
                merged.alpha_on_a.extend(p.alpha_on_a.iter().filter_map(|&i| ops.get(i).copied()));
            }
            continue;
        }
        merged.mapping.extend(p.mapping.into_iter().map(|m| format!("stage {k}: {m}")));
        for (i, grid) in p.grids.into_iter().enumerate() {
            if let Some(&op) = ops.get(i) {
                merged.grids[op] = grid;
            }
        }
        merged.alpha_on_a.extend(p.alpha_on_a.iter().filter_map(|&i| ops.get(i).copied()));
    }
    // Model outputs that are reshapes of held tensors are read where those bytes are; a view of a
    // model input or param is copied first (the host poisons outputs before a run, which would
    // overwrite the source, and a source may be held on several tiles), and so is a transpose or
    // slice view (its bytes are not rows of the held tensor).
    let mut copies: Vec<Move> = Vec::new();
    let mut copied = Vec::new();
    for &o in &g.outputs {
        if let Some((base, view)) = views.get(&o) {
            let name = &g.tensor(o).name;
            let producer = g.ops.iter().position(|op| op.output == o).unwrap_or(0);
            // A model input or param that only this output reads is placed in rows of its own
            // first (bound as any input; a param's values are embedded there).
            if !held.contains_key(base) && g.is_source(*base) {
                let rows = place_source(g, *base, opts.tiles, &mut merged);
                held.insert(*base, rows);
            }
            let slices = match held.get(base) {
                Some(s) => s,
                None => {
                    return Err(unsupported(
                        producer,
                        format!(
                            "output `{name}` is a view of `{}`, which no op reads; output it itself",
                            g.tensor(*base).name
                        ),
                    ))
                }
            };
            // A transpose or slice view is gathered into rows of its own; so is any view of a source.
            let slices = if g.is_source(*base) || !view.steps.is_empty() {
                let tag = format!("y{}_", copied.len());
                let (to, buffers) = row_major(g.tensor(o), opts.tiles, &tag);
                copies.extend(
                    redistribute::moves(name, slices, &to, view).map_err(|e| unsupported(producer, e))?,
                );
                for (t, b) in buffers {
                    merged.tiles[t as usize].buffers.push(b);
                }
                copied.push(name.clone());
                to
            } else {
                slices.clone()
            };
            merged.bindings.push(BindingPlan {
                tensor: o,
                direction: Direction::Output,
                transpose: false,
                slices,
            });
        }
    }
    if !copies.is_empty() {
        let producer = g.ops.len().saturating_sub(1);
        let step = redistribute::superstep_with(&copies, "yx_", !opts.costing)
            .map_err(|e| unsupported(producer, e))?;
        merged.exchange_bytes += step.exchange_bytes;
        if !step.events.is_empty() {
            merged.horizons.push(step.horizon);
        }
        redistribute::append(&mut merged.tiles, step, &format!("copy {}", copied.join(" ")), "yx_");
    }
    // Tiles that share a program share its stage starts too.
    let mut cleared = 0;
    merged
        .tiles
        .for_each_distinct(|tiles, tile| {
            cleared += liveness::finish(tile, &starts[tiles[0]], super::BUFFER_BYTES) * tiles.len() as u64;
            Ok::<(), ()>(())
        })
        .expect("finishing cannot fail");
    merged.cleared_bytes += cleared;
    merged.cost = cost::predict(&merged.tiles, &merged.horizons);
    Ok(merged)
}

/// A refusal that is not a row-chain stage's own.
fn unsupported(op: usize, why: String) -> (PlanError, bool) {
    (PlanError::Unsupported(op, why), false)
}

/// Prefix every buffer name of a stage's plan (buffers, descriptor words, steps, exchange events,
/// bindings) so that stages never share a symbol.
fn rename(p: &mut Plan, tag: &str) {
    let re = |s: &mut Sym| *s = smol_str::format_smolstr!("{tag}{s}");
    let renamed = p.tiles.for_each_distinct(|_, t| {
        // `Init::rename` formats each distinct name of a buffer once, not once per word.
        for b in t.buffers.iter_mut() {
            re(&mut b.name);
            b.init.rename(|s| smol_str::format_smolstr!("{tag}{s}"));
        }
        for step in t.steps.iter_mut() {
            match step {
                Step::LoadWeights(s, ..) => re(s),
                Step::RunAll(_, d, _) => re(&mut d.table),
                Step::Exchange(evs) => {
                    for e in evs.iter_mut() {
                        if let Event::Pointer { buffer, .. } | Event::Send { buffer, .. } = e {
                            *buffer = format!("{tag}{buffer}").into();
                        }
                    }
                }
                Step::Sync | Step::SetCsr(..) | Step::Phase(_) | Step::Stamp(_) => {}
            }
        }
        Ok::<(), ()>(())
    });
    renamed.expect("renaming cannot fail");
    for b in p.bindings.iter_mut() {
        for s in b.slices.iter_mut() {
            s.buffer = smol_str::format_smolstr!("{tag}{}", s.buffer);
        }
    }
}

/// A row-major copy of tensor `t` (rows of its last axis, each padded to a whole word) spread by
/// rows over up to `tiles` tiles, in buffers named `{tag}out`: its slices and, per tile, the
/// buffer (host-bound, so live for the whole run).
/// Place model input or param `base`, which no stage placed, in rows of its own (`row_major`) and
/// bind it there (a param's values are embedded into those rows as any param binding's): for a
/// slice or an output view of it. Returns the rows.
fn place_source(g: &Graph, base: TensorId, tiles: usize, merged: &mut Plan) -> Vec<SliceRef> {
    let (rows, buffers) = row_major(g.tensor(base), tiles, &format!("v{}_", base.0));
    for (t, b) in buffers {
        merged.tiles[t as usize].buffers.push(b);
    }
    merged.bindings.push(BindingPlan {
        tensor: base,
        direction: Direction::Input,
        transpose: false,
        slices: rows.clone(),
    });
    rows
}

fn row_major(
    t: &crate::graph::Tensor,
    tiles: usize,
    tag: &str,
) -> (Vec<SliceRef>, Vec<(u16, super::Buffer)>) {
    let elt = t.dtype.size() as u64;
    let d = *t.shape.last().unwrap_or(&1);
    let rows: u64 = t.shape.iter().rev().skip(1).product();
    let (row_bytes, stride) = (d * elt, (d * elt).div_ceil(4) * 4);
    let used = (tiles as u64).min(rows).max(1);
    let name: Sym = smol_str::format_smolstr!("{tag}out");
    let (mut slices, mut buffers) = (Vec::new(), Vec::new());
    for i in 0..used {
        let (r0, r1) = super::layout::split(rows, used, i);
        if r1 == r0 {
            continue;
        }
        slices.push(SliceRef {
            tile: i as u16,
            buffer: name.clone(),
            offset: 0,
            tensor_offset: r0 * row_bytes,
            rows: (r1 - r0) as u32,
            row_bytes: row_bytes as u32,
            tensor_stride: row_bytes,
            tile_stride: stride as u32,
        });
        buffers.push((i as u16, super::layout::zero(&name, (r1 - r0) * stride, super::MemKind::Tensor)));
    }
    (slices, buffers)
}
