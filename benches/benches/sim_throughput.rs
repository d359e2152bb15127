//! Simulated tile-instructions per second on full-chip programs (`cargo bench --bench
//! sim_throughput`). Prints one line per program and thread count; the figure of merit is
//! instructions per second per host thread. `TILES=n` runs on fewer tiles.

use ipu_host::program::TileProgram;
use ipu_host::sim::{SimConfig, SimDevice};
use ipu_host::Device;
use std::time::Instant;

/// Six workers per tile streaming AMP bundles in an `rpt` loop (the matmul inner loop), all on the
/// same addresses.
const AMP: &str = include_str!("../../tests/programs/amp_shared.s");

/// Supervisor-only integer loop with loads and stores (control-heavy code).
const INTEGER: &str = "
main:
    setzi $m1, 0x60000
    setzi $m2, 20000
loop:
    ld32 $m3, $m1, $m15, 0
    add $m3, $m3, 1
    st32 $m3, $m1, $m15, 0
    brnzdec $m2, loop
    sync 15
    halt
";

/// Runs of each measurement; the fastest is reported (a shared host only ever adds time).
const RUNS: usize = 3;

/// Runs `src` on every tile (`threads` host threads) and prints the speed. `filled` bytes of
/// tile memory are written before the clock starts (f16 ones), as a model's inputs and poisoned
/// outputs are before a run: the timed run then streams through memory the host has already
/// touched, and first-touch page faults do not enter the figure.
fn measure(name: &str, src: &str, threads: usize, filled: Option<(u32, usize)>) {
    let prog = TileProgram::from_asm(src).expect("assembles");
    let tiles = std::env::var("TILES").ok().and_then(|v| v.parse().ok()).unwrap_or(1472);
    let mut best: Option<(f64, ipu_host::device::RunReport)> = None;
    for _ in 0..RUNS {
        let mut dev = SimDevice::new(SimConfig { tiles, threads, max_cycles: u64::MAX }).expect("device");
        let ones: Vec<u8> = filled.map(|(_, n)| [0x00, 0x3C].repeat(n / 2)).unwrap_or_default();
        for t in 0..dev.tile_count() as u16 {
            if let Some((at, _)) = filled {
                dev.write_memory(t, at, &ones).expect("fill");
            }
            dev.load_tile(t, &prog.segment_refs(), prog.entry).expect("load");
        }
        let start = Instant::now();
        let r = dev.run_to_host_sync().expect("runs");
        let secs = start.elapsed().as_secs_f64();
        if best.as_ref().is_none_or(|(s, _)| secs < *s) {
            best = Some((secs, r));
        }
    }
    let (secs, r) = best.expect("at least one run");
    let per_sec = r.issued as f64 / secs;
    println!(
        "sim_throughput program={name} tiles={tiles} threads={threads} issued={} device_cycles={} \
         host_s={secs:.3} (best of {RUNS}) instr_per_s={:.3e} instr_per_s_per_thread={:.3e}",
        r.issued,
        r.cycles,
        per_sec,
        per_sec / threads as f64
    );
}

fn main() {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    // `cargo bench --bench sim_throughput -- amp` runs only the programs whose name contains "amp".
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    // The same loop with each worker on its own rows (16 KiB per worker and stream), as the
    // matmul kernel has them, so the simulator's AMP-loop fast path (core/src/tile/batch.rs)
    // applies; `amp` above has all six workers on the same addresses, so it never does.
    let amp_rows = include_str!("../../tests/programs/amp_rows.s")
        .replace("{X}", "0x60000")
        .replace("{PIN}", "0x80000")
        .replace("{OUT}", "0xa0000")
        .replace("{STRIDE}", "14")
        .replace("{ROWS}", "500");
    // Its rows, 0x60000..0xb8000, are filled before the clock starts.
    let rows_filled = Some((0x60000, 0x58000));
    for (name, src, filled) in
        [("amp", AMP, None), ("amp-rows", amp_rows.as_str(), rows_filled), ("integer", INTEGER, None)]
    {
        if !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str())) {
            continue;
        }
        measure(name, src, 1, filled);
        if cores > 1 {
            measure(name, src, cores, filled);
        }
    }
}
