//! Resident weights on many layers (`ipu_core::plan::resident`, docs/graph-planner.md "Resident
//! weights"): a stack of linear layers whose default grids would each replicate their weight
//! matrix over row groups is planned with one-row-group grids, so that the weights on the busiest
//! tile stay within the budget; a stack whose weights fit keeps the grids the estimate picks.

use std::collections::BTreeMap;

use ipu_core::plan::{self, matmul, resident, stages, PlanOptions};

/// `layers` linear layers `X_{i+1} = X_i · W_i` on `[m, d]`, the weights params.
fn stack(layers: usize, m: u64, d: u64) -> String {
    let mut s = format!(
        "name = \"stack\"\noutputs = [\"X{layers}\"]\n[inputs.X0]\ndtype = \"f16\"\nshape = [{m}, {d}]\n"
    );
    for i in 0..layers {
        s += &format!("[params.W{i}]\ndtype = \"f16\"\nshape = [{d}, {d}]\nfile = \"w{i}.npy\"\n");
    }
    for i in 0..layers {
        s += &format!(
            "[[ops]]\nop = \"matmul\"\na = \"X{i}\"\nb = \"W{i}\"\noutput = \"X{}\"\naccumulate = \"f16\"\ndtype = \"f16\"\n",
            i + 1
        );
    }
    s
}

/// The most param bytes any one tile holds in the plan's bindings.
fn busiest_tile_params(g: &ipu_core::graph::Graph, p: &plan::Plan) -> u64 {
    let mut per_tile: BTreeMap<u16, u64> = BTreeMap::new();
    for b in p.bindings.iter().filter(|b| g.params.contains(&b.tensor)) {
        for s in &b.slices {
            *per_tile.entry(s.tile).or_default() += s.rows as u64 * s.row_bytes as u64;
        }
    }
    per_tile.values().copied().max().unwrap_or(0)
}

/// Bytes per tile the estimate's own grids would hold, summed over the stages.
fn default_total(g: &ipu_core::graph::Graph, tiles: usize) -> (u64, bool) {
    let mut total = 0;
    let mut replicated = false;
    for (_, mm) in stages::matmul_stages(g, PlanOptions::new(tiles)) {
        let grid = matmul::choose_grid(&mm, tiles).expect("a grid fits");
        replicated |= grid.tm > 1;
        total += resident::weight_bytes_per_tile(&mm, grid);
    }
    (total, replicated)
}

#[test]
fn many_layers_get_grids_of_one_row_group_and_stay_within_the_budget() {
    let tiles = 64;
    let g = ipu_host::model::parse("stack.toml", &stack(24, 512, 256)).unwrap();
    let (before, replicated) = default_total(&g, tiles);
    assert!(
        replicated && before > resident::BUDGET,
        "the case must need the change: {before} bytes per tile"
    );
    let p = plan::plan(&g, PlanOptions::new(tiles)).unwrap();
    let held = busiest_tile_params(&g, &p);
    assert!(held <= resident::BUDGET, "{held} bytes of weights on one tile (budget {})", resident::BUDGET);
    // Moved stages hold each weight block once: one row group.
    let lean: Vec<usize> = (0..g.ops.len()).filter(|&op| p.grids[op][0] == 1).collect();
    assert!(!lean.is_empty(), "grids {:?}", p.grids);
    // The planned bytes are what the module's arithmetic says they are.
    let planned: u64 = stages::matmul_stages(&g, PlanOptions::new(tiles))
        .iter()
        .map(|(op, mm)| {
            let [tm, tn, tk] = p.grids[*op];
            resident::weight_bytes_per_tile(mm, matmul::Grid { tm: tm as u64, tn: tn as u64, tk: tk as u64 })
        })
        .sum();
    assert!(held <= planned, "busiest tile {held} B, the grids' sum {planned} B");
    println!(
        "24 layers 512x256x256 on {tiles} tiles: weights per tile {before} -> {held} B, grids {:?}",
        p.grids
    );
}

#[test]
fn weights_within_the_budget_keep_the_estimates_grids() {
    let tiles = 64;
    let g = ipu_host::model::parse("stack.toml", &stack(2, 256, 512)).unwrap();
    let (before, _) = default_total(&g, tiles);
    assert!(before <= resident::BUDGET, "{before}");
    let p = plan::plan(&g, PlanOptions::new(tiles)).unwrap();
    for (op, mm) in stages::matmul_stages(&g, PlanOptions::new(tiles)) {
        let want = matmul::choose_grid(&mm, tiles).unwrap();
        assert_eq!(p.grids[op], [want.tm as u32, want.tn as u32, want.tk as u32], "op {op}");
    }
}
