//! Row ops on their own tiles (docs/graph-planner.md §3): the rows of the input (all leading
//! dimensions flattened) are split over tiles, each tile's rows over its six workers; every row is
//! stored packed to a multiple of four values (8-byte aligned, zero padding). Today: layer
//! normalisation (`layernorm_f16`, docs/kernels.md); a tile with fewer rows than workers has the
//! six workers share each row (`layernorm_sum`/`_var`/`_apply`), so one row per tile — SigLIP's
//! 729 rows on 1472 tiles — still uses the whole tile.

use alloc::format;
use alloc::vec;
use alloc::vec::Vec;
use ipu_schema::Direction;

use super::layout::{split, zero};
use super::{cost, BindingPlan, Buffer, Kernel, MemKind, Plan, PlanError, SliceRef, Step, TilePlan, Word};
use crate::graph::{Graph, OpKind};
use crate::target::{TILE_MEM_SIZE, WORKERS};

/// Whether a tile with `rows` rows of `d` values normalises them with the six workers sharing each
/// row (three launches) rather than one worker per row: when the slowest worker issues fewer
/// instructions that way (few rows of many values). The host reference asks the same question.
pub fn share_rows(rows: u64, d: u64) -> bool {
    let w = WORKERS as u64;
    let (chunks, tail) = (d / 4, d % 4);
    let single = cost::layernorm_issues(rows.div_ceil(w), chunks, tail);
    let shared: u64 = [Kernel::LayerNormSum, Kernel::LayerNormVar, Kernel::LayerNormApply]
        .into_iter()
        .map(|k| cost::layernorm_shared_issues(k, rows, chunks.div_ceil(w), tail) + 2)
        .sum();
    rows > 0 && shared < single
}

/// How a row op spreads the rows of its last axis over the tiles (the layernorm and the row
/// reductions, `row_reduce.rs`): whole rows, as many tiles as rows up to `tiles`.
pub(super) struct RowSplit {
    /// Values per row (the last axis).
    pub d: u64,
    /// Rows in all.
    pub rows_total: u64,
    /// Bytes between rows on a tile: the row in f16, padded to whole 8-byte quads.
    pub stride: u64,
    /// Tiles used.
    pub tm: u64,
    /// Rows on the fullest tile.
    pub per_tile: u64,
}

impl RowSplit {
    /// The split of `x`'s rows over up to `tiles` tiles.
    pub fn of(x: &crate::graph::Tensor, tiles: usize) -> Self {
        let d = *x.shape.last().unwrap_or(&1);
        let rows_total = x.elements() / d.max(1);
        let tm = (tiles as u64).min(rows_total).max(1);
        RowSplit { d, rows_total, stride: d.div_ceil(4) * 8, tm, per_tile: rows_total.div_ceil(tm) }
    }

    /// Rows `r0 .. r0 + rows` of the f16 tensor, held from offset 0 of `buffer` on `tile` at
    /// [`RowSplit::stride`] bytes per row.
    pub fn slice(&self, tile: u16, buffer: &str, r0: u64, rows: u64) -> SliceRef {
        let row_bytes = (2 * self.d) as u32;
        SliceRef {
            tile,
            buffer: buffer.into(),
            offset: 0,
            tensor_offset: r0 * row_bytes as u64,
            rows: rows as u32,
            row_bytes,
            tensor_stride: row_bytes as u64,
            tile_stride: self.stride as u32,
        }
    }
}

/// Plan op `op` (a layernorm) of `g` on up to `tiles` tiles.
pub fn layernorm(g: &Graph, op: usize, tiles: usize) -> Result<Plan, PlanError> {
    let OpKind::LayerNorm { input, gamma, beta, eps } = g.ops[op].kind else {
        return Err(PlanError::Unsupported(op, "not a layernorm".into()));
    };
    let x = g.tensor(input);
    let split_rows = RowSplit::of(x, tiles);
    let RowSplit { d, rows_total, stride, tm, per_tile } = split_rows;
    let need = 2 * per_tile * stride + 2 * stride + 64 * WORKERS as u64 + super::RUNTIME_RESERVE;
    if need > TILE_MEM_SIZE as u64 {
        return Err(PlanError::Memory {
            tile: 0,
            buffer: format!("tensor `{}`", x.name),
            over: need - TILE_MEM_SIZE as u64,
        });
    }
    let inv_d = 1.0f32 / d as f32;
    let mut plans = vec![TilePlan::default(); tiles];
    let (mut xs, mut ys, mut gs, mut bs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let row_bytes = (2 * d) as u32;
    let whole = |tile: u16, buffer: &str| SliceRef {
        tile,
        buffer: buffer.into(),
        offset: 0,
        tensor_offset: 0,
        rows: 1,
        row_bytes,
        tensor_stride: row_bytes as u64,
        tile_stride: stride as u32,
    };
    for i in 0..tm {
        let (r0, r1) = split(rows_total, tm, i);
        let tile = i as u16;
        let p = &mut plans[tile as usize];
        p.buffers.push(zero("X", (r1 - r0) * stride, MemKind::Tensor));
        p.buffers.push(zero("Y", (r1 - r0) * stride, MemKind::Tensor));
        // Absent affine parameters are constant buffers: f16 ones, zeros.
        let ones = || vec![Word::Const(0x3C00_3C00); (stride / 4) as usize];
        p.buffers.push(Buffer {
            name: "G".into(),
            bytes: stride as u32,
            align: 16,
            kind: MemKind::Tensor,
            init: if gamma.is_some() { super::Init::new() } else { ones().into() },
            live: super::Live::ALWAYS,
            read_past: 0,
        });
        p.buffers.push(zero("B", stride, MemKind::Tensor));
        let rows = r1 - r0;
        xs.push(split_rows.slice(tile, "X", r0, rows));
        ys.push(split_rows.slice(tile, "Y", r0, rows));
        gs.push(whole(tile, "G"));
        bs.push(whole(tile, "B"));
        let shared = share_rows(rows, d);
        let chunks = d / 4;
        if shared {
            p.buffers.push(zero("PS", rows * 48, MemKind::Tensor));
        }
        let mut words = Vec::new();
        let mut issues = [0u64; 3];
        for w in 0..WORKERS as u64 {
            // Whole rows per worker, or a share of every row's columns.
            let (w0, w1) = if shared { (0, rows) } else { split(rows, WORKERS as u64, w) };
            let (c0, c1) = if shared { split(chunks, WORKERS as u64, w) } else { (0, chunks) };
            let tail = if !shared || w + 1 == WORKERS as u64 { d % 4 } else { 0 };
            let col = (c0 * 8) as u32;
            words.extend([
                Word::Sym("X".into(), (w0 * stride) as u32 + col),
                Word::Sym("Y".into(), (w0 * stride) as u32 + col),
                Word::Const((w1 - w0) as u32),
                Word::Const(stride as u32),
                Word::Const((c1 - c0) as u32),
                Word::Const(tail as u32),
                Word::Sym("G".into(), col),
                Word::Sym("B".into(), col),
                Word::Const(inv_d.to_bits()),
                Word::Const(eps.to_bits()),
                Word::Const(0),
                Word::Const(0),
                Word::Const(1.0f32.to_bits()),
                if shared { Word::Sym("PS".into(), 0) } else { Word::Const(0) },
                Word::Const(4 * w as u32),
                Word::Const(0),
            ]);
            if shared {
                for (i, k) in [Kernel::LayerNormSum, Kernel::LayerNormVar, Kernel::LayerNormApply]
                    .into_iter()
                    .enumerate()
                {
                    issues[i] = issues[i].max(cost::layernorm_shared_issues(k, w1 - w0, c1 - c0, tail));
                }
            } else {
                issues[0] = issues[0].max(cost::layernorm_issues(w1 - w0, chunks, tail));
            }
        }
        if shared {
            p.launch(super::op_phase(g, op), Kernel::LayerNormSum, "dln", words, issues[0]);
            p.steps.push(Step::RunAll(Kernel::LayerNormVar, "dln".into(), issues[1].into()));
            p.steps.push(Step::RunAll(Kernel::LayerNormApply, "dln".into(), issues[2].into()));
            continue;
        }
        p.launch(super::op_phase(g, op), Kernel::LayerNormF16, "dln", words, issues[0]);
    }
    let bind = |t, direction, slices| BindingPlan { tensor: t, direction, transpose: false, slices };
    let mut bindings = vec![bind(input, Direction::Input, xs), bind(g.ops[op].output, Direction::Output, ys)];
    bindings.extend(gamma.map(|t| bind(t, Direction::Input, gs)));
    bindings.extend(beta.map(|t| bind(t, Direction::Input, bs)));
    let mut grids = vec![[1, 1, 1]; g.ops.len()];
    grids[op] = [tm as u32, 1, 1];
    let mapping = format!("layernorm rows={rows_total} D={d} tiles={tm} rows per tile ≤ {per_tile}");
    Ok(Plan::compute_only(plans, bindings, tm as u32, mapping, grids))
}
