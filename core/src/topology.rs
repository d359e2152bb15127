//! Logical→physical tile mapping and the exchange latency model (`docs/target.md` §1.1–1.2).

use crate::target::{
    EXCHANGE_BASE_LATENCY, EXCHANGE_CYCLES_LANE, EXCHANGE_CYCLES_PER_COLUMN, EXCHANGE_CYCLES_PER_ROW,
    NUM_TILES,
};

/// Physical id of a logical tile, the published C600 snake (FS §1).
pub const fn physical(logical: u16) -> u16 {
    let pair = logical / 2;
    let lane = logical & 1;
    let block = pair / 23;
    let mut row = pair % 23;
    if block & 1 != 0 {
        row = 22 - row;
    }
    row * 64 + (block / 2) * 4 + (block & 1) + lane * 2
}

/// Logical tile whose physical id is `physical(t) ^ 2` (the 64-bit pair partner).
pub const fn pair_partner(logical: u16) -> u16 {
    logical ^ 1
}

const fn column(p: u16) -> u32 {
    ((p >> 2) & 15) as u32
}
const fn row(p: u16) -> u32 {
    (p >> 6) as u32
}
const fn lane(p: u16) -> u32 {
    ((p >> 1) & 1) as u32
}

/// Cycles from a word leaving logical tile `s` to it being at logical tile `d`.
pub const fn latency(s: u16, d: u16) -> u32 {
    let (ps, pd) = (physical(s), physical(d));
    EXCHANGE_BASE_LATENCY
        + EXCHANGE_CYCLES_PER_COLUMN * column(ps).abs_diff(column(pd))
        + EXCHANGE_CYCLES_PER_ROW * row(ps).abs_diff(row(pd))
        + if lane(ps) != lane(pd) { EXCHANGE_CYCLES_LANE } else { 0 }
}

/// Largest latency between any two of the first `tiles` logical tiles.
pub fn max_latency(tiles: usize) -> u32 {
    let n = tiles.min(NUM_TILES) as u16;
    let mut worst = 0;
    // Latency depends on column, row and lane only, so scanning all pairs is exact; 1472² ≈ 2M.
    let mut s = 0;
    while s < n {
        let mut d = 0;
        while d < n {
            let l = latency(s, d);
            if l > worst {
                worst = l;
            }
            d += 1;
        }
        s += 1;
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_is_a_permutation_of_physical_ids() {
        let mut seen = [false; 23 * 64];
        for l in 0..NUM_TILES as u16 {
            let p = physical(l) as usize;
            assert!(!seen[p], "physical {p} hit twice");
            seen[p] = true;
        }
        assert_eq!(seen.iter().filter(|s| **s).count(), NUM_TILES);
    }

    #[test]
    fn pairs_share_physical_xor_two() {
        for l in (0..NUM_TILES as u16).step_by(2) {
            assert_eq!(physical(l) ^ 2, physical(pair_partner(l)));
        }
    }

    #[test]
    fn latency_examples_from_the_doc() {
        // Tiles 0 and 1: same row and column slot, different lane.
        assert_eq!(latency(0, 1), 11 + 2);
        assert_eq!(latency(0, 0), 11);
        // Tile 2 is pair 1: row 1, same column.
        assert_eq!(latency(0, 2), 11 + 2);
        assert_eq!(latency(5, 9), latency(9, 5));
        assert_eq!(max_latency(NUM_TILES), 147);
    }
}
