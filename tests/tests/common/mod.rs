//! Helpers shared by the simulator tests: assemble, load, run, read.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use ipu_host::program::TileProgram;
use ipu_host::sim::{SimConfig, SimDevice};
use ipu_host::{Device, DeviceError, RunReport};

pub fn program(src: &str) -> TileProgram {
    TileProgram::from_asm(src).unwrap_or_else(|e| panic!("assembly failed: {e}"))
}

pub fn device(tiles: usize, threads: usize) -> SimDevice {
    SimDevice::new(SimConfig { tiles, threads, max_cycles: 50_000_000 }).expect("device")
}

pub fn load(dev: &mut SimDevice, tile: u16, prog: &TileProgram) {
    dev.load_tile(tile, &prog.segment_refs(), prog.entry).expect("load");
}

/// Run a single-tile program to its first stop.
pub fn run_one(src: &str) -> (SimDevice, TileProgram, Result<RunReport, DeviceError>) {
    let prog = program(src);
    let mut dev = device(1, 1);
    load(&mut dev, 0, &prog);
    let r = dev.run_to_host_sync();
    (dev, prog, r)
}

pub fn read(dev: &mut SimDevice, tile: u16, addr: u32, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    dev.read_memory(tile, addr, &mut out).expect("read");
    out
}

pub fn read_u32(dev: &mut SimDevice, tile: u16, addr: u32) -> u32 {
    u32::from_le_bytes(read(dev, tile, addr, 4).try_into().unwrap())
}

pub fn read_u16s(dev: &mut SimDevice, tile: u16, addr: u32, n: usize) -> Vec<u16> {
    read(dev, tile, addr, 2 * n).chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
}

/// Whether `python3` can import `modules` (comma-separated). Absent, the caller skips its Python
/// check with a message, unless `IPU_CODEGEN_REQUIRE_TOOLS=1` (set by `.ci/run`), which fails.
pub fn python_with(modules: &str) -> bool {
    let found = std::process::Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var("IPU_CODEGEN_REQUIRE_TOOLS").is_err(),
            "python3 with {modules} is required (IPU_CODEGEN_REQUIRE_TOOLS)"
        );
        eprintln!("skipped: python3 with {modules} not installed");
    }
    found
}

/// A small deterministic generator (xorshift64), so tests reproduce.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Uniform in [-1, 1), quantised to f16.
    pub fn f16(&mut self) -> half::f16 {
        half::f16::from_f32((self.next() % 4096) as f32 / 2048.0 - 1.0)
    }
}

/// Build `src` for `tiles` (a forced grid if given), read the package back, run `iterations`
/// inferences on the simulator with inputs generated from `seed`, and require the verdict's PASS
/// bit-exact against the device-precision reference. Returns the outcome and the package.
pub fn build_and_run(
    src: &str,
    tiles: usize,
    grid: Option<[u32; 3]>,
    seed: u64,
    iterations: u32,
) -> (ipu_host::session::RunOutcome, ipu_host::package::Package) {
    use ipu_host::build::{build, BuildOptions};
    let built = build("model.toml", src, &BuildOptions { threads: 1, grid, ..BuildOptions::new(tiles) })
        .unwrap_or_else(|e| panic!("build: {e}"));
    let pkg = ipu_host::package::Package::from_bytes(&built.bytes).expect("reads back");
    let mut dev = device(tiles, 2);
    let opts = ipu_host::session::RunOptions {
        package_path: "model.ipuexe".into(),
        inputs: std::collections::BTreeMap::new(),
        output_dir: None,
        save_inputs: None,
        seed,
        iterations,
        profile: false,
    };
    let out = ipu_host::session::run(&pkg, &mut dev, &opts).expect("runs");
    assert!(out.numerical_pass && out.max_abs_error == 0.0, "{out:?}");
    (out, pkg)
}

/// Check a device formula of one f16 input against an f64 one on every finite f16: within
/// `carried(x, exact)` plus one f16 rounding, overflowing only where the exact result does, and
/// with the bound not loose by orders of magnitude (worst error/bound above 0.3).
#[allow(dead_code)]
pub fn check_every_f16(device: fn(f32) -> f32, exact: fn(f64) -> f64, carried: fn(f64, f64) -> f64) {
    let mut worst = 0f64;
    for h in 0..=u16::MAX {
        let x = half::f16::from_bits(h).to_f32();
        if !x.is_finite() {
            continue;
        }
        let (d, e) = (device(x) as f64, exact(x as f64));
        let c = carried(x as f64, e);
        let bound = c + 2f64.powi(-11) * (e.abs() + c) + 2f64.powi(-25);
        if d.is_finite() {
            assert!((d - e).abs() <= bound, "f({x}): device {d} vs f64 {e}");
            worst = worst.max((d - e).abs() / bound);
        } else {
            assert!(e.abs() > 65504.0, "f({x}) overflows only where the result does");
        }
    }
    assert!(worst > 0.3, "the bound is not loose by orders of magnitude: worst ratio {worst}");
}

/// A supervisor that runs `kernel` on six workers with the descriptor table at `desc` (`desc_bytes`
/// bytes at 0x7f000), then reaches the host sync: for tests that launch one kernel with
/// descriptors they write themselves (`reduce_kernels.rs`, `softmax_kernel.rs`, `scale_kernel.rs`).
pub fn kernel_harness(kernel: ipu_core::plan::Kernel, desc_bytes: u32) -> TileProgram {
    let text = ipu_runtime_tile::kernels::text(kernel);
    let label = ipu_runtime_tile::kernels::label(kernel);
    program(&format!(
        "main:\n    setzi $m0, {label}\n    setzi $m1, desc\n    runall $m0, $m1\n    sync 2\n    sync 15\n    halt\n\
         {text}\n.org 0x7f000\ndesc: .space {desc_bytes}\n"
    ))
}

/// Write 32-bit words to tile 0.
pub fn write_u32s(dev: &mut SimDevice, addr: u32, words: &[u32]) {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    dev.write_memory(0, addr, &bytes).unwrap();
}

/// Run a loaded kernel harness to its host sync and return the cycle; when `check`, every
/// `(address, halves)` of tile 0 must read back as given.
pub fn run_checking_halves(dev: &mut SimDevice, expected: &[(u32, Vec<u16>)], check: bool) -> u64 {
    let r = dev.run_to_host_sync().expect("runs");
    if check {
        for (at, halves) in expected {
            assert_eq!(&read_u16s(dev, 0, *at, halves.len()), halves, "block at {at:#x}");
        }
    }
    r.cycle
}

/// Tile memory from its base to the host area: what [`fill_and_run`] fills and returns.
pub const TILE_SPAN: (u32, usize) = (0x4c000, 0xe8000 - 0x4c000);

/// Runs `src` on `tiles` tiles of a device `setup` prepares (one host thread, `max_cycles`): tile
/// memory is first filled with 16-bit words `word(z)`, `z` a xorshift sequence from `seed`, then
/// the program is loaded and its `weights` (512 bytes, loaded as zeros over the fill) filled too,
/// so that what an AMP loads reaches its results. Returns the device, the outcome
/// (`HostSync cycles=… issued=…` or the error) and every tile's memory ([`TILE_SPAN`]).
pub fn fill_and_run(
    src: &str,
    tiles: usize,
    seed: u64,
    max_cycles: u64,
    word: impl Fn(u64) -> u16,
    setup: impl FnOnce(&mut SimDevice),
) -> (SimDevice, String, Vec<u8>) {
    let prog = program(src);
    let mut dev = SimDevice::new(SimConfig { tiles, threads: 1, max_cycles }).expect("device");
    setup(&mut dev);
    let mut z = seed;
    for t in 0..tiles as u16 {
        let fill: Vec<u8> = (0..TILE_SPAN.1 / 2)
            .flat_map(|_| {
                z ^= z << 13;
                z ^= z >> 7;
                z ^= z << 17;
                word(z).to_le_bytes()
            })
            .collect();
        dev.write_memory(t, TILE_SPAN.0, &fill).expect("fill");
        dev.load_tile(t, &prog.segment_refs(), prog.entry).expect("load");
        dev.write_memory(t, prog.sym("weights"), &fill[..512]).expect("weights");
    }
    let outcome = match dev.run_to_host_sync() {
        Ok(r) => format!("{:?} cycles={} issued={}", r.state, r.cycles, r.issued),
        Err(e) => format!("error: {e}"),
    };
    let mut mem = Vec::new();
    for t in 0..tiles as u16 {
        mem.extend(read(&mut dev, t, TILE_SPAN.0, TILE_SPAN.1));
    }
    (dev, outcome, mem)
}
