//! Transposes of the last two axes (`[…, R, C]` → `[…, C, R]`), the one layout change the
//! redistribution cannot do by moving words (an element is 2 bytes): each tile takes a part of one
//! batch entry — a group of columns (`R` rows of 2-value-aligned column pieces) or a group of rows
//! (a multiple of 16 rows, all columns; [`Split`]), brought by the redistribution — and writes it
//! as output rows with `transpose_f16` (docs/kernels.md).

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
    let split_by = Split::choose(rows, cols, batches, tiles as u64);
    let units = split_by.units(rows, cols);
    let mut plans = vec![TilePlan::default(); tiles];
    let (mut ins, mut outs) = (Vec::new(), Vec::new());
    for b in 0..batches {
        for (j, &((r0, r1), (c0, c1))) in units.iter().enumerate() {
            // Units (matrix, part) dealt to tiles in turn; a tile may take several.
            let unit = b * units.len() as u64 + j as u64;
            let tile = (unit % tiles as u64) as u16;
            let n = unit / tiles as u64;
            let (xb, yb, db) = (format!("X{n}"), format!("Y{n}"), format!("dtr{n}"));
            // The part's input rows r0..r1 of columns c0..c1 become output rows c0..c1 of
            // columns r0..r1; both padded to whole words on the tile.
            let (h, w) = (r1 - r0, c1 - c0);
            let xs = (w * 2).div_ceil(4) * 4;
            let ys = (h * 2).div_ceil(4) * 4;
            let p = &mut plans[tile as usize];
            p.buffers.push(zero(&xb, h * xs, MemKind::Tensor));
            p.buffers.push(zero(&yb, w * ys, MemKind::Tensor));
            ins.push(SliceRef {
                tile,
                buffer: xb.as_str().into(),
                offset: 0,
                tensor_offset: (b * rows * cols + r0 * cols + c0) * 2,
                rows: h as u32,
                row_bytes: (w * 2) as u32,
                tensor_stride: cols * 2,
                tile_stride: xs as u32,
            });
            outs.push(SliceRef {
                tile,
                buffer: yb.as_str().into(),
                offset: 0,
                tensor_offset: (b * cols * rows + c0 * rows + r0) * 2,
                rows: w as u32,
                row_bytes: (h * 2) as u32,
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
                    Word::Const(h as u32),
                    Word::Const(xs as u32),
                    Word::Const(ys as u32),
                    Word::Const(0),
                    Word::Const(0),
                ]);
                issues = issues.max(cost::transpose_issues(w1 - w0, h));
            }
            p.launch(super::op_phase(g, op), Kernel::TransposeF16, db, words, issues);
        }
    }
    let groups = units.len() as u64;
    let used = (batches * groups).min(tiles as u64) as u32;
    let bind = |t, direction, slices| BindingPlan { tensor: t, direction, transpose: false, slices };
    let mut grids = vec![[1, 1, 1]; g.ops.len()];
    grids[op] = [used, 1, 1];
    let mapping =
        format!("transpose {batches}×[{rows}, {cols}] in {groups} {split_by} per matrix, tiles={used}");
    let bindings = vec![bind(input, Direction::Input, ins), bind(g.ops[op].output, Direction::Output, outs)];
    Ok(Plan::compute_only(plans, bindings, used, mapping, grids))
}

/// How a matrix is cut into the parts tiles transpose.
///
/// By column groups (each part all `R` rows of a few columns, so each tile writes whole output
/// rows), or by row groups (each part all columns of a multiple of 16 input rows, so each tile
/// writes column blocks of the output, 16 wide when there are tiles enough: `[C][16]`, the layout of a row chain's weight blocks, which
/// then arrive as one exchange piece per block instead of one per block row — the `K`ᵀ of
/// attention). Row groups when their slowest worker issues no more than the column groups' (a
/// column group of a long matrix has few columns, so most workers idle: SigLIP's `K`ᵀ, 729×72,
/// 3,653 → 1,066 issues); column groups otherwise (short matrices, as the example encoder block's
/// 50 tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Split {
    /// This many column groups (pairs of columns at least).
    Columns(u64),
    /// This many row groups, each a multiple of 16 rows but the last.
    Rows(u64),
}

impl Split {
    fn choose(rows: u64, cols: u64, batches: u64, tiles: u64) -> Split {
        let per_matrix = (tiles / batches).max(1);
        let columns = Split::Columns(per_matrix.clamp(1, cols.div_ceil(2)));
        let blocks = rows.div_ceil(16).max(1);
        let rows_split = Split::Rows(blocks.div_ceil(blocks.div_ceil(per_matrix)).max(1));
        // Ties keep column groups (one row group of a short matrix is the same part).
        if rows_split.worst_issues(rows, cols) < columns.worst_issues(rows, cols) {
            rows_split
        } else {
            columns
        }
    }

    /// The parts: input row range and column range of each.
    fn units(self, rows: u64, cols: u64) -> Vec<((u64, u64), (u64, u64))> {
        match self {
            Split::Columns(groups) => (0..groups)
                .map(|j| {
                    let (p0, p1) = split(cols.div_ceil(2), groups, j);
                    ((0, rows), (2 * p0, (2 * p1).min(cols)))
                })
                .collect(),
            Split::Rows(groups) => {
                let blocks = rows.div_ceil(16);
                (0..groups)
                    .map(|j| {
                        let (b0, b1) = split(blocks, groups, j);
                        ((16 * b0, (16 * b1).min(rows)), (0, cols))
                    })
                    .filter(|((r0, r1), _)| r1 > r0)
                    .collect()
            }
        }
    }

    /// The slowest worker's issues on the largest part.
    fn worst_issues(self, rows: u64, cols: u64) -> u64 {
        self.units(rows, cols)
            .iter()
            .map(|&((r0, r1), (c0, c1))| cost::transpose_issues((c1 - c0).div_ceil(WORKERS as u64), r1 - r0))
            .max()
            .unwrap_or(0)
    }
}

impl core::fmt::Display for Split {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Split::Columns(_) => write!(f, "column groups"),
            Split::Rows(_) => write!(f, "16-row groups"),
        }
    }
}
