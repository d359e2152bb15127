//! Many seeds through the oracle on several threads, results merged in seed order, and the
//! summary both the `graph_fuzz` driver and the CI test print: counts per class, refusal reasons
//! with their rates, bugs (new, or known from [`crate::findings`]).

use crate::findings;
use crate::graphgen::{self, GraphSpec};
use crate::oracle::{self, Failure, Limits, Outcome};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One seed's result.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// The seed.
    pub seed: u64,
    /// The graph.
    pub spec: GraphSpec,
    /// What the oracle said.
    pub outcome: Outcome,
    /// Wall time of build + run.
    pub time: Duration,
    /// For a bug: the open finding that explains it.
    pub known: Option<&'static str>,
}

/// Run `count` seeds from `start` on `jobs` threads; results in seed order. `progress` is called
/// after each case with the number done.
pub fn run(
    start: u64,
    count: usize,
    jobs: usize,
    limits: Limits,
    progress: &(dyn Fn(usize) + Sync),
) -> Vec<CaseResult> {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<CaseResult>>> = (0..count).map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let seed = start + i as u64;
                let spec = graphgen::generate(seed);
                let t = Instant::now();
                let outcome = oracle::check(&spec, limits);
                let time = t.elapsed();
                let known = match &outcome {
                    Outcome::Bug(f) => findings::known(&spec.to_toml(""), f).map(|o| o.id),
                    _ => None,
                };
                *slots[i].lock().expect("slot") = Some(CaseResult { seed, spec, outcome, time, known });
                progress(done.fetch_add(1, Ordering::Relaxed) + 1);
            });
        }
    });
    slots.into_iter().map(|m| m.into_inner().expect("slot").expect("every seed ran")).collect()
}

/// Counts over a campaign.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Graphs per outcome class (`pass`, `refused`, `overflow-reported`, bug classes).
    pub classes: BTreeMap<String, usize>,
    /// Refusals per normalised reason.
    pub reasons: BTreeMap<String, usize>,
    /// Bugs no open finding explains.
    pub new_bugs: usize,
    /// Bugs explained by an open finding, per finding id.
    pub known_bugs: BTreeMap<&'static str, usize>,
    /// Ops per kind over all graphs (coverage).
    pub ops: BTreeMap<String, usize>,
}

/// Count a campaign's results.
pub fn summarise(results: &[CaseResult]) -> Summary {
    let mut s = Summary::default();
    for r in results {
        let class = match (&r.outcome, r.known) {
            (Outcome::Bug(f), Some(id)) => format!("{} (known {id})", f.class),
            (o, _) => o.class().to_string(),
        };
        *s.classes.entry(class).or_default() += 1;
        for op in &r.spec.ops {
            *s.ops.entry(op.op.clone()).or_default() += 1;
        }
        match (&r.outcome, r.known) {
            (Outcome::Refused { reason, .. }, _) => *s.reasons.entry(reason.clone()).or_default() += 1,
            (Outcome::Bug(_), Some(id)) => *s.known_bugs.entry(id).or_default() += 1,
            (Outcome::Bug(_), None) => s.new_bugs += 1,
            _ => {}
        }
    }
    s
}

/// The report a person reads: classes, refusal reasons with rates, op coverage, every bug.
pub fn report(results: &[CaseResult], wall: Duration) -> String {
    let s = summarise(results);
    let n = results.len().max(1);
    let pct = |k: usize| 100.0 * k as f64 / n as f64;
    let mut out = String::new();
    let slowest = results.iter().max_by_key(|r| r.time);
    let _ = writeln!(
        out,
        "{} graphs (seeds {}..{}) in {:.1} s wall; slowest {:.2} s (seed {})",
        results.len(),
        results.first().map_or(0, |r| r.seed),
        results.last().map_or(0, |r| r.seed + 1),
        wall.as_secs_f64(),
        slowest.map_or(0.0, |r| r.time.as_secs_f64()),
        slowest.map_or(0, |r| r.seed)
    );
    let _ = writeln!(out, "outcomes:");
    for (c, k) in &s.classes {
        let _ = writeln!(out, "  {c:<34} {k:>6}  {:5.1}%", pct(*k));
    }
    // One line per reason, whatever the op: `op N (tanh): why` and `op N (abs): why` count together.
    let _ = writeln!(out, "refusal reasons (rate over all graphs; the ops that met them):");
    let mut by_reason: BTreeMap<String, (usize, BTreeMap<String, usize>)> = BTreeMap::new();
    for (r, k) in &s.reasons {
        let (kind, why) = match (r.find('('), r.find("): ")) {
            (Some(a), Some(b)) if a < b => (&r[a + 1..b], &r[b + 3..]),
            _ => ("", r.as_str()),
        };
        let e = by_reason.entry(why.to_string()).or_default();
        e.0 += k;
        *e.1.entry(kind.to_string()).or_default() += k;
    }
    let mut reasons: Vec<_> = by_reason.into_iter().collect();
    reasons.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
    for (why, (k, kinds)) in reasons {
        let kinds: Vec<String> = kinds.iter().map(|(o, n)| format!("{o} {n}")).collect();
        let why: String = why.chars().take(150).collect();
        let _ = writeln!(out, "  {:5.1}% {k:>5}  {why}  [{}]", pct(k), kinds.join(", "));
    }
    let ops: Vec<String> = s.ops.iter().map(|(o, k)| format!("{o}={k}")).collect();
    let _ = writeln!(out, "ops generated: {}", ops.join(" "));
    let _ = writeln!(
        out,
        "bugs: {} new, {} known {:?}",
        s.new_bugs,
        s.known_bugs.values().sum::<usize>(),
        s.known_bugs
    );
    for r in results {
        if let Outcome::Bug(f) = &r.outcome {
            let tag = r.known.map_or("NEW".to_string(), |id| format!("known {id}"));
            let _ = writeln!(
                out,
                "  seed {} tiles {} [{tag}] {}: {}",
                r.seed,
                r.spec.tiles,
                f.class,
                first_line(&f.message)
            );
        }
    }
    out
}

fn first_line(m: &str) -> String {
    m.lines().next().unwrap_or("").chars().take(300).collect()
}

/// Up to `per_key` representatives (the lowest seeds) of each distinct bug: class, key and the
/// open finding that explains it. A wrong result's key says only which check failed, so more
/// than one of those is worth minimising to tell causes apart.
pub fn distinct_bugs(results: &[CaseResult], per_key: usize) -> Vec<(&CaseResult, &Failure)> {
    let mut seen: BTreeMap<(String, String, Option<&str>), usize> = BTreeMap::new();
    let mut out = Vec::new();
    for r in results {
        if let Outcome::Bug(f) = &r.outcome {
            let n = seen.entry((f.class.to_string(), f.key.clone(), r.known)).or_default();
            *n += 1;
            if *n <= per_key {
                out.push((r, f));
            }
        }
    }
    out
}
