//! One tile: contexts, barrel scheduling and fetch (docs/target.md §3). The semantics of each
//! instruction are in [`exec`], referenced from the ISA table.

pub mod amp;
mod batch;
mod decoded;
pub mod exec;
mod fault;
pub mod mem;
#[cfg(test)]
mod pace_tests;

/// A bus that drops everything, for unit tests of instructions that never reach the fabric.
#[cfg(test)]
pub(crate) struct NoBus;
#[cfg(test)]
impl TileBus for NoBus {
    fn send(&mut self, _: u64, _: &[u8]) {}
    fn set_mux(&mut self, _: u64, _: u32) {}
    fn set_incoming_ptr(&mut self, _: u64, _: u32) {}
    fn set_dcount(&mut self, _: u64, _: u32) {}
}

pub use fault::{CtxId, Fault, FaultKind};

use crate::target::{zone, BARREL_SLOTS, CWEI_BYTES, CWEI_HALF_BYTES, RPT_MAX_COUNT, WORKERS};
use decoded::DecodeCache;
use exec::{Cx, Flow};

/// What a tile tells the fabric. Implemented by the simulator's chip model.
pub trait TileBus {
    /// `bytes.len()/4` words leave this tile, word `i` at cycle `cycle + i`.
    fn send(&mut self, cycle: u64, bytes: &[u8]);
    /// From `cycle` on, the incoming mux selects `source` (a logical tile id or `MUX_NONE`).
    fn set_mux(&mut self, cycle: u64, source: u32);
    /// From `cycle` on, incoming words are written from byte address `addr` on.
    fn set_incoming_ptr(&mut self, cycle: u64, addr: u32);
    /// The number of words this tile expects before the next sync.
    fn set_dcount(&mut self, cycle: u64, words: u32);
}

/// A context's registers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Regs {
    /// `$m0..$m15` (`$m15` always reads 0).
    pub m: [u32; 16],
    /// `$a0..$a15`.
    pub a: [u32; 16],
    /// Program counter.
    pub pc: u32,
}

/// Per-worker floating-point state: AMP accumulators and conversion CSRs.
#[derive(Clone, Copy, Debug, Default)]
pub struct WorkerFp {
    /// Accumulators of the row in flight.
    pub aacc: [f32; 16],
    /// Results of the previous row, drained four (or two) per issue.
    pub drain: [f32; 16],
    /// `$FP_NFMT`.
    pub nfmt: u32,
    /// `$FP_SCL`.
    pub scl: u32,
}

/// A worker context.
#[derive(Clone, Copy, Debug, Default)]
pub struct Worker {
    /// Registers.
    pub regs: Regs,
    /// FP state.
    pub fp: WorkerFp,
    /// Whether it owns its slot.
    pub running: bool,
    /// Next cycle it may issue.
    pub next_issue: u64,
    rpt_left: u32,
    rpt_start: u32,
    rpt_end: u32,
}

/// The AMP weight store decoded to f32 (a cache of `Shared::cwei`, refreshed by `ldcwei`).
#[derive(Clone, Copy, Debug)]
pub struct CweiDecoded {
    /// The 256 f16 values.
    pub f16: [f32; CWEI_BYTES / 2],
    /// The 512 FP8 values as F143 (`[0]`) and F152 (`[1]`), decoded at the first `f8amp` after a
    /// load ([`Self::f8_views`]): f16 matmuls never pay for them.
    f8: [[f32; CWEI_BYTES]; 2],
    /// Whether `f8` holds the store's current bytes.
    f8_fresh: bool,
}

impl Default for CweiDecoded {
    fn default() -> Self {
        CweiDecoded { f16: [0.0; CWEI_BYTES / 2], f8: [[0.0; CWEI_BYTES]; 2], f8_fresh: true }
    }
}

impl CweiDecoded {
    /// Decode `bytes` as f16 now, and as FP8 when first asked.
    fn refresh(&mut self, bytes: &[u8; CWEI_BYTES]) {
        for (i, v) in self.f16.iter_mut().enumerate() {
            *v = crate::f16bits::to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]));
        }
        self.f8_fresh = false;
    }

    /// The FP8 views of `bytes`, the bytes `refresh` was last given ([`Shared::cwei_f8`] is the
    /// only caller, with the store's own bytes).
    fn f8_views(&mut self, bytes: &[u8; CWEI_BYTES]) -> &[[f32; CWEI_BYTES]; 2] {
        if !self.f8_fresh {
            for (fmt, view) in
                [crate::fp8::Fp8Format::E4M3, crate::fp8::Fp8Format::E5M2].iter().zip(self.f8.iter_mut())
            {
                for (v, b) in view.iter_mut().zip(bytes) {
                    *v = crate::fp8::to_f32(*b, *fmt);
                }
            }
            self.f8_fresh = true;
        }
        &self.f8
    }
}

/// State shared by all contexts of a tile.
#[derive(Clone, Copy, Debug)]
pub struct Shared {
    /// Logical tile id.
    pub id: u16,
    /// AMP weight store ([`Shared::load_cwei`] keeps it and its decoded views together).
    cwei: [u8; CWEI_BYTES],
    /// The weight store decoded: as 256 f16 at each load, and as 512 FP8 in each format at the
    /// first `f8amp` after it.
    pub cwei_f32: CweiDecoded,
    /// `$FP_INFMT`.
    pub fp_infmt: u32,
    /// `$FP_ISCL`.
    pub fp_iscl: u32,
    /// `$OUTGOING_BASE`.
    pub outgoing_base: u32,
}

impl Shared {
    /// Load the AMP weight store (`ldcwei`) and its f16 view; the FP8 views follow when asked.
    pub fn load_cwei(&mut self, bytes: &[u8; CWEI_BYTES]) {
        self.cwei = *bytes;
        self.cwei_f32.refresh(bytes);
    }

    /// Load the first half of the weight store (`ldcweih`): the rest keeps its bytes.
    pub fn load_cwei_half(&mut self, bytes: &[u8; CWEI_HALF_BYTES]) {
        let mut all = self.cwei;
        all[..CWEI_HALF_BYTES].copy_from_slice(bytes);
        self.load_cwei(&all);
    }

    /// The weight store as 512 FP8 values in each format, F143 (`[0]`) and F152 (`[1]`).
    pub fn cwei_f8(&mut self) -> &[[f32; CWEI_BYTES]; 2] {
        self.cwei_f32.f8_views(&self.cwei)
    }
}

/// What the supervisor is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SupState {
    /// Issuing.
    Running,
    /// At `sync 2`, waiting for its workers.
    WaitLocal,
    /// At an internal or host sync; the chip model releases it.
    AtSync(u32),
    /// Stopped by `halt`.
    Halted,
}

/// Why [`Tile::run`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The supervisor issued `sync zone` at `cycle` (zone 3 or 15).
    Sync {
        /// Zone.
        zone: u32,
        /// Issue cycle (the arrival).
        cycle: u64,
    },
    /// The supervisor issued `halt` at `cycle`.
    Halted {
        /// Issue cycle.
        cycle: u64,
    },
    /// The next issue would be after the cycle limit.
    Limit,
}

/// One tile's processor state (memory is passed in, so the state stays small and `no_std`).
#[derive(Clone)]
pub struct Tile {
    /// Supervisor registers.
    pub sup: Regs,
    /// Supervisor state.
    pub sup_state: SupState,
    /// Next cycle the supervisor may issue.
    pub sup_next: u64,
    /// Workers by slot.
    pub workers: [Worker; WORKERS],
    /// Shared state.
    pub shared: Shared,
    /// Issues so far (instructions or bundles).
    pub issued: u64,
    /// Cycle of the latest issue.
    pub last_cycle: u64,
    /// No context issues before this cycle (one past the latest issue, or the release cycle).
    floor: u64,
    /// Barrel slots owned by running workers (bit k = worker k), kept in step with `running`.
    owned: u32,
    decoded: DecodeCache,
    /// Whether stretches of the workers' AMP loops may run one worker at a time (`batch.rs`:
    /// the same state either way; tests turn it off to compare).
    pub batching: bool,
    /// No fast-path check before this cycle (`u64::MAX`: none until a worker enters a loop or
    /// exits, the events after which it can newly apply).
    batch_check_at: u64,
    /// Checks left after a refusal, since the last loop entry or exit.
    batch_retries: u32,
    /// Issues run by the fast path (counted in `issued` too): for tests and reports.
    pub batched: u64,
    /// Of those, the issues run round by round in the barrel's order because the workers' ranges
    /// overlap (`batch.rs`).
    pub interleaved: u64,
}

impl Tile {
    /// A reset tile whose supervisor starts at `entry` on cycle 0.
    pub fn new(id: u16, entry: u32) -> Self {
        Tile {
            sup: Regs { pc: entry, ..Regs::default() },
            sup_state: SupState::Running,
            sup_next: 0,
            workers: [Worker::default(); WORKERS],
            shared: Shared {
                id,
                cwei: [0; CWEI_BYTES],
                cwei_f32: CweiDecoded::default(),
                fp_infmt: 0,
                fp_iscl: 0,
                outgoing_base: 0,
            },
            issued: 0,
            last_cycle: 0,
            floor: 0,
            owned: 0,
            decoded: DecodeCache::default(),
            batching: true,
            batch_check_at: u64::MAX,
            batch_retries: 0,
            batched: 0,
            interleaved: 0,
        }
    }

    /// Run the fused AMP bundles with `kernels` (`amp::AmpKernels`; the specification's unless
    /// the host supplies faster ones with the same results).
    pub fn set_amp_kernels(&mut self, kernels: amp::AmpKernels) {
        self.decoded.set_amp_kernels(kernels);
    }

    /// Release the supervisor from an internal/host sync: its next issue is at `cycle`.
    pub fn release(&mut self, cycle: u64) {
        if let SupState::AtSync(_) = self.sup_state {
            self.sup_state = SupState::Running;
            self.sup_next = cycle;
            self.floor = cycle;
        }
    }

    fn owned_slots(&self) -> u32 {
        self.owned
    }

    fn sup_issue_cycle(&self, owned: u32) -> Option<u64> {
        match self.sup_state {
            SupState::Running => {}
            SupState::WaitLocal if owned == 0 => {}
            _ => return None,
        }
        if owned == (1 << WORKERS) - 1 {
            return None;
        }
        let mut t = self.sup_next.max(self.floor);
        while owned & (1 << (t % BARREL_SLOTS)) != 0 {
            t += 1;
        }
        Some(t)
    }

    /// Run until the supervisor reaches an internal/host sync, halts, or the next issue would be
    /// later than `limit`.
    pub fn run(&mut self, mem: &mut [u8], bus: &mut dyn TileBus, limit: u64) -> Result<Stop, Fault> {
        loop {
            match self.sup_state {
                SupState::Halted => return Ok(Stop::Halted { cycle: self.last_cycle }),
                SupState::AtSync(zone) => return Ok(Stop::Sync { zone, cycle: self.last_cycle }),
                _ => {}
            }
            let owned = self.owned_slots();
            if owned == 0 && self.sup_state == SupState::Running {
                // Supervisor alone: it issues at its next cycle, no barrel arbitration needed;
                // stay in this loop while nothing but its own steps can change that.
                loop {
                    let t = self.sup_next.max(self.floor);
                    if t > limit {
                        return Ok(Stop::Limit);
                    }
                    self.step_sup(mem, bus, t)?;
                    self.floor = t + 1;
                    if self.owned != 0 || self.sup_state != SupState::Running {
                        break;
                    }
                }
                continue;
            }
            if self.floor >= self.batch_check_at && self.batching && self.run_amp_rounds(mem, bus, limit)? {
                continue;
            }
            let mut best: Option<(u64, Option<usize>)> = self.sup_issue_cycle(owned).map(|t| (t, None));
            for (k, w) in self.workers.iter().enumerate() {
                if w.running && best.is_none_or(|(t, _)| w.next_issue < t) {
                    best = Some((w.next_issue, Some(k)));
                }
            }
            let Some((t, who)) = best else {
                // Unreachable by construction: a blocked supervisor always has running workers.
                return Ok(Stop::Limit);
            };
            if t > limit {
                return Ok(Stop::Limit);
            }
            match who {
                None => self.step_sup(mem, bus, t)?,
                Some(k) => self.step_worker(mem, bus, t, k)?,
            }
            self.floor = t + 1;
        }
    }

    #[inline(always)]
    fn step_sup(&mut self, mem: &mut [u8], bus: &mut dyn TileBus, t: u64) -> Result<(), Fault> {
        let pc = self.sup.pc;
        let id = self.shared.id;
        let fault = |words, k| Fault { tile: id, ctx: CtxId::Sup, pc, words, cycle: t, kind: k };
        let d = self.decoded.fetch(mem, pc).map_err(|k| fault([0, 0], k))?;
        let (words, cost, len) = (d.words(), d.cost, d.len);
        let mut cx = Cx { regs: &mut self.sup, mem, shared: &mut self.shared, fp: None, bus, cycle: t, pc };
        let flow = d.execute(&mut cx, 0).map_err(|k| fault(words, k))?;
        self.last_cycle = t;
        let mut next_pc = pc.wrapping_add(len);
        match flow {
            Flow::Next => {}
            Flow::Jump(a) => next_pc = a,
            Flow::Sync(zone::LOCAL) => {
                if self.owned_slots() != 0 {
                    self.sup_state = SupState::WaitLocal;
                    self.sup_next = t + 1;
                    return Ok(());
                }
                self.sup_state = SupState::Running;
            }
            Flow::Sync(z @ (zone::INTERNAL | zone::HOST)) => {
                if self.owned_slots() != 0 {
                    return Err(fault(words, FaultKind::WorkersRunning));
                }
                self.sup_state = SupState::AtSync(z);
            }
            Flow::Sync(z) => return Err(fault(words, FaultKind::InvalidZone(z))),
            Flow::Run { entry, arg, all } => {
                self.start_workers(t, entry, arg, all).map_err(|k| fault(words, k))?
            }
            Flow::Halt => {
                if self.owned_slots() != 0 {
                    return Err(fault(words, FaultKind::WorkersRunning));
                }
                self.sup_state = SupState::Halted;
            }
            Flow::Exit | Flow::Rpt { .. } => return Err(fault(words, FaultKind::WrongContext)),
        }
        self.issued += 1;
        self.sup.pc = next_pc;
        self.sup_next = t + cost as u64;
        Ok(())
    }

    fn start_workers(&mut self, t: u64, entry: u32, arg: u32, all: bool) -> Result<(), FaultKind> {
        let owned = self.owned_slots();
        let slots: u32 = if all {
            if owned != 0 {
                return Err(FaultKind::NoFreeWorker);
            }
            (1 << WORKERS) - 1
        } else {
            let free = !owned & ((1 << WORKERS) - 1);
            if free == 0 {
                return Err(FaultKind::NoFreeWorker);
            }
            1 << free.trailing_zeros()
        };
        for k in 0..WORKERS {
            if slots & (1 << k) != 0 {
                let first = t + 1 + (k as u64 + BARREL_SLOTS - (t + 1) % BARREL_SLOTS) % BARREL_SLOTS;
                let mut regs = Regs { pc: entry, ..Regs::default() };
                regs.m[0] = k as u32;
                regs.m[1] = arg;
                self.workers[k] = Worker { regs, running: true, next_issue: first, ..Worker::default() };
                self.owned |= 1 << k;
            }
        }
        Ok(())
    }

    fn step_worker(&mut self, mem: &mut [u8], bus: &mut dyn TileBus, t: u64, k: usize) -> Result<(), Fault> {
        let pc = self.workers[k].regs.pc;
        let ctx = CtxId::Worker(k as u8);
        let id = self.shared.id;
        let fault = |words, e| Fault { tile: id, ctx, pc, words, cycle: t, kind: e };
        let d = self.decoded.fetch(mem, pc).map_err(|e| fault([0, 0], e))?;
        let (words, cost, len) = (d.words(), d.cost, d.len);
        let w = &mut self.workers[k];
        let in_rpt = w.rpt_left > 0;
        if in_rpt && !d.is_bundle() {
            return Err(fault(words, FaultKind::RptBody));
        }
        let mut cx =
            Cx { regs: &mut w.regs, mem, shared: &mut self.shared, fp: Some(&mut w.fp), bus, cycle: t, pc };
        let flow = d.execute(&mut cx, 1).map_err(|e| fault(words, e))?;
        let w = &mut self.workers[k];
        let mut next_pc = pc.wrapping_add(len);
        match flow {
            Flow::Next => {}
            Flow::Jump(a) => next_pc = a,
            Flow::Exit => {
                w.running = false;
                self.owned &= !(1 << k);
                self.batch_check_at = 0;
                self.batch_retries = batch::RETRIES;
            }
            Flow::Rpt { count, bundles } => {
                if count > RPT_MAX_COUNT {
                    return Err(fault(words, FaultKind::RptCount(count)));
                }
                if next_pc % 8 != 0 || bundles == 0 {
                    return Err(fault(words, FaultKind::RptAlign));
                }
                if count > 0 {
                    w.rpt_left = count;
                    w.rpt_start = next_pc;
                    w.rpt_end = next_pc + 8 * bundles;
                    self.batch_check_at = 0;
                    self.batch_retries = batch::RETRIES;
                } else {
                    next_pc += 8 * bundles;
                }
            }
            _ => return Err(fault(words, FaultKind::WrongContext)),
        }
        if in_rpt && next_pc == w.rpt_end {
            w.rpt_left -= 1;
            if w.rpt_left > 0 {
                next_pc = w.rpt_start;
            }
        }
        w.regs.pc = next_pc;
        w.next_issue = t + BARREL_SLOTS * cost as u64;
        self.issued += 1;
        self.last_cycle = t;
        Ok(())
    }
}
