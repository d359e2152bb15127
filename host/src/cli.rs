//! Command-line interface. Logs go to stderr (tracing, `RUST_LOG`), data and result lines to
//! stdout. Exit codes: 0 ok, 1 numerical or device failure, 2 bad usage or input, 3 device busy.

use clap::{Parser, Subcommand};
use ipu_host::build::BuildOptions;
use ipu_host::devices::open_device;
use ipu_host::program::{disassemble, TileProgram};
use ipu_host::session::{self, RunError, RunOptions};
use ipu_host::sim::{SimConfig, SimDevice};
use ipu_host::Device;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::term;

#[derive(Parser)]
#[command(
    name = "ipu-codegen",
    version,
    about = "Compile, run and inspect programs for the Graphcore IPU Mk2"
)]
struct Cli {
    /// More log output on stderr: -v info, -vv debug (RUST_LOG overrides).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct RunArgs {
    /// Device: auto (hardware if present, else the simulator), sim, or /dev/ipuN.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Input tensor from a .npy file (repeatable); missing inputs are generated from --seed.
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// Write outputs as NAME.npy into this directory.
    #[arg(long)]
    output_dir: Option<PathBuf>,
    /// Seed for generated inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Resident inferences (the package is loaded once); each gets its own generated inputs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    iterations: u32,
    /// Write the inputs of the first inference (given or generated) as NAME.npy into this directory.
    #[arg(long, value_name = "DIR")]
    save_inputs: Option<PathBuf>,
    /// Print one JSON object on stdout (the result lines go to stderr).
    #[arg(long)]
    json: bool,
    /// Fail at once (exit 3) instead of waiting when the device is in use.
    #[arg(long)]
    no_wait: bool,
    /// Simulator cycle budget per run call.
    #[arg(long, default_value_t = 2_000_000_000)]
    max_cycles: u64,
    /// Host threads for the simulator and reference (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Write the profile of the last inference (Cap'n Proto, schema/profile.capnp); the package
    /// must be built with `--profile`.
    #[arg(long, value_name = "FILE.capnp")]
    profile: Option<PathBuf>,
    /// Write the profile as Chrome/Perfetto trace-event JSON (opens in ui.perfetto.dev).
    #[arg(long, value_name = "FILE.json")]
    trace: Option<PathBuf>,
    /// Largest number of slices in the trace (whole tiles are left out past it, with a note).
    #[arg(long, default_value_t = ipu_host::profile::trace::DEFAULT_MAX_EVENTS)]
    trace_max_events: usize,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compile a model file into an application package.
    #[command(after_help = BUILD_HELP)]
    Build {
        /// Model file: TOML (docs/model-format.md) or ONNX (docs/onnx.md), told apart by content.
        model: PathBuf,
        /// ONNX models: matmul weights as f16 or fp8 (E4M3 with a power-of-two scale each).
        #[arg(long, value_parser = ["f16", "fp8"])]
        weights: Option<String>,
        /// ONNX models: fix an input's symbolic dimensions, e.g. pixel_values=1,3,224,224 (repeatable).
        #[arg(long = "input-shape", value_name = "NAME=D0,D1,...")]
        input_shapes: Vec<String>,
        /// ONNX models with --weights fp8: an input for the calibration run that picks the
        /// activations' FP8 scales, NAME=FILE.npy (repeatable; default: generated as `run` does).
        #[arg(long = "calibrate", value_name = "NAME=FILE.npy")]
        calibrate: Vec<String>,
        /// ONNX models: also write the imported model (TOML) here, with its params in
        /// params.safetensors beside it: a model file `build` takes as it is.
        #[arg(long, value_name = "FILE.toml")]
        emit_model: Option<PathBuf>,
        /// Package to write.
        #[arg(short, long)]
        output: PathBuf,
        /// Target tiles (default: the whole chip).
        #[arg(long, default_value_t = 1472)]
        tiles: usize,
        /// Host threads (0 = all cores); the package is identical for any value.
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Print one JSON object on stdout.
        #[arg(long)]
        json: bool,
        /// Print per-phase build times.
        #[arg(long)]
        timings: bool,
        /// Print each exchange superstep's bytes, predicted cycles and floor (the most words one
        /// tile sends or receives: no schedule is faster), on stderr.
        #[arg(long)]
        supersteps: bool,
        /// Candidate mappings the search evaluates beyond the baseline.
        #[arg(long, default_value_t = ipu_host::build::DEFAULT_SEARCH_ATTEMPTS)]
        search_attempts: u32,
        /// Save the search state here after each improvement, and resume from it if present.
        #[arg(long)]
        search_state: Option<PathBuf>,
        /// Carry a profile plan: the runtime stores cycle stamps (2 cycles per sample point) that
        /// `run --profile` / `--trace` read back.
        #[arg(long)]
        profile: bool,
        /// Force where casts of matmul side operands run instead of searching: replicated,
        /// before_exchange or after_exchange (docs/search.md).
        #[arg(long, value_parser = parse_side_cast)]
        side_cast: Option<ipu_core::plan::chain::SideCast>,
        /// Force the column groups of a row chain's final matmul instead of searching (docs/search.md).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        column_groups: Option<u32>,
        /// Write the supervisor assembly of each distinct tile program to DIR/tile{N}.s, N the
        /// first tile that runs it (what `ipu-codegen asm` assembles).
        #[arg(long, value_name = "DIR")]
        emit_asm: Option<PathBuf>,
    },
    /// Show where the cycles of a profile go, as tables.
    #[command(
        after_help = "EXAMPLES:\n  ipu-codegen profile qk.capnp\n  ipu-codegen profile qk.capnp --group-by kernel --top 5\n  ipu-codegen profile qk.capnp --group-by tile --json"
    )]
    Profile {
        /// Profile file written by `run --profile`.
        file: PathBuf,
        /// Grouping.
        #[arg(long, value_enum, default_value = "phase")]
        group_by: ipu_host::profile::table::GroupBy,
        /// Rows shown when grouping by tile or kernel, busiest first (default 20 tiles, all kernels).
        #[arg(long)]
        top: Option<usize>,
        /// Print one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Write a self-contained HTML report of a profile and its package.
    #[command(after_help = "EXAMPLES:\n  ipu-codegen report qk.capnp --package qk.ipuexe -o qk.html")]
    Report {
        /// Profile file written by `run --profile`.
        file: PathBuf,
        /// The package that was profiled.
        #[arg(long)]
        package: PathBuf,
        /// HTML file to write.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Run a package on a device and check it against the host reference.
    #[command(after_help = RUN_HELP)]
    Run {
        /// Package.
        package: PathBuf,
        #[command(flatten)]
        args: RunArgs,
    },
    /// Show what a package holds.
    #[command(
        after_help = "EXAMPLES:\n  ipu-codegen inspect mm.ipuexe\n  ipu-codegen inspect mm.ipuexe --json"
    )]
    Inspect {
        /// Package.
        package: PathBuf,
        /// Print one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Build the bundled example (examples/attention.toml, 64 tiles) and run it on the default device.
    #[command(
        after_help = "EXAMPLES:\n  ipu-codegen demo\n  ipu-codegen demo --profile attention.capnp --trace attention.json"
    )]
    Demo {
        /// Where to write the package.
        #[arg(long, default_value = "target/demo")]
        dir: PathBuf,
        #[command(flatten)]
        args: RunArgs,
    },
    /// Assemble a tile program to a flat binary image.
    #[command(after_help = "EXAMPLES:\n  ipu-codegen asm tests/programs/int_loop.s -o loop.bin")]
    Asm {
        /// Assembly source.
        file: PathBuf,
        /// Output image (raw little-endian words from the lowest address).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Disassemble a flat binary image (runs of zero words are shown as one line).
    #[command(
        after_help = "EXAMPLES:\n  ipu-codegen disasm loop.bin\n  ipu-codegen disasm loop.bin --base 0x4c000"
    )]
    Disasm {
        /// Image.
        file: PathBuf,
        /// Tile address of the first byte.
        #[arg(long, default_value = "0x4c000", value_parser = parse_u32)]
        base: u32,
    },
    /// Run an assembly program on simulated tiles until they halt or reach the host sync.
    #[command(after_help = "EXAMPLES:\n  ipu-codegen sim tests/programs/int_loop.s --tiles 1472")]
    Sim {
        /// Assembly source (loaded onto every tile).
        file: PathBuf,
        /// Tiles.
        #[arg(long, default_value_t = 1)]
        tiles: usize,
        /// Host threads (0 = all cores).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Cycle budget.
        #[arg(long, default_value_t = 2_000_000_000)]
        max_cycles: u64,
    },
}

const BUILD_HELP: &str = "SUPPORTED OPS (docs/model-format.md):
  matmul     a, b, transpose_a, transpose_b, leading batch dims, alpha, accumulate = f16|f32, dtype
             (f16 output of f32 accumulation: rank-2 matmuls)
  cast       input, dtype (f16 <-> f8e4m3 / f8e5m2, f32 <-> f16), power-of-two scale
  softmax    input (last axis, f32 statistics)
  add, sub, mul  a, b (NumPy broadcasting, f16): after a matmul its bias or residual (fused),
             else rows of their own (a column or scalar operand is splat across each row)
  gelu       input, approximate = \"tanh\" | \"none\" (erf form) | \"sigmoid\" (quick GeLU x·σ(1.702x);
             f16, f32 arithmetic): fused after a matmul (and its bias), else rows of its own
  layernorm  input, gamma?, beta?, eps? (last axis, f16, f32 statistics)
  reduce_sum, reduce_mean  input (last axis kept with size 1, f16, the sum in f32)
  reshape    input, shape (no data movement)
  transpose  input, perm (keeping the last axis: no data movement; swapping the last two: a kernel)
A graph no single mapping takes whole is planned as stages joined by on-chip redistributions,
the grid of each matmul stage searched with the whole-graph cost (docs/graph-planner.md,
docs/search.md); see examples/encoder_block/.

PARAMS (resident weights): [params.NAME] dtype, shape, file = \"w.npy\" or safetensors + key, FP8 scale

ONNX (docs/onnx.md): a .onnx file (told by content; external data beside it) is imported into the
model format above: shape arithmetic folded, torch's compound ops recognised (tanh/erf/quick GeLU, written-
out LayerNorm, patch-embedding Conv, scales into alpha, packed in-projections split), initializers
become params, outputs keep their ONNX names. --weights fp8 stores matmul weights as E4M3 with
activation scales from a calibration run (--calibrate NAME=FILE.npy); --emit-model shows the result.

EXAMPLES:
  ipu-codegen build examples/matmul.toml -o mm.ipuexe
  ipu-codegen build examples/attention.toml -o att.ipuexe --tiles 64 --json
  ipu-codegen build examples/qk.toml -o qk.ipuexe --tiles 64 --profile --timings
  ipu-codegen build tests/data/onnx/siglip_tiny/dynamo.onnx -o sig.ipuexe --tiles 64 --weights fp8";

const RUN_HELP: &str = "EXAMPLES:
  ipu-codegen run mm.ipuexe
  ipu-codegen run mm.ipuexe --input A=a.npy --input B=b.npy --output-dir out
  ipu-codegen run mm.ipuexe --iterations 3 --seed 7 --save-inputs in --json
  ipu-codegen run qk.ipuexe --profile qk.capnp --trace qk.json

Result lines (stdout): referenceInference=N numericalTest=PASS|FAIL per inference, then the
maximum error against the device-precision reference, the f64 error beside its derived bound and
the count of non-finite outputs, the first mismatching element on failure, and
package=... tiles=... device=... hardwareTest=PASS|FAIL.
Exit codes: 0 pass, 1 numerical or device failure, 2 bad usage or input, 3 device busy.";

fn parse_side_cast(s: &str) -> Result<ipu_core::plan::chain::SideCast, String> {
    use ipu_core::plan::chain::SideCast;
    SideCast::from_name(s)
        .ok_or_else(|| format!("expected one of {}", SideCast::ALL.map(|c| c.name()).join(", ")))
}

fn parse_u32(s: &str) -> Result<u32, String> {
    ipu_core::isa::parse_int(s)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| format!("not an address: {s}"))
}

/// A failure with its exit code.
struct Failure(u8, String);

fn bad(msg: impl Into<String>) -> Failure {
    Failure(2, msg.into())
}

fn read_text(path: &Path) -> Result<String, Failure> {
    std::fs::read_to_string(path).map_err(|e| bad(format!("{}: {e}", path.display())))
}

/// The demo: the seed's attention smoke test, planned for 64 tiles as in the seed log.
const EXAMPLE: (&str, &str) = ("examples/attention.toml", include_str!("../../examples/attention.toml"));
const EXAMPLE_TILES: usize = 64;

fn do_build(
    name: &str,
    src: &str,
    given: Option<BTreeMap<String, ipu_host::reference::HostTensor>>,
    output: &Path,
    opts: &BuildOptions,
) -> Result<ipu_host::build::Built, Failure> {
    let built = ipu_host::build::build_model(name, src, given, opts).map_err(|e| bad(e.to_string()))?;
    ipu_host::atomic::write_atomic(output, &built.bytes)
        .map_err(|e| bad(format!("{}: {e}", output.display())))?;
    tracing::info!(path = %output.display(), bytes = built.bytes.len(), "application package written");
    Ok(built)
}

/// A JSON number, or a string for values JSON cannot hold (`"inf"`, `"nan"`).
fn num(x: f64) -> serde_json::Value {
    if x.is_finite() {
        serde_json::json!(x)
    } else {
        serde_json::json!(x.to_string())
    }
}

fn parse_inputs(specs: &[String]) -> Result<BTreeMap<String, PathBuf>, Failure> {
    parse_files("--input", specs)
}

/// `NAME=FILE.npy` values of `flag`, each name once.
fn parse_files(flag: &str, specs: &[String]) -> Result<BTreeMap<String, PathBuf>, Failure> {
    let mut inputs = BTreeMap::new();
    for spec in specs {
        let (name, file) =
            spec.split_once('=').ok_or_else(|| bad(format!("{flag} {spec}: expected NAME=FILE.npy")))?;
        if let Some(prev) = inputs.insert(name.to_string(), PathBuf::from(file)) {
            return Err(bad(format!(
                "{flag} {name} is given twice ({} and {file}): give each once",
                prev.display()
            )));
        }
    }
    Ok(inputs)
}

fn run_json(
    path: &Path,
    pkg: &ipu_host::package::Package,
    out: &session::RunOutcome,
    a: &RunArgs,
) -> serde_json::Value {
    serde_json::json!({
        "package": path.display().to_string(),
        "device": out.device,
        "cycles": out.cycles,
        "predicted_cycles": pkg.plan.predicted_cycles,
        "max_abs_error": num(out.max_abs_error),
        "max_abs_error_vs_f64": num(out.max_abs_error_f64),
        "f64_error_bound": num(out.bound_f64),
        "f64_error_to_bound": num(out.worst_ratio_f64),
        "compared_elements": out.compared_elements,
        "non_finite_outputs": out.non_finite_outputs,
        "first_mismatch": out.first_mismatch.as_ref().map(|m| serde_json::json!({
            "iteration": m.iteration, "tensor": m.tensor, "index": m.index, "check": m.check,
            "device": num(m.device), "reference": num(m.reference), "bound": num(m.bound)})),
        "numerical_test": if out.numerical_pass { "PASS" } else { "FAIL" },
        "hardware_test": if out.hardware_pass(a.iterations) { "PASS" } else { "FAIL" },
        "iterations": a.iterations,
        "device_seconds": out.device_seconds,
        "device_instructions": out.device_instructions,
        "device_instructions_per_second": out.device_instructions as f64 / out.device_seconds.max(1e-9),
        "reference_seconds": out.reference_seconds,
        "outputs": out.outputs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
    })
}

fn run_package(path: &Path, a: &RunArgs) -> Result<(), Failure> {
    let pkg = session::read_package(path).map_err(|e| bad(e.to_string()))?;
    let inputs = parse_inputs(&a.inputs)?;
    let (mut dev, name) = open_device(&a.device, pkg.tile_count as usize, a.threads, a.max_cycles)
        .map_err(|e| Failure(2, e.to_string()))?;
    let _lock = session::lock_device(&name, !a.no_wait).map_err(|e| match e {
        RunError::Busy(m) => Failure(3, m),
        other => bad(other.to_string()),
    })?;
    let opts = RunOptions {
        package_path: path.display().to_string(),
        inputs,
        output_dir: a.output_dir.clone(),
        save_inputs: a.save_inputs.clone(),
        seed: a.seed,
        iterations: a.iterations,
        profile: a.profile.is_some() || a.trace.is_some(),
    };
    // Result lines are data on stdout, or beside the one JSON object on stderr.
    let say = |l: &str| if a.json { term::err_line(l) } else { term::line(l) };
    let out = match session::run(&pkg, dev.as_mut(), &opts) {
        Ok(out) => out,
        Err(RunError::Device(d)) => {
            let msg = format!("device {name}: {d}");
            say(&format!(
                "package={} tiles={} device={name} hardwareTest=FAIL",
                path.display(),
                pkg.tile_count
            ));
            if a.json {
                term::line(
                    &serde_json::json!({"package": path.display().to_string(), "device": name,
                    "hardware_test": "FAIL", "numerical_test": "FAIL", "error": msg})
                    .to_string(),
                );
            }
            return Err(Failure(1, msg));
        }
        Err(RunError::Input(m)) => return Err(bad(m)),
        Err(RunError::Busy(m)) => return Err(Failure(3, m)),
    };
    let mut profile_lines = Vec::new();
    if let Some(cap) = &out.captured {
        profile_lines = write_profile(path, &pkg, &out.device, cap, a)?;
    }
    for l in out.lines.iter().chain(&profile_lines) {
        say(l);
    }
    if a.json {
        term::line(&run_json(path, &pkg, &out, a).to_string());
    }
    if out.numerical_pass {
        Ok(())
    } else {
        let what = match &out.first_mismatch {
            Some(m) => format!("numerical test failed: first mismatch {m}"),
            None => "numerical test failed".into(),
        };
        Err(Failure(1, what))
    }
}

fn sha256_of(path: &Path) -> Result<String, Failure> {
    use sha2::Digest;
    let bytes = std::fs::read(path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    Ok(ipu_host::build::hex(&sha2::Sha256::digest(&bytes)))
}

/// Write `--profile` and `--trace` from the captured stamps.
fn write_profile(
    path: &Path,
    pkg: &ipu_host::package::Package,
    device: &str,
    cap: &ipu_host::profile::Captured,
    a: &RunArgs,
) -> Result<Vec<String>, Failure> {
    use ipu_host::profile::{trace, Profile};
    let mut lines = Vec::new();
    let sha = sha256_of(path)?;
    let p = Profile::from_run(pkg, &path.display().to_string(), &sha, device, cap)
        .map_err(|e| Failure(1, e.to_string()))?;
    let write = |file: &Path, bytes: &[u8]| {
        ipu_host::atomic::write_atomic(file, bytes).map_err(|e| bad(format!("{}: {e}", file.display())))
    };
    if let Some(file) = &a.profile {
        write(file, &p.to_capnp())?;
        lines.push(format!(
            "profile={} tiles={} samples={}",
            file.display(),
            p.tiles.len(),
            p.sample_count()
        ));
    }
    if let Some(file) = &a.trace {
        let t = trace::trace(&p, a.trace_max_events);
        let events = t["traceEvents"].as_array().map(Vec::len).unwrap_or(0);
        write(file, t.to_string().as_bytes())?;
        lines.push(format!("trace={} events={events}", file.display()));
    }
    Ok(lines)
}

fn read_profile(file: &Path) -> Result<ipu_host::profile::Profile, Failure> {
    let bytes = std::fs::read(file).map_err(|e| bad(format!("{}: {e}", file.display())))?;
    if matches!(bytes.iter().find(|b| !b.is_ascii_whitespace()), Some(b'{' | b'[')) {
        return Err(bad(format!(
            "{}: not a profile file (it looks like JSON, e.g. a --trace file); profiles are the \
             Cap'n Proto files written by `run --profile`",
            file.display()
        )));
    }
    ipu_host::profile::Profile::from_capnp(&bytes).map_err(|e| bad(format!("{}: {e}", file.display())))
}

fn build_json(path: &Path, b: &ipu_host::build::Built, tiles: usize) -> serde_json::Value {
    serde_json::json!({
        "package": path.display().to_string(),
        "sha256": b.sha256,
        "bytes": b.bytes.len(),
        "tiles_used": b.package.info.tiles_used,
        "target_tiles": tiles,
        "predicted_cycles": b.package.plan.predicted_cycles,
        "predicted_exchange_cycles": b.package.plan.predicted_exchange_cycles,
        "baseline_cycles": b.package.plan.baseline_cycles,
        "search_attempts": b.package.plan.search_attempts,
        "param_bytes": param_bytes(&b.package),
        "exchanges": b.exchanges.iter().map(|x| serde_json::json!({
            "phase": x.phase,
            "bytes": x.bytes,
            "predicted_cycles": x.cycles,
            "floor_words": x.floor_words,
        })).collect::<Vec<_>>(),
    })
}

/// `--supersteps`: one line per exchange superstep, and the totals.
fn superstep_lines(b: &ipu_host::build::Built) {
    let (mut cycles, mut floor) = (0u64, 0u64);
    for (k, x) in b.exchanges.iter().enumerate() {
        cycles += x.cycles;
        floor += x.floor_words;
        let ratio = if x.floor_words > 0 {
            format!("{:.2}x", x.cycles as f64 / x.floor_words as f64)
        } else {
            "-".into()
        };
        term::err_line(&format!(
            "superstep {k:>3} bytes={:<10} predicted_cycles={:<8} floor={:<8} {ratio:>7}  {}",
            x.bytes, x.cycles, x.floor_words, x.phase
        ));
    }
    term::err_line(&format!(
        "supersteps={} superstep_cycles={cycles} floor={floor} (release to last landing, without the syncs; the floors summed)",
        b.exchanges.len()
    ));
}

/// Bytes of params by dtype name (resident weights).
fn param_bytes(p: &ipu_host::package::Package) -> BTreeMap<&'static str, u64> {
    let mut by = BTreeMap::new();
    for b in p.bindings.iter().filter(|b| b.direction == ipu_schema::Direction::Param) {
        *by.entry(b.dtype.name()).or_insert(0) += b.shape.iter().product::<u64>() * b.dtype.size() as u64;
    }
    by
}

/// `--input-shape NAME=D0,D1,…` values.
fn parse_input_shapes(specs: &[String]) -> Result<BTreeMap<String, Vec<u64>>, Failure> {
    let mut out = BTreeMap::new();
    for spec in specs {
        let parsed = spec.split_once('=').and_then(|(name, dims)| {
            let dims: Option<Vec<u64>> =
                dims.split(',').map(|d| d.trim().parse::<u64>().ok().filter(|d| *d > 0)).collect();
            Some((name.to_string(), dims?))
        });
        let (name, dims) = parsed.ok_or_else(|| {
            bad(format!("--input-shape {spec}: expected NAME=D0,D1,... with positive sizes"))
        })?;
        if out.insert(name.clone(), dims).is_some() {
            return Err(bad(format!("--input-shape {name} is given twice")));
        }
    }
    Ok(out)
}

fn run(cli: Cli) -> Result<(), Failure> {
    match cli.cmd {
        Cmd::Build {
            model,
            weights,
            input_shapes,
            emit_model,
            calibrate,
            output,
            tiles,
            threads,
            json,
            timings,
            supersteps,
            search_attempts,
            search_state,
            profile,
            side_cast,
            column_groups,
            emit_asm,
        } => {
            let bytes = std::fs::read(&model).map_err(|e| bad(format!("{}: {e}", model.display())))?;
            // Content decides; a file named .onnx that is not one gets the ONNX reader's message.
            let onnx =
                ipu_host::onnx::looks_like_onnx(&bytes) || model.extension().is_some_and(|e| e == "onnx");
            if !calibrate.is_empty() && weights.as_deref() != Some("fp8") {
                return Err(bad("--calibrate chooses FP8 activation scales: it applies with --weights fp8"));
            }
            if !onnx && (weights.is_some() || !input_shapes.is_empty() || emit_model.is_some()) {
                return Err(bad(format!(
                    "{}: --weights, --input-shape and --emit-model apply to ONNX models; this is a model file in TOML",
                    model.display()
                )));
            }
            let mut param_hint: Option<u64> = None;
            let (src, given) = if onnx {
                let mut io = ipu_host::onnx::ImportOptions::new();
                io.input_shapes = parse_input_shapes(&input_shapes)?;
                if weights.as_deref() == Some("fp8") {
                    io.weights = ipu_host::onnx::Weights::Fp8;
                    let files = parse_files("--calibrate", &calibrate)?;
                    let max = ipu_host::onnx::calibrate::AUTO_CALIBRATION_MACS;
                    let start = std::time::Instant::now();
                    match ipu_host::onnx::calibrate::ranges(&model, &io, &files, max).map_err(bad)? {
                        Some(r) => {
                            let ms = start.elapsed().as_millis() as u64;
                            tracing::info!(matmuls = r.len(), elapsed_ms = ms, "calibrated FP8 activation scales");
                            io.activation_ranges = r;
                        }
                        None => tracing::warn!(
                            "no calibration run (more than {max} multiply-accumulates for the host reference): \
                             FP8 activations assume |x| < {}; give --calibrate NAME=FILE.npy to measure them",
                            ipu_host::onnx::DEFAULT_ACTIVATION_RANGE
                        ),
                    }
                }
                let start = std::time::Instant::now();
                let imp = ipu_host::onnx::import(&model, &io).map_err(bad)?;
                tracing::info!(
                    nodes = imp.nodes.0,
                    used = imp.nodes.1,
                    params = imp.params.len(),
                    elapsed_ms = start.elapsed().as_millis() as u64,
                    "imported ONNX model"
                );
                for (name, scale) in &imp.scales {
                    tracing::info!(tensor = %name, scale = *scale, "fp8 scale (power of two)");
                }
                if let Some(path) = &emit_model {
                    let st = ipu_host::onnx::emit::safetensors_bytes(&imp.params).map_err(bad)?;
                    let st_path = path.with_file_name("params.safetensors");
                    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                        std::fs::create_dir_all(dir).map_err(|e| bad(format!("{}: {e}", dir.display())))?;
                    }
                    std::fs::write(path, &imp.toml).map_err(|e| bad(format!("{}: {e}", path.display())))?;
                    std::fs::write(&st_path, st).map_err(|e| bad(format!("{}: {e}", st_path.display())))?;
                }
                let f16_bytes: u64 = imp.params.values().map(|t| t.data.len() as u64 * 2).sum();
                param_hint = (io.weights == ipu_host::onnx::Weights::F16).then_some(f16_bytes);
                (imp.toml, Some(imp.params))
            } else {
                (
                    String::from_utf8(bytes).map_err(|_| {
                        bad(format!(
                            "{}: neither a model file in TOML (not UTF-8 text) nor an ONNX model",
                            model.display()
                        ))
                    })?,
                    None,
                )
            };
            let opts = BuildOptions {
                tiles,
                threads,
                grid: None,
                search_attempts,
                search_state,
                profile,
                side_cast,
                column_groups,
                launch_loops: true,
                emit_asm,
            };
            // Planner messages point at a line of the model text: for an import, the text
            // `--emit-model` writes.
            let label = if onnx {
                format!("{} [imported model, lines as --emit-model writes it]", model.display())
            } else {
                model.display().to_string()
            };
            let b = do_build(&label, &src, given, &output, &opts).map_err(|f| {
                // An imported model refused for memory: say how much of the chip its f16 weights take.
                let chip = (tiles * ipu_core::target::TILE_MEM_SIZE) as u64;
                match param_hint {
                    Some(bytes) if f.1.contains("tile memory") && bytes * 4 > chip => Failure(
                        f.0,
                        format!(
                            "{}\nnote: the weights alone take {bytes} bytes in f16, {}% of the {chip} bytes of \
                             tile memory of {tiles} tiles: try --weights fp8 (half the bytes)",
                            f.1,
                            bytes * 100 / chip
                        ),
                    ),
                    _ => f,
                }
            })?;
            if supersteps {
                superstep_lines(&b);
            }
            if timings {
                for (phase, ms) in &b.timings {
                    term::err_line(&format!("phase {phase:<20} {ms:>6} ms"));
                }
            }
            if json {
                term::line(&build_json(&output, &b, tiles).to_string());
            } else {
                term::line(&format!(
                    "package={} sha256={} tiles_used={} predicted_cycles={}",
                    output.display(),
                    b.sha256,
                    b.package.info.tiles_used,
                    b.package.plan.predicted_cycles
                ));
            }
        }
        Cmd::Run { package, args } => run_package(&package, &args)?,
        Cmd::Profile { file, group_by, top, json } => {
            use ipu_host::profile::table;
            if top.is_some() && group_by == table::GroupBy::Phase {
                return Err(bad(
                    "--top applies to --group-by tile or kernel; a phase table lists every phase",
                ));
            }
            let p = read_profile(&file)?;
            let t = table::table(&p, group_by, top);
            if json {
                term::line(&table::render_json(&p, &t).to_string());
            } else {
                term::text(&table::render_text(&p, &t));
            }
        }
        Cmd::Report { file, package, output } => {
            let p = read_profile(&file)?;
            let pkg = session::read_package(&package).map_err(|e| bad(e.to_string()))?;
            let sha = sha256_of(&package)?;
            if sha != p.package_sha256 {
                return Err(bad(format!(
                    "{}: profile was taken of a package with sha256 {}, but {} has {sha}",
                    file.display(),
                    p.package_sha256,
                    package.display()
                )));
            }
            if pkg.tile_count as usize != p.tiles.len() {
                return Err(bad(format!(
                    "{}: {} tiles, the package has {}",
                    file.display(),
                    p.tiles.len(),
                    pkg.tile_count
                )));
            }
            let html = ipu_host::profile::report::render(&p, &pkg, &package.display().to_string());
            ipu_host::atomic::write_atomic(&output, html.as_bytes())
                .map_err(|e| bad(format!("{}: {e}", output.display())))?;
            term::line(&format!("report={} bytes={}", output.display(), html.len()));
        }
        Cmd::Inspect { package, json } => {
            let pkg = session::read_package(&package).map_err(|e| bad(e.to_string()))?;
            let bytes = std::fs::read(&package).map_err(|e| bad(e.to_string()))?;
            term::text(&ipu_host::inspect::render(&pkg, &bytes, json));
        }
        Cmd::Demo { dir, args } => {
            std::fs::create_dir_all(&dir).map_err(|e| bad(format!("{}: {e}", dir.display())))?;
            let path = dir.join("attention.ipuexe");
            // A profile needs the package's profile plan: build with one when one is asked for.
            let profile = args.profile.is_some() || args.trace.is_some();
            let opts = BuildOptions { threads: args.threads, profile, ..BuildOptions::new(EXAMPLE_TILES) };
            do_build(EXAMPLE.0, EXAMPLE.1, None, &path, &opts)?;
            run_package(&path, &args)?;
        }
        Cmd::Asm { file, output } => {
            let src = read_text(&file)?;
            let prog = TileProgram::from_asm(&src).map_err(|e| bad(format!("{}: {e}", file.display())))?;
            let (base, img) = prog.flat_image();
            ipu_host::atomic::write_atomic(&output, &img)
                .map_err(|e| bad(format!("{}: {e}", output.display())))?;
            term::line(&format!(
                "{}: {} bytes at {base:#x}, entry {:#x}",
                output.display(),
                img.len(),
                prog.entry
            ));
        }
        Cmd::Disasm { file, base } => {
            let bytes = std::fs::read(&file).map_err(|e| bad(format!("{}: {e}", file.display())))?;
            term::text(&disassemble(base, &bytes));
        }
        Cmd::Sim { file, tiles, threads, max_cycles } => {
            let src = read_text(&file)?;
            let prog = TileProgram::from_asm(&src).map_err(|e| bad(format!("{}: {e}", file.display())))?;
            let mut dev =
                SimDevice::new(SimConfig { tiles, threads, max_cycles }).map_err(|e| bad(e.to_string()))?;
            for t in 0..tiles {
                dev.load_tile(t as u16, &prog.segment_refs(), prog.entry).map_err(|e| bad(e.to_string()))?;
            }
            let start = std::time::Instant::now();
            let r = dev.run_to_host_sync().map_err(|e| Failure(1, e.to_string()))?;
            let secs = start.elapsed().as_secs_f64();
            term::line(&format!(
                "state={:?} cycles={} issued={} syncs={} host_seconds={secs:.3} instr_per_second={:.0}",
                r.state,
                r.cycles,
                r.issued,
                r.syncs,
                r.issued as f64 / secs
            ));
        }
    }
    Ok(())
}

/// Entry point.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    term::init_logging(cli.verbose);
    let r = run(cli);
    term::finish();
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(code, msg)) => {
            term::err_line(&format!("error: {msg}"));
            ExitCode::from(code)
        }
    }
}
