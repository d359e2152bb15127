//! Command-line interface. Logs go to stderr (tracing, `RUST_LOG`), data and result lines to
//! stdout. Exit codes: 0 ok, 1 numerical or device failure, 2 bad usage or input, 3 device busy.

use clap::{Parser, Subcommand};
use ipu_host::build::{build, BuildOptions};
use ipu_host::devices::open_device;
use ipu_host::program::{disassemble, TileProgram};
use ipu_host::session::{self, RunError, RunOptions};
use ipu_host::sim::{SimConfig, SimDevice};
use ipu_host::Device;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "ipu-codegen",
    version,
    about = "Compile, run and inspect programs for the Graphcore IPU Mk2"
)]
struct Cli {
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
    /// Resident inferences (the package is loaded once).
    #[arg(long, default_value_t = 1)]
    iterations: u32,
    /// Print one JSON object on stdout.
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
    Build {
        /// Model file (TOML, docs/model-format.md).
        model: PathBuf,
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
        #[arg(long)]
        column_groups: Option<u32>,
    },
    /// Show where the cycles of a profile go, as tables.
    Profile {
        /// Profile file written by `run --profile`.
        file: PathBuf,
        /// Grouping.
        #[arg(long, value_enum, default_value = "phase")]
        group_by: ipu_host::profile::table::GroupBy,
        /// Rows shown when grouping by tile (busiest first).
        #[arg(long, default_value_t = 20)]
        top: usize,
        /// Print one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Write a self-contained HTML report of a profile and its package.
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
    Run {
        /// Package.
        package: PathBuf,
        #[command(flatten)]
        args: RunArgs,
    },
    /// Show what a package holds.
    Inspect {
        /// Package.
        package: PathBuf,
        /// Print one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Build the bundled example (examples/attention.toml, 64 tiles) and run it on the default device.
    Demo {
        /// Where to write the package.
        #[arg(long, default_value = "target/demo")]
        dir: PathBuf,
        #[command(flatten)]
        args: RunArgs,
    },
    /// Assemble a tile program to a flat binary image.
    Asm {
        /// Assembly source.
        file: PathBuf,
        /// Output image (raw little-endian words from the lowest address).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Disassemble a flat binary image.
    Disasm {
        /// Image.
        file: PathBuf,
        /// Tile address of the first byte.
        #[arg(long, default_value = "0x4c000", value_parser = parse_u32)]
        base: u32,
    },
    /// Run an assembly program on simulated tiles until they halt or reach the host sync.
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
    output: &Path,
    opts: &BuildOptions,
) -> Result<ipu_host::build::Built, Failure> {
    let built = build(name, src, opts).map_err(|e| bad(e.to_string()))?;
    ipu_host::atomic::write_atomic(output, &built.bytes)
        .map_err(|e| bad(format!("{}: {e}", output.display())))?;
    tracing::info!(path = %output.display(), bytes = built.bytes.len(), "application package written");
    Ok(built)
}

fn run_package(path: &Path, a: &RunArgs) -> Result<(), Failure> {
    let pkg = session::read_package(path).map_err(|e| bad(e.to_string()))?;
    let mut inputs = BTreeMap::new();
    for spec in &a.inputs {
        let (name, file) =
            spec.split_once('=').ok_or_else(|| bad(format!("--input {spec}: expected NAME=FILE.npy")))?;
        inputs.insert(name.to_string(), PathBuf::from(file));
    }
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
        seed: a.seed,
        iterations: a.iterations,
        profile: a.profile.is_some() || a.trace.is_some(),
    };
    let out = session::run(&pkg, dev.as_mut(), &opts).map_err(|e| match e {
        RunError::Input(m) => bad(m),
        RunError::Device(d) => Failure(1, format!("device {name}: {d}")),
        RunError::Busy(m) => Failure(3, m),
    })?;
    if let Some(cap) = &out.captured {
        write_profile(path, &pkg, &out.device, cap, a)?;
    }
    if a.json {
        let v = serde_json::json!({
            "package": path.display().to_string(),
            "device": out.device,
            "cycles": out.cycles,
            "predicted_cycles": pkg.plan.predicted_cycles,
            "max_abs_error": out.max_abs_error,
            "max_abs_error_vs_f64": out.max_abs_error_f64,
            "numerical_test": if out.numerical_pass { "PASS" } else { "FAIL" },
            "hardware_test": "PASS",
            "outputs": out.outputs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        });
        println!("{v}");
    }
    if out.numerical_pass {
        Ok(())
    } else {
        Err(Failure(1, "numerical test failed".into()))
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
) -> Result<(), Failure> {
    use ipu_host::profile::{trace, Profile};
    let sha = sha256_of(path)?;
    let p = Profile::from_run(pkg, &path.display().to_string(), &sha, device, cap)
        .map_err(|e| Failure(1, e.to_string()))?;
    let write = |file: &Path, bytes: &[u8]| {
        ipu_host::atomic::write_atomic(file, bytes).map_err(|e| bad(format!("{}: {e}", file.display())))
    };
    if let Some(file) = &a.profile {
        write(file, &p.to_capnp())?;
        println!("profile={} tiles={} samples={}", file.display(), p.tiles.len(), p.sample_count());
    }
    if let Some(file) = &a.trace {
        let t = trace::trace(&p, a.trace_max_events);
        let events = t["traceEvents"].as_array().map(Vec::len).unwrap_or(0);
        write(file, t.to_string().as_bytes())?;
        println!("trace={} events={events}", file.display());
    }
    Ok(())
}

fn read_profile(file: &Path) -> Result<ipu_host::profile::Profile, Failure> {
    let bytes = std::fs::read(file).map_err(|e| bad(format!("{}: {e}", file.display())))?;
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
    })
}

fn run(cli: Cli) -> Result<(), Failure> {
    match cli.cmd {
        Cmd::Build {
            model,
            output,
            tiles,
            threads,
            json,
            timings,
            search_attempts,
            search_state,
            profile,
            side_cast,
            column_groups,
        } => {
            let src = read_text(&model)?;
            let opts = BuildOptions {
                tiles,
                threads,
                grid: None,
                search_attempts,
                search_state,
                profile,
                side_cast,
                column_groups,
            };
            let b = do_build(&model.display().to_string(), &src, &output, &opts)?;
            if timings {
                for (phase, ms) in &b.timings {
                    eprintln!("phase {phase:<20} {ms:>6} ms");
                }
            }
            if json {
                println!("{}", build_json(&output, &b, tiles));
            } else {
                println!(
                    "package={} sha256={} tiles_used={} predicted_cycles={}",
                    output.display(),
                    b.sha256,
                    b.package.info.tiles_used,
                    b.package.plan.predicted_cycles
                );
            }
        }
        Cmd::Run { package, args } => run_package(&package, &args)?,
        Cmd::Profile { file, group_by, top, json } => {
            use ipu_host::profile::table;
            let p = read_profile(&file)?;
            let t = table::table(&p, group_by, top);
            if json {
                println!("{}", table::render_json(&p, &t));
            } else {
                print!("{}", table::render_text(&p, &t));
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
            println!("report={} bytes={}", output.display(), html.len());
        }
        Cmd::Inspect { package, json } => {
            let pkg = session::read_package(&package).map_err(|e| bad(e.to_string()))?;
            let bytes = std::fs::read(&package).map_err(|e| bad(e.to_string()))?;
            ipu_host::inspect::print(&pkg, &bytes, json);
        }
        Cmd::Demo { dir, args } => {
            std::fs::create_dir_all(&dir).map_err(|e| bad(format!("{}: {e}", dir.display())))?;
            let path = dir.join("attention.ipuexe");
            let opts = BuildOptions { threads: args.threads, ..BuildOptions::new(EXAMPLE_TILES) };
            do_build(EXAMPLE.0, EXAMPLE.1, &path, &opts)?;
            run_package(&path, &args)?;
        }
        Cmd::Asm { file, output } => {
            let src = read_text(&file)?;
            let prog = TileProgram::from_asm(&src).map_err(|e| bad(format!("{}: {e}", file.display())))?;
            let (base, img) = prog.flat_image();
            ipu_host::atomic::write_atomic(&output, &img)
                .map_err(|e| bad(format!("{}: {e}", output.display())))?;
            println!("{}: {} bytes at {base:#x}, entry {:#x}", output.display(), img.len(), prog.entry);
        }
        Cmd::Disasm { file, base } => {
            let bytes = std::fs::read(&file).map_err(|e| bad(format!("{}: {e}", file.display())))?;
            print!("{}", disassemble(base, &bytes));
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
            println!(
                "state={:?} cycles={} issued={} syncs={} host_seconds={secs:.3} instr_per_second={:.0}",
                r.state,
                r.cycles,
                r.issued,
                r.syncs,
                r.issued as f64 / secs
            );
        }
    }
    Ok(())
}

/// Entry point.
pub fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(code, msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(code)
        }
    }
}
