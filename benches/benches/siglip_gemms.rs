//! The kernels of one SigLIP So400m encoder layer on the whole chip (729 tokens, width 1152, 16
//! heads of 72, MLP 4304), each built and run alone on 1472 tiles: simulated cycles, the cost
//! model's prediction, the compute bound and the ratio, with build time and the build's peak
//! memory beside each (issue "Kernels at transformer scale").
//!
//! - The four GEMMs (f16 operands, f32 accumulation, f16 output): bound = MACs ÷ (1472 × 32
//!   f32-accumulating MACs per cycle); the f16-partials bound (× 64) is printed too.
//! - Attention (`examples/attention.toml`'s op sequence without the FP8 casts: Q·Kᵀ with alpha and
//!   f16 accumulation, softmax, P·V): bound = both GEMMs' MACs ÷ (1472 × 64 f16 MACs per cycle).
//!
//! Each row runs in a child process (this binary again, with `SIGLIP_ROW` set), so the peak
//! memory it reports — `VmHWM` of `/proc/self/status` read right after the build (Linux) — is that
//! row's build alone. `cargo bench --bench siglip_gemms [ROW…]` (about two minutes on 2 cores; rows:
//! qkv, out-proj, mlp-up, mlp-down, mlp-up-gelu, attention, ln-mlp-up).

use ipu_host::build::{build, BuildOptions};
use ipu_host::session::load;
use ipu_host::sim::{SimConfig, SimDevice};
use ipu_host::Device;
use std::time::Instant;

const TILES: usize = 1472;

/// The allocator of the `ipu-codegen` binary, so that build time and peak memory are the CLI's
/// (docs/dependencies.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Rows: name, model text, MACs, MACs per tile cycle of the bound.
fn rows() -> Vec<(&'static str, String, u64, u64)> {
    let gemm = |name: &str, m: u64, k: u64, n: u64| {
        format!(
            "name = \"{name}\"\noutputs = [\"C\"]\n[inputs.A]\ndtype = \"f16\"\nshape = [{m}, {k}]\n[inputs.B]\ndtype = \"f16\"\n\
             shape = [{k}, {n}]\n[[ops]]\nop = \"matmul\"\na = \"A\"\nb = \"B\"\noutput = \"C\"\ndtype = \"f16\"\naccumulate = \"f32\"\n"
        )
    };
    let gelu = |src: String| {
        src.replace("outputs = [\"C\"]", "outputs = [\"H\"]")
            + "[[ops]]\nop = \"gelu\"\ninput = \"C\"\noutput = \"H\"\ndtype = \"f16\"\napproximate = \"tanh\"\n"
    };
    let layernorm_first = |src: String, d: u64| {
        src.replace("a = \"A\"", "a = \"N\"").replace(
            "[[ops]]",
            &format!(
                "[inputs.G]\ndtype = \"f16\"\nshape = [{d}]\n[inputs.Be]\ndtype = \"f16\"\nshape = [{d}]\n\
                 [[ops]]\nop = \"layernorm\"\ninput = \"A\"\ngamma = \"G\"\nbeta = \"Be\"\neps = 1e-6\noutput = \"N\"\n\
                 dtype = \"f16\"\n[[ops]]"
            ),
        )
    };
    let f32acc = ipu_core::target::AMP_F32_MACS_PER_CYCLE as u64;
    let f16acc = ipu_core::target::AMP_F16_MACS_PER_CYCLE as u64;
    let (heads, tokens, dh) = (16u64, 729u64, 72u64);
    let attention = format!(
        "name = \"attention\"\noutputs = [\"O\"]\n\
         [inputs.Q]\ndtype = \"f16\"\nshape = [{heads}, {tokens}, {dh}]\n\
         [inputs.K]\ndtype = \"f16\"\nshape = [{heads}, {tokens}, {dh}]\n\
         [inputs.V]\ndtype = \"f16\"\nshape = [{heads}, {tokens}, {dh}]\n\
         [[ops]]\nop = \"matmul\"\na = \"Q\"\nb = \"K\"\ntranspose_b = true\nalpha = {}\noutput = \"S\"\ndtype = \"f16\"\naccumulate = \"f16\"\n\
         [[ops]]\nop = \"softmax\"\ninput = \"S\"\noutput = \"P\"\ndtype = \"f16\"\n\
         [[ops]]\nop = \"matmul\"\na = \"P\"\nb = \"V\"\noutput = \"O\"\ndtype = \"f16\"\naccumulate = \"f16\"\n",
        1.0 / (dh as f64).sqrt()
    );
    vec![
        ("qkv", gemm("qkv", 729, 1152, 3456), 729 * 1152 * 3456, f32acc),
        ("out-proj", gemm("out-proj", 729, 1152, 1152), 729 * 1152 * 1152, f32acc),
        ("mlp-up", gemm("mlp-up", 729, 1152, 4304), 729 * 1152 * 4304, f32acc),
        ("mlp-down", gemm("mlp-down", 729, 4304, 1152), 729 * 4304 * 1152, f32acc),
        // MLP-up with the GeLU after it, as the layer has it (the GeLU is the matmul's epilogue;
        // the bound is the GEMM's alone).
        ("mlp-up-gelu", gelu(gemm("mlp-up-gelu", 729, 1152, 4304)), 729 * 1152 * 4304, f32acc),
        ("attention", attention, 2 * heads * tokens * tokens * dh, f16acc),
        // MLP-up reading the second LayerNorm's output, as the layer has it: A arrives from an
        // earlier stage as whole rows, held row-major by the grid (docs/kernels.md "Row-major
        // A"); the bound is the GEMM's alone.
        ("ln-mlp-up", layernorm_first(gemm("ln-mlp-up", 729, 1152, 4304), 1152), 729 * 1152 * 4304, f32acc),
    ]
}

/// Peak resident memory of this process so far, in MB (`VmHWM`), if the system says.
fn peak_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn run_row(name: &str, src: &str, macs: u64, per_cycle: u64) {
    let t0 = Instant::now();
    let b = build(&format!("{name}.toml"), src, &BuildOptions { threads: 0, ..BuildOptions::new(TILES) })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let build_ms = t0.elapsed().as_millis();
    let peak = peak_mb().map_or_else(|| "n/a".to_string(), |m| format!("{m:.0}"));
    let mut dev = SimDevice::new(SimConfig { tiles: TILES, threads: 0, max_cycles: u64::MAX }).unwrap();
    load(&mut dev, &b.package).unwrap();
    dev.run_to_host_sync().unwrap();
    let t1 = Instant::now();
    let r = dev.run_to_host_sync().unwrap();
    let sim_s = t1.elapsed().as_secs_f64();
    let bound = macs as f64 / (TILES as f64 * per_cycle as f64);
    let grids: Vec<String> =
        b.package.plan.grids.iter().map(|g| format!("{}x{}x{}", g[0], g[1], g[2])).collect();
    let predicted = b.package.plan.predicted_cycles;
    let model_err = 100.0 * (predicted as f64 - r.cycles as f64) / r.cycles as f64;
    let mut line = format!(
        "siglip {name} cycles={} predicted={predicted} ({model_err:+.2}%) bound={bound:.0} ratio={:.1}% \
         build_ms={build_ms} build_peak_mb={peak} grids={} sim_s={sim_s:.1} tile_instructions={} instr_per_s={:.3e}",
        r.cycles,
        100.0 * bound / r.cycles as f64,
        grids.join(","),
        r.issued,
        r.issued as f64 / sim_s,
    );
    if per_cycle == ipu_core::target::AMP_F32_MACS_PER_CYCLE as u64 {
        let bound16 = macs as f64 / (TILES as f64 * ipu_core::target::AMP_F16_MACS_PER_CYCLE as f64);
        line.push_str(&format!(" f16_partials_ratio={:.1}%", 100.0 * bound16 / r.cycles as f64));
    }
    println!("{line}");
}

fn main() {
    let rows = rows();
    if let Ok(name) = std::env::var("SIGLIP_ROW") {
        let (_, src, macs, per) = rows.iter().find(|r| r.0 == name).expect("known row");
        run_row(&name, src, *macs, *per);
        return;
    }
    // Row names on the command line pick rows (cargo's own `--bench` flag is skipped).
    let picked: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let exe = std::env::current_exe().expect("own path");
    for (name, ..) in rows.iter().filter(|r| picked.is_empty() || picked.iter().any(|p| p == r.0)) {
        let status = std::process::Command::new(&exe).env("SIGLIP_ROW", name).status().expect("runs a row");
        assert!(status.success(), "row {name} failed");
    }
}
