//! `reduce_sum` and `reduce_mean` over the last axis on their own rows (docs/graph-planner.md
//! "Row ops"): the input's rows (all leading dimensions flattened) are split over tiles as
//! `rows.rs` splits a layernorm's, each row packed to a multiple of four values, a tile's rows
//! split over its six workers (whole rows each: `reduce_rows_f16`, docs/kernels.md).
//!
//! The result, one f16 per row (`[…, 1]`), is held one value per 4 bytes: the layout in which a
//! binary op reads an operand broadcast along the last axis (`elementwise.rs`, the splat
//! kernels), so `x − mean(x)` and `x · (1/sum)` take it where it is, a word per row.

use alloc::format;
use alloc::vec;
use alloc::vec::Vec;
use ipu_schema::Direction;

use super::layout::{split, zero};
use super::{cost, BindingPlan, Kernel, MemKind, Plan, PlanError, SliceRef, TilePlan, Word};
use crate::graph::{Graph, OpKind};
use crate::target::{TILE_MEM_SIZE, WORKERS};

/// Bytes per result on the tile: one f16 in each 32-bit word.
const OUT_STRIDE: u64 = 4;

/// The kernel's scale: 1 for the sum, `1/d` (rounded to f32) for the mean; the host reference
/// multiplies by the same value.
pub fn scale(mean: bool, d: u64) -> f32 {
    if mean {
        1.0f32 / d as f32
    } else {
        1.0
    }
}

/// Plan op `op` (`reduce_sum` or `reduce_mean`) of `g` on up to `tiles` tiles.
pub fn plan(g: &Graph, op: usize, tiles: usize) -> Result<Plan, PlanError> {
    let OpKind::Reduce { input, mean } = g.ops[op].kind else {
        return Err(PlanError::Unsupported(op, "not a reduce_sum or reduce_mean".into()));
    };
    let x = g.tensor(input);
    let split_rows = super::rows::RowSplit::of(x, tiles);
    let super::rows::RowSplit { d, rows_total, stride, tm, per_tile } = split_rows;
    let need = per_tile * (stride + OUT_STRIDE) + 64 * WORKERS as u64 + super::RUNTIME_RESERVE;
    if need > TILE_MEM_SIZE as u64 {
        return Err(PlanError::Memory {
            tile: 0,
            buffer: format!("tensor `{}`", x.name),
            over: need - TILE_MEM_SIZE as u64,
        });
    }
    let k = scale(mean, d);
    let mut plans = vec![TilePlan::default(); tiles];
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for i in 0..tm {
        let (r0, r1) = split(rows_total, tm, i);
        let (tile, rows) = (i as u16, r1 - r0);
        let p = &mut plans[tile as usize];
        p.buffers.push(zero("X", rows * stride, MemKind::Tensor));
        p.buffers.push(zero("Y", rows * OUT_STRIDE, MemKind::Tensor));
        xs.push(split_rows.slice(tile, "X", r0, rows));
        ys.push(SliceRef {
            tile,
            buffer: "Y".into(),
            offset: 0,
            tensor_offset: r0 * 2,
            rows: rows as u32,
            row_bytes: 2,
            tensor_stride: 2,
            tile_stride: OUT_STRIDE as u32,
        });
        let (mut words, mut issues) = (Vec::new(), 0);
        for w in 0..WORKERS as u64 {
            let (w0, w1) = split(rows, WORKERS as u64, w);
            words.extend([
                Word::Sym("X".into(), (w0 * stride) as u32),
                Word::Const(stride as u32),
                Word::Sym("Y".into(), (w0 * OUT_STRIDE) as u32),
                Word::Const(OUT_STRIDE as u32),
                Word::Const((w1 - w0) as u32),
                Word::Const((d / 4) as u32),
                Word::Const((d % 4) as u32),
                Word::Const(k.to_bits()),
            ]);
            words.extend((0..8).map(|_| Word::Const(0)));
            issues = issues.max(cost::reduce_rows_issues(w1 - w0, d / 4, d % 4));
        }
        p.launch(super::op_phase(g, op), Kernel::ReduceRowsF16, "drd", words, issues);
    }
    let bind = |t, direction, slices| BindingPlan { tensor: t, direction, transpose: false, slices };
    let bindings = vec![bind(input, Direction::Input, xs), bind(g.ops[op].output, Direction::Output, ys)];
    let mut grids = vec![[1, 1, 1]; g.ops.len()];
    grids[op] = [tm as u32, 1, 1];
    let what = if mean { "reduce_mean" } else { "reduce_sum" };
    let mapping = format!("{what} rows={rows_total} D={d} tiles={tm} rows per tile ≤ {per_tile}");
    Ok(Plan::compute_only(plans, bindings, tm as u32, mapping, grids))
}
