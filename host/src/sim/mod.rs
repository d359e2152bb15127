//! The simulator device: all tiles of a Mk2 chip (or fewer), run in parallel between syncs, with
//! the cycle-exact exchange and sync semantics of `docs/target.md`.

#[cfg(target_arch = "x86_64")]
mod amp_x86;
pub mod fabric;

use crate::device::{Device, DeviceError, RunReport, StopState};
use fabric::TileLog;
use ipu_core::target::{zone, NUM_TILES, SYNC_CYCLES, TILE_MEM_BASE, TILE_MEM_SIZE};
use ipu_core::tile::amp::AmpKernels;
use ipu_core::tile::{Stop, SupState, Tile};
use rayon::prelude::*;

/// Simulator settings.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Tiles (1..=1472).
    pub tiles: usize,
    /// Host threads (0 = rayon's default).
    pub threads: usize,
    /// Stop with an error when the device cycle passes this.
    pub max_cycles: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig { tiles: NUM_TILES, threads: 0, max_cycles: 2_000_000_000 }
    }
}

/// The simulated device.
pub struct SimDevice {
    cfg: SimConfig,
    pool: rayon::ThreadPool,
    tiles: Vec<Box<Tile>>,
    mems: Vec<Vec<u8>>,
    logs: Vec<TileLog>,
    loaded: Vec<bool>,
    started: bool,
    cycle: u64,
    config_writes: Vec<(u32, u32)>,
    /// Words delivered by the exchange so far.
    pub exchanged_words: u64,
    /// Whether loaded tiles may run AMP loops a stretch at a time (`set_amp_batching`).
    amp_batching: bool,
    /// The fused AMP bundles' functions the tiles use (`set_portable_amp`).
    amp_kernels: AmpKernels,
}

/// The fastest AMP kernels this host has: AVX2 + F16C where the CPU has them (`amp_x86.rs`), else
/// the specification's.
fn host_amp_kernels() -> AmpKernels {
    #[cfg(target_arch = "x86_64")]
    return amp_x86::kernels();
    #[cfg(not(target_arch = "x86_64"))]
    AmpKernels::PORTABLE
}

/// A reset tile with the device's AMP settings (`set_amp_batching`, `set_portable_amp`).
fn new_tile(id: u16, entry: u32, batching: bool, kernels: AmpKernels) -> Tile {
    let mut tile = Tile::new(id, entry);
    tile.batching = batching;
    tile.set_amp_kernels(kernels);
    tile
}

impl std::fmt::Debug for SimDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimDevice {{ tiles: {}, cycle: {} }}", self.tiles.len(), self.cycle)
    }
}

impl SimDevice {
    /// A fresh device with zeroed memory and no tile loaded.
    pub fn new(cfg: SimConfig) -> Result<Self, DeviceError> {
        if cfg.tiles == 0 || cfg.tiles > NUM_TILES {
            return Err(DeviceError::Request(format!("tile count {} not in 1..={NUM_TILES}", cfg.tiles)));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(cfg.threads)
            .build()
            .map_err(|e| DeviceError::Unavailable(format!("thread pool: {e}")))?;
        let n = cfg.tiles;
        let amp_kernels = host_amp_kernels();
        Ok(SimDevice {
            pool,
            tiles: (0..n).map(|t| Box::new(new_tile(t as u16, TILE_MEM_BASE, true, amp_kernels))).collect(),
            mems: (0..n).map(|_| vec![0u8; TILE_MEM_SIZE]).collect(),
            logs: vec![TileLog::default(); n],
            loaded: vec![false; n],
            started: false,
            cycle: 0,
            config_writes: Vec::new(),
            exchanged_words: 0,
            amp_batching: true,
            amp_kernels,
            cfg,
        })
    }

    /// Whether the workers' AMP loops may run a stretch at a time where that changes nothing
    /// (`ipu_core::tile` `batch.rs`; on by default). Tests turn it off to compare the states.
    pub fn set_amp_batching(&mut self, on: bool) {
        self.amp_batching = on;
        for t in self.tiles.iter_mut() {
            t.batching = on;
        }
    }

    /// Whether the fused AMP bundles run the specification's portable code (`true`) or the
    /// fastest this host has (the default; the same results, `amp_x86.rs`). Tests compare the two.
    pub fn set_portable_amp(&mut self, portable: bool) {
        self.amp_kernels = if portable { AmpKernels::PORTABLE } else { host_amp_kernels() };
        for t in self.tiles.iter_mut() {
            t.set_amp_kernels(self.amp_kernels);
        }
    }

    /// Per-tile state, for tests and profiles.
    pub fn tile(&self, t: u16) -> &Tile {
        &self.tiles[t as usize]
    }

    /// Device cycle of the last stop.
    pub fn cycle(&self) -> u64 {
        self.cycle
    }

    /// Configuration writes replayed so far (the model has no registers that change behaviour).
    pub fn config_writes(&self) -> &[(u32, u32)] {
        &self.config_writes
    }

    fn check_tile(&self, tile: u16) -> Result<usize, DeviceError> {
        let t = tile as usize;
        if t >= self.tiles.len() {
            return Err(DeviceError::Request(format!(
                "tile {tile} out of range (device has {})",
                self.tiles.len()
            )));
        }
        Ok(t)
    }

    fn range(&self, tile: u16, addr: u32, len: usize) -> Result<(usize, usize), DeviceError> {
        let t = self.check_tile(tile)?;
        if !ipu_core::target::in_tile_memory(addr, len as u32) {
            return Err(DeviceError::Request(format!(
                "tile {tile}: {len} bytes at {addr:#x} are outside tile memory 0x4c000..0xe8000"
            )));
        }
        Ok((t, (addr - TILE_MEM_BASE) as usize))
    }

    /// One superstep: run every unblocked tile until it stops, in parallel.
    fn superstep(&mut self) -> Result<Vec<Stop>, DeviceError> {
        let limit = self.cfg.max_cycles;
        let loaded = &self.loaded;
        let results: Vec<Result<Stop, ipu_core::tile::Fault>> = self.pool.install(|| {
            self.tiles
                .par_iter_mut()
                .zip(self.mems.par_iter_mut())
                .zip(self.logs.par_iter_mut())
                .enumerate()
                .map(|(i, ((tile, mem), log))| {
                    if !loaded[i] {
                        return Ok(Stop::Halted { cycle: 0 });
                    }
                    tile.run(mem, log, limit)
                })
                .collect()
        });
        let mut stops = Vec::with_capacity(results.len());
        for r in results {
            stops.push(r.map_err(DeviceError::Fault)?);
        }
        if let Some(t) = stops.iter().position(|s| *s == Stop::Limit) {
            return Err(DeviceError::Budget { budget: limit, tile: t as u16 });
        }
        Ok(stops)
    }
}

impl Device for SimDevice {
    fn name(&self) -> String {
        "sim".into()
    }

    fn tile_count(&self) -> usize {
        self.tiles.len()
    }

    fn write_config(&mut self, register: u32, value: u32) -> Result<(), DeviceError> {
        self.config_writes.push((register, value));
        Ok(())
    }

    fn load_tile(&mut self, tile: u16, segments: &[(u32, &[u8])], entry: u32) -> Result<(), DeviceError> {
        if self.started {
            return Err(DeviceError::Request("cannot load tiles after the device started".into()));
        }
        for (addr, bytes) in segments {
            let (t, o) = self.range(tile, *addr, bytes.len())?;
            self.mems[t][o..o + bytes.len()].copy_from_slice(bytes);
        }
        let t = self.check_tile(tile)?;
        *self.tiles[t] = new_tile(tile, entry, self.amp_batching, self.amp_kernels);
        self.loaded[t] = true;
        Ok(())
    }

    fn run_to_host_sync(&mut self) -> Result<RunReport, DeviceError> {
        let start = self.cycle;
        if self.started {
            for t in self.tiles.iter_mut() {
                t.release(start);
            }
        }
        self.started = true;
        let issued_before: u64 = self.tiles.iter().map(|t| t.issued).sum();
        let mut syncs = 0;
        loop {
            let stops = self.superstep()?;
            let mut internal = None;
            let mut host = None;
            let mut halted = None;
            let mut arrival = 0u64;
            for (i, s) in stops.iter().enumerate() {
                match *s {
                    Stop::Sync { zone: z, cycle } => {
                        arrival = arrival.max(cycle);
                        if z == zone::INTERNAL {
                            internal.get_or_insert(i);
                        } else {
                            host.get_or_insert(i);
                        }
                    }
                    Stop::Halted { cycle } => {
                        if self.loaded[i] {
                            arrival = arrival.max(cycle);
                            halted.get_or_insert(i);
                        }
                    }
                    Stop::Limit => unreachable!("handled in superstep"),
                }
            }
            let release = arrival + SYNC_CYCLES;
            if let Some(w) = internal {
                if let Some(b) = host.or(halted) {
                    let why = match self.tiles[b].sup_state {
                        SupState::Halted => "has halted".to_string(),
                        _ => "waits on the host sync (zone 15)".to_string(),
                    };
                    return Err(DeviceError::Deadlock {
                        cycle: arrival,
                        waiting: w as u16,
                        zone: zone::INTERNAL,
                        blocker: b as u16,
                        why,
                    });
                }
            }
            self.exchanged_words +=
                fabric::resolve(&mut self.logs, &mut self.mems, release).map_err(DeviceError::Exchange)?;
            let issued = self.tiles.iter().map(|t| t.issued).sum::<u64>() - issued_before;
            if internal.is_some() {
                syncs += 1;
                for t in self.tiles.iter_mut() {
                    t.release(release);
                }
                continue;
            }
            let (state, cycle) =
                if host.is_some() { (StopState::HostSync, release) } else { (StopState::Halted, arrival) };
            self.cycle = cycle;
            return Ok(RunReport { state, cycle, cycles: cycle - start, issued, syncs });
        }
    }

    fn write_memory(&mut self, tile: u16, addr: u32, data: &[u8]) -> Result<(), DeviceError> {
        let (t, o) = self.range(tile, addr, data.len())?;
        self.mems[t][o..o + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn read_memory(&mut self, tile: u16, addr: u32, out: &mut [u8]) -> Result<(), DeviceError> {
        let (t, o) = self.range(tile, addr, out.len())?;
        out.copy_from_slice(&self.mems[t][o..o + out.len()]);
        Ok(())
    }
}
