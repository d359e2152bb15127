//! Grids that keep resident weights small (docs/graph-planner.md "Resident weights").
//!
//! A grid matmul whose right operand is a param keeps its weight blocks on the tiles that read
//! them for the whole run. With `tm` row groups each group needs every block, so a tile holds
//! `1/(tn·tk)` of the matrix: `tm` times what a one-row-group grid of the same tiles holds. The
//! per-stage grid choice (`matmul::choose_grid`) minimises that stage's cycles and never sees the
//! other stages' weights; every grid starts on the lowest tiles, so on a model of many layers
//! tile 0 holds a block of every matrix and fills up (ViT-B/16, 12 layers, f16: refused at layer 7
//! with the default grids, which replicate each matrix 4× over the chip).
//!
//! So, before planning, the resident bytes on the busiest tile are added up over the param
//! matmul stages with their default grids; when they exceed [`BUDGET`], stages are moved, the
//! largest saving first, to the fastest grid of one row group (every tile of the grid holds a
//! distinct part of the matrix) until the sum fits. Forced grids (the stage search's, `--grid`)
//! are left as given. Models whose weights fit the budget plan exactly as before.

use alloc::vec::Vec;

use super::matmul::{self, Grid, MatMul};
use super::{stages, PlanOptions};
use crate::graph::Graph;
use crate::target::TILE_MEM_SIZE;

/// Resident weight bytes per tile above which stages move to one-row-group grids: a quarter of
/// the tile, leaving the rest to code, descriptor tables, exchange buffers and activations.
pub const BUDGET: u64 = TILE_MEM_SIZE as u64 / 4;

/// Bytes of B's blocks on one tile of `g`: `⌈kb/tk⌉ · ⌈nb/tn⌉` weight blocks.
pub fn weight_bytes_per_tile(mm: &MatMul, g: Grid) -> u64 {
    mm.kb().div_ceil(g.tk) * mm.nb().div_ceil(g.tn) * mm.block_bytes() as u64
}

/// The fastest grid with one row group (by the screening estimate; ties: fewer tiles, then the
/// earlier candidate), if one fits.
pub fn lean_grid(mm: &MatMul, tiles: usize) -> Option<Grid> {
    matmul::candidates_with(mm, tiles, true)
        .into_iter()
        .min_by_key(|g| (matmul::estimate_on(mm, *g, tiles), g.tn * g.tk))
}

/// `grids` (indexed by op; `None`: the estimate's choice) with param stages moved to lean grids
/// where the default choices would put more than [`BUDGET`] bytes of weights on one tile.
/// `cut` is the partition the graph is planned with.
pub fn grids(
    g: &Graph,
    opts: PlanOptions,
    cut: &[Vec<usize>],
    grids: &[Option<[u32; 3]>],
) -> Vec<Option<[u32; 3]>> {
    let mut out: Vec<Option<[u32; 3]>> = (0..g.ops.len()).map(|i| grids.get(i).copied().flatten()).collect();
    if opts.grid.is_some() {
        return out;
    }
    let tiles = opts.tiles;
    // (op, bytes per tile now, bytes per tile on the lean grid, the lean grid) of each param stage.
    let mut stages: Vec<(usize, u64, u64, Grid)> = Vec::new();
    let mut total = 0u64;
    for (op, mm) in stages::stage_matmuls(g, cut) {
        if !g.params.contains(&mm.b) {
            continue;
        }
        let now = match out[op] {
            Some([tm, tn, tk]) => Some(Grid { tm: tm as u64, tn: tn as u64, tk: tk as u64 }),
            None => matmul::choose_grid(&mm, tiles),
        };
        let Some(now) = now else { continue };
        let bytes = weight_bytes_per_tile(&mm, now);
        total += bytes;
        if out[op].is_none() {
            if let Some(lean) = lean_grid(&mm, tiles) {
                let lean_bytes = weight_bytes_per_tile(&mm, lean);
                if lean_bytes < bytes {
                    stages.push((op, bytes, lean_bytes, lean));
                }
            }
        }
    }
    if total <= BUDGET {
        return out;
    }
    // Largest saving first; ties in model order (the sort is stable).
    stages.sort_by_key(|&(_, now, lean, _)| core::cmp::Reverse(now - lean));
    for (op, now, lean, grid) in stages {
        if total <= BUDGET {
            break;
        }
        out[op] = Some([grid.tm as u32, grid.tn as u32, grid.tk as u32]);
        total -= now - lean;
    }
    out
}
