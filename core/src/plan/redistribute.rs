//! Redistribution (docs/graph-planner.md §4): bring a tensor from the distribution its producer
//! made to the one its consumer needs. Both are given as binding slices (`SliceRef`: per tile, rows
//! of tensor bytes at a buffer offset), so any planner's output binding can feed any planner's
//! input binding. Bytes are moved as 32-bit words: over the exchange between tiles
//! ([`scatter`](super::scatter)), with the `copy_words` kernel within a tile.
//!
//! Word rule: every piece starts 4-aligned on both tiles. A piece may end inside a word only at
//! the end of a destination row that is also the end of a source row, both with room up to the
//! word boundary in their row stride (the padding of the on-tile layouts): the extra bytes are
//! source padding written over destination padding. Anything else is refused with the tensor,
//! bytes and tiles, never moved approximately.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use super::exchange::Name;
use super::scatter::{scatter, Multicast};
use super::{cost, Buffer, Kernel, MemKind, SliceRef, Step, Word};

/// Words moved from one place to another.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Move {
    /// Source tile.
    pub from: u16,
    /// Source buffer.
    pub src: Name,
    /// Byte offset in it.
    pub src_off: u32,
    /// Destination tile.
    pub to: u16,
    /// Destination buffer.
    pub dst: Name,
    /// Byte offset in it.
    pub dst_off: u32,
    /// Words.
    pub words: u32,
}

/// One row of a distribution: tensor bytes `[t0, t1)` at `addr` in buffer `buf` of `tile`.
#[derive(Clone, Copy, Debug)]
struct Row<'a> {
    t0: u64,
    t1: u64,
    tile: u16,
    buf: &'a str,
    addr: u32,
    /// The row stride leaves room to round the row up to a whole word.
    room: bool,
}

fn rows(slices: &[SliceRef]) -> Vec<Row<'_>> {
    let mut v = Vec::new();
    for s in slices {
        for r in 0..s.rows as u64 {
            let t0 = s.tensor_offset + r * s.tensor_stride;
            v.push(Row {
                t0,
                t1: t0 + s.row_bytes as u64,
                tile: s.tile,
                buf: &s.buffer,
                addr: s.offset + (r as u32) * s.tile_stride,
                room: s.rows == 1 || s.tile_stride >= s.row_bytes.div_ceil(4) * 4,
            });
        }
    }
    v
}

/// How a tensor's bytes come from another tensor's without computing: reshapes (the same bytes),
/// transposes that keep the last axis (runs of the last axis move whole) and slices (runs of the
/// kept part of the last axis). Empty: identity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// Steps from the held tensor towards the read one.
    pub steps: Vec<ViewStep>,
    /// Bytes per element.
    pub elt: u64,
}

/// One step of a [`View`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ViewStep {
    /// A transpose: axis k of the result is axis `perm[k]` of the input.
    Transpose {
        /// The input's shape.
        shape: Vec<u64>,
        /// The permutation.
        perm: Vec<usize>,
    },
    /// The box `starts .. starts + out` of the input.
    Slice {
        /// The input's shape.
        shape: Vec<u64>,
        /// First index kept on each axis.
        starts: Vec<u64>,
        /// The result's shape.
        out: Vec<u64>,
    },
}

fn strides(shape: &[u64]) -> Vec<u64> {
    let r = shape.len();
    let mut stride = alloc::vec![1u64; r];
    for d in (0..r.saturating_sub(1)).rev() {
        stride[d] = stride[d + 1] * shape[d + 1];
    }
    stride
}

impl View {
    /// Bytes that stay contiguous through every step (a multiple of the element size).
    fn run(&self) -> u64 {
        let gcd = |mut a: u64, mut b: u64| {
            while b != 0 {
                (a, b) = (b, a % b);
            }
            a
        };
        self.steps.iter().fold(u64::MAX, |r, step| {
            let last = match step {
                ViewStep::Transpose { shape, .. } => shape.last().copied().unwrap_or(1),
                // A run of the result's last axis; it starts `starts.last` elements into the
                // held row, so both ends must fall on run boundaries.
                ViewStep::Slice { starts, out, .. } => {
                    gcd(out.last().copied().unwrap_or(1), starts.last().copied().unwrap_or(0))
                }
            } * self.elt;
            if r == u64::MAX {
                last
            } else {
                gcd(r, last)
            }
        })
    }
    /// Byte offset in the held tensor of byte offset `x` (the start of a run) of the read tensor.
    fn map(&self, x: u64) -> u64 {
        if self.steps.is_empty() {
            return x;
        }
        let mut e = x / self.elt;
        for step in self.steps.iter().rev() {
            e = match step {
                ViewStep::Transpose { shape, perm } => {
                    let stride = strides(shape);
                    let (mut rest, mut src) = (e, 0);
                    for k in (0..shape.len()).rev() {
                        let n = shape[perm[k]];
                        src += (rest % n) * stride[perm[k]];
                        rest /= n;
                    }
                    src
                }
                ViewStep::Slice { shape, starts, out } => {
                    let stride = strides(shape);
                    let (mut rest, mut src) = (e, 0);
                    for k in (0..out.len()).rev() {
                        src += (rest % out[k] + starts[k]) * stride[k];
                        rest /= out[k];
                    }
                    src
                }
            };
        }
        e * self.elt + x % self.elt
    }
}

/// The slices of a held tensor that the slices `read` of its view give: where a stage is handed a
/// view (a reshape, a last-axis-keeping transpose) of a model input no earlier op placed, the
/// host writes the input itself into the stage's buffers, each run of the view's last axis at
/// the place the view reads it. `None` for a view with a slice step (the host binding must cover
/// every byte of the input, and a slice reads only part of it).
pub fn held_through(view: &View, read: &[SliceRef]) -> Option<Vec<SliceRef>> {
    if view.steps.is_empty() {
        return Some(read.to_vec());
    }
    if view.steps.iter().any(|s| matches!(s, ViewStep::Slice { .. })) {
        return None;
    }
    let run = view.run();
    let mut out: Vec<SliceRef> = Vec::new();
    for s in read {
        for r in 0..s.rows as u64 {
            let (t0, at) =
                (s.tensor_offset + r * s.tensor_stride, s.offset as u64 + r * s.tile_stride as u64);
            let mut x = 0;
            while x < s.row_bytes as u64 {
                let n = (run - (t0 + x) % run).min(s.row_bytes as u64 - x);
                let held = view.map(t0 + x);
                match out.last_mut() {
                    // A run that continues the previous one on the tile and in the held tensor.
                    Some(p)
                        if p.rows == 1
                            && p.tile == s.tile
                            && p.buffer == s.buffer
                            && p.offset as u64 + p.row_bytes as u64 == at + x
                            && p.tensor_offset + p.row_bytes as u64 == held =>
                    {
                        p.row_bytes += n as u32
                    }
                    _ => out.push(SliceRef {
                        tile: s.tile,
                        buffer: s.buffer.clone(),
                        offset: (at + x) as u32,
                        tensor_offset: held,
                        rows: 1,
                        row_bytes: n as u32,
                        tensor_stride: 0,
                        tile_stride: 0,
                    }),
                }
                x += n;
            }
        }
    }
    Some(out)
}

/// The word moves that give every destination byte its value from the source distribution,
/// reading the destination tensor through `view` of the source's. Where the source holds bytes
/// more than once (a replicated input), the first slice wins.
pub fn moves(name: &str, src: &[SliceRef], dst: &[SliceRef], view: &View) -> Result<Vec<Move>, String> {
    let mut s = rows(src);
    s.sort_by_key(|r| (r.t0, r.t1));
    // Disjoint source intervals in tensor order (the first copy of each byte).
    let mut covered = 0u64;
    let mut srows: Vec<Row> = Vec::with_capacity(s.len());
    for mut r in s {
        if r.t1 <= covered {
            continue;
        }
        if r.t0 < covered {
            r.addr += (covered - r.t0) as u32;
            r.t0 = covered;
        }
        covered = r.t1;
        srows.push(r);
    }
    let run = view.run();
    let mut out = Vec::new();
    for d in rows(dst) {
        // Pieces of the destination row that are contiguous in the source.
        let mut p0 = d.t0;
        while p0 < d.t1 {
            let p1 = if run == u64::MAX { d.t1 } else { d.t1.min((p0 / run + 1) * run) };
            let q = view.map(p0);
            let mut x0 = q;
            let q1 = q + (p1 - p0);
            let mut i = srows.partition_point(|r| r.t1 <= x0);
            while x0 < q1 {
                let Some(r) = srows.get(i).filter(|r| r.t0 <= x0) else {
                    return Err(format!(
                        "tensor `{name}`: bytes {x0}.. needed on tile {} are not held by its producer",
                        d.tile
                    ));
                };
                let x1 = q1.min(r.t1);
                let sa = r.addr + (x0 - r.t0) as u32;
                let da = d.addr + (p0 + (x0 - q) - d.t0) as u32;
                let whole = (x1 - x0).is_multiple_of(4);
                let padded_end = x1 == q1 && p1 == d.t1 && x1 == r.t1 && d.room && r.room;
                if !sa.is_multiple_of(4) || !da.is_multiple_of(4) || !(whole || padded_end) {
                    return Err(format!(
                        "tensor `{name}`: bytes {x0}..{x1} sit at offset {sa} of `{}` on tile {} and must go to \
                         offset {da} of `{}` on tile {}; the exchange moves whole aligned words (an odd number \
                         of f16 values per row block or per head, or a slice starting inside a word?)",
                        r.buf, r.tile, d.buf, d.tile
                    ));
                }
                out.push(Move {
                    from: r.tile,
                    src: r.buf.into(),
                    src_off: sa,
                    to: d.tile,
                    dst: d.buf.into(),
                    dst_off: da,
                    words: (x1 - x0).div_ceil(4) as u32,
                });
                x0 = x1;
                i += 1;
            }
            p0 = p1;
        }
    }
    Ok(out)
}

/// A redistribution ready to be appended to the tile plans: the exchange events of each tile, the
/// local copies, and what it costs.
#[derive(Clone, Debug, Default)]
pub struct Superstep {
    /// Exchange events per tile (tiles not listed take part with none).
    pub events: BTreeMap<u16, Vec<super::exchange::Event>>,
    /// Cycles from the release to the last landing.
    pub horizon: u64,
    /// Per tile: the copy list and descriptor buffers and the slowest worker's issues.
    pub copies: BTreeMap<u16, (Vec<Buffer>, u64)>,
    /// Bytes over the exchange (a multicast counted once).
    pub exchange_bytes: u64,
}

/// Longest segment `copy_words` takes (one `rpt` of two bundles per word).
pub(super) const COPY_MAX_WORDS: u32 = 4095;

/// Schedule moves as one exchange superstep plus on-tile copies; `tag` makes buffer names unique.
pub fn superstep(moves: &[Move], tag: &str) -> Result<Superstep, String> {
    superstep_with(moves, tag, true)
}

/// [`superstep`], the exchange validated word by word when `check` (not when costing a search
/// candidate: the plan that is built is planned again with it).
pub fn superstep_with(moves: &[Move], tag: &str, check: bool) -> Result<Superstep, String> {
    let (local, remote): (Vec<&Move>, Vec<&Move>) = moves.iter().partition(|m| m.from == m.to);
    let mut out = Superstep::default();
    let pieces = multicasts(&remote)?;
    out.exchange_bytes = pieces.iter().map(|p| 4 * p.words as u64).sum();
    let sched =
        if check { scatter(&pieces).map(|r| r.0) } else { super::scatter::scatter_unchecked(&pieces) };
    let sched = sched.map_err(|e| format!("{e}"))?;
    out.events = sched.events;
    out.horizon = sched.horizon;
    let mut per_tile: BTreeMap<u16, Vec<&Move>> = BTreeMap::new();
    for m in local {
        per_tile.entry(m.from).or_default().push(m);
    }
    for (tile, ms) in per_tile {
        out.copies.insert(tile, copy_launch(&ms, tag));
    }
    Ok(out)
}

/// Receiving tile, destination buffer, byte offset.
type Receiver<'a> = (u16, &'a Name, u32);

/// Sender, source buffer, byte offset, words.
type SourceRange<'a> = (u16, &'a str, u32, u32);

/// Pieces from remote moves: split each sender's source ranges at every boundary any move has,
/// so that equal ranges are sent once to all their receivers (a word is sent at most once per
/// superstep), then join runs that are contiguous on the sender and on every receiver.
fn multicasts(remote: &[&Move]) -> Result<Vec<Multicast>, String> {
    let mut cuts: BTreeMap<(u16, &str), BTreeSet<u32>> = BTreeMap::new();
    for m in remote {
        let c = cuts.entry((m.from, &*m.src)).or_default();
        c.insert(m.src_off);
        c.insert(m.src_off + 4 * m.words);
    }
    let mut groups: BTreeMap<SourceRange, (&Name, Vec<Receiver>)> = BTreeMap::new();
    for m in remote {
        let c = &cuts[&(m.from, &*m.src)];
        let end = m.src_off + 4 * m.words;
        let mut lo = m.src_off;
        for &hi in c.range(m.src_off + 1..=end) {
            let to = (m.to, &m.dst, m.dst_off + (lo - m.src_off));
            groups
                .entry((m.from, &*m.src, lo, (hi - lo) / 4))
                .or_insert_with(|| (&m.src, Vec::new()))
                .1
                .push(to);
            lo = hi;
        }
    }
    let mut pieces: Vec<Multicast> = Vec::new();
    for ((from, src, off, words), (name, mut to)) in groups {
        to.sort();
        to.dedup();
        if to.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(format!("tile {} needs the same bytes of `{src}` on tile {from} twice", to[0].0));
        }
        if let Some(last) = pieces.last_mut() {
            let joins = last.sender == from
                && *last.src == *src
                && last.src_off + 4 * last.words == off
                && last.to.len() == to.len()
                && last
                    .to
                    .iter()
                    .zip(&to)
                    .all(|(a, b)| a.0 == b.0 && a.1 == *b.1 && a.2 + 4 * last.words == b.2);
            if joins {
                last.words += words;
                continue;
            }
        }
        pieces.push(Multicast {
            sender: from,
            src: name.clone(),
            src_off: off,
            words,
            to: to.into_iter().map(|(t, d, o)| (t, d.clone(), o)).collect(),
        });
    }
    Ok(pieces)
}

/// The `copy_words` launch of one tile: segments (split at the kernel's limit) dealt to the six
/// workers largest first, each to the least loaded (ties: lowest worker).
fn copy_launch(ms: &[&Move], tag: &str) -> (Vec<Buffer>, u64) {
    let mut ms: Vec<&Move> = ms.to_vec();
    ms.sort();
    let mut segs: Vec<(u32, Vec<Word>)> = Vec::new();
    for m in ms {
        let mut done = 0;
        while done < m.words {
            let n = (m.words - done).min(COPY_MAX_WORDS);
            let entry = alloc::vec![
                Word::Sym(String::from(&*m.src).into(), m.src_off + 4 * done),
                Word::Sym(String::from(&*m.dst).into(), m.dst_off + 4 * done),
            ];
            segs.push((n, entry));
            done += n;
        }
    }
    word_launch(segs, cost::copy_issues, &format!("{tag}cl"), &format!("{tag}cd"))
}

/// A launch of a kernel over lists of word segments (`copy_words`, `zero_words`): segments
/// (words, the entry's words before the count) dealt to the six workers largest first, each to
/// the least loaded by `issues` (ties: earlier segment, lowest worker). Returns the list and
/// descriptor buffers and the slowest worker's issues.
pub(super) fn word_launch(
    mut segs: Vec<(u32, Vec<Word>)>,
    issues: fn(&[u32]) -> u64,
    list_name: &str,
    desc_name: &str,
) -> (Vec<Buffer>, u64) {
    segs.sort_by_key(|s| core::cmp::Reverse(s.0));
    let workers = crate::target::WORKERS;
    let mut lists: Vec<Vec<(u32, Vec<Word>)>> = (0..workers).map(|_| Vec::new()).collect();
    let counts = |l: &Vec<(u32, Vec<Word>)>| l.iter().map(|x| x.0).collect::<Vec<_>>();
    for s in segs {
        let w = (0..workers).min_by_key(|&w| (issues(&counts(&lists[w])), w)).unwrap_or(0);
        lists[w].push(s);
    }
    let (mut list, mut desc) = (Vec::new(), Vec::new());
    let mut slowest = 0;
    for l in &lists {
        desc.push(Word::Sym(list_name.into(), 4 * list.len() as u32));
        desc.push(Word::Const(l.len() as u32));
        desc.push(Word::Const(0));
        desc.push(Word::Const(0));
        for (n, entry) in l {
            list.extend(entry.iter().cloned());
            list.push(Word::Const(*n));
        }
        slowest = slowest.max(issues(&counts(l)));
    }
    let buf = |name: &str, init: Vec<Word>| Buffer {
        name: name.into(),
        bytes: 4 * init.len().max(1) as u32,
        align: 16,
        kind: MemKind::Descriptor,
        init: init.into(),
        live: super::Live::ALWAYS,
        read_past: 0,
    };
    (alloc::vec![buf(list_name, list), buf(desc_name, desc)], slowest)
}

/// Append a superstep to every tile's steps: `Phase`, `Sync`, the exchange, then local copies.
/// Without exchange events there is no superstep: each tile copies its own bytes, which its own
/// earlier steps made.
pub fn append(tiles: &mut super::Tiles, s: Superstep, phase: &str, tag: &str) {
    for (t, p) in tiles.iter_mut().enumerate() {
        p.steps.push(Step::Phase(phase.into()));
        if !s.events.is_empty() {
            p.steps.push(Step::Sync);
            p.steps.push(Step::Exchange(s.events.get(&(t as u16)).cloned().unwrap_or_default()));
        }
    }
    for (tile, (buffers, issues)) in s.copies {
        let p = &mut tiles[tile as usize];
        p.buffers.extend(buffers);
        p.steps.push(Step::RunAll(Kernel::CopyWords, format!("{tag}cd").into(), issues.into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::too_many_arguments)]
    fn slice(
        tile: u16,
        buffer: &str,
        offset: u32,
        t0: u64,
        rows: u32,
        row_bytes: u32,
        ts: u64,
        stride: u32,
    ) -> SliceRef {
        SliceRef {
            tile,
            buffer: buffer.into(),
            offset,
            tensor_offset: t0,
            rows,
            row_bytes,
            tensor_stride: ts,
            tile_stride: stride,
        }
    }

    #[test]
    fn rows_split_over_tiles_are_gathered_by_columns() {
        // A [4, 8] f16 tensor: rows 0-1 on tile 0, rows 2-3 on tile 1 (16 B per row, packed);
        // the consumer wants columns 0-3 of all rows on tile 2 and columns 4-7 on tile 0.
        let src = [slice(0, "C", 0, 0, 2, 16, 16, 16), slice(1, "C", 64, 32, 2, 16, 16, 16)];
        let dst = [slice(2, "A", 0, 0, 4, 8, 16, 32), slice(0, "A", 0, 8, 4, 8, 16, 32)];
        let m = moves("T", &src, &dst, &View::default()).unwrap();
        let words: u32 = m.iter().map(|m| m.words).sum();
        assert_eq!(words, 4 * 4, "every byte once: 4 rows × 16 bytes");
        assert!(m.contains(&Move {
            from: 1,
            src: "C".into(),
            src_off: 64 + 16,
            to: 2,
            dst: "A".into(),
            dst_off: 3 * 32,
            words: 2
        }));
        // Tile 0 keeps its own rows by a copy; the rest crosses the exchange.
        let s = superstep(&m, "t").unwrap();
        assert!(s.copies.contains_key(&0) && s.copies.len() == 1);
        assert_eq!(s.exchange_bytes, 4 * (words as u64 - 4));
        assert!(s.horizon > 11);
    }

    #[test]
    fn a_replicated_source_is_read_once() {
        let src = [slice(0, "A", 0, 0, 1, 32, 32, 32), slice(1, "A", 0, 0, 1, 32, 32, 32)];
        let dst = [slice(2, "B", 0, 0, 1, 32, 32, 32), slice(3, "B", 0, 0, 1, 32, 32, 32)];
        let m = moves("T", &src, &dst, &View::default()).unwrap();
        assert!(m.iter().all(|m| m.from == 0), "{m:?}");
        // One send to both receivers.
        let s = superstep(&m, "t").unwrap();
        assert_eq!(s.exchange_bytes, 32);
    }

    #[test]
    fn an_odd_row_end_moves_into_padding_and_misalignment_is_refused() {
        // 5 f16 values per row (10 B), rows 32 B apart on both sides: the last word carries padding.
        let src = [slice(0, "C", 0, 0, 3, 10, 10, 32)];
        let dst = [slice(1, "A", 0, 0, 3, 10, 10, 32)];
        let m = moves("T", &src, &dst, &View::default()).unwrap();
        assert!(m.iter().all(|m| m.words == 3), "{m:?}");
        // Packed rows (no room): the rounded word would overwrite the next row.
        let packed = [slice(1, "A", 0, 0, 3, 10, 10, 10)];
        assert!(moves("T", &src, &packed, &View::default()).unwrap_err().contains("whole aligned words"));
        // A destination that starts mid-word.
        let dst = [slice(1, "A", 2, 0, 1, 8, 10, 32)];
        let e = moves("T", &src, &dst, &View::default()).unwrap_err();
        assert!(e.contains("tensor `T`") && e.contains("tile 1"), "{e}");
    }

    #[test]
    fn bytes_the_producer_does_not_hold_are_an_error() {
        let src = [slice(0, "C", 0, 0, 1, 16, 16, 16)];
        let dst = [slice(1, "A", 0, 0, 2, 16, 16, 16)];
        let e = moves("T", &src, &dst, &View::default()).unwrap_err();
        assert!(e.contains("bytes 16.. needed on tile 1 are not held"), "{e}");
    }
}

#[cfg(test)]
mod view_tests {
    use super::*;

    #[test]
    fn a_head_split_view_maps_runs_of_the_last_axis() {
        // [T=3, H=2, dh=4] f16 transposed to [H, T, dh]: element (h, t, j) comes from (t, h, j).
        let t = ViewStep::Transpose { shape: alloc::vec![3, 2, 4], perm: alloc::vec![1, 0, 2] };
        let v = View { steps: alloc::vec![t], elt: 2 };
        assert_eq!(v.run(), 8);
        // Output (h=1, t=0, j=0) is element 12 → input (t=0, h=1) = element 4.
        assert_eq!(v.map(12 * 2), 4 * 2);
        // Output (h=0, t=2, j=0) is element 8 → input (t=2, h=0) = element 16.
        assert_eq!(v.map(8 * 2), 16 * 2);
    }

    #[test]
    fn a_crop_view_maps_runs_of_the_kept_columns() {
        // [2, 5, 6] f16 cropped to [2, 4, 4] from (0, 1, 0): runs of 4 values (8 bytes).
        let s = ViewStep::Slice {
            shape: alloc::vec![2, 5, 6],
            starts: alloc::vec![0, 1, 0],
            out: alloc::vec![2, 4, 4],
        };
        let v = View { steps: alloc::vec![s], elt: 2 };
        assert_eq!(v.run(), 8);
        // Output (1, 2, 0) = element 24 → input (1, 3, 0) = element 30 + 18 = 48.
        assert_eq!(v.map(24 * 2), 48 * 2);
        // Starting two columns in: runs shrink to the gcd of 4 and 2 (4 bytes).
        let s = ViewStep::Slice {
            shape: alloc::vec![2, 5, 6],
            starts: alloc::vec![0, 0, 2],
            out: alloc::vec![2, 5, 4],
        };
        assert_eq!(View { steps: alloc::vec![s], elt: 2 }.run(), 4);
    }
}
