//! Chrome/Perfetto trace-event JSON (`run --trace FILE.json`): one track (thread) per tile, a
//! slice per phase with the tile's samples nested inside it. Times are microseconds from the
//! start of the call, converted from integer nanoseconds so that nesting is exact.

use super::Profile;
use serde_json::{json, Value};

/// Default cap on slices; whole tiles are dropped past it, with a note in the trace.
pub const DEFAULT_MAX_EVENTS: usize = 200_000;

/// Nanoseconds of `cycle` from the start of the call (rounded down).
fn nanos(p: &Profile, cycle: u64) -> u64 {
    ((cycle.saturating_sub(p.run_start)) as u128 * 1_000_000_000 / p.clock_hz as u128) as u64
}

/// `ts` and `dur` in microseconds for cycles `start..end`, both from integer nanoseconds, so a
/// slice's end (`ts + dur` in ns) is exactly the nanosecond of `end`.
fn span(p: &Profile, start: u64, end: u64) -> (f64, f64) {
    let (a, b) = (nanos(p, start), nanos(p, end));
    (a as f64 / 1000.0, (b - a) as f64 / 1000.0)
}

/// The trace as a JSON value, with at most `max_events` slices.
pub fn trace(p: &Profile, max_events: usize) -> Value {
    let pid = 1;
    let mut events = vec![json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
        "args": {"name": format!("IPU {} — {}", p.device, p.package)}})];
    let total: usize = p.tiles.iter().map(|t| t.samples.len() + phase_runs(t).len()).sum();
    let mut slices = 0usize;
    let mut shown = 0usize;
    for t in &p.tiles {
        let runs = phase_runs(t);
        if slices + t.samples.len() + runs.len() > max_events {
            break;
        }
        shown += 1;
        let tid = u32::from(t.tile) + 1;
        events.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
            "args": {"name": format!("tile {}", t.tile)}}));
        events.push(json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
            "args": {"sort_index": t.tile}}));
        for (first, last) in runs {
            let (s0, s1) = (&t.samples[first], &t.samples[last]);
            let (ts, dur) = span(p, s0.start, s1.end);
            events.push(json!({"ph": "X", "cat": "phase", "name": p.phases[s0.phase as usize], "pid": pid,
                "tid": tid, "ts": ts, "dur": dur,
                "args": {"start_cycle": s0.start, "end_cycle": s1.end}}));
            slices += 1;
            for s in &t.samples[first..=last] {
                let (ts, dur) = span(p, s.start, s.end);
                let name = p.kernel_name(s).unwrap_or(s.kind.name());
                events.push(json!({"ph": "X", "cat": s.kind.name(), "name": name, "pid": pid, "tid": tid,
                    "ts": ts, "dur": dur,
                    "args": {"start_cycle": s.start, "end_cycle": s.end, "cycles": s.cycles()}}));
                slices += 1;
            }
        }
    }
    let mut other = json!({"package": p.package, "device": p.device, "run_cycles": p.run_cycles,
        "clock_hz": p.clock_hz, "slices": slices, "tiles_shown": shown});
    if shown < p.tiles.len() {
        let note = format!(
            "trace capped at {max_events} slices: {slices} of {total} slices, tiles 0..{} of {} (use `ipu-codegen profile` for all)",
            shown,
            p.tiles.len()
        );
        other["note"] = note.clone().into();
        events.push(json!({"ph": "i", "s": "g", "name": note, "pid": pid, "tid": 0, "ts": 0.0}));
    }
    json!({"displayTimeUnit": "ns", "otherData": other, "traceEvents": events})
}

/// Runs of consecutive samples in one phase: `(first, last)` sample indices.
fn phase_runs(t: &super::TileProfile) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, s) in t.samples.iter().enumerate() {
        match runs.last_mut() {
            Some(r) if t.samples[r.1].phase == s.phase => r.1 = i,
            _ => runs.push((i, i)),
        }
    }
    runs
}
