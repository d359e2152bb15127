//! The exchange fabric (docs/target.md §5): per-tile logs of what each tile sent and how it
//! steered its incoming mux and pointer during a superstep, and their resolution at the sync.

use crate::device::ExchangeFault;
use ipu_core::target::{in_tile_memory, MUX_NONE, TILE_MEM_BASE};
use ipu_core::tile::TileBus;
use ipu_core::topology::latency;
use rayon::prelude::*;

/// What one tile did on the fabric in the current superstep, plus its persistent CSR state.
#[derive(Clone, Debug)]
pub struct TileLog {
    /// Cycle each sent word left, in order.
    pub send_cycles: Vec<u64>,
    /// The sent words.
    pub send_words: Vec<u32>,
    /// Mux changes `(effective cycle, source)`.
    pub mux: Vec<(u64, u32)>,
    /// Pointer changes `(effective cycle, address)`.
    pub ptr: Vec<(u64, u32)>,
    /// Expected words `(cycle set, count)`.
    pub dcount: Option<(u64, u32)>,
    /// Mux value at the start of the superstep.
    pub mux_start: u32,
    /// Pointer at the start of the superstep.
    pub ptr_start: u32,
}

impl Default for TileLog {
    fn default() -> Self {
        TileLog {
            send_cycles: Vec::new(),
            send_words: Vec::new(),
            mux: Vec::new(),
            ptr: Vec::new(),
            dcount: None,
            mux_start: MUX_NONE as u32,
            ptr_start: TILE_MEM_BASE,
        }
    }
}

impl TileBus for TileLog {
    fn send(&mut self, cycle: u64, bytes: &[u8]) {
        for (i, w) in bytes.chunks_exact(4).enumerate() {
            self.send_cycles.push(cycle + i as u64);
            self.send_words.push(u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
        }
    }
    fn set_mux(&mut self, cycle: u64, source: u32) {
        self.mux.push((cycle, source));
    }
    fn set_incoming_ptr(&mut self, cycle: u64, addr: u32) {
        self.ptr.push((cycle, addr));
    }
    fn set_dcount(&mut self, cycle: u64, words: u32) {
        self.dcount = Some((cycle, words));
    }
}

impl TileLog {
    /// Mux timeline sorted by effective cycle (stable: later instructions win on ties).
    fn mux_timeline(&self) -> Vec<(u64, u32)> {
        let mut t = Vec::with_capacity(self.mux.len() + 1);
        t.push((0, self.mux_start));
        t.extend_from_slice(&self.mux);
        t.sort_by_key(|(c, _)| *c);
        t
    }

    fn mux_at(timeline: &[(u64, u32)], cycle: u64) -> u32 {
        let i = timeline.partition_point(|(c, _)| *c <= cycle);
        timeline[i.saturating_sub(1)].1
    }

    /// Carry the CSR state into the next superstep and clear the logs.
    fn close(&mut self, ptr_end: u32) {
        let tl = self.mux_timeline();
        self.mux_start = tl.last().map(|m| m.1).unwrap_or(MUX_NONE as u32);
        self.ptr_start = ptr_end;
        self.send_cycles.clear();
        self.send_words.clear();
        self.mux.clear();
        self.ptr.clear();
        self.dcount = None;
    }
}

/// Words one receiver takes: `(arrival, sender, index in sender's stream, address, word)`.
type Landing = (u64, u16, usize, u32, u32);

/// What one receiver took: its landings, its pointer at the end, and a count fault (reported
/// only after lost words, which are the likelier cause of a wrong count).
type Received = (Vec<Landing>, u32, Option<ExchangeFault>);

fn receive(d: u16, logs: &[TileLog], release: u64) -> Result<Received, ExchangeFault> {
    let log = &logs[d as usize];
    let tl = log.mux_timeline();
    let mut arrivals: Vec<(u64, u16, usize)> = Vec::new();
    for (i, &(from, src)) in tl.iter().enumerate() {
        let to = tl.get(i + 1).map(|x| x.0).unwrap_or(u64::MAX);
        if src as usize >= logs.len() || from >= to {
            continue;
        }
        let s = src as u16;
        let lat = latency(s, d) as u64;
        let sl = &logs[s as usize];
        let lo = sl.send_cycles.partition_point(|&t| t + lat < from);
        let hi = sl.send_cycles.partition_point(|&t| t + lat < to);
        for idx in lo..hi {
            arrivals.push((sl.send_cycles[idx] + lat, s, idx));
        }
    }
    arrivals.sort_unstable();
    let mut ptrs = log.ptr.clone();
    ptrs.sort_by_key(|(c, _)| *c);
    let mut ptr = log.ptr_start;
    let mut next_ptr = 0;
    let mut out = Vec::with_capacity(arrivals.len());
    for (arrival, s, idx) in arrivals {
        while next_ptr < ptrs.len() && ptrs[next_ptr].0 <= arrival {
            ptr = ptrs[next_ptr].1;
            next_ptr += 1;
        }
        if arrival >= release {
            return Err(ExchangeFault::Late { sender: s, receiver: d, arrival, release });
        }
        if !in_tile_memory(ptr, 4) || !ptr.is_multiple_of(4) {
            return Err(ExchangeFault::OutOfRange { receiver: d, addr: ptr, cycle: arrival });
        }
        out.push((arrival, s, idx, ptr, logs[s as usize].send_words[idx]));
        ptr = ptr.wrapping_add(4);
    }
    while next_ptr < ptrs.len() {
        ptr = ptrs[next_ptr].1;
        next_ptr += 1;
    }
    // docs/target.md §5: every landing decrements `$INCOMING_DCOUNT`, and any tile whose count is
    // not 0 at the closing sync faults. A successful sync leaves every count at 0, so a tile that
    // did not set the count this superstep expects no words at all.
    let (expected, landed) = match log.dcount {
        Some((set, n)) => (n as u64, out.iter().filter(|l| l.0 >= set).count() as u64),
        None => (0, out.len() as u64),
    };
    let count = if landed < expected {
        Some(ExchangeFault::Missing { receiver: d, expected: (expected - landed) as u32 })
    } else if landed > expected {
        Some(ExchangeFault::Unexpected { receiver: d, extra: (landed - expected) as u32 })
    } else {
        None
    };
    Ok((out, ptr, count))
}

/// Explain a lost word: find the tile whose mux selected the sender nearest in time.
fn explain_lost(s: u16, idx: usize, logs: &[TileLog]) -> ExchangeFault {
    let cycle = logs[s as usize].send_cycles[idx];
    let mut best: Option<(u64, u16, u64, u32, u64)> = None; // (distance, d, arrival, mux, from)
    for (d, log) in logs.iter().enumerate() {
        let tl = log.mux_timeline();
        let arrival = cycle + latency(s, d as u16) as u64;
        for (i, &(from, src)) in tl.iter().enumerate() {
            if src != s as u32 {
                continue;
            }
            let to = tl.get(i + 1).map(|x| x.0).unwrap_or(u64::MAX);
            let dist = if arrival < from { from - arrival } else { arrival.saturating_sub(to - 1) };
            if best.is_none_or(|b| dist < b.0) {
                best = Some((dist, d as u16, arrival, TileLog::mux_at(&tl, arrival), from));
            }
        }
    }
    match best {
        Some((_, d, arrival, mux, from)) => ExchangeFault::Lost {
            sender: s,
            cycle,
            word: idx,
            receiver: Some(d),
            arrival,
            mux_at_arrival: mux,
            selects_from: Some(from),
        },
        None => ExchangeFault::Lost {
            sender: s,
            cycle,
            word: idx,
            receiver: None,
            arrival: 0,
            mux_at_arrival: MUX_NONE as u32,
            selects_from: None,
        },
    }
}

/// Resolve a superstep: deliver every word into receiver memory, check that every word landed
/// somewhere, and reset the logs. `mems[d]` is tile `d`'s memory. Deterministic for any thread
/// count: receivers are independent and errors are reported for the lowest tile id.
pub fn resolve(logs: &mut [TileLog], mems: &mut [Vec<u8>], release: u64) -> Result<u64, ExchangeFault> {
    if logs.iter().all(|l| l.send_words.is_empty() && l.dcount.is_none()) {
        for l in logs.iter_mut() {
            let end = l.ptr.iter().max_by_key(|p| p.0).map(|p| p.1).unwrap_or(l.ptr_start);
            l.close(end);
        }
        return Ok(0);
    }
    let shared: &[TileLog] = logs;
    let results: Vec<Result<Received, ExchangeFault>> =
        (0..shared.len()).into_par_iter().map(|d| receive(d as u16, shared, release)).collect();
    let mut received = Vec::with_capacity(results.len());
    for r in results {
        received.push(r?);
    }
    // Every sent word must land somewhere.
    let mut taken: Vec<Vec<bool>> = shared.iter().map(|l| vec![false; l.send_words.len()]).collect();
    for (land, _, _) in &received {
        for &(_, s, idx, _, _) in land {
            taken[s as usize][idx] = true;
        }
    }
    for (s, t) in taken.iter().enumerate() {
        if let Some(idx) = t.iter().position(|x| !x) {
            return Err(explain_lost(s as u16, idx, shared));
        }
    }
    if let Some(f) = received.iter().find_map(|r| r.2.clone()) {
        return Err(f);
    }
    let mut words = 0u64;
    mems.par_iter_mut().zip(received.par_iter()).for_each(|(mem, (land, _, _))| {
        for &(_, _, _, addr, w) in land {
            let o = (addr - TILE_MEM_BASE) as usize;
            mem[o..o + 4].copy_from_slice(&w.to_le_bytes());
        }
    });
    for (log, (land, end, _)) in logs.iter_mut().zip(received) {
        words += land.len() as u64;
        log.close(end);
    }
    Ok(words)
}
