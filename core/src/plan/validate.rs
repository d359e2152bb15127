//! Word-exact validation of an exchange schedule against the fabric model (docs/target.md §5),
//! computed on runs of words instead of single words.
//!
//! Why runs: a SigLIP-size redistribution moves tens of millions of words (a grid's A operand is
//! multicast to every column of tiles), and the word-by-word form of this check allocated a
//! record per word landed — a quarter of a block's build time and gigabytes of memory went to it
//! (docs/runtime.md "Exchange validation"). Every quantity it reasons about is piecewise
//! contiguous: a send streams consecutive words on consecutive cycles, a mux selects one sender
//! over an interval of cycles, a pointer advances by one word per word taken. So the same
//! judgement is made on the pieces where these intervals intersect, whose number grows with the
//! events, not with the words. The verdict is the word-by-word one (the old form is kept as the
//! test reference in [`reference`] and compared on randomly broken schedules):
//!
//! 1. every word of every transfer leaves its sender exactly once;
//! 2. every word a tile takes (its mux selects the word's sender on arrival) lands at the
//!    incoming pointer, advanced by one word per word taken since the pointer was set;
//! 3. the words each tile takes, and where they land, are exactly the words the transfers to that
//!    tile name, at their destinations (no word missing, none extra, none landing twice).
//!
//! Offsets are byte offsets of whole words (4-aligned), as every planner emits them; a transfer of
//! no words asks nothing.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use super::exchange::{check_issue, Event, Schedule, ScheduleError, Transfer};
use crate::target::MUX_NONE;
use crate::topology::latency;

/// Words a sender streams on consecutive cycles from consecutive offsets of one buffer.
#[derive(Clone, Copy, Debug)]
struct Run {
    /// Cycle of the first word.
    at: u64,
    /// Buffer (interned).
    buf: u32,
    /// Byte offset of the first word.
    off: u32,
    /// Words.
    words: u32,
}

/// Words one tile receives from one sender, contiguous in the source and at the destination
/// (`None`: no incoming pointer was set when they arrived).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Seg {
    sender: u16,
    src: u32,
    src_off: u32,
    dst: Option<(u32, u32)>,
    words: u32,
}

impl Seg {
    fn end(&self) -> u64 {
        self.src_off as u64 + 4 * self.words as u64
    }
    /// Whether `next` (sorted after `self`) continues or overlaps `self` with the same mapping
    /// from source to destination offsets.
    fn same_mapping(&self, next: &Seg) -> bool {
        match (self.dst, next.dst) {
            (Some((b0, o0)), Some((b1, o1))) => {
                b0 == b1 && (o0 as i64 - self.src_off as i64) == (o1 as i64 - next.src_off as i64)
            }
            _ => false,
        }
    }
}

/// Sort `segs` and merge runs that continue each other into maximal runs, so that two sets of
/// the same words at the same destinations compare equal. Overlaps are merged when `overlaps` is
/// true and the mapping agrees (two transfers naming the same words); any other overlap is a word
/// landing twice or asked at two places: its sender is returned.
fn canonical(segs: &mut Vec<Seg>, overlaps: bool) -> Result<(), u16> {
    segs.sort_unstable();
    let mut out: Vec<Seg> = Vec::with_capacity(segs.len());
    for s in segs.drain(..) {
        if let Some(prev) = out.last_mut() {
            if prev.sender == s.sender && prev.src == s.src && (s.src_off as u64) <= prev.end() {
                let overlap = (s.src_off as u64) < prev.end();
                if overlap && !(overlaps && prev.same_mapping(&s)) {
                    return Err(s.sender);
                }
                if prev.same_mapping(&s) {
                    let end = prev.end().max(s.end());
                    prev.words = ((end - prev.src_off as u64) / 4) as u32;
                    continue;
                }
            }
        }
        out.push(s);
    }
    *segs = out;
    Ok(())
}

/// What `tile` takes, in arrival order: the runs of the sender its mux selects over each
/// interval, cut where an incoming pointer is set; each piece lands at the pointer in force
/// advanced by the words taken since it was set.
fn landings(
    streams: &BTreeMap<u16, Vec<Run>>,
    mux: &[(u64, u16)],
    ptr: &[(u64, u32, u32)],
    tile: u16,
) -> Vec<Seg> {
    // (first arrival, sender, buffer, offset, words), arrivals increasing.
    let mut takes: Vec<(u64, u16, u32, u32, u32)> = Vec::new();
    for (j, &(from, source)) in mux.iter().enumerate() {
        let Some(stream) = streams.get(&source).filter(|_| source != MUX_NONE) else { continue };
        let until = mux.get(j + 1).map(|x| x.0).unwrap_or(u64::MAX);
        let lat = latency(source, tile) as u64;
        let first = stream.partition_point(|r| r.at + lat + r.words as u64 <= from);
        for r in &stream[first..] {
            let a0 = r.at + lat;
            if a0 >= until {
                break;
            }
            let (s, e) = (a0.max(from), (a0 + r.words as u64).min(until));
            if s < e {
                takes.push((s, source, r.buf, r.off.wrapping_add(4 * (s - a0) as u32), (e - s) as u32));
            }
        }
    }
    let mut out = Vec::with_capacity(takes.len());
    let (mut k, mut cur, mut since) = (0usize, None::<(u32, u32)>, 0u32);
    for (mut at, sender, src, mut off, mut left) in takes {
        while left > 0 {
            while k < ptr.len() && ptr[k].0 <= at {
                cur = Some((ptr[k].1, ptr[k].2));
                since = 0;
                k += 1;
            }
            // Words up to the next pointer event land with the pointer in force now.
            let n = ptr.get(k).map_or(left, |p| ((p.0 - at).min(left as u64)) as u32);
            let dst = cur.map(|(b, o)| (b, o.wrapping_add(since.wrapping_mul(4))));
            out.push(Seg { sender, src, src_off: off, dst, words: n });
            since = since.wrapping_add(n);
            at += n as u64;
            off = off.wrapping_add(4 * n);
            left -= n;
        }
    }
    out
}

/// Disjoint sorted intervals `[start, end)` of byte offsets of one buffer on one sender: what it
/// sends, and what it sends more than once.
#[derive(Default)]
struct Sent {
    once: Vec<(u64, u64)>,
    twice: Vec<(u64, u64)>,
}

/// Merge sorted-by-start intervals into disjoint maximal ones (touching ones joined).
fn union(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Whether `[s, e)` lies inside one interval of the disjoint sorted `v`.
fn inside(v: &[(u64, u64)], s: u64, e: u64) -> bool {
    let i = v.partition_point(|x| x.0 <= s);
    i > 0 && v[i - 1].1 >= e
}

/// Whether `[s, e)` meets an interval of the disjoint sorted `v`.
fn meets(v: &[(u64, u64)], s: u64, e: u64) -> bool {
    let i = v.partition_point(|x| x.1 <= s);
    v.get(i).is_some_and(|x| x.0 < e)
}

/// Check the events against the fabric model: every word of every transfer is selected by its
/// receiver's mux on arrival and written at the intended offset, and no tile that is not meant to
/// receive it (by some transfer of the same words) takes it.
pub fn validate<'a>(transfers: &'a [Transfer], s: &'a Schedule) -> Result<(), ScheduleError> {
    for (&tile, evs) in &s.events {
        check_issue(tile, evs)?;
    }
    // Buffer names interned once, so that the comparisons below are on integers.
    let mut names: BTreeMap<&'a str, u32> = BTreeMap::new();
    let mut id = |name: &'a str| -> u32 {
        let n = names.len() as u32;
        *names.entry(name).or_insert(n)
    };
    // Each sender's runs in time order, each tile's mux and pointer timelines by cycle.
    let mut streams: BTreeMap<u16, Vec<Run>> = BTreeMap::new();
    let mut muxes: BTreeMap<u16, Vec<(u64, u16)>> = BTreeMap::new();
    let mut ptrs: BTreeMap<u16, Vec<(u64, u32, u32)>> = BTreeMap::new();
    for (tile, evs) in &s.events {
        for e in evs {
            match e {
                Event::Send { at, buffer, offset, words } if *words > 0 => {
                    let r = Run { at: *at, buf: id(buffer), off: *offset, words: *words };
                    streams.entry(*tile).or_default().push(r);
                }
                Event::Mux { at, source } => muxes.entry(*tile).or_default().push((*at, *source)),
                Event::Pointer { at, buffer, offset } => {
                    let b = id(buffer);
                    ptrs.entry(*tile).or_default().push((*at, b, *offset))
                }
                _ => {}
            }
        }
    }
    for v in streams.values_mut() {
        v.sort_by_key(|r| r.at);
    }
    for v in muxes.values_mut() {
        v.sort_by_key(|m| m.0);
    }
    for v in ptrs.values_mut() {
        v.sort_by_key(|p| p.0);
    }
    let ids: Vec<(u32, u32)> = transfers.iter().map(|t| (id(&t.src), id(&t.dst))).collect();
    // 1. A sender sends each word of a transfer exactly once.
    let mut sent: BTreeMap<(u16, u32), Sent> = BTreeMap::new();
    {
        let mut spans: BTreeMap<(u16, u32), Vec<(u64, u64)>> = BTreeMap::new();
        for (&tile, runs) in &streams {
            for r in runs {
                let s0 = r.off as u64;
                spans.entry((tile, r.buf)).or_default().push((s0, s0 + 4 * r.words as u64));
            }
        }
        for (key, mut v) in spans {
            v.sort_unstable();
            let mut twice = Vec::new();
            let mut reach = 0u64;
            for (i, &(a, b)) in v.iter().enumerate() {
                if i > 0 && a < reach {
                    twice.push((a, b.min(reach)));
                }
                reach = reach.max(b);
            }
            sent.insert(key, Sent { once: union(v), twice: union(twice) });
        }
    }
    for (t, &(src, _)) in transfers.iter().zip(&ids) {
        let (a, b) = (t.src_off as u64, t.src_off as u64 + 4 * t.words as u64);
        let ok = t.words == 0
            || sent.get(&(t.sender, src)).is_some_and(|x| inside(&x.once, a, b) && !meets(&x.twice, a, b));
        if !ok {
            return Err(ScheduleError::Misrouted { sender: t.sender, receiver: t.receiver, word: 0 });
        }
    }
    // 2. What every tile takes and where it lands, as maximal runs.
    let mut landed: BTreeMap<u16, Vec<Seg>> = BTreeMap::new();
    for (&tile, mux) in &muxes {
        let ptr = ptrs.get(&tile).map(Vec::as_slice).unwrap_or(&[]);
        let mut l = landings(&streams, mux, ptr, tile);
        if let Err(sender) = canonical(&mut l, false) {
            // A word taken twice: the first transfer from that sender to this tile names it.
            return Err(ScheduleError::Misrouted { sender, receiver: tile, word: 0 });
        }
        if !l.is_empty() {
            landed.insert(tile, l);
        }
    }
    // 3. The words the transfers name, per receiver, as maximal runs: they must be the landings.
    let mut asked: BTreeMap<u16, Vec<Seg>> = BTreeMap::new();
    for (t, &(src, dst)) in transfers.iter().zip(&ids).filter(|(t, _)| t.words > 0) {
        let seg =
            Seg { sender: t.sender, src, src_off: t.src_off, dst: Some((dst, t.dst_off)), words: t.words };
        asked.entry(t.receiver).or_default().push(seg);
    }
    for (&tile, segs) in asked.iter_mut() {
        if canonical(segs, true).is_err() || landed.get(&tile) != Some(segs) {
            return Err(first_misrouted(transfers, &ids, tile, landed.get(&tile).map_or(&[], Vec::as_slice)));
        }
    }
    // 4. No tile takes a word no transfer names.
    if let Some((&tile, l)) = landed.iter().find(|(tile, _)| !asked.contains_key(tile)) {
        return Err(ScheduleError::Misrouted { sender: l[0].sender, receiver: tile, word: 0 });
    }
    Ok(())
}

/// The first word, in transfer order, that does not land where a transfer to `tile` wants it;
/// if every word does, the first word the tile takes that no transfer names. Only on failure.
fn first_misrouted(transfers: &[Transfer], ids: &[(u32, u32)], tile: u16, landed: &[Seg]) -> ScheduleError {
    let mut covered: Vec<(u16, u32, u64, u64)> = Vec::new();
    for (t, &(src, dst)) in transfers.iter().zip(ids).filter(|(t, _)| t.receiver == tile) {
        for i in 0..t.words {
            let off = t.src_off + 4 * i;
            let j = landed.partition_point(|l| (l.sender, l.src, l.src_off) <= (t.sender, src, off));
            let hit = j.checked_sub(1).map(|j| &landed[j]).filter(|l| {
                l.sender == t.sender && l.src == src && (off as u64) < l.end() && {
                    let k = (off - l.src_off) / 4;
                    l.dst.is_some_and(|(b, o)| b == dst && o.wrapping_add(4 * k) == t.dst_off + 4 * i)
                }
            });
            if hit.is_none() {
                return ScheduleError::Misrouted { sender: t.sender, receiver: tile, word: i };
            }
        }
        covered.push((t.sender, src, t.src_off as u64, t.src_off as u64 + 4 * t.words as u64));
    }
    // Every transfer landed: some landed word is not named by any of them.
    let sender = landed
        .iter()
        .find(|l| {
            let mut at = l.src_off as u64;
            let mut spans: Vec<(u64, u64)> =
                covered.iter().filter(|c| c.0 == l.sender && c.1 == l.src).map(|c| (c.2, c.3)).collect();
            spans.sort_unstable();
            for (a, b) in spans {
                if a <= at && b > at {
                    at = b;
                }
            }
            at < l.end()
        })
        .map_or(u16::MAX, |l| l.sender);
    ScheduleError::Misrouted { sender, receiver: tile, word: 0 }
}

/// The word-by-word form of [`validate`], kept as the reference the run form is tested against.
#[cfg(test)]
pub(crate) mod reference {
    use alloc::collections::BTreeMap;
    use alloc::vec::Vec;

    use super::super::exchange::{check_issue, Event, Schedule, ScheduleError, Transfer};
    use crate::target::MUX_NONE;
    use crate::topology::latency;

    /// A word a receiver takes from the fabric: sender, source buffer and offset, and where it lands
    /// (`None`: no incoming pointer was set yet).
    type Landing = (u16, u32, u32, Option<(u32, u32)>);

    /// A word on the fabric: cycle, buffer (interned name), byte offset.
    type Word = (u64, u32, u32);

    /// Every word `tile` takes, in arrival order: the words of the sender its mux selects at each
    /// arrival (docs/target.md §5), written at the incoming pointer advanced by one word per word
    /// taken since the pointer was set.
    fn landings(
        streams: &BTreeMap<u16, Vec<Word>>,
        mux: &[(u64, u16)],
        ptr: &[Word],
        tile: u16,
    ) -> Vec<Landing> {
        let mut takes: Vec<(u64, u16, u32, u32)> = Vec::new();
        for (j, &(from, source)) in mux.iter().enumerate() {
            let Some(stream) = streams.get(&source).filter(|_| source != MUX_NONE) else { continue };
            let until = mux.get(j + 1).map(|x| x.0).unwrap_or(u64::MAX);
            let lat = latency(source, tile) as u64;
            let first = stream.partition_point(|w| w.0 + lat < from);
            let last = stream.partition_point(|w| w.0 + lat < until);
            takes.extend(stream[first..last].iter().map(|&(c, b, o)| (c + lat, source, b, o)));
        }
        let mut out = Vec::with_capacity(takes.len());
        let (mut k, mut since) = (0usize, 0usize);
        for (i, &(arrival, source, b, o)) in takes.iter().enumerate() {
            // The pointer in force: the last one set at or before the arrival (arrivals only grow).
            let mut k_now = k;
            while k_now < ptr.len() && ptr[k_now].0 <= arrival {
                k_now += 1;
            }
            if k_now != k {
                k = k_now;
                since = takes.partition_point(|x| x.0 < ptr[k - 1].0);
            }
            let dst = (k > 0).then(|| (ptr[k - 1].1, ptr[k - 1].2 + 4 * (i - since) as u32));
            out.push((source, b, o, dst));
        }
        out
    }

    /// Check the events against the fabric model: every word of every transfer is selected by its
    /// receiver's mux on arrival and written at the intended offset, and no tile that is not meant to
    /// receive it (by some transfer of the same words) takes it.
    pub(crate) fn validate<'a>(transfers: &'a [Transfer], s: &'a Schedule) -> Result<(), ScheduleError> {
        for (&tile, evs) in &s.events {
            check_issue(tile, evs)?;
        }
        // Buffer names interned once, so that the per-word work compares integers.
        let mut names: BTreeMap<&str, u32> = BTreeMap::new();
        let mut id = |name: &'a str| -> u32 {
            let n = names.len() as u32;
            *names.entry(name).or_insert(n)
        };
        let ids: Vec<(u32, u32)> = transfers.iter().map(|t| (id(&t.src), id(&t.dst))).collect();
        // Each sender's stream (cycle, buffer, offset of the word), and each tile's mux and pointer
        // timelines, all sorted by cycle so that lookups are binary searches.
        let mut streams: BTreeMap<u16, Vec<Word>> = BTreeMap::new();
        let mut muxes: BTreeMap<u16, Vec<(u64, u16)>> = BTreeMap::new();
        let mut ptrs: BTreeMap<u16, Vec<Word>> = BTreeMap::new();
        for (tile, evs) in &s.events {
            for e in evs {
                match e {
                    Event::Send { at, buffer, offset, words } => {
                        let b = id(buffer);
                        let st = streams.entry(*tile).or_default();
                        st.extend((0..*words).map(|i| (at + i as u64, b, offset + 4 * i)));
                    }
                    Event::Mux { at, source } => muxes.entry(*tile).or_default().push((*at, *source)),
                    Event::Pointer { at, buffer, offset } => {
                        let b = id(buffer);
                        ptrs.entry(*tile).or_default().push((*at, b, *offset))
                    }
                    _ => {}
                }
            }
        }
        for v in streams.values_mut() {
            v.sort_by_key(|w| w.0);
        }
        for v in muxes.values_mut() {
            v.sort_by_key(|m| m.0);
        }
        for v in ptrs.values_mut() {
            v.sort_by_key(|p| p.0);
        }
        // 1. A sender sends each word of a transfer exactly once: its words indexed by
        //    (buffer, offset), so a transfer finds them by binary search.
        let by_word: BTreeMap<u16, Vec<(u32, u32)>> = streams
            .iter()
            .map(|(&tile, st)| {
                let mut v: Vec<(u32, u32)> = st.iter().map(|&(_, b, o)| (b, o)).collect();
                v.sort_unstable();
                (tile, v)
            })
            .collect();
        for (t, &(src, _)) in transfers.iter().zip(&ids) {
            let words = by_word.get(&t.sender).map(Vec::as_slice).unwrap_or(&[]);
            let first = words.partition_point(|w| *w < (src, t.src_off));
            let last = words.partition_point(|w| *w < (src, t.src_off + 4 * t.words));
            if last - first != t.words as usize {
                return Err(ScheduleError::Misrouted { sender: t.sender, receiver: t.receiver, word: 0 });
            }
        }
        // 2. What every tile takes and where it lands, sorted by (sender, buffer, offset).
        let mut landed: BTreeMap<u16, (Vec<Landing>, Vec<bool>)> = BTreeMap::new();
        for (&tile, mux) in &muxes {
            let ptr = ptrs.get(&tile).map(Vec::as_slice).unwrap_or(&[]);
            let mut l = landings(&streams, mux, ptr, tile);
            l.sort_unstable();
            let n = l.len();
            landed.insert(tile, (l, alloc::vec![false; n]));
        }
        // 3. Every word of every transfer was taken by its receiver and landed at the right offset.
        //    Transfers are visited in the landings' order, so one cursor per receiver walks its
        //    landings once (a binary search per transfer misses the cache on millions of them).
        let mut order: Vec<usize> = (0..transfers.len()).collect();
        order.sort_unstable_by_key(|&i| {
            (transfers[i].receiver, transfers[i].sender, ids[i].0, transfers[i].src_off)
        });
        let mut cursor = (u16::MAX, 0usize);
        for i in order {
            let (t, (src, dst)) = (&transfers[i], ids[i]);
            // A transfer of no words asks nothing (the run form's reading; the original refused
            // one whose receiver had no mux events).
            if t.words == 0 {
                continue;
            }
            let bad = |word: usize| ScheduleError::Misrouted {
                sender: t.sender,
                receiver: t.receiver,
                word: word as u32,
            };
            let Some((l, used)) = landed.get_mut(&t.receiver) else { return Err(bad(0)) };
            if cursor.0 != t.receiver {
                cursor = (t.receiver, 0);
            }
            while cursor.1 < l.len()
                && (l[cursor.1].0, l[cursor.1].1, l[cursor.1].2) < (t.sender, src, t.src_off)
            {
                cursor.1 += 1;
            }
            let at = cursor.1;
            for i in 0..t.words as usize {
                let want = (t.sender, src, t.src_off + 4 * i as u32, Some((dst, t.dst_off + 4 * i as u32)));
                if l.get(at + i) != Some(&want) {
                    return Err(bad(i));
                }
                used[at + i] = true;
            }
        }
        // 4. No tile takes a word not meant for it.
        for (&tile, (l, used)) in &landed {
            if let Some(i) = used.iter().position(|u| !u) {
                return Err(ScheduleError::Misrouted { sender: l[i].0, receiver: tile, word: i as u32 });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use alloc::vec::Vec;

    use super::super::exchange::{Event, Name, Schedule, Transfer};
    use super::super::scatter::{scatter, Multicast};
    use super::*;

    /// A small deterministic generator (xorshift), so that the cases are the same on every run.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Random multicast pieces among `tiles` tiles: contiguous or strided source offsets, one to
    /// three receivers each at their own destinations.
    fn pieces(rng: &mut Rng, tiles: u16) -> Vec<Multicast> {
        let (src, dst): (Name, Name) = ("x".into(), "y".into());
        let mut out = Vec::new();
        let mut dst_off = alloc::vec![0u32; tiles as usize];
        for sender in 0..tiles {
            let mut off = 0u32;
            for _ in 0..1 + rng.below(4) {
                let words = 1 + rng.below(12) as u32;
                let mut to = Vec::new();
                for _ in 0..1 + rng.below(3) {
                    let r = rng.below(tiles as u64) as u16;
                    if r != sender && !to.iter().any(|t: &(u16, Name, u32)| t.0 == r) {
                        to.push((r, dst.clone(), dst_off[r as usize]));
                        dst_off[r as usize] += 4 * words + 4 * rng.below(2) as u32;
                    }
                }
                if !to.is_empty() {
                    out.push(Multicast { sender, src: src.clone(), src_off: off, words, to });
                }
                off += 4 * words + 4 * rng.below(3) as u32;
            }
        }
        out
    }

    /// One random change to one event: a cycle, an offset or a length one off, a source swapped,
    /// an event dropped, or a send repeated later.
    fn break_one(rng: &mut Rng, s: &mut Schedule) {
        let tiles: Vec<u16> = s.events.keys().copied().collect();
        let tile = tiles[rng.below(tiles.len() as u64) as usize];
        let evs = s.events.get_mut(&tile).unwrap();
        let i = rng.below(evs.len() as u64) as usize;
        let up = rng.below(2) == 0;
        let nudge = |v: &mut u64| *v = if up { *v + 1 } else { v.saturating_sub(1) };
        match rng.below(4) {
            0 => {
                evs.remove(i);
            }
            1 if matches!(evs[i], Event::Send { .. }) => {
                let again = evs[i].clone();
                if let Event::Send { at, buffer, offset, words } = again {
                    evs.push(Event::Send { at: at + 10_000, buffer, offset, words });
                }
            }
            _ => match &mut evs[i] {
                Event::Pointer { at, offset, .. } => {
                    if up {
                        *offset += 4
                    } else {
                        nudge(at)
                    }
                }
                Event::Mux { at, source } => {
                    if rng.below(2) == 0 {
                        nudge(at)
                    } else {
                        *source = (*source + 1) % tiles.len() as u16
                    }
                }
                Event::Send { at, offset, words, .. } => match rng.below(3) {
                    0 => nudge(at),
                    1 => *offset += 4,
                    _ => *words = if up { *words + 1 } else { words.saturating_sub(1).max(1) },
                },
                Event::Expect(_) | Event::Drain { .. } => {}
            },
        }
    }

    #[test]
    fn runs_give_the_word_by_word_verdict_on_valid_and_broken_schedules() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let (mut valid, mut broken) = (0, 0);
        for case in 0..400 {
            let tiles = 2 + rng.below(7) as u16;
            let ps = pieces(&mut rng, tiles);
            let (mut s, transfers): (Schedule, Vec<Transfer>) = scatter(&ps).expect("scatter validates");
            assert_eq!(reference::validate(&transfers, &s), Ok(()), "case {case}: the reference accepts it");
            valid += 1;
            for _ in 0..3 {
                break_one(&mut rng, &mut s);
                let (runs, words) = (validate(&transfers, &s), reference::validate(&transfers, &s));
                assert_eq!(runs.is_ok(), words.is_ok(), "case {case}: runs {runs:?}, words {words:?}\n{s:?}");
                if let (Err(ScheduleError::Late { .. }), _) | (_, Err(ScheduleError::Late { .. })) =
                    (&runs, &words)
                {
                    assert_eq!(runs, words, "case {case}");
                }
                broken += usize::from(words.is_err());
            }
        }
        assert_eq!(valid, 400);
        assert!(broken > 500, "most changes break the schedule: {broken} of 1200");
    }

    #[test]
    fn a_word_taken_twice_is_refused() {
        // Tile 1 selects tile 0 twice while its piece passes once... by moving the park past a
        // second send of the same words: the words land twice.
        let ps = [Multicast {
            sender: 0,
            src: "x".into(),
            src_off: 0,
            words: 4,
            to: alloc::vec![(1, "y".into(), 0)],
        }];
        let (mut s, transfers) = scatter(&ps).unwrap();
        let evs = s.events.get_mut(&1).unwrap();
        evs.retain(|e| !matches!(e, Event::Mux { source: MUX_NONE, .. }));
        let send = s.events[&0].iter().find_map(|e| match e {
            Event::Send { at, .. } => Some(*at),
            _ => None,
        });
        let again = Event::Send { at: send.unwrap() + 100, buffer: "x".into(), offset: 0, words: 4 };
        s.events.get_mut(&0).unwrap().insert(1, again);
        assert!(validate(&transfers, &s).is_err());
        assert_eq!(validate(&transfers, &s).is_err(), reference::validate(&transfers, &s).is_err());
    }
}
