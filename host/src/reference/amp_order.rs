//! The register kernel of the fast device-precision matmul: [`ROWS`] output rows × [`LANES`]
//! output columns whose running K sums stay in registers while one K piece streams past.
//!
//! The arithmetic is the AMP's (docs/target.md §4.4), as `matmul_device_scalar` states it per
//! element: a block of K is four phases of `E` values (4 for f16, 8 for FP8); each phase's `E`
//! products are added pairwise, the previous block's result (the "pin") is added in the column's
//! pin phase, the phase's sum is added, and the block's result is rounded to the partial-sum type.
//! Here the pin is added in every phase, masked to `+0.0` where the phase is not the column's:
//! that is the identity, because the accumulator starts at `+0.0` and an IEEE sum is `−0.0` only
//! when both addends are. On an x86-64 host with AVX2 and F16C the 8 columns are one vector
//! ([`Kernel::run_avx2`]: IEEE multiplies and adds in the same order, never fused, and the f16
//! rounding by `vcvtps2ph` with round-to-nearest-even); elsewhere the same operations run one
//! lane at a time ([`Kernel::run_any`]). Both give the same bits (tested below and against the
//! specification in `tests/tests/reference_speed.rs`).

// Kernels index rows, lanes and phases by number: the numbers are the layout.
#![allow(clippy::needless_range_loop)]

use super::matmul::round_f16;

/// Output rows computed together (they share every load of B).
pub const ROWS: usize = 4;
/// Output columns computed together (one AVX2 vector of f32).
pub const LANES: usize = 8;

/// One K piece for [`ROWS`] rows × [`LANES`] columns.
pub struct Kernel<'a> {
    /// Each row's values of A over the piece's blocks (`blocks · 4E` values, zero-padded).
    pub a: [&'a [f32]; ROWS],
    /// The column panel over the piece's blocks: `[k][LANES]`, `blocks · 4E · LANES` values.
    pub b: &'a [f32],
    /// Blocks of K in the piece.
    pub blocks: usize,
    /// Per phase, all ones in the lanes whose pin phase it is.
    pub masks: [[u32; LANES]; 4],
    /// FP8: the product scale `2^iscl` as the two factors `fp8::scale_pow2` multiplies by;
    /// unused for f16.
    pub scale: (f32, f32),
    /// The partial sums are f16: each block's result is rounded to it.
    pub round16: bool,
}

impl Kernel<'_> {
    /// The piece's result per row and lane (the last block's rounded sums).
    pub fn run<const E: usize>(&self) -> [[f32; LANES]; ROWS] {
        self.check::<E>();
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c") {
            // SAFETY: the host has AVX2 and F16C (checked just above); `check` bounds the loads.
            #[allow(unsafe_code)]
            return unsafe { self.run_avx2::<E>() };
        }
        self.run_any::<E>()
    }

    fn check<const E: usize>(&self) {
        assert!(E == 4 || E == 8, "a phase holds 4 (f16) or 8 (FP8) values");
        assert!(self.b.len() >= self.blocks * 4 * E * LANES, "panel shorter than the piece");
        assert!(self.a.iter().all(|r| r.len() >= self.blocks * 4 * E), "row shorter than the piece");
    }

    /// Lane by lane: the specification's operations in its order.
    pub(super) fn run_any<const E: usize>(&self) -> [[f32; LANES]; ROWS] {
        self.check::<E>();
        let mut pin = [[0f32; LANES]; ROWS];
        for blk in 0..self.blocks {
            let b = &self.b[blk * 4 * E * LANES..(blk + 1) * 4 * E * LANES];
            for (r, pin_r) in pin.iter_mut().enumerate() {
                let a = &self.a[r][blk * 4 * E..(blk + 1) * 4 * E];
                for (c, p) in pin_r.iter_mut().enumerate() {
                    let mut acc = 0f32;
                    for ph in 0..4 {
                        acc += f32::from_bits(p.to_bits() & self.masks[ph][c]);
                        let pr: [f32; E] =
                            core::array::from_fn(|q| a[ph * E + q] * b[(ph * E + q) * LANES + c]);
                        acc += if E == 8 {
                            (((pr[0] + pr[1]) + (pr[2] + pr[3])) + ((pr[4] + pr[5]) + (pr[6] + pr[7])))
                                * self.scale.0
                                * self.scale.1
                        } else {
                            (pr[0] + pr[1]) + (pr[2] + pr[3])
                        };
                    }
                    *p = if self.round16 { round_f16(acc) } else { acc };
                }
            }
        }
        pin
    }

    /// [`Self::run_any`] with the 8 lanes as one AVX2 vector.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    #[allow(unsafe_code)]
    fn run_avx2<const E: usize>(&self) -> [[f32; LANES]; ROWS] {
        use core::arch::x86_64::*;
        // SAFETY (every load below): `check` showed blocks·4E·LANES values of b and blocks·4E of
        // each row of a; the offsets stay below those.
        let masks: [__m256; 4] =
            core::array::from_fn(|ph| unsafe { _mm256_loadu_ps(self.masks[ph].as_ptr() as *const f32) });
        let (s0, s1) = (_mm256_set1_ps(self.scale.0), _mm256_set1_ps(self.scale.1));
        let mut pin = [_mm256_setzero_ps(); ROWS];
        for blk in 0..self.blocks {
            let b = unsafe { self.b.as_ptr().add(blk * 4 * E * LANES) };
            let mut acc = [_mm256_setzero_ps(); ROWS];
            for ph in 0..4 {
                let bv: [__m256; E] =
                    core::array::from_fn(|q| unsafe { _mm256_loadu_ps(b.add((ph * E + q) * LANES)) });
                for r in 0..ROWS {
                    let a = unsafe { self.a[r].as_ptr().add(blk * 4 * E + ph * E) };
                    acc[r] = _mm256_add_ps(acc[r], _mm256_and_ps(pin[r], masks[ph]));
                    let pr: [__m256; E] =
                        core::array::from_fn(|q| _mm256_mul_ps(unsafe { _mm256_set1_ps(*a.add(q)) }, bv[q]));
                    let s = if E == 8 {
                        let lo = _mm256_add_ps(_mm256_add_ps(pr[0], pr[1]), _mm256_add_ps(pr[2], pr[3]));
                        let hi = _mm256_add_ps(_mm256_add_ps(pr[4], pr[5]), _mm256_add_ps(pr[6], pr[7]));
                        _mm256_mul_ps(_mm256_mul_ps(_mm256_add_ps(lo, hi), s0), s1)
                    } else {
                        _mm256_add_ps(_mm256_add_ps(pr[0], pr[1]), _mm256_add_ps(pr[2], pr[3]))
                    };
                    acc[r] = _mm256_add_ps(acc[r], s);
                }
            }
            for r in 0..ROWS {
                pin[r] = if self.round16 {
                    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(acc[r]))
                } else {
                    acc[r]
                };
            }
        }
        let mut out = [[0f32; LANES]; ROWS];
        for r in 0..ROWS {
            // SAFETY: out[r] holds LANES f32.
            unsafe { _mm256_storeu_ps(out[r].as_mut_ptr(), pin[r]) };
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector kernel gives the lane-by-lane kernel's bits, on values that exercise f16
    /// overflow, subnormals, signed zeros, infinities and NaN, for both phase widths and both
    /// partial-sum types.
    #[test]
    fn vector_and_lane_kernels_agree_bit_for_bit() {
        let mut z = 0x1234_5678_9abc_def0u64;
        let mut next = move || {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            z
        };
        let blocks = 5;
        for (e, round16) in [(4usize, true), (4, false), (8, true), (8, false)] {
            let mut val = |_: usize| -> f32 {
                let x = next();
                match x % 1009 {
                    0 => f32::INFINITY,
                    1 => f32::NAN,
                    2..=40 => -0.0,
                    41..=80 => 1e-7,
                    _ => ((x >> 20) as f32 / (1u64 << 44) as f32 - 0.5) * if x % 3 == 0 { 3e4 } else { 2.0 },
                }
            };
            let a: Vec<Vec<f32>> = (0..ROWS).map(|_| (0..blocks * 4 * e).map(&mut val).collect()).collect();
            let b: Vec<f32> = (0..blocks * 4 * e * LANES).map(&mut val).collect();
            let masks =
                core::array::from_fn(|ph| core::array::from_fn(|c| if c / 2 == ph { u32::MAX } else { 0 }));
            let k = Kernel {
                a: core::array::from_fn(|r| &a[r][..]),
                b: &b,
                blocks,
                masks,
                scale: (0.25, 0.5),
                round16,
            };
            let (fast, slow) =
                if e == 4 { (k.run::<4>(), k.run_any::<4>()) } else { (k.run::<8>(), k.run_any::<8>()) };
            for r in 0..ROWS {
                for c in 0..LANES {
                    let (x, y) = (fast[r][c], slow[r][c]);
                    assert!(
                        x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                        "E={e} r={r} c={c}: {x} vs {y}"
                    );
                }
            }
        }
    }
}
