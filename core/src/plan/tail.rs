//! The tail band of a matmul grid (docs/kernels.md "Tail band"): the last rows of the result on
//! the tiles a grid leaves spare.
//!
//! Why: a grid `tm × tn` rarely uses the whole chip (2048×1024·1024×2048 on 1,472 tiles is best
//! as 11 × 128 = 1,408 tiles), and its row groups are as long as `M / tm` makes them, with
//! workers' rows rounded up. Moving a few rows of every column to a band of their own — `rows`
//! rows, split over `tn` column groups on the spare tiles — shortens every main tile's row
//! stream; the band's tiles take more column blocks each, on rows short enough to finish no
//! later. The choice is a pure function of the matmul, the grid and the tile count, so the
//! package records only `[tm, tn, tk]` and the planner, the search and the reference all see
//! the same band.

use alloc::vec::Vec;

use super::matmul::{self, Grid, MatMul};

/// A tail band: the last `rows` rows of the result, split over `tn` column groups, one tile each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tail {
    /// Rows of the band (the last rows of the result).
    pub rows: u64,
    /// Column groups of the band (= its tiles).
    pub tn: u64,
    /// The grid's estimate with the band: the slower of a main tile and a band tile.
    pub estimate: u64,
}

/// The tail band that gives the grid the lowest estimate on `tiles` tiles, if one beats the grid
/// alone. Only grids without a K split, and only matmuls whose A comes from the host (a row
/// chain's A lives on the tiles of the previous op, `MatMul::a_home`), get one.
///
/// Candidates: every distinct column-group count the spare tiles allow (each group takes
/// `⌈nb / tn⌉` blocks), and every band height up to the main groups' rows; the first lowest
/// estimate wins (fewest band tiles, then fewest band rows), so the choice is deterministic.
pub fn tail_band(mm: &MatMul, g: Grid, tiles: usize) -> Option<Tail> {
    if g.tk != 1 || !mm.a_home.is_empty() || g.tm == 0 || mm.m <= g.tm {
        return None;
    }
    let spare = (tiles as u64).checked_sub(g.tm * g.tn).filter(|&s| s > 0)?;
    let (nb, kb) = (mm.nb(), mm.kb());
    let nbt_main = nb.div_ceil(g.tn);
    let uniform = matmul::estimate(mm, g);
    let mut best: Option<Tail> = None;
    for tn in band_widths(nb, spare) {
        let nbt = nb.div_ceil(tn);
        let main = |rows: u64| matmul::band_estimate(mm, (mm.m - rows).div_ceil(g.tm), nbt_main, kb);
        let band = |rows: u64| matmul::band_estimate(mm, rows, nbt, kb);
        // Taller bands are slower and shorten the main rows: past the first height whose band
        // is slower than its main tiles, or that does not fit, none is better. Below it the
        // estimate is the main tiles', which only falls with the height: the first height at
        // its lowest wins. Found by bisection, so that the screening stays cheap for tall
        // matrices (every predicate is monotone in the height).
        // At most the main groups' rows, and every main group keeps one.
        let top = mm.m.div_ceil(g.tm).min(mm.m - g.tm);
        let end = first_true(1, top + 1, |r| band(r) > main(r) || !band_fits(mm, r, nbt, kb));
        if end <= 1 {
            continue;
        }
        let lowest = main(end - 1);
        let rows = first_true(1, end - 1, |r| main(r) <= lowest);
        if lowest < best.map_or(uniform, |b| b.estimate) {
            best = Some(Tail { rows, tn, estimate: lowest });
        }
    }
    best
}

/// The distinct column-group counts of a band on `spare` tiles (each group takes `⌈nb / tn⌉`
/// blocks), fewest first.
fn band_widths(nb: u64, spare: u64) -> Vec<u64> {
    let mut widths: Vec<u64> = (1..=nb).map(|blocks| nb.div_ceil(blocks)).filter(|&tn| tn <= spare).collect();
    widths.dedup();
    widths.reverse();
    widths
}

/// The first `r` in `lo..hi` for which `pred` holds (`hi` if none), `pred` false then true.
fn first_true(mut lo: u64, mut hi: u64, pred: impl Fn(u64) -> bool) -> u64 {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// Whether a band tile's rows fit the kernels' repeat count and its buffers the tile memory.
fn band_fits(mm: &MatMul, rows: u64, nbt: u64, kb: u64) -> bool {
    matmul::rows_fit_rpt(mm, rows) && matmul::fits_sizes(matmul::band_buffers(mm, [rows, nbt, kb], false, 1))
}

/// The row groups of a grid with its tail band: `(first row, end row, column groups)` each, the
/// main groups first (the rows the band leaves, split `tm` ways), then the band.
pub fn row_groups(mm: &MatMul, g: Grid, tail: Option<Tail>) -> Vec<(u64, u64, u64)> {
    let band_rows = tail.map_or(0, |t| t.rows);
    let main = mm.m - band_rows;
    let mut groups: Vec<(u64, u64, u64)> =
        (0..g.tm).map(|i| matmul::split(main, g.tm, i)).map(|(a, b)| (a, b, g.tn)).collect();
    if let Some(t) = tail {
        groups.push((main, mm.m, t.tn));
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::TensorId;
    use ipu_schema::DType;

    fn matmul(m: u64, k: u64, n: u64, acc: DType, out: DType) -> MatMul {
        let t = TensorId(0);
        MatMul {
            a: t,
            b: t,
            c: t,
            ta: false,
            tb: false,
            m,
            k,
            n,
            acc,
            alpha: None,
            out,
            epilogue: None,
            fp8: None,
            a_home: Vec::new(),
            a_rows_whole: false,
        }
    }

    /// The band by trying every height in order (what the bisection must reproduce).
    fn by_scan(mm: &MatMul, g: Grid, tiles: usize) -> Option<Tail> {
        if g.tk != 1 || g.tm == 0 || mm.m <= g.tm || tiles as u64 <= g.tm * g.tn {
            return None;
        }
        let spare = tiles as u64 - g.tm * g.tn;
        let (nb, kb) = (mm.nb(), mm.kb());
        let mut best: Option<Tail> = None;
        for tn in band_widths(nb, spare) {
            let nbt = nb.div_ceil(tn);
            for rows in 1..=mm.m.div_ceil(g.tm).min(mm.m - g.tm) {
                let main = matmul::band_estimate(mm, (mm.m - rows).div_ceil(g.tm), nb.div_ceil(g.tn), kb);
                let band = matmul::band_estimate(mm, rows, nbt, kb);
                if band > main {
                    break;
                }
                if main < best.map_or(matmul::estimate(mm, g), |b| b.estimate) && band_fits(mm, rows, nbt, kb)
                {
                    best = Some(Tail { rows, tn, estimate: main });
                }
            }
        }
        best
    }

    #[test]
    fn bisection_finds_the_band_a_scan_of_every_height_finds() {
        let mut bands = 0;
        for (m, k, n) in [
            (100, 64, 64),
            (200, 64, 128),
            (197, 96, 384),
            (2048, 1024, 2048),
            (729, 1152, 1152),
            (37, 20, 300),
        ] {
            for (acc, out) in [(DType::F16, DType::F16), (DType::F32, DType::F16)] {
                let mm = matmul(m, k, n, acc, out);
                for tiles in [3, 10, 20, 37, 100, 1472] {
                    for g in matmul::candidates(&mm, tiles) {
                        let t = tail_band(&mm, g, tiles);
                        assert_eq!(t, by_scan(&mm, g, tiles), "{m}x{k}x{n} {acc:?} on {tiles}: {g:?}");
                        bands += usize::from(t.is_some());
                    }
                }
            }
        }
        assert!(bands > 100, "the shapes exercise bands: {bands}");
    }
}
