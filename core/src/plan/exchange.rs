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

/// A buffer's name as the exchange carries it: shared, so that the millions of events and
/// transfers of a large redistribution copy a pointer, not the name.
pub type Name = alloc::sync::Arc<str>;

/// Move `words` 32-bit words from `src+src_off` on `sender` to `dst+dst_off` on `receiver`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// Sending tile.
    pub sender: u16,
    /// Receiving tile.
    pub receiver: u16,
    /// Source buffer.
    pub src: Name,
    /// Offset in it.
    pub src_off: u32,
    /// Destination buffer.
    pub dst: Name,
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
        buffer: Name,
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
        buffer: Name,
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
    /// A tile's supervisor cannot issue an event by its cycle (the instruction before it is
    /// still issuing): the code would run late.
    Late {
        /// Tile.
        tile: u16,
        /// Index of the event in the tile's list.
        event: usize,
        /// Cycle the event needs.
        at: u64,
        /// Earliest cycle the supervisor can issue it.
        earliest: u64,
    },
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
            ScheduleError::Late { tile, event, at, earliest } => write!(
                f,
                "validation: tile {tile} exchange event {event} is due at cycle {at} but its supervisor can issue it at {earliest} at the earliest"
            ),
            ScheduleError::Misrouted { sender, receiver, word } => {
                write!(f, "validation: word {word} from tile {sender} would not land on tile {receiver}")
            }
        }
    }
}

/// Cycles a receiver needs after the release before its first pointer event.
const RECEIVER_SETUP: u64 = EXPECT_CYCLES + 1;

/// Supervisor cycles of an `Expect` event (`setzi` and `put` of `$INCOMING_DCOUNT`).
pub(super) const EXPECT_CYCLES: u64 = 2;

/// Schedule transfers greedily in the given order: each sender streams its transfers back to
/// back, each receiver takes one transfer at a time with a one-cycle gap to move its pointer.
pub fn schedule(transfers: &[Transfer]) -> Result<Schedule, ScheduleError> {
    let s = schedule_unchecked(transfers)?;
    validate(transfers, &s)?;
    Ok(s)
}

/// [`schedule`] without the word-by-word validation: for costing search candidates, whose
/// chosen plan is planned again with it.
pub fn schedule_unchecked(transfers: &[Transfer]) -> Result<Schedule, ScheduleError> {
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
    Ok(s)
}

/// One sender's piece of an all-gather: `words` from `buffer+offset` go to the same offset on
/// every other tile of its group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Sending tile.
    pub sender: u16,
    /// Buffer (same name on every tile of the group).
    pub buffer: String,
    /// Byte offset (4-aligned).
    pub offset: u32,
    /// Words.
    pub words: u32,
}

/// Schedule all-gathers: within each group (disjoint tile sets, scheduled side by side), the
/// pieces are sent one after the other and *broadcast* — every other tile of the group selects
/// the sender while its words pass (docs/target.md §5: a word is taken by every tile whose mux
/// selects its sender on arrival). Every tile of a group may both send and receive: its
/// supervisor sets pointer and mux for each incoming piece, sends its own piece in between, and
/// each start is chosen so that those instructions fit (a tile's events never overlap in time).
pub fn all_gather(groups: &[(Vec<u16>, Vec<Piece>)]) -> Result<(Schedule, Vec<Transfer>), ScheduleError> {
    let (s, transfers) = gather(groups, true);
    validate(&transfers, &s)?;
    Ok((s, transfers))
}

/// [`all_gather`]'s schedule without the word-by-word validation (and without the transfers it
/// checks): for costing search candidates, whose chosen plan is planned again with it.
pub fn all_gather_unchecked(groups: &[(Vec<u16>, Vec<Piece>)]) -> Schedule {
    gather(groups, false).0
}

fn gather(groups: &[(Vec<u16>, Vec<Piece>)], with_transfers: bool) -> (Schedule, Vec<Transfer>) {
    let mut s = Schedule::default();
    let mut transfers = Vec::new();
    for (tiles, pieces) in groups {
        // Per tile: the first cycle its supervisor is free, and the cycle after its last landing.
        let mut busy: BTreeMap<u16, u64> = tiles.iter().map(|&t| (t, EXPECT_CYCLES)).collect();
        let mut landed: BTreeMap<u16, u64> = BTreeMap::new();
        let mut expected: BTreeMap<u16, u32> = BTreeMap::new();
        let mut send_end = 0u64;
        for p in pieces.iter().filter(|p| p.words > 0) {
            let rx: Vec<u16> = tiles.iter().copied().filter(|&t| t != p.sender).collect();
            if rx.is_empty() {
                continue;
            }
            // Sender free; senders one at a time; each receiver free to issue its pointer one
            // cycle before the first arrival, after its previous piece has fully landed.
            let mut start = send_end.max(*busy.get(&p.sender).unwrap_or(&EXPECT_CYCLES));
            for &r in &rx {
                let lat = latency(p.sender, r) as u64;
                let ready = busy[&r].max(*landed.get(&r).unwrap_or(&0)) + 1;
                start = start.max(ready.saturating_sub(lat));
            }
            let w = p.words as u64;
            // One shared name for every event of the piece.
            let name: Name = p.buffer.as_str().into();
            send_end = start + w;
            busy.insert(p.sender, start + w);
            s.events.entry(p.sender).or_default().push(Event::Send {
                at: start,
                buffer: name.clone(),
                offset: p.offset,
                words: p.words,
            });
            for &r in &rx {
                let arrive = start + latency(p.sender, r) as u64;
                let ev = s.events.entry(r).or_default();
                ev.push(Event::Pointer { at: arrive - 1, buffer: name.clone(), offset: p.offset });
                ev.push(Event::Mux { at: arrive, source: p.sender });
                busy.insert(r, arrive + 1);
                landed.insert(r, arrive + w);
                *expected.entry(r).or_insert(0) += p.words;
                if with_transfers {
                    transfers.push(Transfer {
                        sender: p.sender,
                        receiver: r,
                        src: name.clone(),
                        src_off: p.offset,
                        dst: name.clone(),
                        dst_off: p.offset,
                        words: p.words,
                    });
                }
            }
        }
        for &t in tiles {
            let Some(evs) = s.events.get_mut(&t) else { continue };
            let words = expected.get(&t).copied().unwrap_or(0);
            if words > 0 {
                evs.insert(0, Event::Expect(words));
                // Park the mux once the last word has landed (and after the tile's own events).
                let end = landed[&t].max(busy[&t]);
                evs.push(Event::Mux { at: end, source: MUX_NONE });
                s.horizon = s.horizon.max(end + 1);
            } else {
                let until = busy[&t].max(send_end);
                evs.push(Event::Drain { until });
                s.horizon = s.horizon.max(until);
            }
        }
    }
    // A tile's events in time order (they were appended per piece); Expect stays first.
    for evs in s.events.values_mut() {
        evs.sort_by_key(|e| match e {
            Event::Expect(_) => 0,
            Event::Pointer { at, .. } | Event::Mux { at, .. } | Event::Send { at, .. } => *at,
            Event::Drain { until } => *until,
        });
    }
    (s, transfers)
}

/// Check that a tile's supervisor can issue every event on time, replaying the issue costs of the
/// code the runtime emits (`ipu-runtime-tile` `runtime::exchange`, docs/target.md §4.3): `Expect`
/// is two instructions; a pointer or mux event is one delayed-effect instruction issued no later
/// than its cycle (cost: delay + 1); a send of n words costs n cycles from its start; a drain waits.
/// Returns the cycle after the tile's last exchange instruction.
pub fn check_issue(tile: u16, events: &[Event]) -> Result<u64, ScheduleError> {
    let mut t = 0u64;
    for (i, e) in events.iter().enumerate() {
        let late = |at: u64, t: u64| ScheduleError::Late { tile, event: i, at, earliest: t };
        match e {
            Event::Expect(_) => t += EXPECT_CYCLES,
            Event::Pointer { at, .. } | Event::Mux { at, .. } => {
                if *at < t {
                    return Err(late(*at, t));
                }
                t = at + 1;
            }
            Event::Send { at, words, .. } => {
                if *at < t {
                    return Err(late(*at, t));
                }
                t = at + *words as u64;
            }
            Event::Drain { until } => t = t.max(*until),
        }
    }
    Ok(t)
}

pub use super::validate::validate;

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(tiles: &[u16], words: u32) -> Vec<Piece> {
        tiles
            .iter()
            .map(|&t| Piece { sender: t, buffer: "k".into(), offset: 4 * words * t as u32, words })
            .collect()
    }

    #[test]
    fn all_gather_broadcasts_each_piece_once_to_every_other_tile() {
        let tiles = [0u16, 1, 2, 5];
        let (s, transfers) = all_gather(&[(tiles.to_vec(), pieces(&tiles, 8))]).unwrap();
        assert_eq!(transfers.len(), 4 * 3);
        for t in tiles {
            let evs = &s.events[&t];
            assert_eq!(evs[0], Event::Expect(24), "tile {t} receives three pieces of 8 words");
            assert_eq!(evs.iter().filter(|e| matches!(e, Event::Send { .. })).count(), 1);
        }
        // The four pieces go one after the other; the last travels at least 11 cycles.
        assert!(s.horizon >= 4 * 8 + 11, "{}", s.horizon);
    }

    #[test]
    fn validation_rejects_a_mux_one_cycle_late() {
        let tiles = [0u16, 1, 2];
        let (mut s, transfers) = all_gather(&[(tiles.to_vec(), pieces(&tiles, 4))]).unwrap();
        let ev = s.events.get_mut(&2).unwrap();
        let i = ev.iter().position(|e| matches!(e, Event::Mux { source: 0, .. })).unwrap();
        if let Event::Mux { at, .. } = &mut ev[i] {
            *at += 1;
        }
        assert_eq!(
            validate(&transfers, &s),
            Err(ScheduleError::Misrouted { sender: 0, receiver: 2, word: 0 })
        );
    }

    #[test]
    fn validation_rejects_events_the_supervisor_cannot_issue_in_time() {
        let tiles = [0u16, 1, 2];
        let (mut s, transfers) = all_gather(&[(tiles.to_vec(), pieces(&tiles, 4))]).unwrap();
        // Tile 1 sends 4 words; a pointer due one cycle before its send ends cannot be issued.
        let ev = s.events.get_mut(&1).unwrap();
        let send =
            ev.iter().find_map(|e| if let Event::Send { at, .. } = e { Some(*at) } else { None }).unwrap();
        let i = ev.iter().position(|e| matches!(e, Event::Send { .. })).unwrap();
        ev.insert(i + 1, Event::Pointer { at: send + 3, buffer: "k".into(), offset: 0 });
        assert_eq!(
            validate(&transfers, &s),
            Err(ScheduleError::Late { tile: 1, event: i + 1, at: send + 3, earliest: send + 4 })
        );
    }

    #[test]
    fn validation_rejects_a_tile_that_takes_words_meant_for_others() {
        // Tile 3 is in no transfer but selects tile 0 while its piece passes.
        let tiles = [0u16, 1];
        let (mut s, transfers) = all_gather(&[(tiles.to_vec(), pieces(&tiles, 4))]).unwrap();
        s.events.insert(3, alloc::vec![Event::Mux { at: 0, source: 0 }]);
        assert!(matches!(
            validate(&transfers, &s),
            Err(ScheduleError::Misrouted { sender: 0, receiver: 3, .. })
        ));
    }

    #[test]
    fn validation_rejects_words_landing_at_the_wrong_offset() {
        // Tile 2's pointer for tile 0's piece is set one word too far: every word lands shifted.
        let tiles = [0u16, 1, 2];
        let (mut s, transfers) = all_gather(&[(tiles.to_vec(), pieces(&tiles, 4))]).unwrap();
        let ev = s.events.get_mut(&2).unwrap();
        let mux = ev.iter().position(|e| matches!(e, Event::Mux { source: 0, .. })).unwrap();
        if let Event::Pointer { offset, .. } = &mut ev[mux - 1] {
            *offset += 4;
        } else {
            panic!("the pointer is set just before the mux: {:?}", ev[mux - 1]);
        }
        assert_eq!(
            validate(&transfers, &s),
            Err(ScheduleError::Misrouted { sender: 0, receiver: 2, word: 0 })
        );
    }

    #[test]
    fn validation_rejects_a_word_sent_twice() {
        // Tile 0 sends its piece a second time after everything landed; nobody selects it, but a
        // transfer's words must leave the sender exactly once.
        let tiles = [0u16, 1];
        let (mut s, transfers) = all_gather(&[(tiles.to_vec(), pieces(&tiles, 4))]).unwrap();
        let again = Event::Send { at: s.horizon + 10, buffer: "k".into(), offset: 0, words: 4 };
        s.events.get_mut(&0).unwrap().push(again);
        let r = validate(&transfers, &s);
        assert!(matches!(r, Err(ScheduleError::Misrouted { sender: 0, .. })), "{r:?} {:?}", s.events[&0]);
    }
}
