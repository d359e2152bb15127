//! f64 matrix products for the reference's real-number values and error bounds.
//!
//! Each sum runs in the plain loop's order — k ascending from zero, one term added at a time — so
//! the results are bit-identical to `for k { s += a·b }`; only the memory traffic changes: B is
//! packed once into panels of [`C`] columns (`[panel][k][C]`), and 4 rows × 8 columns of sums stay
//! in registers while K streams past. On an x86-64 host with AVX2 the register block is computed
//! with 4-lane vector multiplies and adds ([`block_avx2`]); elsewhere by the same operations one
//! lane at a time ([`block_any`]). Both are IEEE multiplies and adds in the same order (never
//! fused into FMA), so the bits do not depend on the host. Why not a GEMM crate: their kernels
//! pick FMA or not by the host CPU, which would make the f64 values (and the printed errors)
//! differ between machines.

// Kernels index rows, lanes and k by number: the numbers are the layout.
#![allow(clippy::needless_range_loop)]

/// Rows of the register block.
const R: usize = 4;
/// Columns of the register block (= columns of one packed panel).
const C: usize = 8;

/// A right operand `[k][n]` packed as panels `[n / C][k][C]`, the last one zero-padded.
pub struct Panels {
    k: usize,
    n: usize,
    data: Vec<f64>,
}

impl Panels {
    /// Packs row-major `[k][n]` `b`.
    pub fn new(b: &[f64], k: usize, n: usize) -> Panels {
        assert!(b.len() >= k * n, "operand shorter than its shape");
        let panels = n.div_ceil(C);
        let mut data = vec![0f64; panels * k * C];
        for kk in 0..k {
            let row = &b[kk * n..(kk + 1) * n];
            for (j, v) in row.iter().enumerate() {
                data[((j / C) * k + kk) * C + j % C] = *v;
            }
        }
        Panels { k, n, data }
    }

    fn panel(&self, q: usize) -> &[f64] {
        &self.data[q * self.k * C..(q + 1) * self.k * C]
    }
}

/// `out[i][j] = Σ_k Σ_t a[t][i][k]·b[t][k][j]` for `rows` row-major `[rows][k]` left operands
/// against packed right operands; the `T` terms of each k are added together first (left to
/// right), then to the sum. Returns `[rows][n]`, row-major.
pub fn product<const T: usize>(a: [&[f64]; T], b: [&Panels; T], rows: usize) -> Vec<f64> {
    #[cfg(target_arch = "x86_64")]
    let simd = std::is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    let simd = false;
    product_on(a, b, rows, simd)
}

/// [`product`] with the vector kernel (`simd`, only where the host has AVX2) or the lane-by-lane one.
fn product_on<const T: usize>(a: [&[f64]; T], b: [&Panels; T], rows: usize, simd: bool) -> Vec<f64> {
    let (k, n) = (b[0].k, b[0].n);
    for t in 0..T {
        assert!(a[t].len() >= rows * k, "operand shorter than its shape");
        assert!(b[t].k == k && b[t].n == n, "right operands of different shapes");
    }
    let zero = vec![0f64; k];
    let mut out = vec![0f64; rows * n];
    for i0 in (0..rows).step_by(R) {
        // Rows past the end read zeros and are not written.
        let a_rows: [[&[f64]; R]; T] = core::array::from_fn(|t| {
            core::array::from_fn(|r| {
                if i0 + r < rows {
                    &a[t][(i0 + r) * k..(i0 + r + 1) * k]
                } else {
                    &zero[..]
                }
            })
        });
        for q in 0..n.div_ceil(C) {
            let panels: [&[f64]; T] = core::array::from_fn(|t| b[t].panel(q));
            #[cfg(target_arch = "x86_64")]
            let acc = if simd {
                // SAFETY: the host has AVX2 (checked above).
                #[allow(unsafe_code)]
                unsafe {
                    block_avx2::<T>(&a_rows, &panels, k)
                }
            } else {
                block_any::<T>(&a_rows, &panels, k)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let acc = {
                let _ = simd;
                block_any::<T>(&a_rows, &panels, k)
            };
            for (r, acc_r) in acc.iter().enumerate().take(rows - i0) {
                let cols = C.min(n - q * C);
                out[(i0 + r) * n + q * C..(i0 + r) * n + q * C + cols].copy_from_slice(&acc_r[..cols]);
            }
        }
    }
    out
}

/// The sums over consecutive ranges of k: `out[q][i][j] = Σ_{cuts[q] ≤ k < cuts[q+1]} a[i][k]·b[k][j]`
/// (each in the plain loop's order, as [`product`] of the range would give it), laid out as
/// `[ranges][rows][n]`. One pass over A and B: the register block's sums are stored and
/// restarted at each cut.
pub fn product_ranges(a: &[f64], b: &Panels, rows: usize, cuts: &[usize]) -> Vec<f64> {
    #[cfg(target_arch = "x86_64")]
    let simd = std::is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    let simd = false;
    product_ranges_on(a, b, rows, cuts, simd)
}

fn product_ranges_on(a: &[f64], b: &Panels, rows: usize, cuts: &[usize], simd: bool) -> Vec<f64> {
    let (k, n) = (b.k, b.n);
    assert!(a.len() >= rows * k, "operand shorter than its shape");
    assert!(cuts.first() == Some(&0) && cuts.last() == Some(&k), "ranges cover k");
    let ranges = cuts.len() - 1;
    let zero = vec![0f64; k];
    let mut out = vec![0f64; ranges * rows * n];
    for i0 in (0..rows).step_by(R) {
        let a_rows: [&[f64]; R] =
            core::array::from_fn(
                |r| if i0 + r < rows { &a[(i0 + r) * k..(i0 + r + 1) * k] } else { &zero[..] },
            );
        for q in 0..n.div_ceil(C) {
            let panel = b.panel(q);
            for g in 0..ranges {
                let (k0, k1) = (cuts[g], cuts[g + 1]);
                let sub: [[&[f64]; R]; 1] = [core::array::from_fn(|r| &a_rows[r][k0..k1])];
                let pan = [&panel[k0 * C..k1 * C]];
                #[cfg(target_arch = "x86_64")]
                let acc = if simd {
                    // SAFETY: the host has AVX2 (checked by the caller).
                    #[allow(unsafe_code)]
                    unsafe {
                        block_avx2::<1>(&sub, &pan, k1 - k0)
                    }
                } else {
                    block_any::<1>(&sub, &pan, k1 - k0)
                };
                #[cfg(not(target_arch = "x86_64"))]
                let acc = {
                    let _ = simd;
                    block_any::<1>(&sub, &pan, k1 - k0)
                };
                let base = g * rows * n;
                for (r, acc_r) in acc.iter().enumerate().take(rows - i0) {
                    let cols = C.min(n - q * C);
                    out[base + (i0 + r) * n + q * C..base + (i0 + r) * n + q * C + cols]
                        .copy_from_slice(&acc_r[..cols]);
                }
            }
        }
    }
    out
}

/// The R×C sums of one register block, k ascending, one lane at a time.
fn block_any<const T: usize>(a: &[[&[f64]; R]; T], b: &[&[f64]; T], k: usize) -> [[f64; C]; R] {
    let mut acc = [[0f64; C]; R];
    for kk in 0..k {
        for r in 0..R {
            for c in 0..C {
                let mut term = a[0][r][kk] * b[0][kk * C + c];
                for t in 1..T {
                    term += a[t][r][kk] * b[t][kk * C + c];
                }
                acc[r][c] += term;
            }
        }
    }
    acc
}

/// [`block_any`] with 4-lane AVX2 multiplies and adds: the same operations in the same order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(unsafe_code)]
fn block_avx2<const T: usize>(a: &[[&[f64]; R]; T], b: &[&[f64]; T], k: usize) -> [[f64; C]; R] {
    use core::arch::x86_64::*;
    for t in 0..T {
        assert!(b[t].len() >= k * C && a[t].iter().all(|row| row.len() >= k));
    }
    let mut acc = [[_mm256_setzero_pd(); 2]; R];
    for kk in 0..k {
        // SAFETY: kk·C + 8 ≤ k·C ≤ b[t].len() (asserted above); unaligned loads.
        let bv: [[__m256d; 2]; T] = core::array::from_fn(|t| unsafe {
            let p = b[t].as_ptr().add(kk * C);
            [_mm256_loadu_pd(p), _mm256_loadu_pd(p.add(4))]
        });
        for r in 0..R {
            let av: [__m256d; T] = core::array::from_fn(|t| _mm256_set1_pd(a[t][r][kk]));
            for h in 0..2 {
                let mut term = _mm256_mul_pd(av[0], bv[0][h]);
                for t in 1..T {
                    term = _mm256_add_pd(term, _mm256_mul_pd(av[t], bv[t][h]));
                }
                acc[r][h] = _mm256_add_pd(acc[r][h], term);
            }
        }
    }
    let mut out = [[0f64; C]; R];
    for r in 0..R {
        // SAFETY: out[r] holds 8 f64.
        unsafe {
            _mm256_storeu_pd(out[r].as_mut_ptr(), acc[r][0]);
            _mm256_storeu_pd(out[r].as_mut_ptr().add(4), acc[r][1]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit-identical to the plain loop (odd shapes: rows, k and n not multiples of the blocks;
    /// values of mixed magnitude so that the summation order shows in the bits).
    #[test]
    fn sums_are_the_plain_loops_bit_for_bit() {
        let (rows, k, n) = (11, 37, 133);
        let val = |i: usize, s: u64| {
            let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(s) >> 11;
            (x as f64 / (1u64 << 53) as f64 - 0.5) * 2f64.powi((x % 40) as i32 - 20)
        };
        let a1: Vec<f64> = (0..rows * k).map(|i| val(i, 1)).collect();
        let a2: Vec<f64> = (0..rows * k).map(|i| val(i, 2)).collect();
        let b1: Vec<f64> = (0..k * n).map(|i| val(i, 3)).collect();
        let b2: Vec<f64> = (0..k * n).map(|i| val(i, 4)).collect();
        let (p1, p2) = (Panels::new(&b1, k, n), Panels::new(&b2, k, n));
        let one = product([&a1], [&p1], rows);
        let two = product([&a1, &a2], [&p1, &p2], rows);
        // The lane-by-lane kernel (the one hosts without AVX2 run) gives the same bits.
        assert_eq!(product_on([&a1], [&p1], rows, false), one);
        assert_eq!(product_on([&a1, &a2], [&p1, &p2], rows, false), two);
        let mut differs_from_pairwise = false;
        for i in 0..rows {
            for j in 0..n {
                let (mut s1, mut s2) = (0f64, 0f64);
                for kk in 0..k {
                    s1 += a1[i * k + kk] * b1[kk * n + j];
                    s2 += a1[i * k + kk] * b1[kk * n + j] + a2[i * k + kk] * b2[kk * n + j];
                }
                assert_eq!(one[i * n + j].to_bits(), s1.to_bits(), "({i}, {j})");
                assert_eq!(two[i * n + j].to_bits(), s2.to_bits(), "({i}, {j})");
                let split: f64 = (0..k).map(|kk| a1[i * k + kk] * b1[kk * n + j]).rev().sum();
                differs_from_pairwise |= split.to_bits() != s1.to_bits();
            }
        }
        // Ranges of k: each range's sums are the plain loop's over that range.
        let cuts = [0, 16, 17, 32, k];
        for simd in [false, true] {
            if simd && !cfg!(target_arch = "x86_64") {
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            if simd && !std::is_x86_feature_detected!("avx2") {
                continue;
            }
            let parts = product_ranges_on(&a1, &p1, rows, &cuts, simd);
            for g in 0..cuts.len() - 1 {
                for i in 0..rows {
                    for j in 0..n {
                        let mut s = 0f64;
                        for kk in cuts[g]..cuts[g + 1] {
                            s += a1[i * k + kk] * b1[kk * n + j];
                        }
                        assert_eq!(parts[(g * rows + i) * n + j].to_bits(), s.to_bits(), "{g} ({i}, {j})");
                    }
                }
            }
        }
        // The data is such that another order gives other bits, so the check above means something.
        assert!(differs_from_pairwise);
    }
}
