//! The simulator's AMP-loop fast path (`core/src/tile/batch.rs`) leaves exactly the state the
//! issue-by-issue path leaves: every program here runs both ways and the whole tile memory,
//! cycles, issue counts and faults are compared. The programs are six workers streaming
//! `{ld2st64pi ; f16amp}` loops over rows that are disjoint (run one worker at a time), that
//! overlap (run round by round in the barrel's order: never one worker at a time), or that run out
//! of tile memory (the fast path refuses: a fault, at the same cycle either way), and a compiled
//! matmul whose workers' scratch areas touch their neighbours' rows.

mod common;
use common::{fill_and_run, TILE_SPAN as MEM};
use ipu_host::sim::{SimConfig, SimDevice};
use ipu_host::Device;

/// `tests/programs/amp_rows.s` with its blanks filled in: worker k streams loads from
/// `x + k·2^stride_log2`, `pin + …` and stores to `out + …`, `rows` iterations of four bundles.
fn program(x: u32, pin: u32, out: u32, stride_log2: u32, rows: u32) -> String {
    include_str!("../programs/amp_rows.s")
        .replace("{X}", &format!("{x:#x}"))
        .replace("{PIN}", &format!("{pin:#x}"))
        .replace("{OUT}", &format!("{out:#x}"))
        .replace("{STRIDE}", &stride_log2.to_string())
        .replace("{ROWS}", &rows.to_string())
}

/// Runs `src` on `tiles` tiles with tile memory filled from `seed` (f16 values of moderate size
/// in every byte pair), with and without the fast path; returns both outcomes.
fn both_ways(src: &str, tiles: usize, seed: u64) -> [(String, Vec<u8>, [u64; 2]); 2] {
    both_ways_until(src, tiles, seed, u64::MAX)
}

/// [`both_ways`] with a cycle limit (`max_cycles`).
fn both_ways_until(src: &str, tiles: usize, seed: u64, max_cycles: u64) -> [(String, Vec<u8>, [u64; 2]); 2] {
    // Sign, exponent 2^-3..2^0, random mantissa.
    let word = |z: u64| ((z & 0x83FF) as u16) | 0x3000 | ((z >> 20) as u16 & 0x0C00);
    [true, false].map(|batching| {
        let (dev, outcome, mem) =
            fill_and_run(src, tiles, seed, max_cycles, word, |d| d.set_amp_batching(batching));
        let batched = (0..tiles as u16).map(|t| dev.tile(t).batched).sum();
        let interleaved = (0..tiles as u16).map(|t| dev.tile(t).interleaved).sum();
        (outcome, mem, [batched, interleaved])
    })
}

/// Asserts both runs ended alike; returns the outcome and how many issues the fast path ran, and
/// how many of those it ran interleaved.
fn assert_same(what: &str, [fast, slow]: [(String, Vec<u8>, [u64; 2]); 2]) -> (String, [u64; 2]) {
    assert_eq!(fast.0, slow.0, "{what}: outcome");
    let differ = fast.1.iter().zip(&slow.1).position(|(a, b)| a != b);
    assert_eq!(differ, None, "{what}: memory differs at byte {differ:?}");
    assert_eq!(slow.2, [0, 0], "{what}: the fast path ran while turned off");
    (fast.0, fast.2)
}

#[test]
fn disjoint_rows_give_the_same_state() {
    // 16 KiB per worker and stream: x 0x60000.., pin 0x80000.., out 0xa0000...
    let (out, [batched, interleaved]) =
        assert_same("disjoint", both_ways(&program(0x60000, 0x80000, 0xa0000, 14, 500), 3, 1));
    assert!(out.starts_with("HostSync"), "{out}");
    assert_eq!(interleaved, 0, "disjoint rows ran interleaved");
    // Nearly all of 3 tiles × 6 workers × 2000 bundles ran in stretches.
    assert!(batched > 3 * 6 * 1900, "{batched} issues batched");
}

#[test]
fn overlapping_rows_give_the_same_state() {
    // Every worker on the same rows, and stores 8 KiB apart over 16 KiB streams.
    // No worker may run alone through any of these: the fast path runs them in the barrel's order.
    let cases = [
        ("same rows", include_str!("../programs/amp_shared.s").to_string()),
        ("rows 8 bytes apart", program(0x60000, 0x80000, 0xa0000, 3, 500)),
        ("overlapping", program(0x60000, 0x80000, 0xa0000, 13, 500)),
        ("into inputs", program(0x60000, 0x80000, 0x62000, 14, 500)),
        // Worker k stores, in each round, the partial sums worker k + 1 loads in the same round (its loads
        // run one element ahead of its stores, hence the 8): the
        // order of the workers within a round decides what is read.
        ("into the next worker's inputs", program(0x60000, 0x80000, 0x84008, 14, 500)),
    ];
    for (i, (what, src)) in cases.iter().enumerate() {
        let (out, [batched, interleaved]) = assert_same(what, both_ways(src, 2, 2 + i as u64));
        assert!(out.starts_with("HostSync"), "{what}: {out}");
        assert!(batched > 2 * 6 * 1900, "{what}: {batched} issues batched");
        assert_eq!(interleaved, batched, "{what}: some worker ran alone");
    }
}

#[test]
fn a_loop_that_runs_out_of_memory_faults_at_the_same_cycle() {
    // Worker 5's stores reach past the end of tile memory part way through the loop.
    let (out, _) =
        assert_same("past the end", both_ways(&program(0x60000, 0x80000, 0xd0000, 14, 1000), 2, 5));
    assert!(out.starts_with("error"), "{out}");
}

#[test]
fn a_cycle_limit_inside_the_loops_stops_both_ways_alike() {
    // The loops take ~12,000 cycles; the limit falls in the middle of them.
    let src = program(0x60000, 0x80000, 0xa0000, 14, 500);
    let (out, [batched, _]) = assert_same("limit", both_ways_until(&src, 2, 6, 5_003));
    assert!(out.starts_with("error"), "{out}");
    assert!(batched > 0, "the stretch before the limit ran fast");
}

#[test]
fn a_compiled_matmul_gives_the_same_state() {
    // Enough rows per worker for the loops to be long, K split so that partial sums are read back.
    let src = "name = \"mm\"\noutputs = [\"C\"]\n[inputs.A]\ndtype = \"f16\"\nshape = [400, 96]\n\
               [inputs.B]\ndtype = \"f16\"\nshape = [96, 40]\n[[ops]]\nop = \"matmul\"\na = \"A\"\nb = \"B\"\n\
               output = \"C\"\ndtype = \"f16\"\naccumulate = \"f32\"\n";
    let pkg = ipu_host::build::build("mm.toml", src, &ipu_host::build::BuildOptions::new(4))
        .expect("builds")
        .package;
    let run = |batching: bool| {
        let mut dev =
            SimDevice::new(SimConfig { tiles: 4, threads: 1, max_cycles: u64::MAX }).expect("device");
        dev.set_amp_batching(batching);
        let opts = ipu_host::session::RunOptions {
            package_path: "mm.ipuexe".into(),
            inputs: Default::default(),
            output_dir: None,
            save_inputs: None,
            seed: 7,
            iterations: 2,
            profile: false,
        };
        let outcome = ipu_host::session::run(&pkg, &mut dev, &opts).expect("runs");
        assert!(outcome.numerical_pass);
        let mut mem = Vec::new();
        for t in 0..4u16 {
            let mut m = vec![0u8; MEM.1];
            dev.read_memory(t, MEM.0, &mut m).expect("read");
            mem.extend(m);
        }
        let batched: u64 = (0..4u16).map(|t| dev.tile(t).batched).sum();
        (outcome.cycles, outcome.device_instructions, mem, batched)
    };
    let (fast, slow) = (run(true), run(false));
    assert_eq!((&fast.0, fast.1), (&slow.0, slow.1));
    assert!(fast.2 == slow.2, "memory differs");
    // The kernel's loops did run in stretches (its scratch overlap is only at the loop's start).
    assert!(fast.3 > fast.1 / 4 && slow.3 == 0, "{} of {} issues batched", fast.3, fast.1);
}
