//! Row ops on their own tiles (docs/graph-planner.md §3): the rows of the input (all leading
//! dimensions flattened) are split over tiles, each tile's rows over its six workers; every row is
//! stored packed to a multiple of four values (8-byte aligned, zero padding). Today: layer
//! normalisation (`layernorm_f16`, docs/kernels.md).

use alloc::format;
use alloc::vec;
use alloc::vec::Vec;
use ipu_schema::Direction;

use super::matmul::{split, zero};
use super::{cost, BindingPlan, Buffer, Kernel, MemKind, Plan, PlanError, SliceRef, TilePlan, Word};
use crate::graph::{Graph, OpKind};
use crate::target::{TILE_MEM_SIZE, WORKERS};

/// Plan op `op` (a layernorm) of `g` on up to `tiles` tiles.
pub fn layernorm(g: &Graph, op: usize, tiles: usize) -> Result<Plan, PlanError> {
    let OpKind::LayerNorm { input, gamma, beta, eps } = g.ops[op].kind else {
        return Err(PlanError::Unsupported(op, "not a layernorm".into()));
    };
    let x = g.tensor(input);
    let d = *x.shape.last().unwrap_or(&1);
    let rows_total = x.elements() / d.max(1);
    let stride = d.div_ceil(4) * 8;
    let tm = (tiles as u64).min(rows_total).max(1);
    let per_tile = rows_total.div_ceil(tm);
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
            init: if gamma.is_some() { Vec::new() } else { ones() },
        });
        p.buffers.push(zero("B", stride, MemKind::Tensor));
        let rows = r1 - r0;
        let slice = |buffer: &str| SliceRef {
            tile,
            buffer: buffer.into(),
            offset: 0,
            tensor_offset: r0 * row_bytes as u64,
            rows: rows as u32,
            row_bytes,
            tensor_stride: row_bytes as u64,
            tile_stride: stride as u32,
        };
        xs.push(slice("X"));
        ys.push(slice("Y"));
        gs.push(whole(tile, "G"));
        bs.push(whole(tile, "B"));
        let mut words = Vec::new();
        let mut issues = 0;
        for w in 0..WORKERS as u64 {
            let (w0, w1) = split(rows, WORKERS as u64, w);
            words.extend([
                Word::Sym("X".into(), (w0 * stride) as u32),
                Word::Sym("Y".into(), (w0 * stride) as u32),
                Word::Const((w1 - w0) as u32),
                Word::Const(stride as u32),
                Word::Const((d / 4) as u32),
                Word::Const((d % 4) as u32),
                Word::Sym("G".into(), 0),
                Word::Sym("B".into(), 0),
                Word::Const(inv_d.to_bits()),
                Word::Const(eps.to_bits()),
                Word::Const(0),
                Word::Const(0),
                Word::Const(1.0f32.to_bits()),
                Word::Const(0),
                Word::Const(0),
                Word::Const(0),
            ]);
            issues = issues.max(cost::layernorm_issues(w1 - w0, d / 4, d % 4));
        }
        p.launch(super::op_phase(g, op), Kernel::LayerNormF16, "dln".into(), words, issues);
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
