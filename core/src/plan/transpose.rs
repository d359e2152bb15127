//! Transposes of the last two axes (`[…, R, C]` → `[…, C, R]`), the one layout change the
//! redistribution cannot do by moving words (an element is 2 bytes): each tile takes a group of
//! columns of one batch entry — `R` rows of 2-value-aligned column pieces, brought by the
//! redistribution — and writes them as output rows with `transpose_f16` (docs/kernels.md).

use alloc::format;
use alloc::vec;
use alloc::vec::Vec;
use ipu_schema::{DType, Direction};

use super::layout::{split, zero};
use super::{cost, BindingPlan, Kernel, MemKind, Plan, PlanError, SliceRef, TilePlan, Word};
use crate::graph::{Graph, OpKind};
use crate::target::WORKERS;

/// Whether op `op` swaps the last two axes and keeps the others.
pub fn swaps_last_two(g: &Graph, op: usize) -> bool {
    let OpKind::Transpose { perm, .. } = &g.ops[op].kind else { return false };
    let r = perm.len();
    r >= 2
        && perm[r - 1] == r - 2
        && perm[r - 2] == r - 1
        && perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p)
}

/// Plan op `op` (a last-two-axes transpose of f16) on up to `tiles` tiles.
pub fn plan(g: &Graph, op: usize, tiles: usize) -> Result<Plan, PlanError> {
    let input = g.ops[op].kind.operands()[0];
    let x = g.tensor(input);
    if x.dtype != DType::F16 {
        return Err(PlanError::Unsupported(
            op,
            format!(
                "a transpose of the last two axes is planned for f16, `{}` is {}",
                x.name,
                x.dtype.name()
            ),
        ));
    }
    let r = x.shape.len();
    let (rows, cols) = (x.shape[r - 2], x.shape[r - 1]);
    let batches: u64 = x.shape[..r - 2].iter().product();
    let groups = (tiles as u64 / batches).clamp(1, cols.div_ceil(2));
    let ys = (rows * 2).div_ceil(4) * 4;
    let mut plans = vec![TilePlan::default(); tiles];
    let (mut ins, mut outs) = (Vec::new(), Vec::new());
    for b in 0..batches {
        for j in 0..groups {
            // Units (matrix, column group) dealt to tiles in turn; a tile may take several.
            let unit = b * groups + j;
            let tile = (unit % tiles as u64) as u16;
            let n = unit / tiles as u64;
            let (xb, yb, db) = (format!("X{n}"), format!("Y{n}"), format!("dtr{n}"));
            let (p0, p1) = split(cols.div_ceil(2), groups, j);
            let (c0, c1) = (2 * p0, (2 * p1).min(cols));
            let w = c1 - c0;
            let xs = (w * 2).div_ceil(4) * 4;
            let p = &mut plans[tile as usize];
            p.buffers.push(zero(&xb, rows * xs, MemKind::Tensor));
            p.buffers.push(zero(&yb, w * ys, MemKind::Tensor));
            ins.push(SliceRef {
                tile,
                buffer: xb.as_str().into(),
                offset: 0,
                tensor_offset: (b * rows * cols + c0) * 2,
                rows: rows as u32,
                row_bytes: (w * 2) as u32,
                tensor_stride: cols * 2,
                tile_stride: xs as u32,
            });
            outs.push(SliceRef {
                tile,
                buffer: yb.as_str().into(),
                offset: 0,
                tensor_offset: (b * cols * rows + c0 * rows) * 2,
                rows: w as u32,
                row_bytes: (rows * 2) as u32,
                tensor_stride: rows * 2,
                tile_stride: ys as u32,
            });
            let mut words = Vec::new();
            let mut issues = 0;
            for k in 0..WORKERS as u64 {
                let (w0, w1) = split(w, WORKERS as u64, k);
                words.extend([
                    Word::Sym(xb.clone().into(), (w0 * 2) as u32),
                    Word::Sym(yb.clone().into(), (w0 * ys) as u32),
                    Word::Const((w1 - w0) as u32),
                    Word::Const(rows as u32),
                    Word::Const(xs as u32),
                    Word::Const(ys as u32),
                    Word::Const(0),
                    Word::Const(0),
                ]);
                issues = issues.max(cost::transpose_issues(w1 - w0, rows));
            }
            p.launch(super::op_phase(g, op), Kernel::TransposeF16, db, words, issues);
        }
    }
    let used = (batches * groups).min(tiles as u64) as u32;
    let bind = |t, direction, slices| BindingPlan { tensor: t, direction, transpose: false, slices };
    let mut grids = vec![[1, 1, 1]; g.ops.len()];
    grids[op] = [used, 1, 1];
    let mapping =
        format!("transpose {batches}×[{rows}, {cols}] in {groups} column groups per matrix, tiles={used}");
    let bindings = vec![bind(input, Direction::Input, ins), bind(g.ops[op].output, Direction::Output, outs)];
    Ok(Plan::compute_only(plans, bindings, used, mapping, grids))
}
