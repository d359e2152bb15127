//! The simulator's host-vector AMP kernels (`host/src/sim/amp_x86.rs`: AVX2 + F16C, chosen at run
//! time) leave exactly the state the specification's portable kernels
//! (`ipu_core::tile::amp::Portable`) leave. Six workers stream `{ld2st64pi ; f16amp}` or
//! `{ld2st64pi ; f32amp}` loops over tile memory filled with f16 (and, as f32 partials, f32)
//! bit patterns of three kinds — moderate values that exercise rounding, values near the f16
//! maximum whose sums overflow, and arbitrary bits (NaNs with payloads, infinities, subnormals,
//! signed zeros) — on rows of their own (the batched path) and on shared rows (issue by issue).
//! Whole tile memory, cycles and issue counts are compared. On a host without AVX2 and F16C both
//! runs are the portable code and the test checks nothing new (it says so).

mod common;
use common::{fill_and_run, TILE_SPAN as MEM};

/// `tests/programs/amp_rows.s` with its blanks filled in and its AMP made `amp`.
fn program(amp: &str, stride_log2: u32, rows: u32) -> String {
    include_str!("../programs/amp_rows.s")
        .replace("{X}", "0x60000")
        .replace("{PIN}", "0x80000")
        .replace("{OUT}", "0xa0000")
        .replace("{STRIDE}", &stride_log2.to_string())
        .replace("{ROWS}", &rows.to_string())
        .replace("f16amp", amp)
}

/// Values of the fill: each 16-bit word from `z`.
#[derive(Clone, Copy, Debug)]
enum Fill {
    /// Sign, exponent 2^-3..2^0, random mantissa.
    Moderate,
    /// Sign, exponent 2^13..2^15: products and sums leave f16's range.
    Large,
    /// Any 16 bits.
    Any,
}

fn word(fill: Fill, z: u64) -> u16 {
    match fill {
        Fill::Moderate => ((z & 0x83FF) as u16) | 0x3000 | ((z >> 20) as u16 & 0x0C00),
        Fill::Large => ((z & 0x83FF) as u16) | 0x7000 | ((z >> 20) as u16 & 0x0800),
        Fill::Any => (z >> 24) as u16,
    }
}

/// Runs `src` on `tiles` tiles filled from `seed`, once with the portable kernels and once with
/// the host's fastest; returns (outcome, memory) of each.
fn both_kernels(src: &str, tiles: usize, fill: Fill, seed: u64) -> [(String, Vec<u8>); 2] {
    [true, false].map(|portable| {
        let (_, outcome, mem) =
            fill_and_run(src, tiles, seed, u64::MAX, |z| word(fill, z), |d| d.set_portable_amp(portable));
        (outcome, mem)
    })
}

fn host_has_simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[test]
fn simd_amp_kernels_match_the_portable_ones_bit_for_bit() {
    if !host_has_simd() {
        eprintln!("this host has no AVX2 + F16C: both runs used the portable kernels");
    }
    let mut specials = 0usize;
    for amp in ["f16amp", "f32amp"] {
        for fill in [Fill::Moderate, Fill::Large, Fill::Any] {
            // Rows of their own (2^14 bytes apart: the batched path) and shared rows (stride
            // 2^0 = 1 byte apart would misalign, so 2^3: every worker one pair further on).
            for (stride, rows) in [(14, 300), (3, 300)] {
                let what = format!("{amp} {fill:?} stride 2^{stride}");
                let [simd, portable] = both_kernels(&program(amp, stride, rows), 2, fill, 7 + stride as u64);
                assert_eq!(simd.0, portable.0, "{what}: outcome");
                assert!(simd.0.starts_with("HostSync"), "{what}: {}", simd.0);
                let differ = simd.1.iter().zip(&portable.1).position(|(a, b)| a != b);
                if let Some(i) = differ {
                    let i = i & !7;
                    panic!(
                        "{what}: memory differs at {:#x}: {:02x?} (host vectors) vs {:02x?} (portable)",
                        MEM.0 as usize + i % MEM.1,
                        &simd.1[i..i + 8],
                        &portable.1[i..i + 8]
                    );
                }
                // The outputs hold what the fill was chosen to reach.
                let out =
                    &portable.1[0xa0000 - MEM.0 as usize..0xa0000 - MEM.0 as usize + 8 * 4 * rows as usize];
                // f16amp stores f16 lanes, f32amp f32 lanes: count those with an all-ones exponent.
                let special = if amp == "f16amp" {
                    out.chunks(2).filter(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7C00 == 0x7C00).count()
                } else {
                    out.chunks(4)
                        .filter(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & 0x7F80_0000 == 0x7F80_0000)
                        .count()
                };
                // Large f16 values overflow f16 sums, not f32 ones.
                match (fill, amp) {
                    (Fill::Moderate, _) => assert_eq!(special, 0, "{what}: moderate values overflowed"),
                    (Fill::Large, "f32amp") => {}
                    _ => assert!(special > 0, "{what}: no infinity or NaN reached the output"),
                }
                specials += special;
            }
        }
    }
    assert!(specials > 0);
}
