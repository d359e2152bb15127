//! The f64 value of a matmul and its per-element error bound, computed from the exact values
//! (docs/reliability.md "The verdict", matmul). The bound never reads the device-precision
//! values: a reference that computed something else could not widen it.
//!
//! For one output `c = Σ_k a_k·b_k` the device's error is at most
//! - **carried**: `|Σ (Δa·b̂ + a·Δb)|` for the operands' own errors, bounded by the smaller of
//!   `Σ δa(|b| + δb) + |a|δb` (elementwise) and `ρ_a(‖b‖ + ρ_b) + ‖a‖ρ_b` (Cauchy–Schwarz with
//!   the row / column norms of the errors, `rows.rs`);
//! - **f32 arithmetic** inside the AMP: each product (exact in f32) goes through at most 7
//!   f32 additions before its block is rounded (`γ(7, 2⁻²⁴)·Σ|a||b|`), and each block's carried
//!   partial sum (the "pin") through at most 4 (`γ(4, 2⁻²⁴)·|pin|`);
//! - **partial-sum roundings**: every K block's sum is rounded to the accumulation type, and so
//!   is every K-split merge. The value rounded at step j is at most
//!   `T_j = |S_j| + carried + E_{j−1} + f32` in magnitude, with `S_j` the exact partial sum at
//!   that point (the same blocks, the same K-split pieces, the planner's reduction tree) and
//!   `E_{j−1}` the bound accumulated so far, so the rounding errors add up to at most
//!   `Σ c_j`, `c_j = u·T_j + underflow`. This is the running (a-posteriori) error bound: it
//!   follows the actual partial sums, which cancel, instead of `γ(n)·Σ|a||b|`.
//!   Where `n` is large the probabilistic bound of Higham & Mary (2019) is smaller:
//!   the rounding errors `δ_j·t_j` (`|δ_j| ≤ u`) are martingale differences when each `δ_j` is
//!   mean-zero given the earlier ones (their model), and Azuma–Hoeffding gives
//!   `|Σ δ_j t_j| ≤ λ·√(Σ c_j²)` with probability at least `1 − 2·exp(−λ²/2)`. The bound takes
//!   the smaller of the two with [`LAMBDA`].

use super::{gamma, gemm64, rows, underflow_error, unit_roundoff};
use ipu_core::plan::matmul::split;
use ipu_schema::DType;
use rayon::prelude::*;

/// λ of the probabilistic accumulation bound: each output element where it is smaller than the
/// rigorous one fails with probability at most `2·exp(−λ²/2) = 5.2·10⁻¹⁸` under the model.
pub const LAMBDA: f64 = 9.0;

/// Index arithmetic of a (batched, transposable) matmul.
pub(super) struct MatMulLayout {
    pub m: u64,
    pub k: u64,
    pub n: u64,
    pub ta: bool,
    pub tb: bool,
    pub a_batched: bool,
    pub b_batched: bool,
}

/// The rounding points of the device's matmul.
pub(super) struct Rounding {
    /// Partial-sum type: every block of K and every K-split merge rounds to it.
    pub acc: DType,
    /// K values per AMP block (16 for f16, 32 for FP8).
    pub block: u64,
    /// K-split pieces.
    pub tk: u64,
    /// The K-split reduction tree (`plan::matmul::reduction_rounds`).
    pub rounds: Vec<Vec<(u64, Vec<u64>)>>,
    /// Scalar applied last (the product is rounded to f16 once more).
    pub alpha: Option<f64>,
}

/// One operand: f64 values, elementwise bounds and row bounds (rows of its last axis).
pub(super) struct Operand<'a> {
    pub exact: &'a [f64],
    pub bound: &'a [f64],
    pub rows: &'a [f64],
}

/// f64 values, elementwise bounds and row bounds of every output of `alpha·A·B`.
pub(super) fn matmul_exact(
    l: &MatMulLayout,
    a: Operand<'_>,
    b: Operand<'_>,
    len: u64,
    r: &Rounding,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (m, k, n) = (l.m as usize, l.k as usize, l.n as usize);
    let batch = len as usize / (m * n).max(1);
    let u32r = unit_roundoff(DType::F32);
    // Operands laid out once as [batch][m][k] and [batch][k][n] (row-major over the loop that
    // vectorises), with |x| + δx beside each value; the f64 sums then run over contiguous rows.
    let gather = |e: &[f64], d: &[f64], batched: bool, rows: usize, cols: usize, transposed: bool| {
        let nb = if batched { batch } else { 1 };
        let mut v = vec![0f64; nb * rows * cols];
        let mut mag = vec![0f64; nb * rows * cols];
        let mut del = vec![0f64; nb * rows * cols];
        for bi in 0..nb {
            for r0 in 0..rows {
                for c in 0..cols {
                    let src = bi * rows * cols + if transposed { c * rows + r0 } else { r0 * cols + c };
                    let dst = bi * rows * cols + r0 * cols + c;
                    v[dst] = e[src];
                    mag[dst] = e[src].abs() + d[src];
                    del[dst] = d[src];
                }
            }
        }
        (v, mag, del)
    };
    let (av, am, ad) = gather(a.exact, a.bound, l.a_batched, m, k, l.ta);
    let (bv, bm, bd) = gather(b.exact, b.bound, l.b_batched, k, n, l.tb);
    let b_entries = if l.b_batched { batch } else { 1 };
    // Row norms of A over K (value and error) and column norms of B over K. The error norms are
    // the tracked row bounds where K is the operand's last axis, else their elements'.
    let a_norm: Vec<f64> = av.chunks(k.max(1)).map(rows::norm).collect();
    let a_rho: Vec<f64> = ad
        .chunks(k.max(1))
        .enumerate()
        .map(|(i, d)| {
            let e = rows::norm(d);
            if l.ta {
                e
            } else {
                a.rows.get(i).map_or(e, |r| r.min(e))
            }
        })
        .collect();
    let col = |x: &[f64], bi: usize, j: usize| {
        (0..k).map(|kk| x[(bi * k + kk) * n + j].powi(2)).sum::<f64>().sqrt()
    };
    let b_norm: Vec<f64> = (0..b_entries * n).map(|e| col(&bv, e / n.max(1), e % n.max(1))).collect();
    let b_rho: Vec<f64> = (0..b_entries * n)
        .map(|e| {
            let c = col(&bd, e / n.max(1), e % n.max(1));
            if l.tb {
                b.rows.get(e).map_or(c, |r| r.min(c))
            } else {
                c
            }
        })
        .collect();
    // Per entry of B: ‖B‖₂ (upper bound) and ‖ΔB‖_F.
    let b_spec: Vec<f64> =
        (0..b_entries).map(|bi| rows::spectral_upper(&bv[bi * k * n..(bi + 1) * k * n], k, n)).collect();
    let b_err_f: Vec<f64> = (0..b_entries).map(|bi| rows::norm(&b_rho[bi * n..(bi + 1) * n])).collect();
    let exact_operands = ad.iter().all(|x| *x == 0.0) && bd.iter().all(|x| *x == 0.0);
    let a_abs: Vec<f64> = if exact_operands { Vec::new() } else { av.iter().map(|v| v.abs()).collect() };
    let al = r.alpha.unwrap_or(1.0);
    // B's panels packed once per batch entry and shared by every row block: whole (the sums
    // and the elementwise bounds) and per K block (the partial sums of the rounding bound).
    let pack = |x: &[f64]| -> Vec<gemm64::Panels> {
        (0..b_entries).map(|bi| gemm64::Panels::new(&x[bi * k * n..(bi + 1) * k * n], k, n)).collect()
    };
    let bs = r.block as usize;
    let kb = k.div_ceil(bs);
    let block_panels: Vec<Vec<gemm64::Panels>> = (0..b_entries)
        .map(|bi| {
            (0..kb)
                .map(|q| {
                    let (k0, k1) = (q * bs, ((q + 1) * bs).min(k));
                    gemm64::Panels::new(&bv[(bi * k + k0) * n..(bi * k + k1) * n], k1 - k0, n)
                })
                .collect()
        })
        .collect();
    let (bvp, bmp) = (pack(&bv), pack(&bm));
    let bdp = if exact_operands { Vec::new() } else { pack(&bd) };
    // Rounding of the partial sums: blocks round once from f32; merges add two partials in f32
    // and round (twice, for f16 partials: f32 then f16).
    let (u_blk, u_merge, sub) = match r.acc {
        DType::F32 => (0.0, u32r, underflow_error(DType::F32)),
        acc => (unit_roundoff(acc), unit_roundoff(acc) + 2.0 * u32r, underflow_error(acc)),
    };
    let (g_terms, g_pin) = (gamma(7, u32r), gamma(4, u32r));
    const ROWS: usize = 16;
    let blocks: Vec<(usize, usize)> =
        (0..batch).flat_map(|bi| (0..m).step_by(ROWS).map(move |i0| (bi, i0))).collect();
    let out: Vec<(Vec<f64>, Vec<f64>, f64)> = blocks
        .into_par_iter()
        .flat_map_iter(|(bi, i0)| {
            let nr = ROWS.min(m - i0);
            let ai = if l.a_batched { bi } else { 0 } * m + i0;
            let bb = if l.b_batched { bi } else { 0 };
            let ar = ai * k..(ai + nr) * k;
            let s = gemm64::product([&av[ar.clone()]], [&bvp[bb]], nr);
            let mag = gemm64::product([&am[ar.clone()]], [&bmp[bb]], nr);
            let prop = if exact_operands {
                vec![0f64; nr * n]
            } else {
                gemm64::product([&ad[ar.clone()], &a_abs[ar.clone()]], [&bmp[bb], &bdp[bb]], nr)
            };
            // Exact partial sums of each K block: [block][row][n].
            let partial: Vec<Vec<f64>> = (0..kb)
                .map(|q| {
                    let (k0, k1) = (q * bs, ((q + 1) * bs).min(k));
                    let ablk: Vec<f64> = (0..nr)
                        .flat_map(|x| av[(ai + x) * k + k0..(ai + x) * k + k1].iter().copied())
                        .collect();
                    gemm64::product([&ablk], [&block_panels[bb][q]], nr)
                })
                .collect();
            let partial = &partial;
            let (mag, prop, s) = (mag, prop, s);
            (0..nr)
                .map(|x| {
                    let (an, arho) = (a_norm[ai + x], a_rho[ai + x]);
                    let mut rnd_sq = 0f64;
                    let mut alpha_sq = 0f64;
                    let mut values = Vec::with_capacity(n);
                    let bounds = (0..n)
                        .map(|j| {
                            let e = x * n + j;
                            let (bn, brho) = (b_norm[bb * n + j], b_rho[bb * n + j]);
                            let carried = prop[e].min(arho * (bn + brho) + an * brho);
                            let f_terms = g_terms * mag[e];
                            // The partial sums, piece by piece, then the reduction tree.
                            let mut pieces = vec![(0f64, 0f64); r.tk as usize];
                            let (mut f_pin, mut sum_c, mut sum_c2) = (0f64, 0f64, 0f64);
                            for (p, piece) in pieces.iter_mut().enumerate() {
                                let (kb0, kb1) = split(kb as u64, r.tk, p as u64);
                                let (mut ps, mut pe) = (0f64, 0f64);
                                for q in kb0 as usize..kb1 as usize {
                                    if q > kb0 as usize {
                                        let f = g_pin * (ps.abs() + carried + pe);
                                        f_pin += f;
                                        pe += f;
                                    }
                                    ps += partial[q][e];
                                    if u_blk > 0.0 {
                                        let c = u_blk * (ps.abs() + carried + pe + f_terms) + sub;
                                        pe += c;
                                        sum_c += c;
                                        sum_c2 += c * c;
                                    }
                                }
                                *piece = (ps, pe);
                            }
                            for step in &r.rounds {
                                for (recv, senders) in step {
                                    for snd in senders {
                                        let ((s1, e1), (s2, e2)) =
                                            (pieces[*recv as usize], pieces[*snd as usize]);
                                        let c =
                                            u_merge * ((s1 + s2).abs() + carried + e1 + e2 + f_terms) + sub;
                                        pieces[*recv as usize] = (s1 + s2, e1 + e2 + c);
                                        sum_c += c;
                                        sum_c2 += c * c;
                                    }
                                }
                            }
                            let rounding = f_terms + f_pin + sum_c.min(LAMBDA * sum_c2.sqrt());
                            rnd_sq += rounding * rounding;
                            let mut bd = al.abs() * (carried + rounding);
                            if r.alpha.is_some() {
                                // f16(total·alpha): the f32 product's rounding, then f16's.
                                let fresh = (unit_roundoff(DType::F16)
                                    + u32r * (1.0 + unit_roundoff(DType::F16)))
                                    * (al * s[e]).abs()
                                    + (unit_roundoff(DType::F16) + 2.0 * u32r) * bd
                                    + underflow_error(DType::F16);
                                alpha_sq += fresh * fresh;
                                bd += fresh;
                            }
                            values.push(s[e] * al);
                            bd
                        })
                        .collect::<Vec<f64>>();
                    // The row's error: ΔA·B̂ + A·ΔB, the roundings, alpha's rounding.
                    let carried_row = arho * (b_spec[bb] + b_err_f[bb]) + an * b_err_f[bb];
                    let rho = al.abs() * (carried_row + rnd_sq.sqrt()) + alpha_sq.sqrt();
                    (values, bounds, rho)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let mut ex = Vec::with_capacity(len as usize);
    let mut bd = Vec::with_capacity(len as usize);
    let mut rho = Vec::with_capacity(batch * m);
    for (v, b, r) in out {
        rho.push(r.min(rows::norm(&b)));
        ex.extend(v);
        bd.extend(b);
    }
    (ex, bd, rho)
}
