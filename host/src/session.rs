//! `run`: package → device → host-exchange session → outputs checked against the host reference
//! (docs/architecture.md, brief §5). Result lines go to stdout exactly as the seed prints them.

use crate::device::{Device, DeviceError, StopState};
use crate::lock;
use crate::package::Package;
use crate::reference::{self, HostTensor};
use crate::verdict;
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
    /// Where to write the first inference's inputs as `.npy` (given or generated).
    pub save_inputs: Option<PathBuf>,
    /// Seed for generated inputs.
    pub seed: u64,
    /// Resident inferences.
    pub iterations: u32,
    /// Read the profile stamps back after the last inference (the package needs a profile plan).
    pub profile: bool,
}

/// The first element that failed a check, for the message a person reads.
#[derive(Clone, Debug, PartialEq)]
pub struct FirstMismatch {
    /// Inference (1-based).
    pub iteration: u32,
    /// Output tensor.
    pub tensor: String,
    /// Element index in the tensor's shape.
    pub index: Vec<u64>,
    /// `"device precision"` or `"f64"`.
    pub check: &'static str,
    /// The device's value.
    pub device: f64,
    /// The value it was compared with.
    pub reference: f64,
    /// The allowed f64 error (0 for device precision).
    pub bound: f64,
}

impl std::fmt::Display for FirstMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let idx: Vec<String> = self.index.iter().map(u64::to_string).collect();
        write!(
            f,
            "{}[{}] inference={} check=\"{}\" device={} reference={}",
            self.tensor,
            idx.join(","),
            self.iteration,
            self.check,
            self.device,
            self.reference
        )?;
        if self.check == "f64" {
            write!(f, " bound={:e}", self.bound)?;
        }
        Ok(())
    }
}

/// Outcome.
#[derive(Clone, Debug, Default)]
pub struct RunOutcome {
    /// Device name.
    pub device: String,
    /// Device cycles of each `run` call.
    pub cycles: Vec<u64>,
    /// Largest |device − device-precision reference| over all outputs and inferences.
    pub max_abs_error: f64,
    /// Largest |device − f64 reference|.
    pub max_abs_error_f64: f64,
    /// Largest per-element bound on the f64 error (derived from the ops, docs/reliability.md).
    pub bound_f64: f64,
    /// Largest |device − f64| / bound over all elements (≤ 1 passes).
    pub worst_ratio_f64: f64,
    /// Output elements compared, over all outputs and inferences (> 0 for a verdict).
    pub compared_elements: u64,
    /// Device NaN/inf elements per output, over all inferences.
    pub non_finite_outputs: BTreeMap<String, u64>,
    /// The first element that failed a check.
    pub first_mismatch: Option<FirstMismatch>,
    /// Every inference matched both checks.
    pub numerical_pass: bool,
    /// Outputs written.
    pub outputs: Vec<PathBuf>,
    /// Result lines, in order, for the caller to print.
    pub lines: Vec<String>,
    /// Profile stamps of the last inference, when asked for.
    pub captured: Option<crate::profile::Captured>,
    /// Host seconds spent in the device's `run` calls.
    pub device_seconds: f64,
    /// Tile instructions (or bundles) the device issued in the `run` calls, all tiles.
    pub device_instructions: u64,
    /// Host seconds spent evaluating the reference.
    pub reference_seconds: f64,
}

impl RunOutcome {
    /// The device ran every requested call to completion without a fault.
    pub fn hardware_pass(&self, iterations: u32) -> bool {
        // A call's cycles are recorded only once it reached its closing host sync.
        iterations > 0 && self.cycles.len() == iterations as usize
    }
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
pub fn to_bytes(t: &HostTensor, transpose: bool) -> Vec<u8> {
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

/// A tensor from bytes in the binding's element order (transposed bindings stay transposed).
pub fn from_bytes(bytes: &[u8], b: &Binding) -> HostTensor {
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

/// The byte every output element is filled with before each call, so that an element the device
/// does not write reads as NaN (f16, f32: 0xFF…) or NaN (FP8 `fnuz`: 0x80), never as a stale or
/// zero value that could pass.
pub fn poison_byte(d: DType) -> u8 {
    match d {
        DType::F8E4M3 | DType::F8E5M2 => 0x80,
        DType::F32 | DType::F16 => 0xFF,
    }
}

/// The seed of iteration `it` (1-based): iteration 1 uses `seed` itself, each later one another
/// seed, so that a call that computes nothing cannot pass on the previous call's outputs.
pub fn iteration_seed(seed: u64, it: u32) -> u64 {
    seed.wrapping_add((it as u64 - 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// The values of every param, read back from the package's tile images through the param
/// bindings: what the device holds, not what the model file said. Replicated copies must agree.
pub fn param_values(pkg: &Package) -> Result<BTreeMap<String, HostTensor>, String> {
    let mut out = BTreeMap::new();
    for b in pkg.bindings.iter().filter(|b| b.direction == Direction::Param) {
        let mut bytes = vec![0u8; b.bytes() as usize];
        let mut seen = vec![false; bytes.len()];
        for s in &b.slices {
            for r in 0..s.rows as u64 {
                let dst = (s.tensor_offset + r * s.tensor_stride) as usize;
                let addr = s.addr + (r * s.tile_stride as u64) as u32;
                let row = pkg.image_bytes(s.tile, addr, s.row_bytes).ok_or_else(|| {
                    format!("param `{}`: tile {} holds no data at {addr:#x}", b.name, s.tile)
                })?;
                for (i, v) in row.iter().enumerate() {
                    if seen[dst + i] && bytes[dst + i] != *v {
                        return Err(format!(
                            "param `{}`: the copies on different tiles differ (byte {})",
                            b.name,
                            dst + i
                        ));
                    }
                    bytes[dst + i] = *v;
                    seen[dst + i] = true;
                }
            }
        }
        let t = from_bytes(&bytes, b);
        out.insert(b.name.clone(), if b.transpose { untranspose(&t) } else { t });
    }
    Ok(out)
}

/// Undo [`to_bytes`]'s transpose: element `j = c·rows + r` of each matrix is `(r, c)`.
fn untranspose(t: &HostTensor) -> HostTensor {
    let r = t.shape.len();
    let (rows, cols) =
        if r >= 2 { (t.shape[r - 2] as usize, t.shape[r - 1] as usize) } else { (1, t.data.len()) };
    let mat = rows * cols;
    let mut data = vec![0f32; t.data.len()];
    for (j, v) in t.data.iter().enumerate() {
        let (m, k) = (j / mat, j % mat);
        data[m * mat + (k % rows) * cols + k / rows] = *v;
    }
    HostTensor { dtype: t.dtype, shape: t.shape.clone(), data }
}

/// Inputs of one iteration: files as given (the same every iteration), the rest generated.
fn prepare_inputs(
    pkg: &Package,
    opts: &RunOptions,
    it: u32,
    files: &BTreeMap<String, HostTensor>,
) -> BTreeMap<String, HostTensor> {
    let mut inputs = BTreeMap::new();
    for b in pkg.bindings.iter().filter(|b| b.direction == Direction::Input) {
        let t = match files.get(&b.name) {
            Some(t) => t.clone(),
            None => generated(b, iteration_seed(opts.seed, it)),
        };
        inputs.insert(b.name.clone(), t);
    }
    inputs
}

/// Whether `name` is a model input that no op reads (the package binds nothing for it).
fn unread_input(pkg: &Package, name: &str) -> bool {
    crate::model::parse("<package model>", &pkg.info.model_source)
        .is_ok_and(|g| g.find(name).is_some_and(|t| g.inputs.contains(&t) && !g.is_read(t)))
}

fn is_param(pkg: &Package, name: &str) -> bool {
    pkg.bindings.iter().any(|b| b.direction == Direction::Param && b.name == name)
}

/// Read the `--input` files, checking each against its binding.
fn read_input_files(pkg: &Package, opts: &RunOptions) -> Result<BTreeMap<String, HostTensor>, RunError> {
    let mut files = BTreeMap::new();
    for (name, path) in &opts.inputs {
        if is_param(pkg, name) {
            return Err(RunError::Input(format!(
                "--input {name}: `{name}` is a param: its values are resident in the package (rebuild it to change them)"
            )));
        }
        let Some(b) = pkg.bindings.iter().find(|b| b.direction == Direction::Input && &b.name == name) else {
            if unread_input(pkg, name) {
                tracing::warn!("--input {name}: no op of the model reads `{name}`; the file is not used");
                continue;
            }
            return Err(RunError::Input(format!(
                "--input {name}: the package has no input tensor of that name"
            )));
        };
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
        files.insert(name.clone(), t);
    }
    Ok(files)
}

/// Fold one output check into the outcome.
fn record(outcome: &mut RunOutcome, it: u32, shape: &[u64], c: verdict::OutputCheck) {
    outcome.max_abs_error = outcome.max_abs_error.max(c.max_abs_error);
    outcome.max_abs_error_f64 = outcome.max_abs_error_f64.max(c.max_abs_error_f64);
    outcome.bound_f64 = outcome.bound_f64.max(c.max_bound_f64);
    outcome.worst_ratio_f64 = outcome.worst_ratio_f64.max(c.worst_ratio_f64);
    outcome.compared_elements += c.elements;
    *outcome.non_finite_outputs.entry(c.name.clone()).or_default() += c.non_finite;
    if let (Some(m), None) = (&c.first_mismatch, &outcome.first_mismatch) {
        outcome.first_mismatch = Some(FirstMismatch {
            iteration: it,
            tensor: c.name.clone(),
            index: verdict::multi_index(shape, m.index),
            check: m.check,
            device: m.device,
            reference: m.reference,
            bound: m.bound,
        });
    }
}

/// One iteration's inputs and the host reference over them.
struct Prepared {
    inputs: BTreeMap<String, HostTensor>,
    reference: reference::Evaluated,
    inputs_seconds: f64,
    reference_seconds: f64,
}

/// Make iteration `it`'s inputs, add them to `sources` (the params and earlier inputs) and
/// evaluate the reference over them.
fn prepare_iteration(
    graph: &ipu_core::graph::Graph,
    pkg: &Package,
    opts: &RunOptions,
    files: &BTreeMap<String, HostTensor>,
    sources: &mut BTreeMap<String, HostTensor>,
    it: u32,
) -> Result<Prepared, RunError> {
    let start = Instant::now();
    let inputs = prepare_inputs(pkg, opts, it, files);
    let inputs_seconds = start.elapsed().as_secs_f64();
    let t0 = Instant::now();
    sources.extend(inputs.iter().map(|(k, v)| (k.clone(), v.clone())));
    let reference = reference::evaluate(graph, sources, &pkg.plan.grids, &pkg.plan.alpha_on_a)
        .map_err(RunError::Input)?;
    Ok(Prepared { inputs, reference, inputs_seconds, reference_seconds: t0.elapsed().as_secs_f64() })
}

/// The whole run pipeline on an opened device. Result lines are collected in
/// [`RunOutcome::lines`]; the caller prints them after the outputs are written.
pub fn run(pkg: &Package, dev: &mut dyn Device, opts: &RunOptions) -> Result<RunOutcome, RunError> {
    let mut outcome = RunOutcome { device: dev.name(), numerical_pass: true, ..RunOutcome::default() };
    if opts.iterations == 0 {
        return Err(RunError::Input(
            "--iterations 0: at least one inference must run to check anything".into(),
        ));
    }
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
    let files = read_input_files(pkg, opts)?;
    // The reference's sources: params once (they never change), this iteration's inputs over them.
    let mut sources = param_values(pkg).map_err(RunError::Input)?;
    // The first iteration's reference is computed while the application loads: loading is one
    // host thread writing tile memory, the reference uses the others. Its log lines still come
    // after the load's, in the seed's order.
    let (mut first_iteration, loaded) = std::thread::scope(|scope| {
        let reference = scope.spawn(|| prepare_iteration(&graph, pkg, opts, &files, &mut sources, 1));
        let loaded = load(dev, pkg).and_then(|()| dev.run_to_host_sync());
        let prepared = reference.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (Some(prepared), loaded)
    });
    let first = loaded?;
    if first.state != StopState::HostSync {
        return Err(RunError::Device(DeviceError::Request(
            "tiles halted before the initial host sync".into(),
        )));
    }
    info!(tile_count = pkg.tiles.len(), "application loaded and initial synchronization completed");
    info!(threads = rayon::current_num_threads(), "configured host reference threads");
    outcome.lines.push("referencePrecision=device".into());
    info!(pages = 2, "attaching host exchange pages");
    info!("host exchange session started");
    let call = pkg.run_call().clone();
    let outputs: Vec<&Binding> = graph
        .outputs
        .iter()
        .map(|id| {
            let name = &graph.tensor(*id).name;
            pkg.bindings.iter().find(|b| b.direction == Direction::Output && &b.name == name).ok_or_else(
                || RunError::Input(format!("{}: no output binding for `{name}`", opts.package_path)),
            )
        })
        .collect::<Result<_, _>>()?;
    let mut last_outputs = BTreeMap::new();
    for it in 1..=opts.iterations {
        let Prepared { inputs, reference, inputs_seconds, reference_seconds } = match first_iteration.take() {
            Some(prepared) => prepared?,
            None => prepare_iteration(&graph, pkg, opts, &files, &mut sources, it)?,
        };
        if let (1, Some(dir)) = (it, &opts.save_inputs) {
            write_npys(dir, &inputs)?;
        }
        info!(iteration = it, elapsed_ms = (inputs_seconds * 1e3) as u64, "prepared reference inputs");
        outcome.reference_seconds += reference_seconds;
        info!(elapsed_ms = (reference_seconds * 1e3) as u64, "evaluated host reference");
        for b in pkg.bindings.iter().filter(|b| b.direction == Direction::Input) {
            write_binding(dev, b, &to_bytes(&inputs[&b.name], b.transpose))?;
        }
        for b in &outputs {
            write_binding(dev, b, &vec![poison_byte(b.dtype); b.bytes() as usize])?;
        }
        for t in 0..pkg.tile_count as u16 {
            dev.write_memory(t, pkg.host.mailbox, &call.command.to_le_bytes())?;
        }
        info!(call = %call.name, command = call.command, phases = call.phases, "invoking host exchange call");
        let t1 = Instant::now();
        let r = dev.run_to_host_sync()?;
        outcome.device_seconds += t1.elapsed().as_secs_f64();
        if r.state != StopState::HostSync {
            return Err(RunError::Device(DeviceError::Request("tiles halted during the run call".into())));
        }
        outcome.cycles.push(r.cycles);
        outcome.device_instructions += r.issued;
        if opts.profile && it == opts.iterations {
            outcome.captured = Some(read_stamps(dev, pkg, r.cycle - r.cycles, r.cycles, it)?);
        }
        let mut ok = true;
        for b in &outputs {
            let got = from_bytes(&read_binding(dev, b)?, b);
            let want = &reference.device[&b.name];
            let dv = verdict::Values { dtype: got.dtype, scale: b.scale, data: &got.data };
            let rv = verdict::Values { dtype: want.dtype, scale: b.scale, data: &want.data };
            let c = verdict::check(&b.name, dv, rv, &reference.exact[&b.name], &reference.bound[&b.name])
                .map_err(RunError::Input)?;
            ok &= c.passed();
            record(&mut outcome, it, &b.shape, c);
            last_outputs.insert(b.name.clone(), got);
        }
        outcome.numerical_pass &= ok;
        outcome
            .lines
            .push(format!("referenceInference={it} numericalTest={}", if ok { "PASS" } else { "FAIL" }));
    }
    if outcome.compared_elements == 0 {
        return Err(RunError::Input(format!("{}: the package has no outputs to check", opts.package_path)));
    }
    info!(
        max_abs_error_vs_f64 = outcome.max_abs_error_f64,
        cycles = ?outcome.cycles,
        tile_instructions = outcome.device_instructions,
        device_seconds = format!("{:.3}", outcome.device_seconds),
        instr_per_second = format!("{:.0}", outcome.device_instructions as f64 / outcome.device_seconds.max(1e-9)),
        reference_seconds = format!("{:.3}", outcome.reference_seconds),
        "device run finished"
    );
    if let Some(dir) = &opts.output_dir {
        outcome.outputs = write_npys(dir, &last_outputs)?;
    }
    outcome.lines.extend(result_lines(&outcome, opts, pkg));
    Ok(outcome)
}

/// Write each tensor as `DIR/NAME.npy`.
fn write_npys(
    dir: &std::path::Path,
    tensors: &BTreeMap<String, HostTensor>,
) -> Result<Vec<PathBuf>, RunError> {
    std::fs::create_dir_all(dir).map_err(|e| RunError::Input(format!("{}: {e}", dir.display())))?;
    let mut written = Vec::new();
    for (name, t) in tensors {
        let path = dir.join(format!("{name}.npy"));
        let bytes = crate::npy::to_bytes(t).map_err(RunError::Input)?;
        crate::atomic::write_atomic(&path, &bytes)
            .map_err(|e| RunError::Input(format!("{}: {e}", path.display())))?;
        written.push(path);
    }
    Ok(written)
}

/// The closing result lines: the seed's three, with the device named and the f64 error beside its
/// bound, and on failure the first element that differs.
fn result_lines(o: &RunOutcome, opts: &RunOptions, pkg: &Package) -> Vec<String> {
    let verdict = if o.numerical_pass { "PASS" } else { "FAIL" };
    let non_finite: u64 = o.non_finite_outputs.values().sum();
    let mut lines =
        vec![format!("referenceMaximumAbsoluteError={} numericalTest={verdict}", fmt_err(o.max_abs_error))];
    lines.push(format!(
        "f64MaximumAbsoluteError={} f64ErrorBound={} nonFiniteOutputs={non_finite} comparedElements={}",
        fmt_err(o.max_abs_error_f64),
        fmt_err(o.bound_f64),
        o.compared_elements
    ));
    if let Some(m) = &o.first_mismatch {
        lines.push(format!("firstMismatch={m}"));
    }
    let hw = if o.hardware_pass(opts.iterations) { "PASS" } else { "FAIL" };
    lines.push(format!(
        "package={} tiles={} device={} hardwareTest={hw}",
        opts.package_path, pkg.tile_count, o.device
    ));
    lines
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
