//! Row norms of the error: beside each element's bound `b` (on |device − f64|), every tensor
//! carries per row of its last axis a bound `ρ` on the Euclidean norm of the row's error vector
//! (docs/reliability.md "The verdict"). Elementwise bounds alone assume every error of a row
//! takes the sign that hurts most, at once; `ρ` keeps what a linear map can do to the row as a
//! whole (`‖Δx·W‖ ≤ ‖W‖₂·ρ`, `|Δx·w| ≤ ‖w‖·ρ`), which is what stays tight through chains of
//! matmuls. Always `ρ ≤ √Σ b²` (the elementwise bound is itself a row bound).

use super::gemm64;

/// Rows of a tensor with this many elements and last axis `d` (a scalar is one row of one).
pub fn count(len: usize, d: usize) -> usize {
    len.checked_div(d).unwrap_or(0)
}

/// `√Σ b²` per row: the row bound that follows from the elementwise bounds.
pub fn from_elements(bd: &[f64], d: usize) -> Vec<f64> {
    if d == 0 {
        return Vec::new();
    }
    bd.chunks(d).map(norm).collect()
}

/// Euclidean norm.
pub fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// `min(ρ, √Σ b²)` per row: a derived row bound never worse than the elementwise one.
pub fn clamp(rho: Vec<f64>, bd: &[f64], d: usize) -> Vec<f64> {
    rho.into_iter().zip(from_elements(bd, d)).map(|(r, e)| if r.is_nan() { e } else { r.min(e) }).collect()
}

/// Row bounds of a view (reshape, slice, transpose) whose element `o` is input element
/// `from[o]` (or, with `from` empty, the same element): an output row inside one input row is
/// bounded by that row's `ρ`; an output row made of whole input rows by their `ρ`s in
/// quadrature; any other by its elements.
pub fn view(from: &[usize], d_in: usize, d_out: usize, rho_in: &[f64], bd_out: &[f64]) -> Vec<f64> {
    let rows = count(bd_out.len(), d_out);
    let src = |o: usize| if from.is_empty() { o } else { from[o] };
    let derived: Vec<f64> = (0..rows)
        .map(|r| {
            if d_in == 0 {
                return f64::NAN;
            }
            let first = src(r * d_out) / d_in;
            if (r * d_out..(r + 1) * d_out).all(|o| src(o) / d_in == first) {
                return rho_in[first];
            }
            // Whole input rows, each once, in order: a merge of rows (`[4, 24] → [96]`).
            if d_out.is_multiple_of(d_in)
                && (0..d_out / d_in).all(|q| {
                    let row = src(r * d_out + q * d_in) / d_in;
                    (0..d_in).all(|c| src(r * d_out + q * d_in + c) == row * d_in + c)
                })
            {
                let sq: f64 =
                    (0..d_out / d_in).map(|q| rho_in[src(r * d_out + q * d_in) / d_in].powi(2)).sum();
                return sq.sqrt();
            }
            f64::NAN
        })
        .collect();
    clamp(derived, bd_out, d_out)
}

/// An upper bound on the largest singular value `‖B‖₂` of the row-major `rows × cols` matrix
/// `b`: with `G` the Gram matrix of the smaller side, `σ_max² = λ_max(G) ≤ ‖G^(2^s)‖_F^(1/2^s)`
/// (the Schatten norm of order 2^(s+1) bounds the spectral norm from above: it is the 2^(s+1)-norm
/// of the singular values). Three squarings overestimate by at most `rank^(1/16)` and in
/// practice by a few percent; the f64 roundings are covered by a relative margin of 10⁻⁶. A
/// matrix too large for the O(m²·n) Gram product within a budget of 3·10⁸ multiply-adds (about
/// m ≤ 400) gets its Frobenius norm (also an upper bound, looser), so that the bound's cost
/// stays proportional to the model's for large weights.
pub fn spectral_upper(b: &[f64], rows: usize, cols: usize) -> f64 {
    let (m, n) = (rows.min(cols), rows.max(cols));
    if m == 0 {
        return 0.0;
    }
    const BUDGET: f64 = 3e8;
    let frob = norm(&b[..rows * cols]);
    if frob == 0.0 || !frob.is_finite() {
        return frob;
    }
    let squarings = 3;
    if (m * m) as f64 * n as f64 + squarings as f64 * (m as f64).powi(3) > BUDGET {
        return frob * (1.0 + 1e-6);
    }
    // Scaled by the Frobenius norm so that no power overflows; the scale comes back at the end.
    let bs: Vec<f64> = b[..rows * cols].iter().map(|x| x / frob).collect();
    // G = B·Bᵀ (rows ≤ cols) or Bᵀ·B: m × m.
    let g = if rows <= cols {
        let mut bt = vec![0f64; rows * cols];
        for i in 0..rows {
            for j in 0..cols {
                bt[j * rows + i] = bs[i * cols + j];
            }
        }
        gemm64::product([&bs], [&gemm64::Panels::new(&bt, cols, rows)], rows)
    } else {
        let mut bt = vec![0f64; rows * cols];
        for i in 0..rows {
            for j in 0..cols {
                bt[j * rows + i] = bs[i * cols + j];
            }
        }
        gemm64::product([&bt], [&gemm64::Panels::new(&bs, rows, cols)], cols)
    };
    // G^(2^t) = h · e^log, h renormalised at each squaring.
    let (mut h, mut log) = (g, 0f64);
    for _ in 0..squarings {
        let f = norm(&h);
        if f == 0.0 {
            return 0.0;
        }
        let hn: Vec<f64> = h.iter().map(|x| x / f).collect();
        h = gemm64::product([&hn], [&gemm64::Panels::new(&hn, m, m)], m);
        log = 2.0 * (log + f.ln());
    }
    let ln_lambda = (log + norm(&h).ln()) / (1u64 << squarings) as f64;
    frob * (0.5 * ln_lambda).exp() * (1.0 + 1e-6)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Power iteration: a lower estimate of ‖B‖₂ that converges to it.
    fn power(b: &[f64], rows: usize, cols: usize) -> f64 {
        let mut v = vec![1f64; cols];
        let mut s = 0.0;
        for _ in 0..2000 {
            let w: Vec<f64> = (0..rows).map(|i| (0..cols).map(|j| b[i * cols + j] * v[j]).sum()).collect();
            let z: Vec<f64> = (0..cols).map(|j| (0..rows).map(|i| b[i * cols + j] * w[i]).sum()).collect();
            let nz = norm(&z);
            s = (nz / norm(&v)).sqrt();
            v = z.iter().map(|x| x / nz).collect();
        }
        s
    }

    #[test]
    fn spectral_bound_is_above_the_norm_and_close_to_it() {
        let mut x = 0x1234_5678u64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        for (rows, cols) in [(1, 1), (1, 7), (7, 1), (13, 40), (40, 13), (96, 96), (50, 3)] {
            let b: Vec<f64> = (0..rows * cols).map(|_| rnd()).collect();
            let (upper, est) = (spectral_upper(&b, rows, cols), power(&b, rows, cols));
            assert!(upper >= est * (1.0 - 1e-9), "{rows}×{cols}: {upper} < {est}");
            assert!(upper <= est * 1.35, "{rows}×{cols}: {upper} vs {est}");
        }
        // A rank-one matrix: exact up to the margin.
        let b: Vec<f64> = (0..6 * 5).map(|i| ((i / 5) as f64 + 1.0) * ((i % 5) as f64 - 2.0)).collect();
        let exact = norm(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) * norm(&[-2.0, -1.0, 0.0, 1.0, 2.0]);
        let upper = spectral_upper(&b, 6, 5);
        assert!(upper >= exact && upper <= exact * (1.0 + 1e-5), "{upper} vs {exact}");
        assert_eq!(spectral_upper(&[0.0; 6], 2, 3), 0.0);
    }

    #[test]
    fn views_keep_row_bounds_where_rows_stay_whole() {
        // [2, 4] → [2, 2, 2] (split rows): each half row within its parent's ρ.
        let bd = vec![1.0; 8];
        let split = view(&[], 4, 2, &[0.5, 3.0], &bd);
        assert_eq!(split, vec![0.5, 0.5, 2f64.sqrt(), 2f64.sqrt()]);
        // [4, 2] → [2, 4] (merge rows): quadrature.
        let merged = view(&[], 2, 4, &[0.1, 0.2, 0.3, 0.4], &bd);
        assert!((merged[0] - (0.05f64).sqrt()).abs() < 1e-12 && (merged[1] - 0.5).abs() < 1e-12);
        // A transpose of the last two axes of [2, 2]: rows gather from both inputs: elementwise.
        let t = view(&[0, 2, 1, 3], 2, 2, &[0.0, 0.0], &[0.1, 0.2, 0.3, 0.4]);
        assert!((t[0] - norm(&[0.1, 0.2])).abs() < 1e-15);
    }
}
