//! f64 matrix products for the reference's real-number values and error bounds.
//!
//! Each sum runs in the plain loop's order — k ascending from zero, one term added at a time — so
//! the results are bit-identical to `for k { s += a·b }`; only the memory traffic changes: 4 rows ×
//! 4 columns of sums stay in registers while K streams past, and B is packed in panels of
//! [`PANEL`] columns that stay in cache for every row of a row block. Why not a GEMM crate: their
//! kernels pick FMA or not by the host CPU, which would make the f64 values (and the printed
//! errors) differ between machines.

/// Columns of B packed together (K × 64 f64 = 512 KiB at K = 1024: an L2-sized panel).
const PANEL: usize = 64;
/// Rows of the register block.
const R: usize = 4;
/// Columns of the register block.
const C: usize = 4;

/// One product: `out[i][j] = Σ_k Σ_t a[t][i][k]·b[t][k][j]`, the `T` terms of each k added
/// together first (left to right), then to the sum.
pub struct Product<'a, const T: usize> {
    /// Row-major `[rows][k]` left operands.
    pub a: [&'a [f64]; T],
    /// Row-major `[k][n]` right operands.
    pub b: [&'a [f64]; T],
}

/// Rows `rows` × columns `n` of the product, row-major, for the `k`-long sums.
pub fn product<const T: usize>(p: &Product<'_, T>, rows: usize, k: usize, n: usize) -> Vec<f64> {
    for t in 0..T {
        assert!(p.a[t].len() >= rows * k && p.b[t].len() >= k * n, "operand shorter than its shape");
    }
    let zero = vec![0f64; k];
    let mut out = vec![0f64; rows * n];
    let mut panels: [Vec<f64>; T] = core::array::from_fn(|_| vec![0f64; k * PANEL]);
    for j0 in (0..n).step_by(PANEL) {
        let jn = PANEL.min(n - j0);
        for (t, panel) in panels.iter_mut().enumerate() {
            pack(p.b[t], k, n, j0, jn, panel);
        }
        for i0 in (0..rows).step_by(R) {
            // Rows past the end read zeros and are not written.
            let a_rows: [[&[f64]; R]; T] = core::array::from_fn(|t| {
                core::array::from_fn(|r| {
                    if i0 + r < rows {
                        &p.a[t][(i0 + r) * k..(i0 + r + 1) * k]
                    } else {
                        &zero[..]
                    }
                })
            });
            for q in 0..jn.div_ceil(C) {
                let b_quads: [&[f64]; T] = core::array::from_fn(|t| &panels[t][q * k * C..(q + 1) * k * C]);
                let acc = block::<T>(&a_rows, &b_quads, k);
                for (r, acc_r) in acc.iter().enumerate().take(rows - i0) {
                    for (c, v) in acc_r.iter().enumerate().take(jn - q * C) {
                        out[(i0 + r) * n + j0 + q * C + c] = *v;
                    }
                }
            }
        }
    }
    out
}

/// Columns `j0..j0+jn` of `[k][n]` as quads `[q][k][C]`, zero-padded to whole quads.
fn pack(b: &[f64], k: usize, n: usize, j0: usize, jn: usize, out: &mut [f64]) {
    out.iter_mut().for_each(|v| *v = 0.0);
    for q in 0..jn.div_ceil(C) {
        for kk in 0..k {
            for c in 0..C.min(jn - q * C) {
                out[(q * k + kk) * C + c] = b[kk * n + j0 + q * C + c];
            }
        }
    }
}

/// The 4×4 sums of one register block, k ascending.
#[inline(always)]
fn block<const T: usize>(a: &[[&[f64]; R]; T], b: &[&[f64]; T], k: usize) -> [[f64; C]; R] {
    let mut acc = [[0f64; C]; R];
    for kk in 0..k {
        let bq: [[f64; C]; T] = core::array::from_fn(|t| {
            let s = &b[t][kk * C..kk * C + C];
            [s[0], s[1], s[2], s[3]]
        });
        for r in 0..R {
            let av: [f64; T] = core::array::from_fn(|t| a[t][r][kk]);
            for c in 0..C {
                let mut term = av[0] * bq[0][c];
                for t in 1..T {
                    term += av[t] * bq[t][c];
                }
                acc[r][c] += term;
            }
        }
    }
    acc
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
        let one = product(&Product { a: [&a1], b: [&b1] }, rows, k, n);
        let two = product(&Product { a: [&a1, &a2], b: [&b1, &b2] }, rows, k, n);
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
        // The data is such that another order gives other bits, so the check above means something.
        assert!(differs_from_pairwise);
    }
}
