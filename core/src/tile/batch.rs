//! Stretches of the workers' AMP loops run at once, without the scheduler, when that cannot change
//! anything.
//!
//! The matmul inner loop is an `rpt` over fused `{ld2st64pi ; AMP}` or `{ld2xst64pace ; AMP}`
//! bundles (`amp::fused`), run by every worker while the supervisor cannot issue. Every such
//! bundle costs 1, so the barrel gives each running worker one issue per turn, in the order of
//! their slots. A bundle loads 8 bytes at each of two addresses and stores 8 bytes at a third;
//! each address advances by an amount fixed by the bundle (8 for `ld2st64pi`; for `ld2xst64pace`
//! its stride select and the stride register, which nothing in the loop writes): a stride per
//! stream and bundle. So W rounds read and write three known sequences of addresses per worker. Besides memory, the workers share only
//! the weight store and the FP CSRs, which the AMP reads and only the supervisor writes, and the
//! code, which a store into an `rpt` body would change.
//!
//! So when, for the next W rounds, every access is aligned and inside tile memory (no fault can
//! happen) and no store reaches a body being run, the rounds run here:
//! - worker by worker (worker 0's W bundles, then worker 1's, …) when no worker's stores touch
//!   another worker's loads or stores: the order of their issues cannot matter then, and one
//!   stream at a time stays in the host's caches;
//! - otherwise round by round, each round in the barrel's order (the workers by their next issue
//!   cycle, which all fall in one turn of the barrel): the scheduler's own order.
//!
//! Either way registers, accumulators, memory, issue counts and cycles are exactly what the
//! issue-by-issue path leaves. Anything else — a pointer register shared by two streams or
//! `$m15` (or a packed pair holding `$m15`, or a stride register in it), a body with another
//! bundle or mixing the two main halves, a cycle limit inside the stretch, an access that would
//! fault — leaves the ordinary path in charge.
//!
//! The matmul kernel's first stores go to a scratch area just before the worker's rows, which its
//! neighbour's last (flush-row) loads read; so at loop entry the ranges overlap, and after a few
//! rounds the stores have moved on into the rows. While checks are left ([`RETRIES`] per loop
//! entry or exit), an overlapping stretch therefore runs only [`RETRY_ROUNDS`] rounds (and a
//! refused one waits as long) before the next check.

use super::amp::Streams;
use super::decoded::Decoded;
use super::exec::{pace_advance, Cx, FusedFn};
use super::{Fault, FaultKind, Tile, TileBus};
use crate::isa::MAX_FIELDS;
use crate::target::{in_tile_memory, BARREL_SLOTS, WORKERS};

/// Longest `rpt` body the fast path takes (the matmul loop's is 4 bundles).
const MAX_BODY: usize = 8;
/// Rounds between a refused check and the next.
pub(super) const RETRY_ROUNDS: u64 = 8;
/// Checks after the first, per loop entry or exit.
pub(super) const RETRIES: u32 = 2;
/// Fewest rounds worth running this way.
const MIN_ROUNDS: u64 = 8;

/// One worker's loop, as the fast path runs it.
#[derive(Clone, Copy)]
struct Stream {
    /// The body's bundles: the fused function, the main half's and the AMP's operands.
    body: [(FusedFn, [u32; MAX_FIELDS], [u32; MAX_FIELDS]); MAX_BODY],
    /// The addresses of the two loads and the store at the start.
    start: [u32; 3],
    /// The bytes each address advances by after each bundle of the body.
    inc: [[u32; 3]; MAX_BODY],
    /// How the body streams: packed addresses advance modulo 2^21.
    streams: Streams,
}

impl Stream {
    /// For `rounds` issues from body position `at` (of `len`): the bytes each of the three streams
    /// touches, as `[first, end)`, when every access is 8-aligned and inside tile memory.
    fn spans(&self, len: usize, at: usize, rounds: u64) -> Option<[(u64, u64); 3]> {
        let bytes = 8 * rounds;
        if self.streams == Streams::Ld2st64pi {
            // Every address advances by 8: one range each, checked at once.
            let mut out = [(0, 0); 3];
            for (o, &p) in out.iter_mut().zip(&self.start) {
                if !p.is_multiple_of(8) || !in_tile_memory(p, bytes as u32) {
                    return None;
                }
                *o = (p as u64, p as u64 + bytes);
            }
            return Some(out);
        }
        let mut out = [(u64::MAX, 0); 3];
        let mut addr = self.start;
        let mut j = at;
        for _ in 0..rounds {
            for i in 0..3 {
                let a = addr[i];
                if !a.is_multiple_of(8) || !in_tile_memory(a, 8) {
                    return None;
                }
                out[i] = (out[i].0.min(a as u64), out[i].1.max(a as u64 + 8));
                addr[i] = pace_advance(a, self.inc[j][i]);
            }
            j = if j + 1 == len { 0 } else { j + 1 };
        }
        Some(out)
    }
}

impl Tile {
    /// Runs as many rounds of the workers' AMP loops as the conditions above allow, at once.
    /// `Ok(false)` when it ran nothing.
    #[inline(never)]
    pub(super) fn run_amp_rounds(
        &mut self,
        mem: &mut [u8],
        bus: &mut dyn TileBus,
        limit: u64,
    ) -> Result<bool, Fault> {
        // The supervisor cannot issue: it waits at `sync 2`, or the workers own every slot. No
        // worker leaves its loop inside the stretch, so that stays true throughout.
        let ready = self.owned != 0
            && self.sup_issue_cycle(self.owned).is_none()
            && !self.workers.iter().any(|w| w.running && w.rpt_left == 0);
        let found = if ready { self.amp_streams(mem, limit) } else { None };
        let Some((streams, mut rounds, disjoint)) = found else {
            if ready && self.batch_retries > 0 {
                self.batch_retries -= 1;
                self.batch_check_at = self.floor + RETRY_ROUNDS * BARREL_SLOTS;
            } else {
                self.batch_check_at = u64::MAX;
            }
            return Ok(false);
        };
        let mut last = 0u64;
        if disjoint {
            for (k, s) in streams.iter().enumerate() {
                let Some(s) = s else { continue };
                for _ in 0..rounds {
                    last = last.max(self.step(k, s, mem, bus)?);
                }
                self.issued += rounds;
                self.batched += rounds;
            }
        } else {
            // The barrel's own order: round by round, the workers by their next issue cycle
            // (all within one turn of the barrel, `amp_streams` checks). While checks are left,
            // only a few rounds: overlaps at a loop's start pass, and then each worker may run
            // alone, which keeps one stream at a time in the host's caches.
            if self.batch_retries > 0 {
                self.batch_retries -= 1;
                rounds = rounds.min(RETRY_ROUNDS);
            }
            let mut order: [usize; WORKERS] = core::array::from_fn(|k| k);
            let n = streams.iter().filter(|s| s.is_some()).count();
            order.sort_by_key(|&k| (streams[k].is_none(), self.workers[k].next_issue));
            for _ in 0..rounds {
                for &k in &order[..n] {
                    let s = streams[k].as_ref().expect("a running worker's stream");
                    last = last.max(self.step(k, s, mem, bus)?);
                }
            }
            self.issued += rounds * n as u64;
            self.batched += rounds * n as u64;
            self.interleaved += rounds * n as u64;
        }
        self.last_cycle = last;
        self.floor = last + 1;
        // Check again right away: the loops may go on.
        self.batch_check_at = 0;
        Ok(true)
    }

    /// Worker `k` issues the next bundle of its loop `s`; returns the cycle it issued at.
    #[inline(always)]
    fn step(&mut self, k: usize, s: &Stream, mem: &mut [u8], bus: &mut dyn TileBus) -> Result<u64, Fault> {
        let w = &mut self.workers[k];
        let (start, end) = (w.rpt_start, w.rpt_end);
        let pc = w.regs.pc;
        let (f, main, aux) = &s.body[((pc - start) / 8) as usize];
        let t = w.next_issue;
        let mut cx =
            Cx { regs: &mut w.regs, mem, shared: &mut self.shared, fp: Some(&mut w.fp), bus, cycle: t, pc };
        // Unreachable by the checks in `amp_streams`; reported as the issue path would.
        f(&mut cx, main, aux).map_err(|kind| Fault {
            tile: self.shared.id,
            ctx: super::CtxId::Worker(k as u8),
            pc,
            words: [0, 0],
            cycle: t,
            kind,
        })?;
        let mut next_pc = pc + 8;
        if next_pc == end {
            w.rpt_left -= 1;
            if w.rpt_left > 0 {
                next_pc = start;
            }
        }
        w.regs.pc = next_pc;
        w.next_issue = t + BARREL_SLOTS;
        Ok(t)
    }

    /// Every running worker's loop as a [`Stream`], how many rounds may run at once, and whether
    /// the workers' ranges are disjoint (so each may run its rounds alone); `None` when any other
    /// condition of the module comment fails.
    #[allow(clippy::type_complexity)]
    fn amp_streams(&mut self, mem: &[u8], limit: u64) -> Option<([Option<Stream>; WORKERS], u64, bool)> {
        let mut streams_of: [Option<Stream>; WORKERS] = [None; WORKERS];
        let mut rounds = u64::MAX;
        let mut latest = 0u64;
        let mut at = [0usize; WORKERS];
        let mut lens = [0usize; WORKERS];
        for (k, w) in self.workers.iter().enumerate().filter(|(_, w)| w.running) {
            let len = ((w.rpt_end - w.rpt_start) / 8) as usize;
            if len == 0 || len > MAX_BODY || w.regs.pc < w.rpt_start || w.regs.pc >= w.rpt_end {
                return None;
            }
            let mut body = [(unused as FusedFn, [0; MAX_FIELDS], [0; MAX_FIELDS]); MAX_BODY];
            let mut inc = [[0u32; 3]; MAX_BODY];
            // The registers the main halves write (their addresses), the same in every bundle.
            let mut written: Option<(Streams, [u32; 3])> = None;
            for (i, slot) in body.iter_mut().enumerate().take(len) {
                let d: &Decoded = self.decoded.fetch(mem, w.rpt_start + 8 * i as u32).ok()?;
                let (f, streams, main, aux) = d.fused_amp()?;
                let regs = match streams {
                    // Three distinct pointer registers, none `$m15`.
                    Streams::Ld2st64pi => {
                        let r = [main[3], main[4], main[5]];
                        let distinct = r[0] != r[1] && r[0] != r[2] && r[1] != r[2];
                        if r.contains(&15) || !distinct {
                            return None;
                        }
                        r
                    }
                    // A pair without `$m15`, and a stride register outside it.
                    Streams::Ld2xst64pace => {
                        let p = main[2];
                        if p == 14 || main[3] == p || main[3] == p + 1 {
                            return None;
                        }
                        [p, p + 1, p]
                    }
                };
                if d.cost != 1 || written.is_some_and(|x| x != (streams, regs)) {
                    return None;
                }
                written = Some((streams, regs));
                inc[i] = streams.increments(&w.regs.m, &main);
                *slot = (f, main, aux);
            }
            let (streams, _) = written?;
            at[k] = ((w.regs.pc - w.rpt_start) / 8) as usize;
            lens[k] = len;
            rounds = rounds.min((len - at[k]) as u64 + (w.rpt_left as u64 - 1) * len as u64);
            latest = latest.max(w.next_issue);
            let start = streams.addresses(&w.regs.m, &body[0].1);
            streams_of[k] = Some(Stream { body, start, inc, streams });
        }
        let streams = streams_of;
        // Every issue of the stretch at or before the limit.
        if latest > limit {
            return None;
        }
        rounds = rounds.min((limit - latest) / BARREL_SLOTS + 1).min(u32::MAX as u64 / 8);
        if rounds < MIN_ROUNDS {
            return None;
        }
        let overlaps = |a: (u64, u64), b: (u64, u64)| a.0 < b.1 && b.0 < a.1;
        let code: [(u64, u64); WORKERS] = core::array::from_fn(|k| {
            let w = &self.workers[k];
            if w.running {
                (w.rpt_start as u64, w.rpt_end as u64)
            } else {
                (0, 0)
            }
        });
        let mut spans = [[(0u64, 0u64); 3]; WORKERS];
        for (k, s) in streams.iter().enumerate() {
            if let Some(s) = s {
                spans[k] = s.spans(lens[k], at[k], rounds)?;
            }
        }
        let mut disjoint = true;
        for (k, s) in streams.iter().enumerate() {
            if s.is_none() {
                continue;
            }
            let store = spans[k][2];
            if code.iter().any(|c| overlaps(store, *c)) {
                return None;
            }
            for (j, o) in streams.iter().enumerate() {
                if j != k && o.is_some() && spans[j].iter().any(|p| overlaps(store, *p)) {
                    disjoint = false;
                }
            }
        }
        // Interleaved, the rounds follow the barrel only if every worker's next issue falls in the
        // same turn of it (each then issues once per turn, as every bundle costs 1).
        let earliest = streams
            .iter()
            .zip(&self.workers)
            .filter(|(s, _)| s.is_some())
            .map(|(_, w)| w.next_issue)
            .min()?;
        if !disjoint && latest - earliest >= BARREL_SLOTS {
            return None;
        }
        Some((streams, rounds, disjoint))
    }
}

/// Fills the body slots past the loop's length (never called).
fn unused(
    _: &mut Cx<'_>,
    _: &[u32; MAX_FIELDS],
    _: &[u32; MAX_FIELDS],
) -> Result<super::exec::Flow, FaultKind> {
    Err(FaultKind::WrongContext)
}
