//! The oracle for random graphs (issue 38): a model is either refused at `build` with a message
//! that names the op and the reason, or it builds and `run` passes the verdict (bit-exact against
//! the device-precision reference, within the f64 bound). Everything else is a compiler bug: a
//! FAIL, a device fault or deadlock, a panic, a hang, a package `run` refuses.
//!
//! One exception is not a bug but the verdict doing its job: an FP8 cast (or an f16 op) that
//! overflows gives NaN/inf on the device *and* in the device-precision reference, while the f64
//! path, which rounds nowhere, stays finite — `run` then says FAIL. [`Outcome::Overflow`] is that
//! case, and only that: bit-exact against the device-precision reference, and every element over
//! its f64 bound non-finite (re-checked element by element here from the saved inputs and outputs,
//! so that a wrong finite value cannot hide behind a NaN) — or, finite elements over their bound
//! where an intermediate tensor overflowed (non-finite in device precision, finite in f64) and a
//! later op made it finite again: `max`/`min` give their constant for a NaN input (maxNum). [`Outcome::Domain`] is its twin: a
//! function evaluated at the edge of its domain (`pow` or `log` of a value near 0 that is negative
//! in f64 and not on the device) gives a finite device value where f64 has none, so `run` says
//! FAIL; every other element is checked as for an overflow.

use crate::graphgen::GraphSpec;
use ipu_host::build::{build, BuildError, BuildOptions};
use ipu_host::reference::HostTensor;
use ipu_host::session::{self, RunError, RunOptions};
use ipu_host::sim::{SimConfig, SimDevice};
use ipu_host::verdict;
use ipu_schema::Direction;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Once;
use std::time::Duration;

/// A compiler bug the oracle saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// `wrong-result`, `f64-bound`, `device-error`, `run-refused`, `panic`, `hang`,
    /// `model-error` (the parser refused a generated model), `build-options`.
    pub class: &'static str,
    /// The message with names and numbers taken out: two failures with the same class and key
    /// are taken to be the same bug (the minimiser keeps both fixed).
    pub key: String,
    /// The message as printed.
    pub message: String,
}

/// What one graph did.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Built, ran, and the verdict passed.
    Pass,
    /// Non-finite values (overflow) reported by the verdict consistently with the reference.
    Overflow,
    /// A finite device value whose f64 value or bound is NaN (a function at the edge of its
    /// domain, or at a pole within the carried error), reported by the verdict; every other
    /// element within its bound.
    Domain,
    /// Refused at build: the normalised reason (the op kind and why) and the message.
    Refused {
        /// Normalised reason.
        reason: String,
        /// Full message.
        message: String,
    },
    /// A compiler bug.
    Bug(Failure),
}

impl Outcome {
    /// The class name used in counts.
    pub fn class(&self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Overflow => "overflow-reported",
            Outcome::Domain => "domain-reported",
            Outcome::Refused { .. } => "refused",
            Outcome::Bug(f) => f.class,
        }
    }
}

/// Limits of one check.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Wall-clock limit of build + run (a hang past it is a bug).
    pub timeout: Duration,
    /// Simulated cycles before the device stops the run.
    pub max_cycles: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { timeout: Duration::from_secs(120), max_cycles: 20_000_000 }
    }
}

/// Take file paths, line numbers, tensor names and numbers out of a message, so that one
/// reason counts once: `model.toml:31: op 4 (matmul): `t3` …` → `op N (matmul): `_` …`.
pub fn normalise(msg: &str) -> String {
    let first = msg.lines().next().unwrap_or("");
    let body = match first.find(".toml:") {
        Some(i) => first[i + 6..].trim_start_matches(|c: char| c.is_ascii_digit()).trim_start_matches(": "),
        None => first,
    };
    let mut out = String::new();
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '[' {
            // A list of names or sizes.
            out.push_str("[_]");
            for d in chars.by_ref() {
                if d == ']' {
                    break;
                }
            }
        } else if c == '`' {
            out.push_str("`_`");
            for d in chars.by_ref() {
                if d == '`' {
                    break;
                }
            }
        } else if c.is_ascii_digit() && out.ends_with(|p: char| p.is_ascii_alphabetic()) {
            // Part of a name (`f16`, `f8e4m3`): kept.
            out.push(c);
            while let Some(d) = chars.next_if(|d| d.is_ascii_alphanumeric()) {
                out.push(d);
            }
        } else if c.is_ascii_digit() {
            out.push('N');
            while chars.peek().is_some_and(|d| d.is_ascii_digit() || *d == '.') {
                chars.next();
            }
        } else {
            out.push(c);
        }
    }
    out
}

thread_local! {
    /// Set while the oracle runs a case on this thread: its panics are results, not noise.
    static QUIET: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// A panic hook that records where a case's panic happened (for its key) and prints nothing for
/// those; every other panic goes to the default hook.
fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let quiet = QUIET.with(|q| {
                let mut q = q.borrow_mut();
                if q.is_some() {
                    *q = Some(
                        info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default(),
                    );
                    true
                } else {
                    false
                }
            });
            if !quiet {
                default(info);
            }
        }));
    });
}

/// Check a generated graph: its params written into a temporary directory, built and run there.
pub fn check(spec: &GraphSpec, limits: Limits) -> Outcome {
    let dir = tempfile::tempdir().expect("temp dir");
    if let Err(e) = spec.write_params(dir.path()) {
        return Outcome::Bug(Failure { class: "harness", key: e.to_string(), message: e.to_string() });
    }
    check_text(&dir.path().join("model.toml"), &spec.to_toml(""), spec.tiles, spec.seed, limits)
}

/// Check model text as if read from `file` (params are found relative to it) on `tiles` tiles
/// with inputs from `seed`, on a thread of its own under the wall-clock limit.
pub fn check_text(file: &Path, text: &str, tiles: usize, seed: u64, limits: Limits) -> Outcome {
    install_hook();
    let (tx, rx) = std::sync::mpsc::channel();
    let (file, text) = (file.to_path_buf(), text.to_string());
    let work =
        std::thread::Builder::new().name(format!("graph-{seed}")).stack_size(64 << 20).spawn(move || {
            QUIET.with(|q| *q.borrow_mut() = Some(String::new()));
            let r = std::panic::catch_unwind(|| check_inner(&file, &text, tiles, seed, limits));
            let at = QUIET.with(|q| q.borrow_mut().take()).unwrap_or_default();
            let out = r.unwrap_or_else(|p| {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                let key = format!("{at}: {}", normalise(&msg));
                Outcome::Bug(Failure { class: "panic", key, message: format!("panicked at {at}: {msg}") })
            });
            let _ = tx.send(out);
        });
    if let Err(e) = work {
        return Outcome::Bug(Failure { class: "harness", key: e.to_string(), message: e.to_string() });
    }
    match rx.recv_timeout(limits.timeout) {
        Ok(out) => out,
        // The thread is left running: a hang in the planner cannot be interrupted from outside.
        Err(_) => Outcome::Bug(Failure {
            class: "hang",
            key: "wall clock".into(),
            message: format!("build + run took longer than {:?}", limits.timeout),
        }),
    }
}

fn bug(class: &'static str, message: String) -> Outcome {
    Outcome::Bug(Failure { class, key: normalise(&message), message })
}

fn check_inner(file: &Path, text: &str, tiles: usize, seed: u64, limits: Limits) -> Outcome {
    let opts = BuildOptions { threads: 1, ..BuildOptions::new(tiles) };
    let built = match build(&file.to_string_lossy(), text, &opts) {
        Ok(b) => b,
        Err(BuildError::Model(e)) => return bug("model-error", e.to_string()),
        Err(BuildError::Options(e)) => return bug("build-options", e),
        Err(e) => {
            let message = e.to_string();
            return Outcome::Refused { reason: normalise(&message), message };
        }
    };
    let pkg = match ipu_host::package::Package::from_bytes(&built.bytes) {
        Ok(p) => p,
        // What `ipu-codegen run` does first (`session::read_package`): a refusal here is `run`
        // refusing the package `build` wrote.
        Err(e) => return bug("run-refused", format!("package: {e}")),
    };
    let mut dev = match SimDevice::new(SimConfig { tiles, threads: 1, max_cycles: limits.max_cycles }) {
        Ok(d) => d,
        Err(e) => return bug("harness", e.to_string()),
    };
    let mut opts = RunOptions {
        package_path: "model.ipuexe".into(),
        inputs: BTreeMap::new(),
        output_dir: None,
        save_inputs: None,
        seed,
        iterations: 1,
        profile: false,
    };
    let out = match session::run(&pkg, &mut dev, &opts) {
        Ok(o) => o,
        Err(RunError::Input(m)) => return bug("run-refused", m),
        Err(RunError::Device(e)) => return bug("device-error", e.to_string()),
        Err(RunError::Busy(m)) => return bug("harness", m),
    };
    let non_finite: u64 = out.non_finite_outputs.values().sum();
    let passed = out.numerical_pass && out.max_abs_error == 0.0;
    // A PASS is taken as it is unless it holds non-finite values or an f64 error over the
    // largest bound (possible only where an element's bound is NaN, which no comparison fails).
    if passed && non_finite == 0 && out.max_abs_error_f64 <= out.bound_f64 {
        return Outcome::Pass;
    }
    let first = out.first_mismatch.as_ref().map(|m| m.to_string()).unwrap_or_default();
    if !passed && (out.max_abs_error != 0.0 || out.first_mismatch.as_ref().is_some_and(|m| m.check != "f64"))
    {
        let m = format!("device-precision mismatch: {first} (max |error| {})", out.max_abs_error);
        return Outcome::Bug(Failure { class: "wrong-result", key: "device precision".into(), message: m });
    }
    // Non-finite outputs (a PASS with NaN/inf in it, or a bit-exact FAIL): run again (the same
    // inputs: the seed) saving inputs and outputs — written with fsync, so not for every graph —
    // apart from the model's directory, and look at every element.
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path();
    (opts.output_dir, opts.save_inputs) = (Some(dir.join("out")), Some(dir.join("in")));
    let mut dev = match SimDevice::new(SimConfig { tiles, threads: 1, max_cycles: limits.max_cycles }) {
        Ok(d) => d,
        Err(e) => return bug("harness", e.to_string()),
    };
    if let Err(e) = session::run(&pkg, &mut dev, &opts) {
        return bug("harness", format!("the same run again: {e}"));
    }
    let look = match look(&pkg, dir) {
        Ok(l) => l,
        Err(e) => return bug("harness", format!("re-evaluating the reference: {e}")),
    };
    match (passed, look) {
        // docs/reliability.md "The verdict": a device NaN or inf where f64 is finite is an
        // infinite error, never a pass.
        (true, Look { nan_vs_finite: Some(e), .. }) => Outcome::Bug(Failure {
            class: "nan-passed",
            key: "non-finite device value passed against a finite f64 value".into(),
            message: format!("verdict PASS, but {e}"),
        }),
        (true, Look { finite_over: Some(e), .. }) => Outcome::Bug(Failure {
            class: "nan-passed",
            key: "finite device value over its f64 bound passed".into(),
            message: format!("verdict PASS, but {e}"),
        }),
        (true, _) => Outcome::Pass,
        // An intermediate overflowed (non-finite in device precision, finite in f64) and a later
        // op made it finite again — `max`/`min` give their constant for a NaN (maxNum) — so the
        // output is finite and far from f64: the overflow, reported by the verdict's FAIL.
        (false, Look { finite_over: Some(_), upstream: Some(_), .. }) => Outcome::Overflow,
        (false, Look { finite_over: Some(e), .. }) => Outcome::Bug(Failure {
            class: "f64-bound",
            key: "f64".into(),
            message: format!("bit-exact, but a finite element exceeds its f64 bound: {e}; first: {first}"),
        }),
        (false, Look { domain: Some(_), .. }) => Outcome::Domain,
        (false, _) => Outcome::Overflow,
    }
}

/// What an element-by-element look at one saved run found.
struct Look {
    /// A finite device element over its f64 bound.
    finite_over: Option<String>,
    /// A non-finite device element whose f64 value is finite.
    nan_vs_finite: Option<String>,
    /// A finite device element whose f64 value is NaN.
    domain: Option<String>,
    /// The first tensor, in op order, holding a non-finite device-precision value whose f64
    /// value is finite (an overflow: an FP8 cast's NaN, an f16 infinity).
    upstream: Option<String>,
}

/// Re-evaluate the reference on the saved inputs and the package's params, and check the saved
/// outputs: the finite elements against their f64 bounds (the non-finite ones matched the
/// device-precision reference bit for bit already), the non-finite ones against f64 values.
fn look(pkg: &ipu_host::package::Package, dir: &Path) -> Result<Look, String> {
    let graph =
        ipu_host::model::parse("<package model>", &pkg.info.model_source).map_err(|e| e.to_string())?;
    let mut sources = session::param_values(pkg)?;
    for b in pkg.bindings.iter().filter(|b| b.direction == Direction::Input) {
        sources.insert(b.name.clone(), ipu_host::npy::read(&dir.join("in").join(format!("{}.npy", b.name)))?);
    }
    let ev = ipu_host::reference::evaluate(&graph, &sources, &pkg.plan.grids, &pkg.plan.alpha_on_a)?;
    let mut found = Look { finite_over: None, nan_vs_finite: None, domain: None, upstream: None };
    found.upstream = graph.ops.iter().map(|op| &graph.tensor(op.output).name).find_map(|name| {
        let (dev, exact) = (ev.device.get(name)?, ev.exact.get(name)?);
        let t = graph.tensor(graph.find(name)?);
        let dv = verdict::Values { dtype: t.dtype, scale: t.scale, data: &dev.data };
        (0..dev.data.len()).find(|&i| !verdict::real(&dv, i).is_finite() && exact[i].is_finite()).map(|i| {
            format!("`{name}`[{i}] overflowed: {} in device precision, {} in f64", dev.data[i], exact[i])
        })
    });
    for b in pkg.bindings.iter().filter(|b| b.direction == Direction::Output) {
        let got: HostTensor = ipu_host::npy::read(&dir.join("out").join(format!("{}.npy", b.name)))?;
        let (want, exact) = (&ev.device[&b.name], &ev.exact[&b.name]);
        let dv = verdict::Values { dtype: b.dtype, scale: b.scale, data: &got.data };
        let (keep, odd): (Vec<usize>, Vec<usize>) =
            (0..got.data.len()).partition(|&i| verdict::real(&dv, i).is_finite());
        // A finite device value where f64 has none, or no bound (a pole such as `reciprocal` of a
        // value within its error of 0): the f64 path left the function's domain.
        let bounds = &ev.bound[&b.name];
        let (keep, outside): (Vec<usize>, Vec<usize>) =
            keep.into_iter().partition(|&i| !exact[i].is_nan() && !bounds[i].is_nan());
        if let Some(&i) = outside.first() {
            let at = verdict::multi_index(&b.shape, i as u64);
            let e = format!(
                "`{}`{at:?} is {} on the device, {} in f64 with bound {}",
                b.name,
                verdict::real(&dv, i),
                exact[i],
                bounds[i]
            );
            found.domain.get_or_insert(e);
        }
        if let Some(&i) = odd.iter().find(|&&i| exact[i].is_finite()) {
            let at = verdict::multi_index(&b.shape, i as u64);
            let e =
                format!("`{}`{at:?} is {} on the device, {} in f64", b.name, verdict::real(&dv, i), exact[i]);
            found.nan_vs_finite.get_or_insert(e);
        }
        if keep.is_empty() {
            continue;
        }
        let pickf = |v: &[f32]| keep.iter().map(|&i| v[i]).collect::<Vec<f32>>();
        let pickd = |v: &[f64]| keep.iter().map(|&i| v[i]).collect::<Vec<f64>>();
        let (d, r) = (pickf(&got.data), pickf(&want.data));
        let c = verdict::check(
            &b.name,
            verdict::Values { dtype: b.dtype, scale: b.scale, data: &d },
            verdict::Values { dtype: b.dtype, scale: b.scale, data: &r },
            &pickd(exact),
            &pickd(&ev.bound[&b.name]),
        )?;
        if !c.passed() {
            let e = format!("output `{}`: {} finite elements over their bound", b.name, c.over_bound);
            found.finite_over.get_or_insert(e);
        }
    }
    Ok(found)
}
