//! The row-strided AMP kernels (`AmpF16Strided`, `AmpF32Strided`, `AmpF8Strided`;
//! `runtime-tile/src/amp_strided.rs`), hand-written launches independent of the planner: six
//! workers each take `rows` rows of a row-major A (row stride S) starting at their own row, block
//! kb of each row (the last 32 bytes of the row, so the stream's jumps cross every row end). The
//! same launch of the plain kernel on the same block copied out as `[row][16]` must leave exactly
//! the same tile memory, and each launch must take exactly 6 × (`cost::kernel_issues` − 1) cycles
//! more than a launch of a one-issue kernel (`exit`) under the same supervisor: six workers with
//! equal issue counts end one barrel turn apart per issue, so the supervisor's `sync 2` moves by
//! exactly that. The simulator's fast paths (batched rounds, host-vector AMP kernels) must leave
//! what the issue-by-issue portable path leaves.

mod common;
use common::{program, read};
use ipu_core::plan::{cost, Kernel};
use ipu_host::program::TileProgram;
use ipu_host::sim::{SimConfig, SimDevice};
use ipu_host::Device;

/// Row-major A.
const A: u32 = 0x80000;
/// Worker w's `[row][16]` copy of block kb for the plain kernel, at `PLAIN + w·WORKER`.
const PLAIN: u32 = 0xA0000;
const PIN: u32 = 0xA8000;
/// Worker w's `out − 40`.
const OUT: u32 = 0xB0000;
const WORKER: u32 = 0x1000;
const WEIGHTS: u32 = 0xB8000;
/// Everything the kernels read or write (and the fill): region 1 of tile memory.
const DATA: (u32, usize) = (0x80000, 0xE8000 - 0x80000);

/// The supervisor: load the weights, run `label` on six workers with the table at `desc`, wait,
/// stop. The table has room for the six entries and the shared S word.
fn harness(label: &str, text: &str) -> TileProgram {
    program(&format!(
        "main:\n    setzi $m2, {WEIGHTS:#x}\n    ldcwei $m2\n    setzi $m0, {label}\n    setzi $m1, desc\n    \
         runall $m0, $m1\n    sync 2\n    sync 15\n    halt\n{text}\n.org 0x7f000\ndesc: .space 112\n"
    ))
}

fn kernel_program(k: Kernel) -> TileProgram {
    harness(ipu_runtime_tile::kernels::label(k), &ipu_runtime_tile::kernels::text(k))
}

/// One launch: how it ended, cycles, region-1 memory, batched issues.
struct Launch {
    outcome: String,
    cycles: u64,
    mem: Vec<u8>,
    batched: u64,
}

/// How the simulator runs a launch.
#[derive(Clone, Copy)]
struct Sim {
    batching: bool,
    portable: bool,
}
const DEFAULT: Sim = Sim { batching: true, portable: false };

/// Runs `prog` with region 1 filled from `seed` (f16 values of moderate size in every byte pair),
/// worker w's plain copy of rows `w..w + rows + 2` of block kb written, and descriptors for the
/// plain (`strided == false`) or the strided kernel; with `shared_out`, every worker stores to
/// worker 0's output (overlapping streams).
fn launch(
    prog: &TileProgram,
    strided: bool,
    rows: u32,
    s: u32,
    seed: u64,
    sim: Sim,
    shared_out: bool,
) -> Launch {
    launch_at(prog, strided, rows, s, seed, sim, shared_out, None)
}

/// [`launch`], every worker's x at `x` if given.
#[allow(clippy::too_many_arguments)]
fn launch_at(
    prog: &TileProgram,
    strided: bool,
    rows: u32,
    s: u32,
    seed: u64,
    sim: Sim,
    shared_out: bool,
    x: Option<u32>,
) -> Launch {
    let kb = s / 32 - 1;
    let mut dev = SimDevice::new(SimConfig { tiles: 1, threads: 1, max_cycles: 10_000_000 }).expect("device");
    dev.set_amp_batching(sim.batching);
    dev.set_portable_amp(sim.portable);
    let mut z = seed;
    let mut fill = Vec::with_capacity(DATA.1);
    while fill.len() < DATA.1 {
        z ^= z << 13;
        z ^= z >> 7;
        z ^= z << 17;
        // Sign, exponent 2^-3..2^0, random mantissa.
        let h = ((z & 0x83FF) as u16) | 0x3000 | ((z >> 20) as u16 & 0x0C00);
        fill.extend(h.to_le_bytes());
    }
    for w in 0..6u32 {
        for r in 0..rows + 2 {
            let from = (A + (w + r) * s + kb * 32 - DATA.0) as usize;
            let to = (PLAIN + w * WORKER + 32 * r - DATA.0) as usize;
            fill.copy_within(from..from + 32, to);
        }
    }
    dev.write_memory(0, DATA.0, &fill).expect("fill");
    dev.load_tile(0, &prog.segment_refs(), prog.entry).expect("load");
    let mut desc = Vec::new();
    for w in 0..6u32 {
        let x = x.unwrap_or(if strided { A + w * s + kb * 32 } else { PLAIN + w * WORKER });
        let out = OUT + if shared_out { 0 } else { w * WORKER };
        desc.extend([x, PIN + w * WORKER, out, rows + 1]);
    }
    desc.push(s);
    let bytes: Vec<u8> = desc.iter().flat_map(|w| w.to_le_bytes()).collect();
    dev.write_memory(0, prog.sym("desc"), &bytes).expect("descriptors");
    let (outcome, cycles) = match dev.run_to_host_sync() {
        Ok(r) => ("HostSync".to_string(), r.cycle),
        Err(e) => (format!("{e}"), 0),
    };
    Launch { outcome, cycles, mem: read(&mut dev, 0, DATA.0, DATA.1), batched: dev.tile(0).batched }
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<u32> {
    a.iter().zip(b).position(|(x, y)| x != y).map(|i| DATA.0 + i as u32)
}

/// The strided kernel on row-major A gives the plain kernel's bits on the `[row][16]` copy, and
/// both take the cycles their issue counts say, for every AMP kind, row count and stride.
#[test]
fn strided_kernels_match_the_plain_ones_and_their_issue_counts() {
    let exit = harness("k_exit", ".align 8\nk_exit:\n    exit\n");
    for (plain, strided) in [
        (Kernel::AmpF16, Kernel::AmpF16Strided),
        (Kernel::AmpF32, Kernel::AmpF32Strided),
        (Kernel::AmpF8, Kernel::AmpF8Strided),
    ] {
        let (pp, sp) = (kernel_program(plain), kernel_program(strided));
        for rows in [1u32, 2, 7, 100] {
            for s in [32u32, 64, 1152] {
                let what = format!("{strided:?}, {rows} rows, S = {s}");
                let seed = 11 + rows as u64 * 7 + s as u64;
                let base = launch(&exit, false, rows, s, seed, DEFAULT, false);
                let want = launch(&pp, false, rows, s, seed, DEFAULT, false);
                let got = launch(&sp, true, rows, s, seed, DEFAULT, false);
                assert_eq!(first_difference(&got.mem, &want.mem), None, "{what}: memory differs");
                // The kernels wrote their rows: output differs from the fill.
                let out = (OUT + 40 - DATA.0) as usize..(OUT + 40 + 32 * rows - DATA.0) as usize;
                assert!(got.mem[out.clone()] != base.mem[out], "{what}: no output");
                let issues = |k| cost::kernel_issues(k, rows + 1);
                assert_eq!(want.cycles - base.cycles, 6 * (issues(plain) - 1), "{what}: plain cycles");
                assert_eq!(got.cycles - base.cycles, 6 * (issues(strided) - 1), "{what}: strided cycles");
            }
        }
    }
}

/// The strided loops run batched (workers alone while their stores touch no other worker's
/// streams, round by round when every worker stores to the same rows) and with the host's AMP
/// kernels, and leave exactly what the portable issue-by-issue path leaves.
#[test]
fn strided_kernels_fast_paths_match_the_specification() {
    for k in [Kernel::AmpF16Strided, Kernel::AmpF32Strided, Kernel::AmpF8Strided] {
        let prog = kernel_program(k);
        for (s, shared_out) in [(1152u32, false), (64, false), (1152, true)] {
            let what = format!("{k:?}, S = {s}, shared output {shared_out}");
            let spec = launch(&prog, true, 100, s, 5, Sim { batching: false, portable: true }, shared_out);
            assert_eq!(spec.batched, 0, "{what}: batched while turned off");
            for sim in
                [DEFAULT, Sim { batching: true, portable: true }, Sim { batching: false, portable: false }]
            {
                let fast = launch(&prog, true, 100, s, 5, sim, shared_out);
                assert_eq!(first_difference(&fast.mem, &spec.mem), None, "{what}: memory differs");
                assert_eq!(fast.cycles, spec.cycles, "{what}: cycles");
                if sim.batching {
                    // Nearly all of 6 workers × 404 bundles ran in stretches.
                    assert!(fast.batched > 6 * 350, "{what}: {} issues batched", fast.batched);
                }
            }
        }
    }
}

/// A strided x stream that leaves tile memory part way through the loop: the fast path must not
/// run into the fault, which comes at the same cycle (the report names it), with the same memory,
/// either way.
#[test]
fn strided_stream_leaving_memory_faults_alike_with_and_without_the_fast_path() {
    let prog = kernel_program(Kernel::AmpF16Strided);
    // Row 40 of 100 is the first past the end of tile memory.
    let x = 0xE8000 - 40 * 1152 + 1120;
    let [fast, slow] = [DEFAULT, Sim { batching: false, portable: true }]
        .map(|sim| launch_at(&prog, true, 100, 1152, 3, sim, false, Some(x)));
    assert!(
        fast.outcome.contains("outside tile memory") && fast.outcome.contains("cycle"),
        "{}",
        fast.outcome
    );
    assert_eq!(fast.outcome, slow.outcome);
    assert_eq!(first_difference(&fast.mem, &slow.mem), None, "memory differs");
    // A stretch is the rest of the loop, and this one holds the fault: the fast path refuses it.
    assert_eq!(fast.batched, 0, "batched across a fault");
}
