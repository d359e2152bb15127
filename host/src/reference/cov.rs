//! Covariance matrices of the shared random part of a tensor's error (the probabilistic branch,
//! `bounds.rs`), one per vector along the last axis (rows) or the second-to-last (columns, for
//! a tensor made by swapping the last two axes). Under a linear map of the vector they are
//! exact (`J·C·Jᵀ`), where the scalar summaries of `bounds.rs` (`sd`, `sv`) would assume the
//! worst direction at every step; they are kept where they are small enough
//! ([`fits`]) and summarised otherwise.

use super::gemm64;

/// Largest number of covariance entries kept for one tensor (16 MiB of f64).
const BUDGET: usize = 1 << 21;

/// Covariance matrices, `d × d`, one per vector.
#[derive(Clone, Debug)]
pub struct Cov {
    /// Vectors run along the last axis (`true`) or the second-to-last.
    pub rows: bool,
    /// Vector length.
    pub d: usize,
    /// Length of the last axis (column vectors: the number of columns per matrix).
    pub last: usize,
    /// Row-major `d × d` matrices, one per vector.
    pub m: Vec<f64>,
}

/// Whether covariances of vectors of length `d` over `len` elements fit the budget.
pub fn fits(len: usize, d: usize) -> bool {
    d > 0 && len.saturating_mul(d) <= BUDGET
}

impl Cov {
    /// Zero covariances of row vectors of length `d` over `len` elements.
    pub fn zero_rows(len: usize, d: usize) -> Cov {
        Cov { rows: true, d, last: d, m: vec![0.0; len / d.max(1) * d * d] }
    }

    /// Number of vectors.
    pub fn vectors(&self) -> usize {
        self.m.len() / (self.d * self.d).max(1)
    }

    /// The matrix of vector `v`.
    pub fn mat(&self, v: usize) -> &[f64] {
        &self.m[v * self.d * self.d..(v + 1) * self.d * self.d]
    }

    /// Element `e` (flat, row-major): its vector and its position in it.
    pub fn locate(&self, e: usize) -> (usize, usize) {
        if self.rows {
            (e / self.d, e % self.d)
        } else {
            let (c, r, b) = (e % self.last, (e / self.last) % self.d, e / (self.last * self.d));
            (b * self.last + c, r)
        }
    }

    /// Per element, its variance (the diagonal entry), never negative.
    pub fn variances(&self, len: usize) -> Vec<f64> {
        (0..len)
            .map(|e| {
                let (v, p) = self.locate(e);
                self.m[v * self.d * self.d + p * self.d + p].max(0.0)
            })
            .collect()
    }

    /// Per row vector, an upper bound on `√λ_max` (Gershgorin's row sums and the Frobenius
    /// norm, both bound the largest eigenvalue of a symmetric matrix). NaN for column vectors
    /// (the rows' covariance is unknown).
    pub fn sqrt_lambda_max(&self) -> Vec<f64> {
        let d = self.d;
        (0..self.vectors())
            .map(|v| {
                if !self.rows {
                    return f64::NAN;
                }
                let m = self.mat(v);
                let gersh = (0..d)
                    .map(|i| m[i * d..(i + 1) * d].iter().map(|x| x.abs()).sum::<f64>())
                    .fold(0f64, f64::max);
                let frob = m.iter().map(|x| x * x).sum::<f64>().sqrt();
                (gersh.min(frob) * (1.0 + 1e-9)).sqrt()
            })
            .collect()
    }

    /// `S·C·S` per vector, `S` the diagonal of `scale` (per element of the tensor).
    pub fn scaled(&self, scale: &[f64]) -> Cov {
        let d = self.d;
        let mut out = self.clone();
        // The element at each position of each vector.
        for v in 0..self.vectors() {
            let s: Vec<f64> = (0..d).map(|p| scale[self.element(v, p)]).collect();
            let m = &mut out.m[v * d * d..(v + 1) * d * d];
            for i in 0..d {
                for j in 0..d {
                    m[i * d + j] *= s[i] * s[j];
                }
            }
        }
        out
    }

    /// The flat element at position `p` of vector `v`.
    pub fn element(&self, v: usize, p: usize) -> usize {
        if self.rows {
            v * self.d + p
        } else {
            let (b, c) = (v / self.last, v % self.last);
            (b * self.d + p) * self.last + c
        }
    }

    /// Adds `diag(x²)` (independent sources, one per element) to every vector's matrix.
    pub fn add_diagonal(&mut self, x: &[f64]) {
        let d = self.d;
        for v in 0..self.vectors() {
            for p in 0..d {
                let e = self.element(v, p);
                self.m[v * d * d + p * d + p] += x[e] * x[e];
            }
        }
    }
}

/// `(1 + t)·A + (1 + 1/t)·B` with `t = √(tr B / tr A)`: a covariance bound of the sum of two
/// random vectors whose cross-covariance is unknown (`(x + y)(x + y)ᵀ ≼ (1 + t)xxᵀ + (1 + 1/t)yyᵀ`).
pub fn sum_unknown(a: &[f64], b: &[f64], d: usize) -> Vec<f64> {
    let tr = |m: &[f64]| (0..d).map(|i| m[i * d + i].max(0.0)).sum::<f64>();
    let (ta, tb) = (tr(a), tr(b));
    if ta == 0.0 {
        return b.to_vec();
    }
    if tb == 0.0 {
        return a.to_vec();
    }
    let t = (tb / ta).sqrt();
    a.iter().zip(b).map(|(x, y)| (1.0 + t) * x + (1.0 + 1.0 / t) * y).collect()
}

/// `Bᵀ·C·B` for a `k × k` matrix C and a row-major `k × n` matrix B (packed as `panels`, with
/// `bt` its transpose, `n × k`).
pub fn congruence(c: &[f64], k: usize, n: usize, panels: &gemm64::Panels, bt: &[f64]) -> Vec<f64> {
    // T = C·B (k × n), then Bᵀ·T (n × n).
    let t = gemm64::product([c], [panels], k);
    gemm64::product([bt], [&gemm64::Panels::new(&t, k, n)], n)
}

/// `J·C·Jᵀ` for the layer normalisation's `J = (I − 11ᵀ/D − zzᵀ/D)/σ`, in O(D²).
pub fn layernorm_map(c: &[f64], z: &[f64], sigma: f64) -> Vec<f64> {
    let d = z.len();
    let n = d as f64;
    // Left: L = (C − 1·(1ᵀC)/D − z·(zᵀC)/D)/σ.
    let mut l = c.to_vec();
    let col_mean: Vec<f64> = (0..d).map(|j| (0..d).map(|i| c[i * d + j]).sum::<f64>() / n).collect();
    let col_z: Vec<f64> = (0..d).map(|j| (0..d).map(|i| z[i] * c[i * d + j]).sum::<f64>() / n).collect();
    for i in 0..d {
        for j in 0..d {
            l[i * d + j] = (c[i * d + j] - col_mean[j] - z[i] * col_z[j]) / sigma;
        }
    }
    // Right: L·Jᵀ = (L − (L1)1ᵀ/D − (Lz)zᵀ/D)/σ.
    let row_mean: Vec<f64> = (0..d).map(|i| l[i * d..(i + 1) * d].iter().sum::<f64>() / n).collect();
    let row_z: Vec<f64> =
        (0..d).map(|i| l[i * d..(i + 1) * d].iter().zip(z).map(|(a, b)| a * b).sum::<f64>() / n).collect();
    let mut out = vec![0f64; d * d];
    for i in 0..d {
        for j in 0..d {
            out[i * d + j] = (l[i * d + j] - row_mean[i] - row_z[i] * z[j]) / sigma;
        }
    }
    out
}

/// `J·C·Jᵀ` for the softmax's `J = diag(p) − ppᵀ`, in O(D²).
pub fn softmax_map(c: &[f64], p: &[f64]) -> Vec<f64> {
    let d = p.len();
    // Cp, pᵀCp.
    let cp: Vec<f64> = (0..d).map(|i| (0..d).map(|j| c[i * d + j] * p[j]).sum()).collect();
    let pcp: f64 = p.iter().zip(&cp).map(|(a, b)| a * b).sum();
    let mut out = vec![0f64; d * d];
    for i in 0..d {
        for j in 0..d {
            out[i * d + j] =
                p[i] * c[i * d + j] * p[j] - p[i] * cp[i] * p[j] - p[i] * cp[j] * p[j] + p[i] * pcp * p[j];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mul(a: &[f64], b: &[f64], d: usize) -> Vec<f64> {
        (0..d * d).map(|e| (0..d).map(|k| a[(e / d) * d + k] * b[k * d + e % d]).sum()).collect()
    }

    fn t(a: &[f64], d: usize) -> Vec<f64> {
        (0..d * d).map(|e| a[(e % d) * d + e / d]).collect()
    }

    #[test]
    fn structured_maps_equal_the_dense_products() {
        let d = 5;
        let g: Vec<f64> = (0..d * d).map(|i| ((i * 7 % 11) as f64 - 5.0) / 3.0).collect();
        let c = mul(&g, &t(&g, d), d); // PSD
        let z = [1.2, -0.3, 0.5, -1.1, -0.3];
        let sigma = 0.7;
        let j: Vec<f64> = (0..d * d)
            .map(|e| {
                let (i, k) = (e / d, e % d);
                ((i == k) as u8 as f64 - 1.0 / d as f64 - z[i] * z[k] / d as f64) / sigma
            })
            .collect();
        let want = mul(&mul(&j, &c, d), &t(&j, d), d);
        let got = layernorm_map(&c, &z, sigma);
        assert!(want.iter().zip(&got).all(|(a, b)| (a - b).abs() < 1e-12), "{want:?} {got:?}");
        let p = [0.1, 0.2, 0.3, 0.15, 0.25];
        let j: Vec<f64> =
            (0..d * d).map(|e| (e / d == e % d) as u8 as f64 * p[e / d] - p[e / d] * p[e % d]).collect();
        let want = mul(&mul(&j, &c, d), &t(&j, d), d);
        let got = softmax_map(&c, &p);
        assert!(want.iter().zip(&got).all(|(a, b)| (a - b).abs() < 1e-12));
    }

    #[test]
    fn column_vectors_locate_their_elements() {
        // Shape [2, 3, 4] with column vectors (length 3, 4 columns per matrix).
        let c = Cov { rows: false, d: 3, last: 4, m: vec![0.0; 8 * 9] };
        for e in 0..24 {
            let (v, p) = c.locate(e);
            assert_eq!(c.element(v, p), e);
        }
        assert_eq!(c.locate(4 * 3 + 1), (4 + 1, 0));
    }
}
