//! Exchange scheduling (docs/target.md §5): turn transfers into timed per-tile events, and
//! validate the events against the fabric model before any code is emitted.
//!
//! Times are cycles after the sync release that opens the exchange superstep; a tile's first
//! instruction after the release issues at 0 and the supervisor issues one instruction per cycle.

use alloc::collections::BTreeMap;
use alloc::string::String;

use alloc::vec::Vec;

use crate::target::MUX_NONE;
use crate::topology::latency;

/// Move `words` 32-bit words from `src+src_off` on `sender` to `dst+dst_off` on `receiver`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// Sending tile.
    pub sender: u16,
    /// Receiving tile.
    pub receiver: u16,
    /// Source buffer.
    pub src: String,
    /// Offset in it.
    pub src_off: u32,
    /// Destination buffer.
    pub dst: String,
    /// Offset in it.
    pub dst_off: u32,
    /// Words.
    pub words: u32,
}

/// A timed exchange action of one tile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Receiver: expect this many words before the closing sync (`$INCOMING_DCOUNT`); 2 cycles.
    Expect(u32),
    /// Receiver: incoming pointer becomes `buffer+offset` at cycle `at`.
    Pointer {
        /// Effective cycle.
        at: u64,
        /// Buffer.
        buffer: String,
        /// Offset.
        offset: u32,
    },
    /// Receiver: incoming mux selects `source` (or `MUX_NONE`) from cycle `at`.
    Mux {
        /// Effective cycle.
        at: u64,
        /// Source tile.
        source: u16,
    },
    /// Sender: words leave from cycle `at`, one per cycle.
    Send {
        /// First word's cycle.
        at: u64,
        /// Buffer.
        buffer: String,
        /// Offset.
        offset: u32,
        /// Words.
        words: u32,
    },
    /// Wait so that the closing sync issues no earlier than `until`.
    Drain {
        /// Cycle.
        until: u64,
    },
}

/// Events per tile and the cycle at which the last tile reaches the closing sync.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    /// Events of each tile that takes part.
    pub events: BTreeMap<u16, Vec<Event>>,
    /// Latest closing-sync issue cycle over all tiles.
    pub horizon: u64,
}

/// Why a schedule is invalid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScheduleError {
    /// A tile both sends and receives in one superstep (not supported by the code generator).
    SendAndReceive(u16),
    /// Validation found a word that would not land where intended.
    Misrouted {
        /// Sender.
        sender: u16,
        /// Intended receiver.
        receiver: u16,
        /// Word index in the transfer.
        word: u32,
    },
}

impl core::fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ScheduleError::SendAndReceive(t) => write!(f, "tile {t} both sends and receives in one exchange"),
            ScheduleError::Misrouted { sender, receiver, word } => {
                write!(f, "validation: word {word} from tile {sender} would not land on tile {receiver}")
            }
        }
    }
}

/// Cycles a receiver needs after the release before its first pointer event.
const RECEIVER_SETUP: u64 = 3;

/// Schedule transfers greedily in the given order: each sender streams its transfers back to
/// back, each receiver takes one transfer at a time with a one-cycle gap to move its pointer.
pub fn schedule(transfers: &[Transfer]) -> Result<Schedule, ScheduleError> {
    let mut send_free: BTreeMap<u16, u64> = BTreeMap::new();
    let mut recv_free: BTreeMap<u16, u64> = BTreeMap::new();
    let mut s = Schedule::default();
    let mut expect: BTreeMap<u16, u32> = BTreeMap::new();
    let mut last_arrival: BTreeMap<u16, u64> = BTreeMap::new();
    for t in transfers {
        if recv_free.contains_key(&t.sender) {
            return Err(ScheduleError::SendAndReceive(t.sender));
        }
        if send_free.contains_key(&t.receiver) {
            return Err(ScheduleError::SendAndReceive(t.receiver));
        }
        let lat = latency(t.sender, t.receiver) as u64;
        let sf = *send_free.get(&t.sender).unwrap_or(&0);
        let rf = *recv_free.get(&t.receiver).unwrap_or(&RECEIVER_SETUP);
        let start = sf.max(rf.saturating_sub(lat));
        let arrive = start + lat;
        let w = t.words as u64;
        send_free.insert(t.sender, start + w);
        recv_free.insert(t.receiver, arrive + w + 1);
        *expect.entry(t.receiver).or_insert(0) += t.words;
        let la = last_arrival.entry(t.sender).or_insert(0);
        *la = (*la).max(arrive + w);
        s.events.entry(t.sender).or_default().push(Event::Send {
            at: start,
            buffer: t.src.clone(),
            offset: t.src_off,
            words: t.words,
        });
        let rx = s.events.entry(t.receiver).or_default();
        rx.push(Event::Pointer { at: arrive - 1, buffer: t.dst.clone(), offset: t.dst_off });
        rx.push(Event::Mux { at: arrive, source: t.sender });
    }
    for (tile, evs) in s.events.iter_mut() {
        if let Some(words) = expect.get(tile) {
            evs.insert(0, Event::Expect(*words));
            // Park the mux after the last word so later sends by the same source cannot land here.
            let end = recv_free[tile] - 1;
            evs.push(Event::Mux { at: end, source: MUX_NONE });
            s.horizon = s.horizon.max(end + 1);
        } else {
            let until = last_arrival[tile];
            evs.push(Event::Drain { until });
            s.horizon = s.horizon.max(until);
        }
    }
    validate(transfers, &s)?;
    Ok(s)
}

/// Check the events against the fabric model: every word of every transfer is selected by its
/// receiver's mux on arrival and written at the intended offset, and no other tile takes it.
pub fn validate(transfers: &[Transfer], s: &Schedule) -> Result<(), ScheduleError> {
    // Reconstruct each sender's stream (cycle → (transfer, word)) from its Send events.
    let mut streams: BTreeMap<u16, Vec<(u64, String, u32)>> = BTreeMap::new();
    for (tile, evs) in &s.events {
        for e in evs {
            if let Event::Send { at, buffer, offset, words } = e {
                for i in 0..*words {
                    streams.entry(*tile).or_default().push((at + i as u64, buffer.clone(), offset + 4 * i));
                }
            }
        }
    }
    // Mux and pointer timelines.
    let mut muxes: BTreeMap<u16, Vec<(u64, u16)>> = BTreeMap::new();
    let mut ptrs: BTreeMap<u16, Vec<(u64, String, u32)>> = BTreeMap::new();
    for (tile, evs) in &s.events {
        for e in evs {
            match e {
                Event::Mux { at, source } => muxes.entry(*tile).or_default().push((*at, *source)),
                Event::Pointer { at, buffer, offset } => {
                    ptrs.entry(*tile).or_default().push((*at, buffer.clone(), *offset))
                }
                _ => {}
            }
        }
    }
    let mux_at = |tile: u16, cycle: u64| -> u16 {
        muxes
            .get(&tile)
            .and_then(|m| m.iter().rev().find(|(c, _)| *c <= cycle))
            .map(|x| x.1)
            .unwrap_or(MUX_NONE)
    };
    // Walk each receiver's arrivals in time order and replay its pointer.
    for t in transfers {
        let stream = streams.get(&t.sender).map(Vec::as_slice).unwrap_or(&[]);
        let lat = latency(t.sender, t.receiver) as u64;
        let mine: Vec<&(u64, String, u32)> = stream
            .iter()
            .filter(|(_, b, o)| *b == t.src && *o >= t.src_off && *o < t.src_off + 4 * t.words)
            .collect();
        if mine.len() != t.words as usize {
            return Err(ScheduleError::Misrouted { sender: t.sender, receiver: t.receiver, word: 0 });
        }
        for (i, (sent, _, _)) in mine.iter().enumerate() {
            let arrival = sent + lat;
            let bad = ScheduleError::Misrouted { sender: t.sender, receiver: t.receiver, word: i as u32 };
            if mux_at(t.receiver, arrival) != t.sender {
                return Err(bad);
            }
            // Pointer: last set at or before the arrival, advanced by words landed since.
            let p = ptrs
                .get(&t.receiver)
                .and_then(|p| p.iter().rev().find(|(c, _, _)| *c <= arrival))
                .ok_or(bad.clone())?;
            let landed_since =
                stream.iter().filter(|(c, _, _)| c + lat >= p.0 && c + lat < arrival).count() as u32;
            if p.1 != t.dst || p.2 + 4 * landed_since != t.dst_off + 4 * i as u32 {
                return Err(bad);
            }
            // No other tile in the schedule selects this sender when the word passes it.
            for (&other, _) in muxes.iter().filter(|(o, _)| **o != t.receiver) {
                if mux_at(other, sent + latency(t.sender, other) as u64) == t.sender {
                    return Err(bad);
                }
            }
        }
    }
    Ok(())
}
