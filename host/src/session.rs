//! `run`: package → device → host-exchange session → outputs checked against the host reference
//! (docs/architecture.md, brief §5). Result lines go to stdout exactly as the seed prints them.

use crate::device::{Device, DeviceError, StopState};
use crate::lock;
use crate::package::Package;
use crate::reference::{self, HostTensor};
use half::f16;
use ipu_schema::{Binding, DType, Direction, SEG_ZERO};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;
use tracing::info;

/// Run settings.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Package path as given (printed in the result line).
    pub package_path: String,
    /// Input files by tensor name.
    pub inputs: BTreeMap<String, PathBuf>,
    /// Where to write outputs as `.npy`.
    pub output_dir: Option<PathBuf>,
    /// Seed for generated inputs.
    pub seed: u64,
    /// Resident inferences.
    pub iterations: u32,
    /// Read the profile stamps back after the last inference (the package needs a profile plan).
    pub profile: bool,
}

/// Outcome.
#[derive(Clone, Debug, Default)]
pub struct RunOutcome {
    /// Device name.
    pub device: String,
    /// Device cycles of each `run` call.
    pub cycles: Vec<u64>,
    /// Largest |device − reference| over all outputs and inferences.
    pub max_abs_error: f64,
    /// Largest |device − f64 reference|.
    pub max_abs_error_f64: f64,
    /// Every inference matched.
    pub numerical_pass: bool,
    /// Outputs written.
    pub outputs: Vec<PathBuf>,
    /// Result lines (also printed).
    pub lines: Vec<String>,
    /// Profile stamps of the last inference, when asked for.
    pub captured: Option<crate::profile::Captured>,
}

/// Errors of a run, with the exit code they map to.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad input (exit 2).
    #[error("{0}")]
    Input(String),
    /// The device failed (exit 1).
    #[error("{0}")]
    Device(#[from] DeviceError),
    /// The device lock is busy (exit 3).
    #[error("{0}")]
    Busy(String),
}

/// Deterministic inputs: uniform in [-1, 1) rounded to the dtype (splitmix64 per element).
pub fn generated(b: &Binding, seed: u64) -> HostTensor {
    let n = b.shape.iter().product::<u64>();
    let salt =
        b.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3));
    let data = (0..n)
        .map(|i| {
            let mut z = seed ^ salt ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let x = (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            if b.dtype == DType::F16 {
                f16::from_f32(x).to_f32()
            } else {
                x
            }
        })
        .collect();
    HostTensor { dtype: b.dtype, shape: b.shape.clone(), data }
}

/// Tensor bytes in the binding's element order: with `transpose`, each matrix of the last two
/// dimensions is transposed (`[..., r, c]` → `[..., c, r]`).
fn to_bytes(t: &HostTensor, transpose: bool) -> Vec<u8> {
    let r = t.shape.len();
    let (rows, cols) =
        if r >= 2 { (t.shape[r - 2] as usize, t.shape[r - 1] as usize) } else { (1, t.data.len()) };
    let mat = rows * cols;
    let at = |i: usize| {
        if !transpose {
            return t.data[i];
        }
        // Output position j = c·rows + r of matrix m reads input (r, c) of the same matrix.
        let (m, j) = (i / mat, i % mat);
        t.data[m * mat + (j % rows) * cols + j / rows]
    };
    let mut out = Vec::with_capacity(t.data.len() * t.dtype.size());
    for i in 0..t.data.len() {
        let v = at(i);
        match t.dtype {
            DType::F32 => out.extend_from_slice(&v.to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f16::from_f32(v).to_bits().to_le_bytes()),
            _ => out.push(v as u8),
        }
    }
    out
}

fn from_bytes(bytes: &[u8], b: &Binding) -> HostTensor {
    let data = match b.dtype {
        DType::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
        DType::F16 => {
            bytes.chunks_exact(2).map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect()
        }
        _ => bytes.iter().map(|v| *v as f32).collect(),
    };
    HostTensor { dtype: b.dtype, shape: b.shape.clone(), data }
}

/// Copy a tensor into tiles through its binding's slices (row by row while the device waits at
/// the host sync; the simulator writes tile memory directly, as the host-exchange window would).
fn write_binding(dev: &mut dyn Device, b: &Binding, bytes: &[u8]) -> Result<(), DeviceError> {
    for s in &b.slices {
        for r in 0..s.rows as u64 {
            let src = (s.tensor_offset + r * s.tensor_stride) as usize;
            let addr = s.addr + (r * s.tile_stride as u64) as u32;
            dev.write_memory(s.tile, addr, &bytes[src..src + s.row_bytes as usize])?;
        }
    }
    Ok(())
}

fn read_binding(dev: &mut dyn Device, b: &Binding) -> Result<Vec<u8>, DeviceError> {
    let mut out = vec![0u8; b.bytes() as usize];
    for s in &b.slices {
        for r in 0..s.rows as u64 {
            let dst = (s.tensor_offset + r * s.tensor_stride) as usize;
            let addr = s.addr + (r * s.tile_stride as u64) as u32;
            dev.read_memory(s.tile, addr, &mut out[dst..dst + s.row_bytes as usize])?;
        }
    }
    Ok(out)
}

/// Load every tile image (zero-filled segments expanded) and replay the configuration writes.
pub fn load(dev: &mut dyn Device, pkg: &Package) -> Result<(), DeviceError> {
    info!(register_writes = pkg.config.len(), "replaying device configuration");
    for (r, v) in &pkg.config {
        dev.write_config(*r, *v)?;
    }
    info!(tile_count = pkg.tiles.len(), "loading application");
    let zeros = vec![0u8; ipu_core::target::TILE_MEM_SIZE];
    for img in &pkg.tiles {
        let segs: Vec<(u32, &[u8])> = img
            .segments
            .iter()
            .map(|s| (s.addr, if s.flags & SEG_ZERO != 0 { &zeros[..s.len as usize] } else { &s.bytes[..] }))
            .collect();
        dev.load_tile(img.tile, &segs, img.entry)?;
    }
    Ok(())
}

/// The whole run pipeline on an opened device.
pub fn run(pkg: &Package, dev: &mut dyn Device, opts: &RunOptions) -> Result<RunOutcome, RunError> {
    let mut outcome = RunOutcome { device: dev.name(), numerical_pass: true, ..RunOutcome::default() };
    if dev.tile_count() < pkg.tile_count as usize {
        return Err(RunError::Input(format!(
            "package targets {} tiles but device {} has {}",
            pkg.tile_count,
            dev.name(),
            dev.tile_count()
        )));
    }
    if opts.profile && pkg.plan.profile.is_none() {
        return Err(RunError::Input(format!(
            "{}: the package has no profile plan; rebuild it with `ipu-codegen build --profile`",
            opts.package_path
        )));
    }
    let graph = crate::model::parse("<package model>", &pkg.info.model_source)
        .map_err(|e| RunError::Input(e.to_string()))?;
    load(dev, pkg)?;
    let first = dev.run_to_host_sync()?;
    if first.state != StopState::HostSync {
        return Err(RunError::Device(DeviceError::Request(
            "tiles halted before the initial host sync".into(),
        )));
    }
    info!(tile_count = pkg.tiles.len(), "application loaded and initial synchronization completed");
    // Inputs.
    let start = Instant::now();
    let mut inputs = BTreeMap::new();
    for b in pkg.bindings.iter().filter(|b| b.direction == Direction::Input) {
        let t = match opts.inputs.get(&b.name) {
            Some(path) => {
                let t = crate::npy::read(path).map_err(RunError::Input)?;
                if t.shape != b.shape || t.dtype != b.dtype {
                    return Err(RunError::Input(format!(
                        "{}: input `{}` must be {} {:?}, the file holds {} {:?}",
                        path.display(),
                        b.name,
                        b.dtype.name(),
                        b.shape,
                        t.dtype.name(),
                        t.shape
                    )));
                }
                t
            }
            None => generated(b, opts.seed),
        };
        inputs.insert(b.name.clone(), t);
    }
    if let Some(unknown) = opts.inputs.keys().find(|k| !inputs.contains_key(*k)) {
        return Err(RunError::Input(format!(
            "--input {unknown}: the package has no input tensor of that name"
        )));
    }
    info!(elapsed_ms = start.elapsed().as_millis() as u64, "prepared reference inputs");
    let threads = rayon::current_num_threads();
    info!(threads, "configured host reference threads");
    println!("referencePrecision=device");
    let t0 = Instant::now();
    let (reference, exact) =
        reference::evaluate(&graph, &inputs, &pkg.plan.grids).map_err(RunError::Input)?;
    info!(elapsed_ms = t0.elapsed().as_millis() as u64, "evaluated host reference");
    info!(pages = 2, "attaching host exchange pages");
    info!("host exchange session started");
    let call = pkg.run_call().clone();
    let mut last_outputs = BTreeMap::new();
    for it in 1..=opts.iterations {
        for b in pkg.bindings.iter().filter(|b| b.direction == Direction::Input) {
            write_binding(dev, b, &to_bytes(&inputs[&b.name], b.transpose))?;
        }
        for t in 0..pkg.tile_count as u16 {
            dev.write_memory(t, pkg.host.mailbox, &call.command.to_le_bytes())?;
        }
        info!(call = %call.name, command = call.command, phases = call.phases, "invoking host exchange call");
        let r = dev.run_to_host_sync()?;
        if r.state != StopState::HostSync {
            return Err(RunError::Device(DeviceError::Request("tiles halted during the run call".into())));
        }
        outcome.cycles.push(r.cycles);
        if opts.profile && it == opts.iterations {
            outcome.captured = Some(read_stamps(dev, pkg, r.cycle - r.cycles, r.cycles, it)?);
        }
        let mut ok = true;
        for b in pkg.bindings.iter().filter(|b| b.direction == Direction::Output) {
            let got = from_bytes(&read_binding(dev, b)?, b);
            let want = &reference[&b.name];
            for (i, (g, w)) in got.data.iter().zip(&want.data).enumerate() {
                let err = (g - w).abs() as f64;
                let same_nan = g.is_nan() && w.is_nan();
                // `err` may be NaN (one side NaN): that is a mismatch too.
                let within = err <= 1e-3 * (1.0 + w.abs() as f64);
                if !same_nan && !within {
                    ok = false;
                }
                if !same_nan {
                    outcome.max_abs_error =
                        outcome.max_abs_error.max(if err.is_nan() { f64::INFINITY } else { err });
                }
                if let Some(e) = exact.get(&b.name) {
                    let dev = match b.dtype {
                        DType::F8E4M3 | DType::F8E5M2 => {
                            let f = if b.dtype == DType::F8E5M2 {
                                ipu_core::fp8::Fp8Format::E5M2
                            } else {
                                ipu_core::fp8::Fp8Format::E4M3
                            };
                            ipu_core::fp8::to_f32(*g as u8, f) as f64 * 2f64.powi(b.scale as i32)
                        }
                        _ => *g as f64,
                    };
                    if !dev.is_nan() {
                        outcome.max_abs_error_f64 = outcome.max_abs_error_f64.max((dev - e[i]).abs());
                    }
                }
            }
            last_outputs.insert(b.name.clone(), got);
        }
        outcome.numerical_pass &= ok;
        let line = format!("referenceInference={it} numericalTest={}", if ok { "PASS" } else { "FAIL" });
        println!("{line}");
        outcome.lines.push(line);
    }
    info!(max_abs_error_vs_f64 = outcome.max_abs_error_f64, cycles = ?outcome.cycles, "device run finished");
    if let Some(dir) = &opts.output_dir {
        std::fs::create_dir_all(dir).map_err(|e| RunError::Input(format!("{}: {e}", dir.display())))?;
        for (name, t) in &last_outputs {
            let path = dir.join(format!("{name}.npy"));
            let bytes = crate::npy::to_bytes(t).map_err(RunError::Input)?;
            crate::atomic::write_atomic(&path, &bytes)
                .map_err(|e| RunError::Input(format!("{}: {e}", path.display())))?;
            outcome.outputs.push(path);
        }
    }
    let verdict = if outcome.numerical_pass { "PASS" } else { "FAIL" };
    let line =
        format!("referenceMaximumAbsoluteError={} numericalTest={verdict}", fmt_err(outcome.max_abs_error));
    println!("{line}");
    outcome.lines.push(line);
    let line = format!("package={} tiles={} hardwareTest=PASS", opts.package_path, pkg.tile_count);
    println!("{line}");
    outcome.lines.push(line);
    Ok(outcome)
}

/// Read every tile's profile stamps (docs/profile.md).
fn read_stamps(
    dev: &mut dyn Device,
    pkg: &Package,
    run_start: u64,
    run_cycles: u64,
    iteration: u32,
) -> Result<crate::profile::Captured, DeviceError> {
    let Some(plan) = &pkg.plan.profile else {
        return Err(DeviceError::Request("no profile plan".into()));
    };
    let mut stamps = Vec::with_capacity(plan.tiles.len());
    for (t, ts) in plan.tiles.iter().enumerate() {
        let mut bytes = vec![0u8; 4 * (ts.samples.len() + 1)];
        dev.read_memory(t as u16, ts.buffer, &mut bytes)?;
        stamps.push(bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect());
    }
    let samples: usize = plan.tiles.iter().map(|t| t.samples.len()).sum();
    info!(tiles = plan.tiles.len(), samples, "read profile samples");
    Ok(crate::profile::Captured { stamps, run_start, run_cycles, iteration })
}

fn fmt_err(e: f64) -> String {
    if e == 0.0 {
        "0".into()
    } else {
        format!("{e:.6}")
    }
}

/// Read and validate a package file. It is read whole rather than memory-mapped: a mapping could
/// change under us after validation, and mapping needs `unsafe` (docs/architecture.md).
pub fn read_package(path: &std::path::Path) -> Result<Package, RunError> {
    let bytes = std::fs::read(path).map_err(|e| RunError::Input(format!("{}: {e}", path.display())))?;
    info!("reading application package");
    let pkg = Package::from_bytes(&bytes).map_err(|e| RunError::Input(format!("{}: {e}", path.display())))?;
    info!(tiles = pkg.tile_count, compiler = %pkg.info.compiler, "application package read");
    Ok(pkg)
}

/// Take the device lock for `device`.
pub fn lock_device(device: &str, wait: bool) -> Result<lock::DeviceLock, RunError> {
    let path = lock::lock_path(device);
    info!(path = %path.display(), "waiting for hardware ownership");
    lock::acquire(&path, wait).map_err(|e| match e {
        lock::LockError::Busy { .. } => RunError::Busy(e.to_string()),
        other => RunError::Input(other.to_string()),
    })
}
