//! `ipu-codegen`: build, run, inspect and debug Graphcore Mk2 programs without the vendor SDK.

use clap::{Parser, Subcommand};
use ipu_host::program::{disassemble, TileProgram};
use ipu_host::sim::{SimConfig, SimDevice};
use ipu_host::Device;
use std::path::PathBuf;
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

#[derive(Subcommand)]
enum Cmd {
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

fn parse_u32(s: &str) -> Result<u32, String> {
    ipu_core::isa::parse_int(s)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| format!("not an address: {s}"))
}

/// A failure with the exit code it maps to (2 = bad input or usage).
struct Failure(u8, String);

fn read_text(path: &PathBuf) -> Result<String, Failure> {
    std::fs::read_to_string(path).map_err(|e| Failure(2, format!("{}: {e}", path.display())))
}

fn run(cli: Cli) -> Result<(), Failure> {
    match cli.cmd {
        Cmd::Asm { file, output } => {
            let src = read_text(&file)?;
            let prog =
                TileProgram::from_asm(&src).map_err(|e| Failure(2, format!("{}: {e}", file.display())))?;
            let (base, img) = prog.flat_image();
            std::fs::write(&output, &img).map_err(|e| Failure(2, format!("{}: {e}", output.display())))?;
            println!("{}: {} bytes at {base:#x}, entry {:#x}", output.display(), img.len(), prog.entry);
        }
        Cmd::Disasm { file, base } => {
            let bytes = std::fs::read(&file).map_err(|e| Failure(2, format!("{}: {e}", file.display())))?;
            print!("{}", disassemble(base, &bytes));
        }
        Cmd::Sim { file, tiles, threads, max_cycles } => {
            let src = read_text(&file)?;
            let prog =
                TileProgram::from_asm(&src).map_err(|e| Failure(2, format!("{}: {e}", file.display())))?;
            let mut dev = SimDevice::new(SimConfig { tiles, threads, max_cycles })
                .map_err(|e| Failure(2, e.to_string()))?;
            for t in 0..tiles {
                dev.load_tile(t as u16, &prog.segment_refs(), prog.entry)
                    .map_err(|e| Failure(2, e.to_string()))?;
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(code, msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(code)
        }
    }
}
