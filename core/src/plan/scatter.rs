//! Point-to-point and multicast exchange for redistributions (docs/graph-planner.md §4): any tile
//! may send and receive in the same superstep, a piece may go to several receivers at their own
//! destinations, and every receiver parks its mux after each piece, so words a sender streams
//! later can never land in the wrong place.
//!
//! Greedy list scheduling in the given piece order: a piece starts when its sender's supervisor is
//! free and every receiver can set its pointer one cycle before the first word arrives, after its
//! previous piece has landed. A tile's supervisor does one thing at a time (docs/target.md §4.3):
//! a send occupies it one cycle per word and each pointer or mux change one cycle, so a piece is
//! moved later until those cycles are free on every tile involved (a tile sends while it
//! receives, between its receiver's events). The schedule is validated word by word by
//! [`exchange::validate`] before it is returned.

use alloc::collections::{BTreeMap, BinaryHeap};
use alloc::vec::Vec;
use core::cmp::Reverse;

use super::exchange::{self, Event, Name, Schedule, ScheduleError, Transfer, EXPECT_CYCLES};
use crate::target::MUX_NONE;
use crate::topology::latency;

/// Words from one sender to one or more receivers, each with its own destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Multicast {
    /// Sending tile.
    pub sender: u16,
    /// Source buffer on the sender.
    pub src: Name,
    /// Byte offset in it (4-aligned).
    pub src_off: u32,
    /// Words.
    pub words: u32,
    /// Receivers: tile, destination buffer, byte offset (4-aligned). Never the sender.
    pub to: Vec<(u16, Name, u32)>,
}

/// Cycles a tile's supervisor is occupied: disjoint `[start, end)` intervals keyed by start,
/// touching intervals merged, and the end of the last one kept so that the common query (a cycle
/// after everything the tile has been given so far) needs no search.
#[derive(Default)]
struct Busy {
    spans: BTreeMap<u64, u64>,
    end: u64,
}

impl Busy {
    /// End of an occupied interval that overlaps `[a, b)`, if any.
    fn conflict(&self, a: u64, b: u64) -> Option<u64> {
        if a >= self.end {
            return None;
        }
        self.spans.range(..b).next_back().and_then(|(_, &end)| (end > a).then_some(end))
    }
    fn take(&mut self, mut a: u64, mut b: u64) {
        // Join an interval ending at `a` and one starting at `b` (the caller never overlaps).
        if let Some((&s, &e)) = self.spans.range(..=a).next_back() {
            if e == a {
                a = s;
            }
        }
        if let Some(e) = self.spans.remove(&b) {
            b = e;
        }
        self.spans.insert(a, b);
        self.end = self.end.max(b);
    }
}

/// What the scheduler knows about every tile so far, indexed by tile.
#[derive(Default)]
struct State {
    /// Each tile's occupied supervisor cycles (receivers start with their `Expect`).
    busy: Vec<Busy>,
    /// A sender's next free send cycle.
    send_end: Vec<u64>,
    /// A receiver's cycle after its last landed word (pieces reach a receiver one after another).
    landed: Vec<u64>,
    /// The cycle after a sender's last word lands anywhere.
    arrived: Vec<u64>,
    /// Words each receiver expects (`None`: not a receiver).
    expected: Vec<Option<u32>>,
}

impl State {
    /// The earliest cycle piece `p` can start: its sender free, each receiver able to set its
    /// pointer one cycle before the first word after its previous piece landed, and the send and
    /// each receiver's pointer, mux and park cycles on free supervisor cycles.
    fn earliest(&self, p: &Multicast) -> u64 {
        let w = p.words as u64;
        let mut start = self.send_end[p.sender as usize];
        for (r, _, _) in &p.to {
            let ready = self.landed[*r as usize].max(EXPECT_CYCLES) + 1;
            start = start.max(ready.saturating_sub(latency(p.sender, *r) as u64));
        }
        loop {
            let mut later = self.busy[p.sender as usize].conflict(start, start + w);
            for (r, _, _) in &p.to {
                let arrive = start + latency(p.sender, *r) as u64;
                let b = &self.busy[*r as usize];
                for c in [arrive - 1, arrive, arrive + w] {
                    if let Some(end) = b.conflict(c, c + 1) {
                        later = Some(later.unwrap_or(0).max(start + (end - c)));
                    }
                }
            }
            match later {
                Some(t) => start = t.max(start + 1),
                None => return start,
            }
        }
    }

    /// Place piece `p` at `start`: its events, and the transfers they implement.
    fn place(&mut self, p: &Multicast, start: u64, s: &mut Schedule, transfers: &mut Vec<Transfer>) {
        let w = p.words as u64;
        self.busy[p.sender as usize].take(start, start + w);
        self.send_end[p.sender as usize] = start + w;
        s.events.entry(p.sender).or_default().push(Event::Send {
            at: start,
            buffer: p.src.clone(),
            offset: p.src_off,
            words: p.words,
        });
        for (r, dst, dst_off) in &p.to {
            let arrive = start + latency(p.sender, *r) as u64;
            let b = &mut self.busy[*r as usize];
            for c in [arrive - 1, arrive, arrive + w] {
                b.take(c, c + 1);
            }
            let ev = s.events.entry(*r).or_default();
            ev.push(Event::Pointer { at: arrive - 1, buffer: dst.clone(), offset: *dst_off });
            ev.push(Event::Mux { at: arrive, source: p.sender });
            ev.push(Event::Mux { at: arrive + w, source: MUX_NONE });
            self.landed[*r as usize] = arrive + w;
            *self.expected[*r as usize].get_or_insert(0) += p.words;
            let a = &mut self.arrived[p.sender as usize];
            *a = (*a).max(arrive + w);
            transfers.push(Transfer {
                sender: p.sender,
                receiver: *r,
                src: p.src.clone(),
                src_off: p.src_off,
                dst: dst.clone(),
                dst_off: *dst_off,
                words: p.words,
            });
        }
    }
}

/// Schedule pieces; returns the per-tile events and the transfers they implement. Each sender's
/// pieces go in the given order; among the senders, the piece that can start earliest goes next
/// (list scheduling; ties to the lower sender). Start times only grow as pieces are placed, so a
/// lazily re-checked heap finds that piece without re-evaluating every sender each time.
pub fn scatter(pieces: &[Multicast]) -> Result<(Schedule, Vec<Transfer>), ScheduleError> {
    let tiles = pieces.iter().flat_map(|p| core::iter::once(p.sender).chain(p.to.iter().map(|t| t.0))).max();
    let n = tiles.map_or(0, |t| t as usize + 1);
    let mut st = State {
        busy: (0..n).map(|_| Busy::default()).collect(),
        send_end: alloc::vec![0; n],
        landed: alloc::vec![0; n],
        arrived: alloc::vec![0; n],
        expected: alloc::vec![None; n],
    };
    let mut receiver = alloc::vec![false; n];
    let mut queues: BTreeMap<u16, alloc::collections::VecDeque<&Multicast>> = BTreeMap::new();
    for p in pieces.iter().filter(|p| p.words > 0 && !p.to.is_empty()) {
        if let Some((r, _, _)) = p.to.iter().find(|t| t.0 == p.sender) {
            return Err(ScheduleError::SendAndReceive(*r));
        }
        for (r, _, _) in &p.to {
            if !receiver[*r as usize] {
                receiver[*r as usize] = true;
                st.busy[*r as usize].take(0, EXPECT_CYCLES);
            }
        }
        queues.entry(p.sender).or_default().push_back(p);
    }
    let mut heap: BinaryHeap<Reverse<(u64, u16)>> =
        queues.iter().map(|(&snd, q)| Reverse((st.earliest(q[0]), snd))).collect();
    let mut s = Schedule::default();
    let mut transfers = Vec::new();
    while let Some(Reverse((at, snd))) = heap.pop() {
        let Some(&p) = queues.get(&snd).and_then(|q| q.front()) else { continue };
        let now = st.earliest(p);
        if now > at {
            heap.push(Reverse((now, snd)));
            continue;
        }
        st.place(p, now, &mut s, &mut transfers);
        let q = queues.get_mut(&snd).expect("queued");
        q.pop_front();
        if let Some(next) = q.front() {
            heap.push(Reverse((st.earliest(next), snd)));
        }
    }
    for (tile, evs) in s.events.iter_mut() {
        // A tile's events in time order (sends and receptions were placed independently).
        evs.sort_by_key(|e| match e {
            Event::Pointer { at, .. } | Event::Mux { at, .. } | Event::Send { at, .. } => *at,
            Event::Expect(_) | Event::Drain { .. } => 0,
        });
        let t = *tile as usize;
        if let Some(words) = st.expected[t] {
            evs.insert(0, Event::Expect(words));
        }
        // The closing sync waits for the tile's own events and for its sent words to land.
        let until = st.busy[t].end.max(st.arrived[t]);
        evs.push(Event::Drain { until });
        s.horizon = s.horizon.max(until);
    }
    exchange::validate(&transfers, &s)?;
    Ok((s, transfers))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(sender: u16, off: u32, words: u32, to: &[(u16, u32)]) -> Multicast {
        Multicast {
            sender,
            src: "s".into(),
            src_off: off,
            words,
            to: to.iter().map(|&(t, o)| (t, Name::from("d"), o)).collect(),
        }
    }

    #[test]
    fn tiles_may_send_and_receive_in_one_superstep() {
        // A ring: every tile sends 8 words to the next and receives 8 from the previous.
        let pieces: Vec<Multicast> = (0..4u16).map(|t| piece(t, 0, 8, &[((t + 1) % 4, 0)])).collect();
        let (s, transfers) = scatter(&pieces).unwrap();
        assert_eq!(transfers.len(), 4);
        for t in 0..4u16 {
            let evs = &s.events[&t];
            assert_eq!(evs[0], Event::Expect(8), "tile {t}");
            assert_eq!(evs.iter().filter(|e| matches!(e, Event::Send { .. })).count(), 1);
        }
        // Each word travels at least the self-latency; the ring is not serialised through one tile.
        assert!(s.horizon >= 8 + 11 && s.horizon < 2 * (8 + 13 + 3), "{}", s.horizon);
    }

    #[test]
    fn a_multicast_is_sent_once_to_receivers_at_their_own_offsets() {
        let (s, transfers) = scatter(&[piece(0, 16, 4, &[(1, 0), (2, 32)])]).unwrap();
        assert_eq!(transfers.len(), 2);
        assert_eq!(s.events[&0].iter().filter(|e| matches!(e, Event::Send { .. })).count(), 1);
        let ptr = |t: u16| {
            s.events[&t].iter().find_map(|e| match e {
                Event::Pointer { offset, .. } => Some(*offset),
                _ => None,
            })
        };
        assert_eq!((ptr(1), ptr(2)), (Some(0), Some(32)));
    }

    #[test]
    fn a_sender_cannot_be_its_own_receiver() {
        assert_eq!(scatter(&[piece(3, 0, 4, &[(3, 0)])]).unwrap_err(), ScheduleError::SendAndReceive(3));
    }

    #[test]
    fn later_pieces_of_a_sender_do_not_reach_an_earlier_receiver() {
        // Tile 0 sends to 1, then to 2: tile 1 parks its mux, so the validator accepts the schedule;
        // without the park the second piece would land on tile 1 too.
        let (mut s, transfers) = scatter(&[piece(0, 0, 4, &[(1, 0)]), piece(0, 16, 4, &[(2, 0)])]).unwrap();
        let evs = s.events.get_mut(&1).unwrap();
        evs.retain(|e| !matches!(e, Event::Mux { source: MUX_NONE, .. }));
        assert!(matches!(
            exchange::validate(&transfers, &s),
            Err(ScheduleError::Misrouted { sender: 0, receiver: 1, .. })
        ));
    }
}
