//! The cost model: predicted cycles of a `run` call from the target model (docs/target.md §3–§6)
//! and the kernels' instruction counts (`ipu-runtime-tile`, docs/kernels.md).

use super::{Issues, Kernel, Step};
use crate::target::{BARREL_SLOTS, SYNC_CYCLES};

/// Predicted cycles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    /// Whole `run` call, from the host-sync release to the next release.
    pub cycles: u64,
    /// Cycles spent in exchange supersteps (release to release).
    pub exchange: u64,
}

/// Worker issues of a kernel for one descriptor entry (must match the kernel code).
pub fn kernel_issues(kernel: Kernel, count: u32) -> u64 {
    match kernel {
        // setup 8 (shl, 4×ld32 indexed by the shifted worker number, 2×ld64pi, rpt — which then
        // sits at word 7, ≡ 4 mod 8 bytes, with no nop) + 4 per row incl. the flush row + 2.
        Kernel::AmpF16 | Kernel::AmpF32 | Kernel::AmpF8 => 8 + 4 * count as u64 + 2,
        // setup 11 (shl, 5×ld32 — the fifth S, shared —, add and shl making the stride register,
        // 2×ld64pi, tapack), rpt — at word 11, ≡ 4 mod 8 bytes, with no nop —, 4 per row incl. the
        // flush row, then shl and st64 (the last store's address) and exit.
        Kernel::AmpF16Strided | Kernel::AmpF32Strided | Kernel::AmpF8Strided => 12 + 4 * count as u64 + 3,
        Kernel::CastF16ToF8
        | Kernel::CastF8ToF16
        | Kernel::ScaleF16
        | Kernel::SoftmaxF16
        | Kernel::CvtF32ToF16
        | Kernel::CastF32ToF16
        | Kernel::CastF16ToF32 => chain_issues(kernel, count as u64),
        Kernel::BiasF16 => bias_issues(count as u64, 1),
        Kernel::CopyWords => copy_issues(&[count]),
        Kernel::ZeroWords => zero_issues(&[count]),
        Kernel::TransposeF16 => transpose_issues(1, count as u64),
        Kernel::LayerNormF16 => layernorm_issues(1, count as u64 / 4, count as u64 % 4),
        Kernel::LayerNormSum | Kernel::LayerNormVar | Kernel::LayerNormApply => {
            layernorm_shared_issues(kernel, 1, count as u64 / 4, count as u64 % 4)
        }
        Kernel::GeluF16 => gelu_issues(count as u64, 1),
        Kernel::GeluErfF16 => gelu_erf_issues(count as u64, 1),
        Kernel::GeluSigmoidF16 => gelu_sigmoid_issues(count as u64, 1),
        Kernel::ReduceRowsF16 => reduce_rows_issues(1, count as u64 / 4, count as u64 % 4),
        Kernel::MapF16(func) => super::map::issues(func, count as u64, 0, 1),
        Kernel::BinaryF16(_) => binary_rows_issues(1, count as u64),
        Kernel::SplatF16(..) => splat_rows_issues(1, count as u64),
        // shl, add, 4×ld32, brz (7); prologue 5; add, rpt; one bundle per chunk after the first;
        // st64pi, exit. An empty range exits after the branch.
        Kernel::AddF16 | Kernel::AddF32 => {
            if count == 0 {
                8
            } else {
                count as u64 + 15
            }
        }
        Kernel::AddBlocksF16 | Kernel::AddBlocksF32 => binary_rows_issues(1, count as u64),
    }
}

/// Worker issues of `layernorm_f16` for `rows` rows of `4·chunks + tail` values: setup 13 (shl,
/// add, 8×ld32, 2×lda32, brz); per row 40 + 37 per 4-value chunk (6 sum, 10 variance, 21 apply)
/// + 32 per tail value (6, 8, 18) + 3 when there are chunks; exit.
pub fn layernorm_issues(rows: u64, chunks: u64, tail: u64) -> u64 {
    let per_row = 40 + 37 * chunks + 32 * tail + if chunks > 0 { 3 } else { 0 };
    14 + rows * per_row
}

/// Worker issues of a row-shared layer normalisation launch for `rows` rows of which this worker
/// takes `chunks` 4-value chunks and `tail` single values: setup 15, exit 1; per row (`[c]` = 1
/// when there are chunks) sum 13 + [c] + 6·chunks + 6·tail; variance 28 + [c] + 10·chunks + 8·tail;
/// apply 49 + [c] + 21·chunks + 18·tail (docs/kernels.md).
pub fn layernorm_shared_issues(kernel: Kernel, rows: u64, chunks: u64, tail: u64) -> u64 {
    let c = u64::from(chunks > 0);
    let per_row = match kernel {
        Kernel::LayerNormSum => 13 + c + 6 * chunks + 6 * tail,
        Kernel::LayerNormVar => 28 + c + 10 * chunks + 8 * tail,
        _ => 49 + c + 21 * chunks + 18 * tail,
    };
    16 + rows * per_row
}

/// Worker issues of `transpose_f16` for `rows` output rows of `r` values: setup 9 (shl, add,
/// 6×ld32, brz); per row 3×or, add, 5 per value (ldh16, sth16, 2×add, brnzdec), then add, add,
/// add, brnz; exit.
pub fn transpose_issues(rows: u64, r: u64) -> u64 {
    10 + rows * (8 + 5 * r)
}

/// Worker issues of `copy_words` for one worker's list of segments (words each): shl, add,
/// 2×ld32, brz, add (6); per segment 3×ld32, add, nop, rpt (6), two bundles per word, brnzdec;
/// exit. An empty list exits after the branch.
pub fn copy_issues(segments: &[u32]) -> u64 {
    if segments.is_empty() {
        return 6;
    }
    7 + segments.iter().map(|&w| 7 + 2 * w as u64).sum::<u64>()
}

/// Worker issues of `zero_words` for one worker's list of segments (words each): shl, add,
/// 2×ld32, brz, add (6); per segment 2×ld32, add, rpt (4), one bundle per word, brnzdec; exit.
/// An empty list exits after the branch.
pub fn zero_issues(segments: &[u32]) -> u64 {
    if segments.is_empty() {
        return 6;
    }
    7 + segments.iter().map(|&w| 5 + w as u64).sum::<u64>()
}

/// Worker issues of the elementwise chain kernels for `units` units of work: pairs of 4-value
/// chunks for `CastF16ToF8`, 4-value chunks otherwise.
pub fn chain_issues(kernel: Kernel, units: u64) -> u64 {
    let chunks = units;
    match kernel {
        // 12 up to brz; prologue 4; add, rpt; 3 per pair after the first; epilogue 2; exit.
        Kernel::CastF16ToF8 => {
            if units == 0 {
                13
            } else {
                18 + 3 * (units - 1) + 3
            }
        }
        // 12 setup up to brz; add; 5 per chunk; exit.
        Kernel::CastF8ToF16 => {
            if chunks == 0 {
                13
            } else {
                14 + 5 * chunks
            }
        }
        // 12 setup up to brz; add; 6 per chunk (5 body, brnzdec); exit.
        Kernel::CastF32ToF16 | Kernel::CastF16ToF32 => {
            if chunks == 0 {
                13
            } else {
                14 + 6 * chunks
            }
        }
        Kernel::ScaleF16 => scale_issues([(chunks, 1), (0, 0)]),
        Kernel::CvtF32ToF16 => cvt_issues(chunks, 1),
        other => kernel_issues(other, chunks as u32),
    }
}

/// Worker issues of the alpha kernel over two segments of `(chunks, blocks)`: setup 9 (shl, add,
/// 6 loads, `setzi`); per segment its two `brz` (one if it has no chunks), per block the first
/// chunk and the second's load (2 moves, 7), the count `add` and `brz`, then when there are more
/// chunks an `add` and 7 per further chunk, the last store, `add`, `add`, `brnz`; then 3 loads,
/// `add`, `brnz`; `exit`.
pub fn scale_issues(segments: [(u64, u64); 2]) -> u64 {
    let segment = |(chunks, blocks): (u64, u64)| match (chunks, blocks) {
        (0, _) => 1,
        (_, 0) => 2,
        (1, _) => 2 + blocks * 15,
        _ => 2 + blocks * (15 + 1 + 7 * (chunks - 1)),
    };
    9 + segments.iter().map(|&s| segment(s) + 5).sum::<u64>() + 1
}

/// Worker issues of `gelu_f16` for `chunks` groups of four values per block over `blocks` blocks:
/// set-up 15 (shl, add, 4×ld32, 9×lda32), 2×brz, `add`; per block 3 moves, 45 per chunk (ld64pi,
/// 2×f16v2tof32, 2 × 19 for the formula on a pair — 11 two-lane operations, and 2×`f32exp` and
/// 2×`f32div`, which cost 2 —, 2×f32v2tof16, st64pi, brnzdec), the stride add and brnzdec; exit.
/// Empty: 17 or 18.
pub fn gelu_issues(chunks: u64, blocks: u64) -> u64 {
    match (blocks, chunks) {
        (0, _) => 17,
        (_, 0) => 18,
        _ => 18 + blocks * (5 + 45 * chunks) + 1,
    }
}

/// Worker issues of `gelu_erf_f16` for `chunks` groups of four values per block over `blocks`
/// blocks: set-up 15 (shl, add, 4×ld32, 9×lda32), 2×brz, `add`; per block 3 moves, 103 per chunk
/// (ld64pi, 2 × (f16v2tof32, 2 × 24 for the formula — `f32sqrt`, `f32div`, `f32exp` cost 2 —,
/// f32v2tof16), st64pi, brnzdec), the stride add and brnzdec; exit. Empty: 17 or 18.
pub fn gelu_erf_issues(chunks: u64, blocks: u64) -> u64 {
    match (blocks, chunks) {
        (0, _) => 17,
        (_, 0) => 18,
        _ => 19 + blocks * (5 + 103 * chunks),
    }
}

/// Worker issues of `gelu_sigmoid_f16` (the code of `gelu_erf_f16` with another formula) for
/// `chunks` groups of four values per block over `blocks` blocks: as `gelu_erf_issues`, with 31
/// per chunk (ld64pi, 2 × (f16v2tof32, 2 × 6 for the formula — `f32mul`, `f32exp`, `f32add`,
/// `f32div`, the exp and divide costing 2 —, f32v2tof16), st64pi, brnzdec).
pub fn gelu_sigmoid_issues(chunks: u64, blocks: u64) -> u64 {
    match (blocks, chunks) {
        (0, _) => 17,
        (_, 0) => 18,
        _ => 19 + blocks * (5 + 31 * chunks),
    }
}

/// Worker issues of `reduce_rows_f16` for `rows` rows of `4·chunks + tail` values: set-up 11
/// (shl, add, 7×ld32, lda32, brz), `add`; per row the sum of `layernorm_f16` — ld64, 2×or, brz,
/// an `add` when there are chunks, 6 per chunk (ld64pi, 2×f16v2tof32, 2×f32v2add, brnzdec), or,
/// brz, 6 per tail value (ldh16, f16v2tof32, f32add, 2×add, brnz), f32add — then f32mul,
/// f32v2tof16, sth16, 2×add, brnzdec; exit. No rows: 12.
pub fn reduce_rows_issues(rows: u64, chunks: u64, tail: u64) -> u64 {
    if rows == 0 {
        return 12;
    }
    13 + rows * (13 + u64::from(chunks > 0) + 6 * chunks + 6 * tail)
}

/// Worker issues of the row binary kernels (`add_rows_f16`, …) for `rows` rows of `chunks`
/// 4-value chunks: set-up 14 (shl, add, 8×ld32, 2×brz, 2×add); per row 3 moves, 2 loads, the
/// op, 2 loads, nop, rpt (10), one bundle per chunk after the first, st64pi, 3 pointer adds,
/// brnzdec; exit. Empty: 12 (no rows) or 13 (no chunks).
pub fn binary_rows_issues(rows: u64, chunks: u64) -> u64 {
    match (rows, chunks) {
        (0, _) => 12,
        (_, 0) => 13,
        _ => 15 + rows * (14 + chunks),
    }
}

/// Worker issues of the splat row kernels (`add_splat_b_f16`, …) for `rows` rows of `chunks`
/// 4-value chunks (≥ 1): set-up 16 (shl, add, 10×ld32, setzi, brz, 2×add); per row 10 to splat
/// the value, 3 moves, brz, then for more than one chunk an `add` and 4 per chunk but the last
/// (ld64pi, op, st64pi, brnzdec), the last chunk 3, 3 pointer adds, brnzdec; exit. No rows: 15.
pub fn splat_rows_issues(rows: u64, chunks: u64) -> u64 {
    if rows == 0 {
        return 15;
    }
    let more = if chunks > 1 { 1 + 4 * (chunks - 1) } else { 0 };
    17 + rows * (21 + more)
}

/// Worker issues of `bias_f16` for `rows` rows per block over `blocks` blocks: set-up 9 (shl,
/// add, 5×ld32, 2×brz), `add` 1; per block 4 bias loads and 3 pointer/count moves, 13 per row
/// (4 × ld64pi, f16v4add, st64pi; brnzdec), the stride add and brnzdec; exit. Empty: 9 or 10.
pub fn bias_issues(rows: u64, blocks: u64) -> u64 {
    match (blocks, rows) {
        (0, _) => 9,
        (_, 0) => 10,
        _ => 10 + blocks * (9 + 13 * rows) + 1,
    }
}

/// Worker issues of `cvt_f32_f16` for `quads` groups of four f32 per block over `blocks` blocks:
/// set-up 8 (shl, add, 4×ld32, 2×brz), `add` 1; per block 5 (two pointer copies, the first
/// load and conversion, `rpt`), 3 bundles per quad, then the stride add and brnzdec; exit. An
/// empty range exits at the first or second branch.
pub fn cvt_issues(quads: u64, blocks: u64) -> u64 {
    match (blocks, quads) {
        (0, _) => 8,
        (_, 0) => 9,
        _ => 9 + blocks * (7 + 3 * quads) + 1,
    }
}

/// Worker issues of the softmax kernel for `rows` rows of `n` values into destination blocks of `be`
/// values: per row three passes over `n / 4` groups of four (64-bit loads and stores; block jumps
/// every 4 source groups and every `be / 4` destination groups) and `n % 4` single values.
pub fn softmax_issues(rows: u64, n: u64, be: u64) -> u64 {
    let (g, t) = (n / 4, n % 4);
    let (blocks, rest) = (g / 4, g % 4);
    let d = (be / 4).max(1);
    // Pass heads 4, 8 and 12 (the first loads the four −inf lane maxima, the second sets −max
    // twice, zeroes two sum lanes and loads the `e` row, the third adds the lanes, takes 1/sum and
    // loads the `e` row), the lane maxima folded into one (5), three heads of the leftover-group
    // loops and three of the tails (2 each), the row end (4); a loop-count adjust per pass for
    // whole blocks and for leftover groups; per whole source block 5 + 4 × (15 + 6) plus its loop
    // moves (2, 2, 3 and 2 more when a destination block ends); per leftover group 3 + 16 + 7;
    // per tail value 6 + 11 + 8.
    let per_row = 45
        + 3 * u64::from(blocks > 0)
        + 3 * u64::from(rest > 0)
        + 96 * blocks
        + 2 * (4 * blocks / d)
        + 26 * rest
        + 25 * t;
    // Setup 20 (descriptor, constants, G / 4 and G mod 4, the rows branch), exit.
    20 + rows * per_row + 1
}

/// Cycles from `runall` to the supervisor's next instruction after `sync 2`, when the slowest
/// worker issues `max_issues` (docs/target.md §3: workers start on the next slots; the
/// supervisor resumes after the last exit).
pub fn runall_cycles(max_issues: u64) -> u64 {
    BARREL_SLOTS * max_issues + 2
}

/// When a launch whose `runall` issues at `run` ends: the cycle of the last slowest worker's
/// `exit` and that worker's slot (docs/target.md §3: worker `k` first issues at the first cycle
/// after `run` in slot `k`, then every 6 cycles; the supervisor's `sync 2` completes the cycle
/// after the last exit). `before` is the previous launch's end in the same superstep, which fixes
/// the slot of `run`; without one, `run` is taken in the slot of the highest slowest worker,
/// which then starts last, 6 cycles after `run`: the latest end any slot could give.
pub fn launch_end(run: u64, issues: Issues, before: Option<(u64, u64)>) -> (u64, u64) {
    let slots = BARREL_SLOTS;
    let slowest = (0..slots).filter(|k| issues.slowest >> k & 1 == 1);
    let run_slot = match before {
        Some((exit, slot)) => (slot + (run - exit)) % slots,
        None => slowest.clone().max().unwrap_or(slots - 1),
    };
    let start = |k: u64| run + 1 + (k + 2 * slots - run_slot - 1) % slots;
    let (first_issue, slot) = slowest.map(|k| (start(k), k)).max().unwrap_or((run + slots, run_slot));
    (first_issue + slots * issues.max.saturating_sub(1), slot)
}

/// Whether the launch at `steps[i]` also sets up the next one: when it is followed by a weight
/// load and another launch, and at least two of its workers finish 4 or more issues before the
/// slowest, the supervisor issues the next launch's three `setzi` (weights, kernel, table) and its
/// `sync 2` in the slots those workers free (docs/target.md §3): each exits at least 19 cycles
/// before the last worker, so its slot comes round three times before then. The weight load then
/// follows the last exit at once. Shared by the runtime's emitter and [`predict`].
pub fn sets_up_next_launch(steps: &[Step], i: usize) -> bool {
    let Some(Step::RunAll(_, _, issues)) = steps.get(i) else { return false };
    let early = (!issues.slowest & 0x3F).count_ones();
    matches!(steps.get(i + 1), Some(Step::LoadWeights(..)))
        && matches!(steps.get(i + 2), Some(Step::RunAll(..)))
        && early >= 2
        && issues.spare >= 4
}

/// Supervisor instructions of the runtime around the phases: command fetch (setzi, ld32, brnz,
/// call) and return (br) before the host sync.
const CALL_OVERHEAD: u64 = 5;

/// Supervisor instructions of one profile stamp: `get` of the cycle counter and `st32`; a
/// `setzi` re-bases the stamp pointer every `STAMPS_PER_BASE` stamps (docs/profile.md).
pub fn stamp_cycles(n: u32) -> u64 {
    2 + u64::from(n > 0 && n.is_multiple_of(STAMPS_PER_BASE))
}

/// Stamps addressable from one base (the `st32` offset is 12 bits of words).
pub const STAMPS_PER_BASE: u32 = 4096;

/// Predict a `run` call from the steps (`RunAll` carries its slowest worker's issues) and the
/// horizon of each exchange superstep.
pub fn predict(tiles: &super::Tiles, exchange_horizon: &[u64]) -> Cost {
    // Split each tile's steps into supersteps at Sync/Exchange; time per superstep per tile, each
    // distinct program once (tiles that share a program take the same time).
    let distinct = tiles.distinct();
    let supersteps = distinct
        .first()
        .map(|(_, t)| t.steps.iter().filter(|s| matches!(s, Step::Sync | Step::Exchange(_))).count())
        .unwrap_or(0)
        + 1;
    let mut longest = alloc::vec![0u64; supersteps];
    let mut is_exchange = alloc::vec![false; supersteps];
    for (_, t) in distinct {
        let mut ss = 0;
        let profiled = t.steps.iter().any(|s| matches!(s, Step::Stamp(_)));
        // The profiled runtime stamps the host-sync release: setzi of the base, get, st32.
        let mut time = CALL_OVERHEAD - 1 + if profiled { 3 } else { 0 };
        let mut xi = 0;
        // The last worker exit of this superstep and its slot: the next `runall`'s slot follows
        // from it. The first launch after a sync is taken at its latest end.
        let mut last_exit: Option<(u64, u64)> = None;
        for (i, step) in t.steps.iter().enumerate() {
            // Whether this step's `setzi` ran during the launch two or one steps before.
            let set_up = |back: usize| i >= back && sets_up_next_launch(&t.steps, i - back);
            match step {
                Step::LoadWeights(_, _, load) => time += u64::from(!set_up(1)) + load.cycles() as u64,
                Step::SetCsr(..) => time += 2,
                Step::RunAll(_, _, issues) => {
                    let setzi = if set_up(2) { 0 } else { 2 };
                    let (exit, slot) = launch_end(time + setzi, *issues, last_exit);
                    last_exit = Some((exit, slot));
                    time = exit + 2;
                }
                Step::Phase(_) => {}
                Step::Stamp(n) => time += stamp_cycles(*n),
                Step::Sync | Step::Exchange(_) => {
                    if let Step::Exchange(_) = step {
                        // The schedule's times count from the step's first instruction.
                        time += exchange_horizon.get(xi).copied().unwrap_or(0);
                        is_exchange[ss] = true;
                        xi += 1;
                    }
                    longest[ss] = longest[ss].max(time);
                    ss += 1;
                    time = 0;
                    last_exit = None;
                }
            }
        }
        longest[ss] = longest[ss].max(time + 1);
    }
    let mut c = Cost::default();
    for (ss, l) in longest.iter().enumerate() {
        let stage = l + SYNC_CYCLES;
        c.cycles += stage;
        if is_exchange[ss] {
            c.exchange += stage;
        }
    }
    c
}
