//! Profiles (docs/profile.md): capture from the cycle stamps a profiled package stores, the
//! Cap'n Proto file (`schema/profile.capnp`), and the views over it: text tables (`table.rs`),
//! the HTML report (`report.rs`) and Perfetto trace JSON (`trace.rs`).

#[allow(missing_docs, clippy::all, unused_qualifications)]
#[rustfmt::skip]
pub mod profile_capnp;
pub mod report;
pub mod table;
pub mod trace;

use crate::package::Package;
use ipu_schema::{SampleKind, TileMemory, NO_KERNEL};

/// Version of `schema/profile.capnp` this code writes and reads.
pub const SCHEMA_VERSION: u32 = 1;

/// One interval of one tile, in device cycles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Index into `Profile::phases`.
    pub phase: u16,
    /// What the tile did.
    pub kind: SampleKind,
    /// Index into `Profile::kernels`, or `NO_KERNEL`.
    pub kernel: u16,
    /// First cycle.
    pub start: u64,
    /// Cycle after the last (`start <= end`).
    pub end: u64,
}

impl Sample {
    /// Cycles.
    pub fn cycles(&self) -> u64 {
        self.end - self.start
    }
}

/// One tile's samples and memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileProfile {
    /// Logical tile.
    pub tile: u16,
    /// Contiguous intervals in time order.
    pub samples: Vec<Sample>,
    /// Bytes by kind.
    pub memory: TileMemory,
}

/// A decoded, validated profile.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// Tile clock in Hz.
    pub clock_hz: u64,
    /// Package path as given to `run`.
    pub package: String,
    /// SHA-256 of the package file, hex.
    pub package_sha256: String,
    /// Device name.
    pub device: String,
    /// Device cycle at the start of the profiled call.
    pub run_start: u64,
    /// Cycles of the call.
    pub run_cycles: u64,
    /// Which inference (1-based).
    pub iteration: u32,
    /// Phase names.
    pub phases: Vec<String>,
    /// Kernel names.
    pub kernels: Vec<String>,
    /// One per tile, in tile order.
    pub tiles: Vec<TileProfile>,
}

/// What the session read back, and about which run.
#[derive(Clone, Debug)]
pub struct Captured {
    /// Per tile, the raw `$COUNT_L` stamps.
    pub stamps: Vec<Vec<u32>>,
    /// Device cycle of the host-sync release that started the call.
    pub run_start: u64,
    /// Cycles of the call.
    pub run_cycles: u64,
    /// Which inference.
    pub iteration: u32,
}

/// Why a profile is refused.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// Not a Cap'n Proto message of the schema.
    #[error("not a readable profile message: {0}")]
    Decode(String),
    /// Decoded, but inconsistent.
    #[error("invalid profile: {0}")]
    Invalid(String),
}

impl From<capnp::Error> for ProfileError {
    fn from(e: capnp::Error) -> Self {
        ProfileError::Decode(e.to_string())
    }
}

impl Profile {
    /// Build a profile from a profiled package and the stamps of one run call. The stamps are
    /// 32-bit: each is unwrapped against the previous one (and stamp 0 against `run_start`).
    pub fn from_run(
        pkg: &Package,
        package: &str,
        package_sha256: &str,
        device: &str,
        cap: &Captured,
    ) -> Result<Profile, ProfileError> {
        let plan =
            pkg.plan.profile.as_ref().ok_or_else(|| ProfileError::Invalid("no profile plan".into()))?;
        let mut tiles = Vec::with_capacity(plan.tiles.len());
        for (t, ts) in plan.tiles.iter().enumerate() {
            let raw = cap.stamps.get(t).map(Vec::as_slice).unwrap_or(&[]);
            if raw.len() != ts.samples.len() + 1 {
                return Err(ProfileError::Invalid(format!(
                    "tile {t}: {} stamps read, the plan has {}",
                    raw.len(),
                    ts.samples.len() + 1
                )));
            }
            let mut at = cap.run_start + u64::from(raw[0].wrapping_sub(cap.run_start as u32));
            let mut samples = Vec::with_capacity(ts.samples.len() + 1);
            for (i, sp) in ts.samples.iter().enumerate() {
                let end = at + u64::from(raw[i + 1].wrapping_sub(raw[i]));
                samples.push(Sample { phase: sp.phase, kind: sp.kind, kernel: sp.kernel, start: at, end });
                at = end;
            }
            // The host intervals reach the call's edges: from the release (one `setzi` before
            // stamp 0) and, after the last stamp, the return and the host sync, whose end is the
            // device's count of the call's cycles.
            let call_end = cap.run_start + cap.run_cycles;
            if at > call_end {
                return Err(ProfileError::Invalid(format!(
                    "tile {t}: stamps reach cycle {at}, after the call ended at {call_end}"
                )));
            }
            if let Some(first) = samples.first_mut() {
                first.start = cap.run_start;
            }
            let host = ts.samples.first().map(|s| s.phase).unwrap_or(0);
            samples.push(Sample {
                phase: host,
                kind: SampleKind::Host,
                kernel: NO_KERNEL,
                start: at,
                end: call_end,
            });
            let memory = pkg.plan.memory.get(t).copied().unwrap_or_default();
            tiles.push(TileProfile { tile: t as u16, samples, memory });
        }
        Ok(Profile {
            clock_hz: ipu_core::target::CLOCK_HZ as u64,
            package: package.into(),
            package_sha256: package_sha256.into(),
            device: device.into(),
            run_start: cap.run_start,
            run_cycles: cap.run_cycles,
            iteration: cap.iteration,
            phases: plan.phases.clone(),
            kernels: plan.kernels.clone(),
            tiles,
        })
    }

    /// Total samples.
    pub fn sample_count(&self) -> usize {
        self.tiles.iter().map(|t| t.samples.len()).sum()
    }

    /// Name of a sample's kernel, if any.
    pub fn kernel_name(&self, s: &Sample) -> Option<&str> {
        (s.kernel != NO_KERNEL).then(|| self.kernels.get(s.kernel as usize).map(String::as_str)).flatten()
    }

    /// Encode as a Cap'n Proto message (unpacked, deterministic for the same profile).
    pub fn to_capnp(&self) -> Vec<u8> {
        use profile_capnp::{profile, Kind};
        let words = 64
            + self.phases.iter().chain(&self.kernels).map(|s| s.len() / 8 + 2).sum::<usize>()
            + self.tiles.iter().map(|t| 10 + 3 * t.samples.len()).sum::<usize>()
            + 64;
        let alloc = capnp::message::HeapAllocator::new().first_segment_words(words as u32);
        let mut msg = capnp::message::Builder::new(alloc);
        let mut p = msg.init_root::<profile::Builder>();
        p.set_schema_version(SCHEMA_VERSION);
        p.set_clock_hz(self.clock_hz);
        p.set_package(self.package.as_str());
        p.set_package_sha256(self.package_sha256.as_str());
        p.set_device(self.device.as_str());
        p.set_tile_count(self.tiles.len() as u32);
        p.set_run_start(self.run_start);
        p.set_run_cycles(self.run_cycles);
        p.set_iteration(self.iteration);
        let mut names = p.reborrow().init_phase_names(self.phases.len() as u32);
        for (i, n) in self.phases.iter().enumerate() {
            names.set(i as u32, n.as_str());
        }
        let mut names = p.reborrow().init_kernel_names(self.kernels.len() as u32);
        for (i, n) in self.kernels.iter().enumerate() {
            names.set(i as u32, n.as_str());
        }
        let mut tiles = p.init_tiles(self.tiles.len() as u32);
        for (i, t) in self.tiles.iter().enumerate() {
            let mut tb = tiles.reborrow().get(i as u32);
            tb.set_tile(t.tile);
            let mut m = tb.reborrow().init_memory();
            m.set_code(t.memory.code);
            m.set_tensors(t.memory.tensors);
            m.set_descriptors(t.memory.descriptors);
            m.set_exchange(t.memory.exchange);
            m.set_host(t.memory.host);
            m.set_profile(t.memory.profile);
            let mut sl = tb.init_samples(t.samples.len() as u32);
            for (j, s) in t.samples.iter().enumerate() {
                let mut sb = sl.reborrow().get(j as u32);
                sb.set_phase(s.phase);
                sb.set_kind(match s.kind {
                    SampleKind::Compute => Kind::Compute,
                    SampleKind::Sync => Kind::Sync,
                    SampleKind::Exchange => Kind::Exchange,
                    SampleKind::Host => Kind::Host,
                });
                sb.set_kernel(s.kernel);
                sb.set_start(s.start);
                sb.set_end(s.end);
            }
        }
        capnp::serialize::write_message_to_words(&msg)
    }

    /// Decode and validate a profile file. Untrusted: the traversal limit follows the file size,
    /// every index and count is checked before use.
    pub fn from_capnp(bytes: &[u8]) -> Result<Profile, ProfileError> {
        use profile_capnp::{profile, Kind};
        let opts = *capnp::message::ReaderOptions::new()
            .traversal_limit_in_words(Some(bytes.len() / 8 * 4 + 1024))
            .nesting_limit(16);
        let mut slice = bytes;
        let reader = capnp::serialize::read_message_from_flat_slice(&mut slice, opts)?;
        if !slice.is_empty() {
            return Err(ProfileError::Decode(format!("{} bytes after the message", slice.len())));
        }
        let p = reader.get_root::<profile::Reader>()?;
        if p.get_schema_version() != SCHEMA_VERSION {
            return Err(ProfileError::Invalid(format!(
                "schema version {} (this reader understands {SCHEMA_VERSION})",
                p.get_schema_version()
            )));
        }
        let text = |r: capnp::text::Reader<'_>| -> Result<String, ProfileError> {
            r.to_string().map_err(|e| ProfileError::Decode(format!("text is not UTF-8: {e}")))
        };
        let names = |l: capnp::text_list::Reader<'_>| -> Result<Vec<String>, ProfileError> {
            l.iter().map(|t| text(t?)).collect()
        };
        let phases = names(p.get_phase_names()?)?;
        let kernels = names(p.get_kernel_names()?)?;
        let tl = p.get_tiles()?;
        if p.get_tile_count() != tl.len() || tl.len() as usize > ipu_core::target::NUM_TILES {
            return Err(ProfileError::Invalid(format!(
                "tile count {} but {} tile entries (at most {})",
                p.get_tile_count(),
                tl.len(),
                ipu_core::target::NUM_TILES
            )));
        }
        let mut tiles = Vec::with_capacity(tl.len() as usize);
        for (i, t) in tl.iter().enumerate() {
            if t.get_tile() as usize != i {
                return Err(ProfileError::Invalid(format!("entry {i} is for tile {}", t.get_tile())));
            }
            let m = t.get_memory()?;
            let memory = TileMemory {
                code: m.get_code(),
                tensors: m.get_tensors(),
                descriptors: m.get_descriptors(),
                exchange: m.get_exchange(),
                host: m.get_host(),
                profile: m.get_profile(),
                // The profile format carries code as one figure; `inspect` gives it by kind.
                ..TileMemory::default()
            };
            let total = table::memory_total(&memory);
            if total > ipu_core::target::TILE_MEM_SIZE as u64 {
                return Err(ProfileError::Invalid(format!(
                    "tile {i}: memory use {total} bytes exceeds the tile"
                )));
            }
            let sl = t.get_samples()?;
            let mut samples = Vec::with_capacity(sl.len() as usize);
            let mut prev_end = None;
            for (j, s) in sl.iter().enumerate() {
                let kind = match s.get_kind() {
                    Ok(Kind::Compute) => SampleKind::Compute,
                    Ok(Kind::Sync) => SampleKind::Sync,
                    Ok(Kind::Exchange) => SampleKind::Exchange,
                    Ok(Kind::Host) => SampleKind::Host,
                    Err(e) => return Err(ProfileError::Invalid(format!("tile {i} sample {j}: {e}"))),
                };
                let sample = Sample {
                    phase: s.get_phase(),
                    kind,
                    kernel: s.get_kernel(),
                    start: s.get_start(),
                    end: s.get_end(),
                };
                let bad = |why: String| ProfileError::Invalid(format!("tile {i} sample {j}: {why}"));
                if sample.phase as usize >= phases.len() {
                    return Err(bad(format!("phase {} of {}", sample.phase, phases.len())));
                }
                if sample.kernel != NO_KERNEL && sample.kernel as usize >= kernels.len() {
                    return Err(bad(format!("kernel {} of {}", sample.kernel, kernels.len())));
                }
                if sample.end < sample.start {
                    return Err(bad(format!("ends at {} before it starts at {}", sample.end, sample.start)));
                }
                if prev_end.is_some_and(|e| e != sample.start) {
                    return Err(bad(format!(
                        "starts at {}, the previous sample ended at {prev_end:?}",
                        sample.start
                    )));
                }
                prev_end = Some(sample.end);
                samples.push(sample);
            }
            tiles.push(TileProfile { tile: i as u16, samples, memory });
        }
        let clock_hz = p.get_clock_hz();
        if clock_hz == 0 {
            return Err(ProfileError::Invalid("clock of 0 Hz".into()));
        }
        Ok(Profile {
            clock_hz,
            package: text(p.get_package()?)?,
            package_sha256: text(p.get_package_sha256()?)?,
            device: text(p.get_device()?)?,
            run_start: p.get_run_start(),
            run_cycles: p.get_run_cycles(),
            iteration: p.get_iteration(),
            phases,
            kernels,
            tiles,
        })
    }
}
