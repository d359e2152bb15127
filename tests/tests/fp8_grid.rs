//! FP8 matmuls on the grid planner (`plan::matmul`, `f8amp`: 32-deep K blocks of one byte per
//! value, f16 partials): rows, columns and K split over tiles, the K-split partial sums reduced
//! over the exchange in f16 — bit-exact against the device-precision reference, within the f64
//! bound, and costed. Before, an FP8 matmul was always a row chain holding the whole weight on
//! every tile (a So400m weight of 1152 × 4304 cannot be). A layernorm first makes the graph
//! one of stages (a graph that is one row chain is planned as one).

mod common;

fn model(m: u64, k: u64, n: u64, scale: i64) -> String {
    format!(
        "name = \"f8\"\noutputs = [\"Y\"]\n[inputs.X]\ndtype = \"f16\"\nshape = [{m}, {k}]\n[inputs.W]\ndtype = \"f16\"\n\
         shape = [{k}, {n}]\n[[ops]]\nop = \"layernorm\"\ninput = \"X\"\noutput = \"XN\"\ndtype = \"f16\"\n\
         [[ops]]\nop = \"cast\"\ninput = \"XN\"\noutput = \"X8\"\ndtype = \"f8e4m3\"\nscale = {scale}\n\
         [[ops]]\nop = \"cast\"\ninput = \"W\"\noutput = \"W8\"\ndtype = \"f8e5m2\"\n\
         [[ops]]\nop = \"matmul\"\na = \"X8\"\nb = \"W8\"\noutput = \"Y\"\ndtype = \"f16\"\naccumulate = \"f16\"\n"
    )
}

#[test]
fn fp8_matmuls_split_over_rows_columns_and_depth() {
    let mut report = String::new();
    for (m, k, n, tiles) in
        [(40u64, 96u64, 48u64, 1usize), (40, 96, 48, 8), (129, 588, 96, 64), (200, 1024, 256, 512)]
    {
        let src = model(m, k, n, -1);
        let (out, pkg) = common::build_and_run(&src, tiles, None, 3, 1);
        assert!(out.compared_elements > 0 && out.max_abs_error_f64 <= out.bound_f64, "{out:?}");
        let g = ipu_host::model::parse("m.toml", &src).unwrap();
        let plan = ipu_core::plan::plan(&g, ipu_core::plan::PlanOptions::new(tiles)).unwrap();
        let (sim, pred) = (out.cycles[0], pkg.plan.predicted_cycles);
        report.push_str(&format!(
            "{m}x{k}x{n} on {tiles}: simulated {sim} predicted {pred} {:?}\n",
            plan.mapping
        ));
        assert!(
            plan.mapping.iter().any(|s| s.starts_with("stage 3: matmul") && s.contains(" grid ")),
            "{report}"
        );
        assert!(sim.abs_diff(pred) * 100 <= 3 * sim, "{report}");
    }
    println!("{report}");
}
