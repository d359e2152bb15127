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
