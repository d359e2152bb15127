//! The K-split reduction of a matmul (docs/kernels.md "K split"): the partial sums of a K group's
//! `tk` tiles are added over the exchange in the order of [`reduction_rounds`],
//! which the host reference follows too.
//!
//! Two forms. When one round takes every partial (fan-in `f = tk`), the group *reduce-scatters*:
//! every tile of the group finishes a share of the rows — each worker's rows split `tk` ways —
//! receiving only that share of the others' partials, so the words a tile receives, its adds and
//! its epilogue all shrink by `tk` and no tile of the group idles while its root finishes alone.
//! The sums still follow the reference's order `((P0 + P1) + P2) + …` element by element (the
//! running sum sits in the receive buffer until the tile's own partial joins it). With more
//! rounds (a fan-in that fits only below `tk`) the tree of [`reduce_group`] leaves the sums on the
//! group's first tile, as before.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use super::cost::{binary_rows_issues, kernel_issues};
use super::exchange::{Event, Schedule, Transfer, EXPECT_CYCLES};
use super::layout::{split, zero, ROW, SCRATCH, SLACK};
use super::{Kernel, MemKind, TilePlan, Word};
use crate::target::{MUX_NONE, WORKERS};
use crate::topology::latency;

/// The reduction rounds of `tk` partial sums with fan-in `f`: in round `r` (stride `s = f^r`),
/// each tile `l` with `l % (f·s) == 0` adds the partials of `l + s, l + 2s, …` (those below `tk`)
/// to its own, in that order. After the last round tile 0 holds the sum. `(receiver, senders)`.
pub fn reduction_rounds(tk: u64, f: u64) -> Vec<Vec<(u64, Vec<u64>)>> {
    let mut rounds = Vec::new();
    let mut s = 1u64;
    while s < tk && f >= 2 {
        let round: Vec<(u64, Vec<u64>)> = (0..tk)
            .step_by((f * s) as usize)
            .map(|l| (l, (1..f).map(|j| l + j * s).filter(|&x| x < tk).collect::<Vec<_>>()))
            .filter(|(_, senders)| !senders.is_empty())
            .collect();
        rounds.push(round);
        s *= f;
    }
    rounds
}

/// One reduction round: what moves over the exchange, and the add kernels each receiver runs
/// `(tile, descriptor name suffix, descriptor words, slowest worker's issues)`, in order.
pub(super) struct Round {
    pub transfers: Vec<Transfer>,
    pub adds: Vec<(u16, String, Vec<Word>, u64)>,
}

/// One worker's rows of an output block on a tile: the byte offset of the first in the block, its
/// index among the tile's rows, and how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Piece {
    pub at: u64,
    pub row: u64,
    pub rows: u64,
}

/// The workers' pieces of a block whose rows are split `wr` over the workers: each worker's rows
/// follow its AMP scratch.
pub(super) fn pieces(wr: &[(u64, u64)]) -> Vec<Piece> {
    let mut off = 0;
    wr.iter()
        .map(|&(w0, w1)| {
            let p = Piece { at: off + SCRATCH as u64, row: w0, rows: w1 - w0 };
            off += SCRATCH as u64 + (w1 - w0) * ROW as u64;
            p
        })
        .collect()
}

/// Share `l` of `tk` of every worker's piece: the rows a reduce-scattering tile finishes, still
/// one piece per worker (so the workers stay balanced on every tile of the group).
pub(super) fn share(all: &[Piece], tk: u64, l: u64) -> Vec<Piece> {
    all.iter()
        .map(|p| {
            let (s0, s1) = split(p.rows, tk, l);
            Piece { at: p.at + s0 * ROW as u64, row: p.row + s0, rows: s1 - s0 }
        })
        .collect()
}

/// Schedule the reduction tree of one K group (`tk` tiles, `tile(l)`), `cbytes` bytes of partial
/// sums per tile, over the rounds of [`reduction_rounds`]. Each receiver takes up to `f − 1`
/// partials into `R` and adds them to its `C` in sender order.
pub(super) fn reduce_group(
    plans: &mut [TilePlan],
    rounds: &mut [Round],
    tile: impl Fn(u64) -> u16,
    (tk, f): (u64, u64),
    cbytes: u64,
    add: Kernel,
) {
    for (r, round) in reduction_rounds(tk, f).iter().enumerate() {
        for (recv, senders) in round {
            let rt = tile(*recv);
            let p = &mut plans[rt as usize];
            if !p.buffers.iter().any(|b| b.name == "R") {
                p.buffers.push(zero("R", (f - 1) * cbytes + SLACK as u64, MemKind::Exchange));
            }
            for (k, sd) in senders.iter().enumerate() {
                let k = k as u64;
                rounds[r].transfers.push(Transfer {
                    sender: tile(*sd),
                    receiver: rt,
                    src: "C".into(),
                    src_off: 0,
                    dst: "R".into(),
                    dst_off: (k * cbytes) as u32,
                    words: (cbytes / 4) as u32,
                });
                for (cr, words) in add_descriptors(cbytes, "R", k * cbytes).into_iter().enumerate() {
                    let issues = descriptor_issues(add, &words);
                    rounds[r].adds.push((rt, format!("_{k}_{cr}"), words, issues));
                }
            }
        }
    }
}

/// The one-round reduce-scatter of a K group (`tk` tiles, `tile(l)`, `nbt` blocks of `cblk` bytes
/// with the workers' pieces `all`): tile `l` receives share `l` of every other tile's partials
/// into `R` (`[sender][piece][block]`, so a worker's piece is one stride in C and another in R)
/// and adds them with `add_blocks` (the row binary kernel's code over f16 or f32, the caller's
/// choice; blocks are its rows), one launch per step over all blocks, so that each element is summed in the order `((P0 + P1) + P2) + …`.
/// Returns each tile's share.
pub(super) fn reduce_scatter(
    plans: &mut [TilePlan],
    round: &mut Round,
    tile: impl Fn(u64) -> u16,
    (tk, nbt, cblk): (u64, u64, u64),
    all: &[Piece],
) -> Vec<Vec<Piece>> {
    let shares: Vec<Vec<Piece>> = (0..tk).map(|l| share(all, tk, l)).collect();
    for (l, mine) in shares.iter().enumerate() {
        let l = l as u64;
        // Bytes of the share over all blocks, and each piece's offset among them (`[piece][block]`).
        let mut prefix = Vec::with_capacity(mine.len());
        let mut bytes = 0;
        for p in mine {
            prefix.push(bytes);
            bytes += nbt * p.rows * ROW as u64;
        }
        if bytes == 0 {
            continue;
        }
        let rt = tile(l);
        plans[rt as usize].buffers.push(zero("R", (tk - 1) * bytes + SLACK as u64, MemKind::Exchange));
        // Slot of partial `q` in R (the senders in index order), or `None` for the tile's own.
        let slot = |q: u64| (q != l).then(|| if q < l { q } else { q - 1 });
        for q in 0..tk {
            let Some(k) = slot(q) else { continue };
            for (p, pre) in mine.iter().zip(&prefix) {
                for nbl in 0..nbt {
                    if p.rows > 0 {
                        round.transfers.push(Transfer {
                            sender: tile(q),
                            receiver: rt,
                            src: "C".into(),
                            src_off: (nbl * cblk + p.at) as u32,
                            dst: "R".into(),
                            dst_off: (k * bytes + pre + nbl * p.rows * ROW as u64) as u32,
                            words: (p.rows * ROW as u64 / 4) as u32,
                        });
                    }
                }
            }
        }
        // Where partial q of a worker's piece starts and its block stride: in the tile's C, or
        // in its slot of R.
        let at = |q: u64, p: &Piece, pre: u64| match slot(q) {
            None => (Word::Sym("C".into(), p.at as u32), cblk),
            Some(k) => (Word::Sym("R".into(), (k * bytes + pre) as u32), p.rows * ROW as u64),
        };
        // The running sum starts in partial 0's place; once the tile's own partial has been added
        // it lives in C (which the epilogue and the output read).
        let mut acc = 0u64;
        let mut in_c = l == 0;
        for q in 1..tk {
            let into_c = in_c || q == l;
            let (mut words, mut slowest) = (Vec::with_capacity(8 * WORKERS), 0);
            for (p, pre) in mine.iter().zip(&prefix) {
                let (dst, dst_stride) = at(acc, p, *pre);
                let (src, src_stride) = at(q, p, *pre);
                let (out, out_stride) = if into_c { at(l, p, *pre) } else { at(acc, p, *pre) };
                let chunks = p.rows * ROW as u64 / 8;
                words.extend([
                    dst,
                    Word::Const(dst_stride as u32),
                    src,
                    Word::Const(src_stride as u32),
                    out,
                    Word::Const(out_stride as u32),
                    Word::Const(nbt as u32),
                    Word::Const(chunks as u32),
                ]);
                slowest = slowest.max(binary_rows_issues(nbt, chunks));
            }
            round.adds.push((rt, format!("_{q}"), words, slowest));
            in_c = into_c;
            acc = if into_c { l } else { acc };
        }
    }
    shares
}

/// The exchange of reduce-scattering K groups (each the tiles `l = 0..tk` of one group, sending
/// the `transfers` of [`reduce_scatter`]), in `tk − 1` rounds: in round `d` tile `l` streams its
/// pieces for tile `l + d` (mod `tk`) back to back while it takes tile `l − d`'s, which land one
/// after another in the sender's slot of `R`. So a tile's supervisor sets its pointer and mux once
/// per round, before its own sends, instead of between pieces (where its own sends would keep it
/// busy: the generic schedulers then serialise the two directions). A round starts when the
/// previous round's last word has landed on every tile of the group. The caller validates it
/// word by word (`exchange::validate`; `matmul::plan`, not when it only costs a candidate).
pub(super) fn scatter_schedule(groups: &[Vec<u16>], transfers: &[Transfer]) -> Schedule {
    let mut by_pair: alloc::collections::BTreeMap<(u16, u16), Vec<&Transfer>> = Default::default();
    for t in transfers {
        by_pair.entry((t.sender, t.receiver)).or_default().push(t);
    }
    let none: Vec<&Transfer> = Vec::new();
    let mut s = Schedule::default();
    for g in groups {
        let tk = g.len();
        let pieces = |a: usize, b: usize| by_pair.get(&(g[a], g[b])).unwrap_or(&none);
        let mut evs: Vec<Vec<Event>> = alloc::vec![Vec::new(); tk];
        for (r, ev) in evs.iter_mut().enumerate() {
            let words: u32 = (0..tk).flat_map(|q| pieces(q, r).iter().map(|t| t.words)).sum();
            if words > 0 {
                ev.push(Event::Expect(words));
            }
        }
        // The cycle of the next round's pointer events: every receiver's `Expect` done.
        let mut at = EXPECT_CYCLES;
        // Each tile's mux: a tile that takes nothing in a round parks it, or the round's sender
        // (streaming to another tile) would land there too.
        let mut mux = alloc::vec![MUX_NONE; tk];
        for d in 1..tk {
            for (r, ev) in evs.iter_mut().enumerate() {
                let q = (r + tk - d) % tk;
                if let Some(first) = pieces(q, r).first() {
                    ev.push(Event::Pointer { at, buffer: first.dst.clone(), offset: first.dst_off });
                    ev.push(Event::Mux { at: at + 1, source: g[q] });
                    mux[r] = g[q];
                } else if mux[r] != MUX_NONE {
                    ev.push(Event::Mux { at: at + 1, source: MUX_NONE });
                    mux[r] = MUX_NONE;
                }
            }
            let mut next = at + 2;
            for (q, ev) in evs.iter_mut().enumerate() {
                let r = (q + d) % tk;
                let mut t = at + 2;
                for p in pieces(q, r) {
                    ev.push(Event::Send { at: t, buffer: p.src.clone(), offset: p.src_off, words: p.words });
                    t += p.words as u64;
                }
                // The cycle after the sender's last word of this round has reached its receiver
                // and every tile that selects this sender in a later round (a word reaches every
                // tile; those must not take it).
                let reach = (d..tk).map(|e| latency(g[q], g[(q + e) % tk])).max().unwrap_or(0);
                next = next.max(t + reach as u64);
            }
            at = next;
        }
        for (r, ev) in evs.iter_mut().enumerate() {
            if mux[r] != MUX_NONE {
                ev.push(Event::Mux { at, source: MUX_NONE });
            }
            if !ev.is_empty() {
                ev.push(Event::Drain { until: at + 1 });
                s.events.insert(g[r], core::mem::take(ev));
            }
        }
        s.horizon = s.horizon.max(at + 1);
    }
    s
}

/// Descriptor tables of `C[i] += src[i]` over the first `bytes` of C, `src` at `src_base` in
/// buffer `src`, in 8-byte chunks spread over the workers; one table per round of at most 4096
/// chunks per worker (the kernel's `rpt` limit).
pub(super) fn add_descriptors(bytes: u64, src: &str, src_base: u64) -> Vec<Vec<Word>> {
    let chunks = bytes / 8;
    let rounds = chunks.div_ceil(WORKERS as u64 * 4096);
    (0..rounds)
        .map(|cr| {
            let (r0, r1) = split(chunks, rounds, cr);
            let mut words = Vec::new();
            for w in 0..WORKERS as u64 {
                let (c0, c1) = split(r1 - r0, WORKERS as u64, w);
                let (c0, c1) = (r0 + c0, r0 + c1);
                words.push(Word::Sym("C".into(), (c0 * 8) as u32));
                words.push(Word::Sym(src.into(), (src_base + c0 * 8) as u32));
                words.push(Word::Sym("C".into(), (c0 * 8) as u32));
                words.push(Word::Const((c1 - c0) as u32));
            }
            words
        })
        .collect()
}

/// The slowest worker's issues of a descriptor table (count in word 3 of each 4-word entry).
pub(super) fn descriptor_issues(kernel: Kernel, words: &[Word]) -> u64 {
    words
        .chunks(4)
        .map(|w| if let Some(Word::Const(n)) = w.get(3) { kernel_issues(kernel, *n) } else { 0 })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_split_every_workers_rows() {
        let wr: Vec<(u64, u64)> = (0..6).map(|w| split(25, 6, w)).collect();
        let all = pieces(&wr);
        assert_eq!(all[1], Piece { at: 2 * 40 + 5 * 32, row: 5, rows: 4 });
        for tk in 1..=7 {
            let shares: Vec<Vec<Piece>> = (0..tk).map(|l| share(&all, tk, l)).collect();
            for (w, p) in all.iter().enumerate() {
                // The shares of a piece tile it in order, each starting where the last ended.
                let (mut at, mut row) = (p.at, p.row);
                for s in &shares {
                    assert_eq!((s[w].at, s[w].row), (at, row));
                    at += s[w].rows * 32;
                    row += s[w].rows;
                }
                assert_eq!(row, p.row + p.rows);
            }
        }
    }

    /// The adds of a share follow the reference's order: replaying the descriptors on symbolic
    /// sums gives `((P0 + P1) + P2) + …` in C for every tile of the group.
    #[test]
    fn reduce_scatter_adds_in_the_reference_order() {
        for tk in 2..=5u64 {
            let wr: Vec<(u64, u64)> = (0..6).map(|w| split(13, 6, w)).collect();
            let all = pieces(&wr);
            let mut plans = alloc::vec![TilePlan::default(); tk as usize];
            let mut round = Round { transfers: Vec::new(), adds: Vec::new() };
            let cblk = 6 * 40 + 13 * 32;
            let shares = reduce_scatter(&mut plans, &mut round, |l| l as u16, (tk, 2, cblk), &all);
            for l in 0..tk {
                // Symbolic memory: which sum each location holds, by (buffer, offset).
                let mut mem: alloc::collections::BTreeMap<(String, u32), String> = Default::default();
                let key = |w: &Word| match w {
                    Word::Sym(b, o) => (String::from(b.as_str()), *o),
                    _ => unreachable!(),
                };
                for t in round.transfers.iter().filter(|t| t.receiver == l as u16) {
                    mem.insert((String::from(&*t.dst), t.dst_off), format!("P{}", t.sender));
                }
                for (nbl, p) in (0..2u64).flat_map(|b| shares[l as usize].iter().map(move |p| (b, *p))) {
                    if p.rows > 0 {
                        mem.insert(("C".into(), (nbl * cblk + p.at) as u32), format!("P{l}"));
                    }
                }
                for (_, _, words, _) in round.adds.iter().filter(|a| a.0 == l as u16) {
                    for e in words.chunks(8) {
                        let Word::Const(blocks) = e[6] else { unreachable!() };
                        if let Word::Const(0) = e[7] {
                            continue;
                        }
                        // (pointer, block stride) of dst, src, out.
                        let stride = |i: usize| match e[2 * i + 1] {
                            Word::Const(s) => s,
                            _ => unreachable!(),
                        };
                        for b in 0..blocks {
                            let at = |i: usize| {
                                let (buf, off) = key(&e[2 * i]);
                                (buf, off + b * stride(i))
                            };
                            let sum = format!("({} + {})", mem[&at(0)], mem[&at(1)]);
                            mem.insert(at(2), sum);
                        }
                    }
                }
                let want = (1..tk).fold(String::from("P0"), |s, q| format!("({s} + P{q})"));
                for nbl in 0..2u64 {
                    for p in shares[l as usize].iter().filter(|p| p.rows > 0) {
                        assert_eq!(mem[&("C".into(), (nbl * cblk + p.at) as u32)], want, "tk {tk} tile {l}");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod schedule_tests {
    use super::*;

    /// The reduce-scatter of groups of 2..5 tiles, with shares that leave some tiles nothing to
    /// take in some rounds (2 rows over 6 workers), validates word by word; and with 146 rows a
    /// pair exchanges both ways at once: the exchange takes about one share, not two.
    #[test]
    fn reduce_scatter_rounds_validate_and_overlap_both_directions() {
        for (rows, tk) in [(2u64, 2u64), (2, 3), (2, 5), (13, 4), (146, 2), (146, 5)] {
            let wr: Vec<(u64, u64)> = (0..6).map(|w| split(rows, 6, w)).collect();
            let all = pieces(&wr);
            let cblk = 6 * 40 + rows * 32;
            let mut plans = alloc::vec![TilePlan::default(); 2 * tk as usize + 1];
            let mut round = Round { transfers: Vec::new(), adds: Vec::new() };
            // Two groups with interleaved tile numbers, as a grid's tile order may give.
            let groups: Vec<Vec<u16>> =
                (0..2u16).map(|g| (0..tk as u16).map(|l| 1 + 2 * l + g).collect()).collect();
            for g in &groups {
                reduce_scatter(&mut plans, &mut round, |l| g[l as usize], (tk, 3, cblk), &all);
            }
            let s = scatter_schedule(&groups, &round.transfers);
            crate::plan::exchange::validate(&round.transfers, &s)
                .unwrap_or_else(|e| panic!("{rows} rows, tk {tk}: {e}"));
            if (rows, tk) == (146, 2) {
                let share_words = 3 * 73 * 32 / 4;
                assert!(s.horizon < share_words + 64, "{}", s.horizon);
            }
        }
    }
}
