//! Runs of kernel launches as supervisor loops (docs/runtime.md "Launch loops").
//!
//! A matmul on a tile is a run of launches of one kernel, each loading the next weight block and
//! starting the workers on the next descriptor table: the weight addresses and the tables are
//! equally spaced. Straight-line code is six instructions per launch (`setzi`, `ldcwei`, `setzi`,
//! `setzi`, `runall`, `sync 2`); a loop is about seventeen for the whole run. The loop takes exactly
//! the cycles of the straight-line code, so the cost model (`ipu_core::plan::cost`) needs no
//! change: the three instructions that set up the next launch in straight-line code (three
//! `setzi`) are three here too (two `add`s and the loop's `brnzdec`, or its counter's `setzi`),
//! issued at the same places — in the slots of workers that finish early when the launch sets up
//! the next (`cost::sets_up_next_launch`), or after the last worker's exit when all six finish
//! together (then the supervisor has no slot before that exit either way). A run whose launches do
//! neither (one early worker, or fewer than four spare issues) is left straight-line: there the
//! loop's instructions would find free slots the straight-line `setzi`s do not use, and the run
//! would end earlier than the cost model says.
//!
//! ```text
//!     [setzi $m2, W0]  ldcwei $m2  [setzi $m0, K ; setzi $m1, D0]   ; as the first launch was set up
//!     runall $m0, $m1
//!     add $m2, $m2, WS ; add $m1, $m1, DS ; setzi $m3, N-3
//! top: sync 2
//!     ldcwei $m2 ; runall $m0, $m1          ; launches 2 .. N-1
//!     add $m2, $m2, WS ; add $m1, $m1, DS ; brnzdec $m3, top
//!     sync 2
//!     ldcwei $m2 ; runall $m0, $m1          ; launch N, then what straight-line code does after it
//! ```

use alloc::string::String;
use core::fmt::Write;
use ipu_core::plan::cost::sets_up_next_launch;
use ipu_core::plan::Step;

/// Fewest launches made a loop: below this the loop is not shorter than straight-line code.
pub const MIN_LAUNCHES: usize = 4;

/// A run of `n` (weight load, launch) pairs from step `at`, weight addresses `ws` and tables `ds`
/// bytes apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// Index of the first weight load.
    pub at: usize,
    /// Launches.
    pub n: usize,
    /// Bytes between consecutive weight blocks.
    pub ws: i32,
    /// Bytes between consecutive descriptor tables.
    pub ds: i32,
}

/// The run of launches starting at step `i` that can be a loop, if any.
pub fn find(steps: &[Step], i: usize) -> Option<Run> {
    let pair = |j: usize| match (steps.get(j), steps.get(j + 1)) {
        (Some(Step::LoadWeights(b, w, l)), Some(Step::RunAll(k, d, is))) => Some((b, *w, *l, *k, d, *is)),
        _ => None,
    };
    let (buf, w0, load, kernel, d0, issues) = pair(i)?;
    let (_, w1, _, _, d1, _) = pair(i + 2)?;
    let (ws, ds) = (w1 as i64 - w0 as i64, d1.offset as i64 - d0.offset as i64);
    let imm = |v: i64| (-32768..=32767).contains(&v);
    if !imm(ws) || !imm(ds) {
        return None;
    }
    let mut n = 1;
    while let Some((b, w, l, k, d, is)) = pair(i + 2 * n) {
        let same = b == buf
            && l == load
            && k == kernel
            && is == issues
            && d.table == d0.table
            && w as i64 == w0 as i64 + n as i64 * ws
            && d.offset as i64 == d0.offset as i64 + n as i64 * ds;
        if !same {
            break;
        }
        n += 1;
    }
    if n < MIN_LAUNCHES {
        return None;
    }
    // Each launch but the last sets up the next, or all six workers finish together.
    let sets_up = sets_up_next_launch(steps, i + 1);
    let together = issues.slowest == 0x3F && issues.spare == 0;
    (sets_up || together).then_some(Run { at: i, n, ws: ws as i32, ds: ds as i32 })
}

/// The loop's code, up to the last launch's `runall`: the caller emits what straight-line code
/// puts after that launch (its set-up of the next step, `sync 2`). `label` must be unique in the
/// tile's code.
pub fn code(s: &mut String, steps: &[Step], run: Run, label: &str) {
    let (Step::LoadWeights(buf, w0, load), Step::RunAll(kernel, d0, _)) =
        (&steps[run.at], &steps[run.at + 1])
    else {
        unreachable!("a run starts with a weight load and a launch")
    };
    let ld = load.mnemonic();
    // The first launch as straight-line code has it, the weight address in $m2.
    let set_up = run.at > 0 && sets_up_next_launch(steps, run.at - 1);
    if !set_up {
        let _ = writeln!(s, "    setzi $m2, {buf}+{w0}");
    }
    let _ = writeln!(s, "    {ld} $m2");
    if !set_up {
        let _ = write!(s, "    setzi $m0, {}\n    setzi $m1, {d0}\n", crate::kernels::label(*kernel));
    }
    let (ws, ds) = (run.ws, run.ds);
    let _ = write!(
        s,
        "    runall $m0, $m1\n    add $m2, $m2, {ws}\n    add $m1, $m1, {ds}\n    setzi $m3, {}\n\
         {label}:\n    sync 2\n    {ld} $m2\n    runall $m0, $m1\n    add $m2, $m2, {ws}\n    add $m1, $m1, {ds}\n\
         \x20   brnzdec $m3, {label}\n    sync 2\n    {ld} $m2\n    runall $m0, $m1\n",
        run.n - 3
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipu_core::plan::{CweiLoad, Desc, Issues, Kernel};

    fn launches(n: usize, issues: Issues) -> alloc::vec::Vec<Step> {
        (0..n)
            .flat_map(|j| {
                [
                    Step::LoadWeights("B".into(), 512 * j as u32, CweiLoad::Full),
                    Step::RunAll(Kernel::AmpF16, Desc { table: "D".into(), offset: 96 * j as u32 }, issues),
                ]
            })
            .collect()
    }

    /// Equally spaced launches whose workers finish together, or early enough to set up the next,
    /// make a run; a break in the spacing ends it; others stay straight-line.
    #[test]
    fn runs_are_found_where_the_loop_takes_the_straight_line_cycles() {
        let together = Issues::all(30);
        let steps = launches(6, together);
        assert_eq!(find(&steps, 0), Some(Run { at: 0, n: 6, ws: 512, ds: 96 }));
        let early = Issues::of_workers([30, 30, 26, 26, 26, 26]);
        assert_eq!(find(&launches(5, early), 0).map(|r| r.n), Some(5));
        // One early worker: straight-line code has no set-up, the loop would find a free slot.
        assert_eq!(find(&launches(5, Issues::of_workers([30, 30, 30, 30, 30, 26])), 0), None);
        assert_eq!(find(&launches(3, together), 0), None, "too short to gain");
        let mut broken = launches(6, together);
        broken[8] = Step::LoadWeights("B".into(), 9999, CweiLoad::Full);
        assert_eq!(find(&broken, 0).map(|r| r.n), Some(4));
    }
}
