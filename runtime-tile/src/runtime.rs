//! The supervisor runtime of every tile: the host-exchange command loop around the `run` call,
//! and the code of each step of a tile plan (docs/runtime.md).

use alloc::collections::BTreeSet;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;
use ipu_core::plan::exchange::Event;
use ipu_core::plan::{Step, TilePlan};
use ipu_core::target::{csr, SEND_MAX_WORDS};

/// Name of the host mailbox (command word of the next call; 0 = `run`), at the start of the host
/// area on every tile.
pub const MAILBOX: &str = "mailbox";
/// Address of the mailbox.
pub const MAILBOX_ADDR: u32 = ipu_core::target::HOST_AREA_BASE;

/// Largest `delay` operand (19-bit field, FS §4).
const MAX_DELAY: u64 = 1 << 19;
/// Largest `delaypic` delay (7 bits) and `delayxpic` delay (12 bits).
const MAX_PIC_DELAY: u64 = 127;
const MAX_XPIC_DELAY: u64 = 4095;

/// Tracks the supervisor's issue cycle inside an exchange superstep.
struct Timed<'a> {
    out: &'a mut String,
    t: u64,
}

impl Timed<'_> {
    fn line(&mut self, s: core::fmt::Arguments<'_>, cost: u64) {
        let _ = self.out.write_fmt(s);
        self.out.push('\n');
        self.t += cost;
    }
    /// Delay so that the next instruction issues at `until` (or later if `until` has passed).
    fn wait_until(&mut self, until: u64) {
        while self.t < until {
            let n = (until - self.t).min(MAX_DELAY);
            self.line(format_args!("    delay {n}"), n);
        }
    }
    /// Emit a delayed-effect instruction (`delaypic`/`delayxpic`) whose effect is at `at`.
    fn effect_at(&mut self, at: u64, max: u64, f: impl Fn(u64) -> String) {
        if at > self.t + max {
            self.wait_until(at - max);
        }
        let d = at - self.t;
        let text = f(d);
        self.line(format_args!("    {text}"), d + 1);
    }
}

fn exchange(out: &mut String, events: &[Event]) {
    let mut tm = Timed { out, t: 0 };
    for e in events {
        match e {
            Event::Expect(words) => {
                tm.line(format_args!("    setzi $m1, {words}"), 1);
                tm.line(format_args!("    put {:#x}, $m1", csr::INCOMING_DCOUNT), 1);
            }
            Event::Pointer { at, buffer, offset } => {
                tm.effect_at(*at, MAX_PIC_DELAY, |d| alloc::format!("delaypic {d}, 0, {buffer}+{offset}"));
            }
            Event::Mux { at, source } => {
                tm.effect_at(*at, MAX_XPIC_DELAY, |d| alloc::format!("delayxpic {d}, 0, {source}"));
            }
            Event::Send { at, buffer, offset, words } => {
                tm.wait_until(*at);
                let mut done = 0;
                while done < *words {
                    let n = (*words - done).min(SEND_MAX_WORDS);
                    tm.line(format_args!("    send {n}, {buffer}+{}, 1", offset + 4 * done), n as u64);
                    done += n;
                }
            }
            Event::Drain { until } => tm.wait_until(*until),
        }
    }
    tm.line(format_args!("    sync 3"), 1);
}

/// Store the cycle counter as stamp `n` (cost: `ipu_core::plan::cost::stamp_cycles`).
fn stamp(s: &mut String, n: u32) {
    let per = ipu_core::plan::cost::STAMPS_PER_BASE;
    if n > 0 && n.is_multiple_of(per) {
        let _ = writeln!(s, "    setzi $m9, {}+{}", ipu_core::plan::profile::BUFFER, 4 * n);
    }
    let _ = write!(s, "    get $m8, {}\n    st32 $m8, $m9, $m15, {}\n", csr::COUNT_L, 4 * (n % per));
}

/// The supervisor code of step `i` (straight-line: no loops over launches or exchange events).
/// A launch that sets up the next (`cost::sets_up_next_launch`) loads the next weight address into
/// `$m2` and the next kernel and table into `$m0`, `$m1` while its workers run; that load and
/// launch then have no `setzi` of their own.
fn step_code(s: &mut String, steps: &[Step], i: usize) {
    use ipu_core::plan::cost::sets_up_next_launch;
    let set_up = |back: usize| i >= back && sets_up_next_launch(steps, i - back);
    match &steps[i] {
        Step::LoadWeights(buf, off, load) => {
            if set_up(1) {
                let _ = writeln!(s, "    {} $m2", load.mnemonic());
            } else {
                let _ = write!(s, "    setzi $m1, {buf}+{off}\n    {} $m1\n", load.mnemonic());
            }
        }
        Step::RunAll(k, desc, _) => {
            if !set_up(2) {
                let _ = write!(s, "    setzi $m0, {}\n    setzi $m1, {desc}\n", crate::kernels::label(*k));
            }
            s.push_str("    runall $m0, $m1\n");
            after_launch(s, steps, i);
        }
        Step::Sync => s.push_str("    sync 3\n"),
        Step::SetCsr(c, v) => {
            let _ = write!(s, "    setzi $m1, {v}\n    put {c:#x}, $m1\n");
        }
        Step::Exchange(events) => exchange(s, events),
        Step::Phase(_) => {}
        Step::Stamp(n) => stamp(s, *n),
    }
}

/// What follows launch `steps[i]`'s `runall`: the next launch's set-up when this one sets it up
/// (`cost::sets_up_next_launch`), then the wait for the workers.
fn after_launch(s: &mut String, steps: &[Step], i: usize) {
    if ipu_core::plan::cost::sets_up_next_launch(steps, i) {
        if let (Step::LoadWeights(buf, off, _), Step::RunAll(k2, desc2, _)) = (&steps[i + 1], &steps[i + 2]) {
            let _ = write!(
                s,
                "    setzi $m2, {buf}+{off}\n    setzi $m0, {}\n    setzi $m1, {desc2}\n",
                crate::kernels::label(*k2)
            );
        }
    }
    s.push_str("    sync 2\n");
}

/// Lines of supervisor code each phase of a tile's steps takes (phases in order of first
/// appearance, a phase's steps added up wherever they are): what to name when a tile's code does
/// not fit the executable region.
pub fn phase_code_lines(plan: &TilePlan) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    let mut phase = String::from("runtime");
    let mut s = String::new();
    for (i, step) in plan.steps.iter().enumerate() {
        if let Step::Phase(p) = step {
            phase = String::from(p.as_str());
            continue;
        }
        s.clear();
        step_code(&mut s, &plan.steps, i);
        let lines = s.lines().count();
        match out.iter_mut().find(|(p, _)| *p == phase) {
            Some((_, n)) => *n += lines,
            None => out.push((phase.clone(), lines)),
        }
    }
    out
}

/// The kinds of a tile's code, as `.kind` counts them (`asm::Program::kind_bytes`).
pub mod code_kind {
    /// The host command loop, the call and its return.
    pub const RUNTIME: u32 = 0;
    /// Worker kernels.
    pub const KERNELS: u32 = 1;
    /// Supervisor code of launches, weight loads, CSR writes, syncs and stamps.
    pub const LAUNCHES: u32 = 2;
    /// Supervisor code of exchange supersteps.
    pub const EXCHANGE: u32 = 3;
}

/// The complete code text of one tile (symbols of its buffers are defined by the linker), its
/// parts marked by kind (`.kind`, [`code_kind`]); runs of launches as loops
/// ([`crate::launch_loop`]).
pub fn tile_code(plan: &TilePlan) -> String {
    tile_code_with(plan, true)
}

/// [`tile_code`], with runs of launches as loops or (`loops` false) as straight-line code: the
/// same cycles either way (`tests/tests/launch_loops.rs`).
pub fn tile_code_with(plan: &TilePlan, loops: bool) -> String {
    let mut s = String::new();
    s.push_str(".equ mailbox, 0xe7b00\n.kind 0\nmain:\n    sync 15\ncmd:\n");
    if plan.steps.iter().any(|s| matches!(s, Step::Stamp(_))) {
        // Profile stamp 0: the host sync released this tile ($m9 = stamp base, docs/profile.md).
        let _ = writeln!(s, "    setzi $m9, {}", ipu_core::plan::profile::BUFFER);
        stamp(&mut s, 0);
    }
    s.push_str(
        "    setzi $m1, mailbox\n    ld32 $m2, $m1, $m15, 0\n    brnz $m2, stop\n    \
         call $m10, phases\n    sync 15\n    bri cmd\nstop:\n    halt\nphases:\n",
    );
    // Every kernel a launch names, loops included.
    let kernels: BTreeSet<_> =
        plan.steps.iter().filter_map(|s| if let Step::RunAll(k, ..) = s { Some(*k) } else { None }).collect();
    let mut kind = code_kind::RUNTIME;
    let mut i = 0;
    let mut runs = 0;
    while i < plan.steps.len() {
        let step = &plan.steps[i];
        let k = if matches!(step, Step::Exchange(_)) { code_kind::EXCHANGE } else { code_kind::LAUNCHES };
        if k != kind && !matches!(step, Step::Phase(_)) {
            let _ = writeln!(s, ".kind {k}");
            kind = k;
        }
        if let Some(run) = crate::launch_loop::find(&plan.steps, i).filter(|_| loops) {
            crate::launch_loop::code(&mut s, &plan.steps, run, &alloc::format!("launches{runs}"));
            let last = run.at + 2 * run.n - 1;
            after_launch(&mut s, &plan.steps, last);
            runs += 1;
            i = last + 1;
            continue;
        }
        step_code(&mut s, &plan.steps, i);
        i += 1;
    }
    let _ = writeln!(s, ".kind {}\n    br $m10\n.kind {}", code_kind::RUNTIME, code_kind::KERNELS);
    for k in kernels {
        s.push_str(&crate::kernels::text(k));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipu_core::plan::Kernel;

    /// A phase's lines are its steps' lines wherever they are; steps before any phase are the
    /// runtime's; the phases' lines add up to the steps' part of the tile's code.
    #[test]
    fn phase_code_lines_add_up_per_phase() {
        let run = |d: &str| Step::RunAll(Kernel::AmpF16, d.into(), 10.into());
        let plan = TilePlan {
            buffers: Vec::new(),
            steps: alloc::vec![
                Step::Sync,
                Step::Phase("matmul S".into()),
                Step::LoadWeights("B".into(), 0, ipu_core::plan::CweiLoad::Full),
                run("d0"),
                Step::Phase("softmax P".into()),
                run("d1"),
                Step::Phase("matmul S".into()),
                run("d2"),
            ],
        };
        let parts = phase_code_lines(&plan);
        assert_eq!(
            parts,
            alloc::vec![("runtime".into(), 1), ("matmul S".into(), 2 + 4 + 4), ("softmax P".into(), 4)]
        );
        let code = tile_code(&plan);
        let body = code.split("phases:\n").nth(1).unwrap().split("    br $m10").next().unwrap();
        // `.kind` marks emit no bytes.
        let lines = body.lines().filter(|l| !l.starts_with(".kind")).count();
        assert_eq!(lines, parts.iter().map(|p| p.1).sum::<usize>());
        assert!(body.starts_with(".kind 2\n"), "launch code is marked as such: {body}");
    }

    /// A launch whose early workers leave the supervisor time sets up the next weight load and
    /// launch; one whose workers all finish together, or with one early worker, does not.
    #[test]
    fn a_launch_sets_up_the_next_only_when_two_workers_finish_early() {
        use ipu_core::plan::{CweiLoad, Issues};
        let code_of = |issues: Issues| {
            let plan = TilePlan {
                buffers: Vec::new(),
                steps: alloc::vec![
                    Step::LoadWeights("B".into(), 0, CweiLoad::Full),
                    Step::RunAll(Kernel::AmpF16, "d0".into(), issues),
                    Step::LoadWeights("B".into(), 512, CweiLoad::Full),
                    Step::RunAll(Kernel::AmpF16, "d1".into(), issues),
                ],
            };
            let code = tile_code(&plan);
            let body = code.split("phases:\n").nth(1).unwrap().split("    br $m10").next().unwrap();
            body.lines()
                .filter(|l| !l.starts_with(".kind"))
                .map(|l| alloc::format!("{l}\n"))
                .collect::<String>()
        };
        // Workers 0 and 1 take one more row (4 issues) than the other four.
        let early = Issues::of_workers([26, 26, 22, 22, 22, 22]);
        assert_eq!(
            code_of(early),
            "    setzi $m1, B+0\n    ldcwei $m1\n    setzi $m0, k_amp_f16\n    setzi $m1, d0\n    \
             runall $m0, $m1\n    setzi $m2, B+512\n    setzi $m0, k_amp_f16\n    setzi $m1, d1\n    \
             sync 2\n    ldcwei $m2\n    runall $m0, $m1\n    sync 2\n"
        );
        for late in [
            Issues::all(26),
            Issues::of_workers([26, 26, 26, 26, 26, 22]),
            Issues::of_workers([26, 26, 23, 23, 23, 23]),
        ] {
            assert!(code_of(late).contains("sync 2\n    setzi $m1, B+512\n    ldcwei $m1\n"), "{late:?}");
        }
    }

    /// The `.kind` marks count every code byte once: runtime, kernels, launches and exchange add
    /// up to the assembled size, and each kind gets the bytes of its own instructions.
    #[test]
    fn code_kinds_add_up_to_the_code() {
        use ipu_core::plan::exchange::Event;
        let plan = TilePlan {
            buffers: Vec::new(),
            steps: alloc::vec![
                Step::Phase("matmul S".into()),
                Step::RunAll(Kernel::AddF16, "d0".into(), 10.into()),
                Step::Exchange(alloc::vec![Event::Expect(4), Event::Drain { until: 9 }]),
                Step::Sync,
            ],
        };
        let text = alloc::format!(".equ d0, 0x80000\n{}", tile_code(&plan));
        let mut out = alloc::vec![0u8; 1 << 16];
        let p = crate::asm::assemble(&text, ipu_core::target::TILE_MEM_BASE, &mut out).expect("assembles");
        let total: u32 = p.segments.iter().map(|s| s.len as u32).sum();
        let [runtime, kernels, launches, exchange] = p.kind_bytes;
        assert_eq!(runtime + kernels + launches + exchange, total);
        // setzi, setzi, runall, sync 2 | sync 3 after the exchange.
        assert_eq!(launches, 4 * 5);
        // setzi, put (Expect), delay (Drain), sync 3.
        assert_eq!(exchange, 4 * 4);
        assert_eq!(
            kernels,
            crate::asm::assemble(&crate::kernels::text(Kernel::AddF16), 0x4c000, &mut out).unwrap().used
                as u32
        );
        assert!(runtime > 0);
    }
}
