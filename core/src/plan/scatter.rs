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

/// Cycles a tile's supervisor is occupied, kept by kind because each kind is added in time order:
/// a receiver's `Expect` at the start, its sends (a sender's pieces go in order, each after the
/// previous), and its receiver events (pointer, mux and park, one cycle each; a receiver's pieces
/// arrive one after another). So every lookup is a binary search in a sorted vector, and the end
/// of the last occupied cycle is kept so that the common query (after everything) is one compare.
#[derive(Clone, Default)]
struct Busy {
    /// `[0, expect)` is the receiver's `Expect` (0 if the tile receives nothing).
    expect: u64,
    /// Send spans `[start, end)` in time order, touching spans merged.
    sends: Vec<(u64, u64)>,
    /// Receiver event cycles in increasing order.
    events: Vec<u64>,
    /// One past the last occupied cycle.
    end: u64,
}

impl Busy {
    /// The end of an occupied stretch that overlaps `[a, b)`, if any: every start of `[a, b)`
    /// before it overlaps it too, so a caller may move past it without missing a free start.
    fn conflict(&self, a: u64, b: u64) -> Option<u64> {
        if a >= self.end {
            return None;
        }
        if a < self.expect {
            return Some(self.expect);
        }
        let i = self.sends.partition_point(|s| s.0 < b);
        if let Some(&(_, e)) = i.checked_sub(1).and_then(|i| self.sends.get(i)) {
            if e > a {
                return Some(e);
            }
        }
        let j = self.events.partition_point(|&c| c < a);
        self.events.get(j).filter(|&&c| c < b).map(|&c| c + 1)
    }
    fn expect(&mut self, cycles: u64) {
        self.expect = cycles;
        self.end = self.end.max(cycles);
    }
    fn send(&mut self, a: u64, b: u64) {
        debug_assert!(self.sends.last().is_none_or(|s| s.1 <= a), "sends in time order");
        match self.sends.last_mut() {
            Some(last) if last.1 == a => last.1 = b,
            _ => self.sends.push((a, b)),
        }
        self.end = self.end.max(b);
    }
    fn event(&mut self, c: u64) {
        debug_assert!(self.events.last().is_none_or(|&l| l < c), "receiver events in time order");
        self.events.push(c);
        self.end = self.end.max(c + 1);
    }
}

/// What the scheduler knows about every tile so far, indexed by tile.
#[derive(Clone, Default)]
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
        let mut start = self.ready(p);
        // The smallest start at which the sender and every receiver are free. Each conflict moves
        // the start past starts that all hit the same occupied stretch, so the checks may go in any
        // order: round the tiles, moving on at once, until all of them pass at one start.
        let checks = p.to.len() + 1;
        let (mut i, mut clean) = (0usize, 0usize);
        while clean < checks {
            let later = match i.checked_sub(1).map(|k| &p.to[k]) {
                None => self.busy[p.sender as usize].conflict(start, start + w),
                Some((r, _, _)) => {
                    let arrive = start + latency(p.sender, *r) as u64;
                    let b = &self.busy[*r as usize];
                    [arrive - 1, arrive, arrive + w]
                        .into_iter()
                        .filter_map(|c| b.conflict(c, c + 1).map(|end| start + (end - c)))
                        .max()
                }
            };
            match later {
                Some(t) => {
                    start = t.max(start + 1);
                    clean = 0;
                }
                None => clean += 1,
            }
            i = (i + 1) % checks;
        }
        start
    }

    /// A lower bound of [`earliest`](Self::earliest) from array lookups only: the sender free and
    /// every receiver's previous piece landed, ignoring the supervisor calendars.
    fn ready(&self, p: &Multicast) -> u64 {
        let mut start = self.send_end[p.sender as usize];
        for (r, _, _) in &p.to {
            let ready = self.landed[*r as usize].max(EXPECT_CYCLES) + 1;
            start = start.max(ready.saturating_sub(latency(p.sender, *r) as u64));
        }
        start
    }

    /// Place piece `p` at `start`: its events, and the transfers they implement.
    fn place(&mut self, p: &Multicast, start: u64, s: &mut Schedule, transfers: &mut Option<Vec<Transfer>>) {
        self.occupy(p, start);
        record(p, start, s, transfers);
    }

    /// What placing piece `p` at `start` takes of every tile involved.
    fn occupy(&mut self, p: &Multicast, start: u64) {
        let w = p.words as u64;
        self.busy[p.sender as usize].send(start, start + w);
        self.send_end[p.sender as usize] = start + w;
        for (r, _, _) in &p.to {
            let arrive = start + latency(p.sender, *r) as u64;
            let b = &mut self.busy[*r as usize];
            for c in [arrive - 1, arrive, arrive + w] {
                b.event(c);
            }
            self.landed[*r as usize] = arrive + w;
            *self.expected[*r as usize].get_or_insert(0) += p.words;
            let a = &mut self.arrived[p.sender as usize];
            *a = (*a).max(arrive + w);
        }
    }

    /// The cycle after the last event or landing of any tile (the schedule's horizon).
    fn horizon(&self) -> u64 {
        self.busy.iter().zip(&self.arrived).map(|(b, &a)| b.end.max(a)).max().unwrap_or(0)
    }
}

/// The events of piece `p` placed at `start`, and the transfers they implement when they are to be
/// validated (`Some`).
fn record(p: &Multicast, start: u64, s: &mut Schedule, transfers: &mut Option<Vec<Transfer>>) {
    let w = p.words as u64;
    s.events.entry(p.sender).or_default().push(Event::Send {
        at: start,
        buffer: p.src.clone(),
        offset: p.src_off,
        words: p.words,
    });
    for (r, dst, dst_off) in &p.to {
        let arrive = start + latency(p.sender, *r) as u64;
        let ev = s.events.entry(*r).or_default();
        ev.push(Event::Pointer { at: arrive - 1, buffer: dst.clone(), offset: *dst_off });
        ev.push(Event::Mux { at: arrive, source: p.sender });
        ev.push(Event::Mux { at: arrive + w, source: MUX_NONE });
        let Some(transfers) = transfers.as_mut() else { continue };
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

/// Schedule pieces; returns the per-tile events and the transfers they implement. Each sender's
/// pieces go in the given order; among the senders, the piece that can start earliest goes next
/// (list scheduling; ties to the lower sender). Start times only grow as pieces are placed, so a
/// lazily re-checked heap finds that piece without re-evaluating every sender each time. Above
/// [`ORDERED_ABOVE`] receiver entries the re-checks cost minutes (every placement makes the waiting
/// senders of the same receivers re-walk hundreds of calendars), so pieces are placed in a fixed
/// order instead: sender by sender or round by round, whichever ends sooner.
pub fn scatter(pieces: &[Multicast]) -> Result<(Schedule, Vec<Transfer>), ScheduleError> {
    scatter_with(pieces, ORDERED_ABOVE, true)
}

/// [`scatter`]'s schedule without the validation and without the transfers it checks: for costing
/// search candidates, whose chosen plan is planned again with it (the same schedule).
pub fn scatter_unchecked(pieces: &[Multicast]) -> Result<Schedule, ScheduleError> {
    scatter_with(pieces, ORDERED_ABOVE, false).map(|r| r.0)
}

fn scatter_with(
    pieces: &[Multicast],
    ordered_above: usize,
    check: bool,
) -> Result<(Schedule, Vec<Transfer>), ScheduleError> {
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
                st.busy[*r as usize].expect(EXPECT_CYCLES);
            }
        }
        queues.entry(p.sender).or_default().push_back(p);
    }
    let mut s = Schedule::default();
    let mut transfers = check.then(Vec::new);
    let entries: usize = pieces.iter().map(|p| p.to.len()).sum();
    if entries > ordered_above {
        // Too many for the list scheduler, whose re-checks of waiting senders grow with senders ×
        // receivers per piece: place pieces in a fixed order instead, each at its earliest start,
        // in two orders (sender by sender; round by round), and keep the shorter schedule.
        let queues: Vec<Vec<&Multicast>> = queues.into_values().map(Vec::from).collect();
        let longest = queues.iter().map(Vec::len).max().unwrap_or(0);
        let by_sender = || queues.iter().flatten().copied();
        let by_round = || (0..longest).flat_map(|k| queues.iter().filter_map(move |q| q.get(k).copied()));
        // Both orders are first only timed (a schedule of millions of events is large to keep
        // twice), then the shorter one is placed again and recorded.
        let by_sender_ends = in_order(by_sender(), st.clone(), None).horizon();
        let by_round_ends = in_order(by_round(), st.clone(), None).horizon();
        let st = if by_round_ends < by_sender_ends {
            in_order(by_round(), st, Some((&mut s, &mut transfers)))
        } else {
            in_order(by_sender(), st, Some((&mut s, &mut transfers)))
        };
        return finish(st, s, transfers);
    }
    let mut heap: BinaryHeap<Reverse<(u64, u16)>> =
        queues.iter().map(|(&snd, q)| Reverse((st.earliest(q[0]), snd))).collect();
    while let Some(Reverse((at, snd))) = heap.pop() {
        let Some(&p) = queues.get(&snd).and_then(|q| q.front()) else { continue };
        // Heap keys are lower bounds of their piece's earliest start (starts only grow), so the
        // popped piece goes next exactly when its key is still its earliest start. A stale key is
        // first raised by the cheap bound: after a placement most waiting senders of the same
        // receivers fail there, without walking the receivers' calendars.
        let ready = st.ready(p);
        if ready > at {
            heap.push(Reverse((ready, snd)));
            continue;
        }
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
    finish(st, s, transfers)
}

/// Receiver entries (pieces × receivers) above which pieces are placed in a fixed order. The list
/// scheduler takes minutes at 7 M (So400m's FP8 MLP-up activation to a 5×269 grid). Measured on
/// SigLIP-size stages (`docs/graph-planner.md`): at 3.8 M the fixed order is better and twice as
/// fast (f16 729×1152 to a 10×72×2 grid: exchange 52,542 → 41,458 cycles), at 3.5 M equal, at
/// 1.2 M much worse (62,790 → 104,336 on 368 tiles): so the list scheduler up to 2 M.
const ORDERED_ABOVE: usize = 2_000_000;

/// Place `pieces` in the order given, each at its earliest start; record the events if asked.
fn in_order<'p>(
    pieces: impl Iterator<Item = &'p Multicast>,
    mut st: State,
    mut out: Option<(&mut Schedule, &mut Option<Vec<Transfer>>)>,
) -> State {
    for p in pieces {
        let at = st.earliest(p);
        st.occupy(p, at);
        if let Some((s, transfers)) = out.as_mut() {
            record(p, at, s, transfers);
        }
    }
    st
}

fn finish(
    st: State,
    mut s: Schedule,
    transfers: Option<Vec<Transfer>>,
) -> Result<(Schedule, Vec<Transfer>), ScheduleError> {
    // Each sender's send spans in time order, for the park elision.
    let sends: BTreeMap<u16, Vec<(u64, u64)>> = s
        .events
        .iter()
        .map(|(&t, evs)| {
            let mut v: Vec<(u64, u64)> = evs
                .iter()
                .filter_map(|e| match e {
                    Event::Send { at, words, .. } => Some((*at, at + *words as u64)),
                    _ => None,
                })
                .collect();
            v.sort_unstable();
            (t, v)
        })
        .filter(|(_, v)| !v.is_empty())
        .collect();
    for (tile, evs) in s.events.iter_mut() {
        // A tile's events in time order (sends and receptions were placed independently).
        evs.sort_by_key(|e| match e {
            Event::Pointer { at, .. } | Event::Mux { at, .. } | Event::Send { at, .. } => *at,
            Event::Expect(_) | Event::Drain { .. } => 0,
        });
        let t = *tile as usize;
        if st.expected[t].is_some() {
            early_pointers(evs);
            elide(*tile, evs, &sends);
        }
        if let Some(words) = st.expected[t] {
            evs.insert(0, Event::Expect(words));
        }
        // The closing sync waits for the tile's own events and for its sent words to land.
        let until = st.busy[t].end.max(st.arrived[t]);
        evs.push(Event::Drain { until });
        s.horizon = s.horizon.max(until);
    }
    let Some(transfers) = transfers else { return Ok((s, Vec::new())) };
    exchange::validate(&transfers, &s)?;
    Ok((s, transfers))
}

/// Set each piece's incoming pointer as soon as the previous piece has landed (one cycle after its
/// park) and the tile's supervisor is free, instead of one cycle before the piece arrives: the
/// wait before the piece then falls on its mux change, whose `delayxpic` holds up to 4,095 cycles
/// of delay, where a pointer's `delaypic` holds 127 and a longer gap took a `delay` instruction
/// more (docs/runtime.md "Exchange code size"). No word lands between a park and the next mux
/// change, so the pointer takes every word it took before; the validation checks that. `evs` is
/// the receiver's events in time order as [`record`] writes them; the first piece keeps its time
/// (the receiver's `Expect` goes before it).
fn early_pointers(evs: &mut [Event]) {
    // The first cycle the next event can take effect (the supervisor issues one instruction
    // after another; a send holds it for its words), and the cycle after the last park.
    let (mut free, mut parked) = (0u64, None::<u64>);
    for e in evs.iter_mut() {
        match e {
            Event::Pointer { at, .. } => {
                if let Some(p) = parked {
                    *at = (*at).min(free.max(p + 1));
                }
                free = *at + 1;
            }
            Event::Mux { at, source } => {
                if *source == MUX_NONE {
                    parked = Some(*at);
                }
                free = *at + 1;
            }
            Event::Send { at, words, .. } => free = free.max(*at + *words as u64),
            Event::Expect(_) | Event::Drain { .. } => {}
        }
    }
}

/// Drop receiver events that change nothing (docs/runtime.md "Exchange code size"): a pointer
/// event setting the pointer where the previous piece left it (it advances by 4 per landed word),
/// a park whose sender sends nothing that would arrive here before the next mux change, and then a
/// mux change to the source already selected. `evs` is the receiver's events in time order (its
/// own sends among them), every piece as [`record`] writes it — pointer, mux, park — so the words
/// a piece lands are the cycles from its mux to its park; the closing park stays, so no later superstep's words can land here. The
/// schedule's cycles do not change; the word-by-word validation runs on the result.
fn elide(tile: u16, evs: &mut Vec<Event>, sends: &BTreeMap<u16, Vec<(u64, u64)>>) {
    // Would a word `sender` sends arrive on `tile` in `[a, b)`?
    let arrives = |sender: u16, a: u64, b: u64| {
        let lat = latency(sender, tile) as u64;
        let spans = sends.get(&sender).map_or(&[][..], Vec::as_slice);
        // The first span ending after `a` (arrival end = end + lat).
        let i = spans.partition_point(|&(_, e)| e + lat <= a);
        spans.get(i).is_some_and(|&(st, _)| st + lat < b)
    };
    let mut out: Vec<Event> = Vec::with_capacity(evs.len());
    // The pointer after the last landed piece, the selected source, and the last park kept.
    let mut pointer: Option<(Name, u32)> = None;
    let mut mux = MUX_NONE;
    let mut last_arrival = 0u64;
    let mut i = 0;
    while i < evs.len() {
        match &evs[i] {
            Event::Pointer { buffer, offset, .. } => {
                if pointer.as_ref().is_some_and(|(b, o)| b == buffer && o == offset) {
                    i += 1;
                    continue;
                }
                pointer = Some((buffer.clone(), *offset));
                out.push(evs[i].clone());
            }
            Event::Mux { at, source } if *source != MUX_NONE => {
                last_arrival = *at;
                if *source != mux {
                    out.push(evs[i].clone());
                    mux = *source;
                }
            }
            Event::Mux { at, .. } => {
                // A park at the end of the piece that arrived from `last_arrival`: the pointer has
                // moved past its words.
                if let Some((_, o)) = pointer.as_mut() {
                    *o += 4 * (*at - last_arrival) as u32;
                }
                let next = evs[i + 1..].iter().find_map(|e| match e {
                    Event::Mux { at, source } if *source != MUX_NONE => Some(*at),
                    _ => None,
                });
                match next {
                    Some(m) if mux != MUX_NONE && !arrives(mux, *at, m) => {}
                    _ => {
                        out.push(evs[i].clone());
                        mux = MUX_NONE;
                    }
                }
            }
            _ => out.push(evs[i].clone()),
        }
        i += 1;
    }
    *evs = out;
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
    fn fixed_order_placement_moves_the_same_words_in_a_valid_schedule() {
        // Row blocks multicast to groups of tiles that also send (as a grid matmul's A operand):
        // 12 senders, 4 pieces of 8 words each, to the 6 tiles of the sender's block's group.
        let group = |b: u16| (0..6u16).map(move |k| 12 + ((b * 6 + k) % 12)).collect::<Vec<_>>();
        let mut pieces = Vec::new();
        for snd in 0..12u16 {
            let b = snd / 6;
            for k in 0..4u32 {
                let to: Vec<(u16, u32)> =
                    group(b).into_iter().map(|t| (t, 32 * (4 * (snd as u32 % 6) + k))).collect();
                pieces.push(piece(snd, 32 * k, 8, &to));
            }
        }
        // Tiles 12.. also send to the others' group, so receivers are busy sending too.
        for snd in 12..24u16 {
            let to: Vec<(u16, u32)> =
                (0..4u16).map(|k| ((snd - 12 + k + 1) % 12, 1024 + 32 * k as u32)).collect();
            pieces.push(piece(snd, 0, 8, &to));
        }
        let (list, mut a) = scatter_with(&pieces, usize::MAX, true).unwrap();
        let (ordered, mut b) = scatter_with(&pieces, 0, true).unwrap();
        a.sort_by_key(|t| (t.sender, t.receiver, t.src_off, t.dst_off));
        b.sort_by_key(|t| (t.sender, t.receiver, t.src_off, t.dst_off));
        assert_eq!(a, b);
        // Each group tile takes 6 senders × 4 pieces × 8 words, one piece after another.
        for h in [list.horizon, ordered.horizon] {
            assert!(h >= 6 * 4 * 8, "{h}");
        }
        assert_ne!(list.events, ordered.events, "the two paths are different schedules");
    }

    /// Receiver events that change nothing are dropped (`elide`): pieces landing one after
    /// another at consecutive offsets set the pointer once; a park stays only where its sender's
    /// later words would arrive before the next mux change, and the last park always stays.
    #[test]
    fn receivers_skip_pointer_and_park_events_that_change_nothing() {
        let count = |evs: &[Event]| {
            let ptr = evs.iter().filter(|e| matches!(e, Event::Pointer { .. })).count();
            let park = evs.iter().filter(|e| matches!(e, Event::Mux { source: MUX_NONE, .. })).count();
            let mux = evs.iter().filter(|e| matches!(e, Event::Mux { .. })).count() - park;
            (ptr, mux, park)
        };
        // Four senders, 8 words each, to consecutive offsets of tile 9: one pointer, four mux
        // changes, one park (each sender sends nothing else).
        let contiguous: Vec<Multicast> = (0..4u16).map(|t| piece(t, 0, 8, &[(9, 32 * t as u32)])).collect();
        let (s, _) = scatter(&contiguous).unwrap();
        assert_eq!(count(&s.events[&9]), (1, 4, 1), "{:?}", s.events[&9]);
        // Offsets with gaps: a pointer per piece.
        let gaps: Vec<Multicast> = (0..4u16).map(|t| piece(t, 0, 8, &[(9, 64 * t as u32)])).collect();
        let (s, _) = scatter(&gaps).unwrap();
        assert_eq!(count(&s.events[&9]).0, 4);
        // One sender's consecutive pieces to the same receiver: one pointer, one mux, one park.
        let (s, _) = scatter(&[piece(0, 0, 8, &[(9, 0)]), piece(0, 32, 8, &[(9, 32)])]).unwrap();
        assert_eq!(count(&s.events[&9]), (1, 1, 1), "{:?}", s.events[&9]);
        // Tile 0 sends to 1, then to 2 and 1: tile 1's first park must stay (tile 0's piece for
        // tile 2 passes it), and the schedule validates (`scatter` runs the validator).
        let (s, _) =
            scatter(&[piece(0, 0, 4, &[(1, 0)]), piece(0, 16, 4, &[(2, 0)]), piece(0, 32, 4, &[(1, 16)])])
                .unwrap();
        assert_eq!(count(&s.events[&1]).2, 2, "{:?}", s.events[&1]);
    }

    #[test]
    fn a_pointer_is_set_once_the_previous_piece_has_landed() {
        // Tile 0 sends 8 words to tile 1, 200 to tile 2, then 8 more to tile 1 at a gap in its
        // buffer: tile 1's second pointer goes one cycle after its first park, so the 200-cycle
        // wait falls on the mux change (`delayxpic`, 12 bits) rather than a `delay` before a
        // `delaypic` (7 bits); the schedule validates (`scatter` runs the validator).
        let pieces = [piece(0, 0, 8, &[(1, 0)]), piece(0, 32, 200, &[(2, 0)]), piece(0, 832, 8, &[(1, 64)])];
        let (s, _) = scatter(&pieces).unwrap();
        let evs = &s.events[&1];
        let ptrs: Vec<u64> = evs
            .iter()
            .filter_map(|e| if let Event::Pointer { at, .. } = e { Some(*at) } else { None })
            .collect();
        let parks: Vec<u64> = evs
            .iter()
            .filter_map(|e| if let Event::Mux { at, source: MUX_NONE } = e { Some(*at) } else { None })
            .collect();
        let muxes: Vec<u64> = evs
            .iter()
            .filter_map(|e| if let Event::Mux { at, source: 0 } = e { Some(*at) } else { None })
            .collect();
        assert_eq!((ptrs.len(), muxes.len()), (2, 2), "{evs:?}");
        assert_eq!(ptrs[1], parks[0] + 1, "{evs:?}");
        assert!(muxes[1] - ptrs[1] > 127, "the wait is on the mux: {evs:?}");
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
