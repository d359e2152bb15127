//! The f64 value of a matmul and its error bounds (docs/reliability.md "The verdict", matmul),
//! computed from the exact values: the bounds never read the device-precision values.
//!
//! For one output `c = Σ_k a_k·b_k` the device's error is made of
//! - **carried** errors of the operands, `Σ (Δa·b̂ + a·Δb)`: rigorously at most the smaller of
//!   `Σ δa(|b| + δb) + |a|δb` (elementwise) and `ρ_a(‖b‖ + ρ_b) + ‖a‖ρ_b` (Cauchy–Schwarz with
//!   the row / column norms of the errors, `rows.rs`); in the probabilistic branch the random
//!   parts map linearly (`min(Σ|b|·sd_a, sv_a·‖b‖)` and the same for `b`), the deterministic
//!   parts elementwise, and `Δa·Δb` is a second-order term;
//! - **f32 arithmetic** inside the AMP: each product (exact in f32) goes through at most 7 f32
//!   additions before its block is rounded (`γ(7, 2⁻²⁴)·Σ|a||b|`), and each block's carried
//!   partial sum (the "pin") through at most 4 (`γ(4, 2⁻²⁴)·|pin|`);
//! - **partial-sum roundings**: every K block's sum is rounded to the accumulation type, and so
//!   is every K-split merge. The value rounded at step j is at most
//!   `T_j = |S_j| + carried + E_{j−1} + f32` in magnitude, `S_j` the exact partial sum at that
//!   point (the same blocks, the same K-split pieces, the planner's reduction tree) and
//!   `E_{j−1}` the bound accumulated so far: rigorously the roundings add up to at most
//!   `Σ_j (u·T_j + underflow)` — the running (a-posteriori) bound, which follows the actual
//!   partial sums instead of `γ(n)·Σ|a||b|`. In the probabilistic branch (Higham & Mary 2019)
//!   the rounding errors `δ_j·S_j` are independent random terms of scale `u·|S_j|`, which add in
//!   quadrature (`√Σ (u·S_j)²`, the `√n·u` of their analysis in place of `n·u`), and
//!   `u·(T_j − |S_j|)` is deterministic.

use super::bounds::{half_ulp, Bounds, Parts, LAMBDA};
use super::cov::{self, Cov};
use super::{gamma, gemm64, rows, unit_roundoff};
use ipu_core::plan::matmul::split;
use ipu_schema::DType;
use rayon::prelude::*;

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

/// One operand: f64 values and their bounds.
pub(super) struct Operand<'a> {
    pub exact: &'a [f64],
    pub bounds: &'a Bounds,
}

/// An operand laid out as `[entries][rows][cols]`, row-major over the contraction where it is
/// a column (`B`) or a row (`A`): values and each bound array gathered the same way.
struct Laid {
    v: Vec<f64>,
    abs: Vec<f64>,
    sq: Vec<f64>,
    /// |x| + b (rigorous magnitude).
    mag: Vec<f64>,
    b: Vec<f64>,
    sd: Vec<f64>,
    dg2: Vec<f64>,
    dg: Vec<f64>,
    det: Vec<f64>,
    comb: Vec<f64>,
}

fn lay(x: &Operand<'_>, entries: usize, rows: usize, cols: usize, transposed: bool) -> Laid {
    let len = entries * rows * cols;
    let z = || vec![0f64; len];
    let mut l =
        Laid { v: z(), abs: z(), sq: z(), mag: z(), b: z(), sd: z(), dg2: z(), dg: z(), det: z(), comb: z() };
    let bd = x.bounds;
    for bi in 0..entries {
        for r0 in 0..rows {
            for c in 0..cols {
                let src = bi * rows * cols + if transposed { c * rows + r0 } else { r0 * cols + c };
                let dst = bi * rows * cols + r0 * cols + c;
                let e = x.exact[src];
                l.v[dst] = e;
                l.abs[dst] = e.abs();
                l.sq[dst] = e * e;
                l.mag[dst] = e.abs() + bd.b[src];
                l.b[dst] = bd.b[src];
                l.sd[dst] = bd.sd[src];
                l.dg[dst] = bd.dg[src];
                l.dg2[dst] = bd.dg[src] * bd.dg[src];
                l.det[dst] = bd.det[src];
                l.comb[dst] = bd.comb[src];
            }
        }
    }
    l
}

/// Per row of `x` (`[rows][cols]`), the tracked row bound where the row is the tensor's own
/// row (`tracked`), never above the norm of its elements.
fn row_bounds(x: &[f64], cols: usize, tracked: Option<&[f64]>) -> Vec<f64> {
    x.chunks(cols.max(1))
        .enumerate()
        .map(|(i, r)| {
            let e = rows::norm(r);
            tracked.and_then(|t| t.get(i)).map_or(e, |t| t.min(e))
        })
        .collect()
}

/// Per column of `x` (`[entries][k][n]`), its norm over k, or the tracked bound.
fn col_bounds(x: &[f64], entries: usize, k: usize, n: usize, tracked: Option<&[f64]>) -> Vec<f64> {
    (0..entries * n)
        .map(|e| {
            let (bi, j) = (e / n.max(1), e % n.max(1));
            let c = (0..k).map(|q| x[(bi * k + q) * n + j].powi(2)).sum::<f64>().sqrt();
            tracked.and_then(|t| t.get(e)).map_or(c, |t| t.min(c))
        })
        .collect()
}

/// f64 values and bounds of every output of `alpha·A·B`.
pub(super) fn matmul_exact(
    l: &MatMulLayout,
    a: Operand<'_>,
    b: Operand<'_>,
    len: u64,
    r: &Rounding,
) -> (Vec<f64>, Bounds) {
    let (m, k, n) = (l.m as usize, l.k as usize, l.n as usize);
    let batch = len as usize / (m * n).max(1);
    let u32r = unit_roundoff(DType::F32);
    let (a_entries, b_entries) = (if l.a_batched { batch } else { 1 }, if l.b_batched { batch } else { 1 });
    // The operands' ellipsoids move through the product where their layout allows (A's vectors
    // over K; B's over N or over K) and the output's fit the budget; otherwise they are folded
    // into the operands' boxes first.
    let fits = cov::fits(len as usize, n);
    let a_q_ok = a.bounds.q.as_ref().is_none_or(|c| c.d == k && c.rows != l.ta);
    let b_q_ok =
        b.bounds.q.as_ref().is_none_or(|c| (c.d == n && c.rows != l.tb) || (c.d == k && c.rows == l.tb));
    let q_path = fits && a_q_ok && b_q_ok;
    let (fa, fb);
    let a = if !q_path && a.bounds.q.is_some() {
        fa = a.bounds.folded();
        Operand { exact: a.exact, bounds: &fa }
    } else {
        a
    };
    let b = if !q_path && b.bounds.q.is_some() {
        fb = b.bounds.folded();
        Operand { exact: b.exact, bounds: &fb }
    } else {
        b
    };
    let al = lay(&a, a_entries, m, k, l.ta);
    let bl = lay(&b, b_entries, k, n, l.tb);
    let b_bounds = b.bounds;
    // Rows of A over K: tracked bounds apply where K is A's last axis.
    fn when(on: bool, t: &[f64]) -> Option<&[f64]> {
        if on {
            Some(t)
        } else {
            None
        }
    }
    let a_tr = |t| when(!l.ta, t);
    let a_norm = row_bounds(&al.v, k, None);
    let a_rho = row_bounds(&al.b, k, a_tr(&a.bounds.rho));
    let a_sv = row_bounds(&al.sd, k, a_tr(&a.bounds.sv));
    let a_dr = row_bounds(&al.det, k, a_tr(&a.bounds.dr));
    let a_cn = row_bounds(&al.comb, k, None);
    let a_dgmax: Vec<f64> = al.dg.chunks(k.max(1)).map(|r| r.iter().fold(0f64, |m, x| m.max(*x))).collect();
    // Columns of B over K: tracked where B is stored transposed (K its last axis).
    let b_tr = |t| when(l.tb, t);
    let b_norm = col_bounds(&bl.v, b_entries, k, n, None);
    let b_rho = col_bounds(&bl.b, b_entries, k, n, b_tr(&b.bounds.rho));
    let b_svc = col_bounds(&bl.sd, b_entries, k, n, b_tr(&b.bounds.sv));
    let b_drc = col_bounds(&bl.det, b_entries, k, n, b_tr(&b.bounds.dr));
    let b_cn = col_bounds(&bl.comb, b_entries, k, n, None);
    // Rows of B over N (the output row's axis), tracked where B is not transposed.
    let b_trr = |t| when(!l.tb, t);
    let b_svr = row_bounds(&bl.sd, n, b_trr(&b.bounds.sv));
    let b_drr = row_bounds(&bl.det, n, b_trr(&b.bounds.dr));
    // Per entry of B: ‖B‖₂ (upper bound) and ‖ΔB‖_F.
    let b_spec: Vec<f64> =
        (0..b_entries).map(|bi| rows::spectral_upper(&bl.v[bi * k * n..(bi + 1) * k * n], k, n)).collect();
    let b_err_f: Vec<f64> = (0..b_entries).map(|bi| rows::norm(&b_rho[bi * n..(bi + 1) * n])).collect();
    let (a_exact, b_exact) = (a.bounds.is_exact(), b.bounds.is_exact());
    let alpha = r.alpha.unwrap_or(1.0);
    // B's panels packed once per batch entry and shared by every row block: whole, and per K
    // block for the partial sums of the rounding bound.
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
                    gemm64::Panels::new(&bl.v[(bi * k + k0) * n..(bi * k + k1) * n], k1 - k0, n)
                })
                .collect()
        })
        .collect();
    let (bvp, bmp, babs, bsq) = (pack(&bl.v), pack(&bl.mag), pack(&bl.abs), pack(&bl.sq));
    let packed = |x: &[f64]| if b_exact { Vec::new() } else { pack(x) };
    let (bbp, bsdp, bdg2p, bdetp, bcombp) =
        (packed(&bl.b), packed(&bl.sd), packed(&bl.dg2), packed(&bl.det), packed(&bl.comb));
    // The rounding of a partial sum of magnitude at most T: blocks round once from f32 (f16
    // partials) or not at all (f32 partials); merges add two partials in f32 and round (for
    // f16 partials once more).
    let round_blk = |t: f64| if r.acc == DType::F32 { 0.0 } else { half_ulp(r.acc, 0, t) };
    let round_merge = |t: f64| {
        let h32 = half_ulp(DType::F32, 0, t);
        if r.acc == DType::F32 {
            h32
        } else {
            h32 + half_ulp(r.acc, 0, t + h32)
        }
    };
    let (g_terms, g_pin) = (gamma(7, u32r), gamma(4, u32r));
    const ROWS: usize = 16;
    let blocks: Vec<(usize, usize)> =
        (0..batch).flat_map(|bi| (0..m).step_by(ROWS).map(move |i0| (bi, i0))).collect();
    // Per output row: values, [b, sd, dg, det] per element, [ρ, sv, dr].
    type Row = (Vec<f64>, [Vec<f64>; 4], [f64; 3]);
    let out: Vec<Row> = blocks
        .into_par_iter()
        .flat_map_iter(|(bi, i0)| {
            let nr = ROWS.min(m - i0);
            let ai = if l.a_batched { bi } else { 0 } * m + i0;
            let bb = if l.b_batched { bi } else { 0 };
            let ar = ai * k..(ai + nr) * k;
            let prod = |x: &[f64], p: &gemm64::Panels| gemm64::product([&x[ar.clone()]], [p], nr);
            let none = || vec![0f64; nr * n];
            let s = prod(&al.v, &bvp[bb]);
            let mag = prod(&al.mag, &bmp[bb]);
            // Rigorous carried: δa·(|b| + δb) + |a|·δb; probabilistic: the random parts of each
            // side (shared and own sources apart), the deterministic parts, Δa·Δb.
            let (mut prop, sd_a, dg_a, det_a) = if a_exact {
                (none(), none(), none(), none())
            } else {
                (
                    prod(&al.b, &bmp[bb]),
                    prod(&al.sd, &babs[bb]),
                    prod(&al.dg2, &bsq[bb]),
                    prod(&al.det, &babs[bb]),
                )
            };
            let (sd_b, dg_b, det_b, second) = if b_exact {
                (none(), none(), none(), none())
            } else {
                prop.iter_mut().zip(prod(&al.abs, &bbp[bb])).for_each(|(p, x)| *p += x);
                let second = if a_exact { none() } else { prod(&al.comb, &bcombp[bb]) };
                (prod(&al.abs, &bsdp[bb]), prod(&al.sq, &bdg2p[bb]), prod(&al.abs, &bdetp[bb]), second)
            };
            // Exact partial sums of each K block: [block][row][n].
            let partial: Vec<Vec<f64>> = (0..kb)
                .map(|q| {
                    let (k0, k1) = (q * bs, ((q + 1) * bs).min(k));
                    let ablk: Vec<f64> = (0..nr)
                        .flat_map(|x| al.v[(ai + x) * k + k0..(ai + x) * k + k1].iter().copied())
                        .collect();
                    gemm64::product([&ablk], [&block_panels[bb][q]], nr)
                })
                .collect();
            let (al, a_norm, a_rho, a_sv, a_dr, a_cn, a_dgmax) =
                (&al, &a_norm, &a_rho, &a_sv, &a_dr, &a_cn, &a_dgmax);
            let (b_norm, b_rho, b_svc, b_drc, b_cn) = (&b_norm, &b_rho, &b_svc, &b_drc, &b_cn);
            let (b_svr, b_drr, b_spec, b_err_f) = (&b_svr, &b_drr, &b_spec, &b_err_f);
            let (round_blk, round_merge) = (&round_blk, &round_merge);
            (0..nr)
                .map(move |x| {
                    let i = ai + x;
                    let (an, arho, asv, adr) = (a_norm[i], a_rho[i], a_sv[i], a_dr[i]);
                    let mut values = Vec::with_capacity(n);
                    let mut cols: [Vec<f64>; 4] = std::array::from_fn(|_| Vec::with_capacity(n));
                    let (mut rnd_sq, mut alpha_sq, mut dgb_max, mut fresh_det_sq) = (0f64, 0f64, 0f64, 0f64);
                    for j in 0..n {
                        let e = x * n + j;
                        let c = bb * n + j;
                        let carried = prop[e].min(arho * (b_norm[c] + b_rho[c]) + an * b_rho[c]);
                        let f_terms = g_terms * mag[e];
                        // Probabilistic: each side's random part at its tighter bound, the
                        // deterministic parts, Δa·Δb; `carried_p` bounds the carried error
                        // under the probabilistic bounds.
                        let dgb = dg_b[e].sqrt();
                        dgb_max = dgb_max.max(dgb);
                        let rand =
                            sd_a[e].min(asv * b_norm[c]) + dg_a[e].sqrt() + sd_b[e].min(an * b_svc[c]) + dgb;
                        let second_order = second[e].min(a_cn[i] * b_cn[c]);
                        let det_carried =
                            det_a[e].min(adr * b_norm[c]) + det_b[e].min(an * b_drc[c]) + second_order;
                        let carried_p = carried.min(LAMBDA * rand + det_carried);
                        // The partial sums, piece by piece, then the reduction tree, twice: with
                        // the rigorous magnitudes (the running bound) and with the probabilistic
                        // ones (the ranges of the random roundings).
                        let sweep = |carried: f64| {
                            let mut pieces = vec![(0f64, 0f64); r.tk as usize];
                            let (mut f_pin, mut sum_c, mut sq) = (0f64, 0f64, 0f64);
                            for (p, piece) in pieces.iter_mut().enumerate() {
                                let (kb0, kb1) = split(kb as u64, r.tk, p as u64);
                                let (mut ps, mut pe) = (0f64, 0f64);
                                for (q, part) in
                                    partial.iter().enumerate().take(kb1 as usize).skip(kb0 as usize)
                                {
                                    if q > kb0 as usize {
                                        let f = g_pin * (ps.abs() + carried + pe);
                                        f_pin += f;
                                        pe += f;
                                    }
                                    ps += part[e];
                                    let c = round_blk(ps.abs() + carried + pe + f_terms);
                                    pe += c;
                                    sum_c += c;
                                    sq += c * c;
                                }
                                *piece = (ps, pe);
                            }
                            for step in &r.rounds {
                                for (recv, senders) in step {
                                    for snd in senders {
                                        let ((s1, e1), (s2, e2)) =
                                            (pieces[*recv as usize], pieces[*snd as usize]);
                                        let c = round_merge((s1 + s2).abs() + carried + e1 + e2 + f_terms);
                                        pieces[*recv as usize] = (s1 + s2, e1 + e2 + c);
                                        sum_c += c;
                                        sq += c * c;
                                    }
                                }
                            }
                            (f_pin, sum_c, sq)
                        };
                        let (f_pin, sum_c, _) = sweep(carried);
                        let (f_pin_p, sum_c_p, rand_sq) = sweep(carried_p);
                        let rounding = f_terms + f_pin + sum_c;
                        rnd_sq += rounding * rounding;
                        let mut bd = alpha.abs() * (carried + rounding);
                        let sd = alpha.abs() * rand;
                        let mut dg = alpha.abs() * rand_sq.sqrt();
                        let fresh_det = second_order + f_terms + f_pin_p;
                        let mut det = alpha.abs() * (det_carried + f_terms + f_pin_p);
                        let mut fd = alpha.abs() * fresh_det;
                        if r.alpha.is_some() {
                            // f16(f32(total·alpha)): the f32 product's rounding, then f16's.
                            let y = (alpha * s[e]).abs();
                            let (y_r, y_p) =
                                (y + bd, y + alpha.abs() * (carried_p + f_terms + f_pin_p + sum_c_p));
                            let h = |y: f64| {
                                (
                                    half_ulp(DType::F32, 0, y),
                                    half_ulp(DType::F16, 0, y + half_ulp(DType::F32, 0, y)),
                                )
                            };
                            let ((h32, h16), (p32, p16)) = (h(y_r), h(y_p));
                            alpha_sq += (h32 + h16).powi(2);
                            bd += h32 + h16;
                            dg = dg.hypot(p16);
                            det += p32;
                            fd += p32;
                        }
                        fresh_det_sq += fd * fd;
                        values.push(s[e] * alpha);
                        cols[0].push(bd);
                        cols[1].push(sd);
                        cols[2].push(dg);
                        cols[3].push(det);
                    }
                    // The row's error: ΔA·B̂ + A·ΔB, the roundings, alpha's rounding.
                    let rho = alpha.abs()
                        * (arho * (b_spec[bb] + b_err_f[bb]) + an * b_err_f[bb] + rnd_sq.sqrt())
                        + alpha_sq.sqrt();
                    let (mut a_svr, mut a_drr) = (0f64, 0f64);
                    for q in 0..k {
                        a_svr += al.abs[i * k + q] * b_svr[bb * k + q];
                        a_drr += al.abs[i * k + q] * b_drr[bb * k + q];
                    }
                    let sv = alpha.abs() * (b_spec[bb] * (asv + a_dgmax[i]) + a_svr + dgb_max);
                    let dr = alpha.abs() * (b_spec[bb] * adr + a_drr) + fresh_det_sq.sqrt();
                    (values, cols, [rho, sv, dr])
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let mut ex = Vec::with_capacity(len as usize);
    let mut el: [Vec<f64>; 4] = std::array::from_fn(|_| Vec::with_capacity(len as usize));
    let mut rw: [Vec<f64>; 3] = std::array::from_fn(|_| Vec::with_capacity(batch * m));
    for (v, c, q) in out {
        ex.extend(v);
        for (dst, src) in el.iter_mut().zip(c) {
            dst.extend(src);
        }
        for (dst, src) in rw.iter_mut().zip(q) {
            dst.push(src);
        }
    }
    let [b, mut sd, dg, det] = el;
    let [rho, sv, dr] = rw;
    let both = |x, y| layouts(l, x, y);
    let c = if fits {
        both(a.bounds, b_bounds).map(|[a_c, b_rows, b_cols]| {
            let (c, elem) =
                propagate(l, &al, &bl, [a_c, b_rows, b_cols], [Some(&al.dg2), Some(&bl.dg2)], batch, alpha);
            for (s, e) in sd.iter_mut().zip(elem) {
                *s = s.min(e * (1.0 + 1e-9));
            }
            c
        })
    } else {
        None
    };
    // The ellipsoids: the same maps, no own part.
    let q = if q_path && (a.bounds.q.is_some() || b_bounds.q.is_some()) {
        let qa = a.bounds.q.as_ref();
        let (qr, qc) = match &b_bounds.q {
            Some(c) if c.d == n && c.rows != l.tb => (Some(c), None),
            Some(c) => (None, Some(c)),
            None => (None, None),
        };
        Some(propagate(l, &al, &bl, [qa, qr, qc], [None, None], batch, alpha).0)
    } else {
        None
    };
    (ex, Bounds::new(Parts { b, rho, sd, dg, sv, det, dr }, n).with_cov(c, n).with_q(q))
}

/// Per output row `(bi, i)`, the covariance (or ellipsoid) matrix of the linear image of the
/// operands' errors (`cov.rs`): `α²·Bᵀ·(C_a + diag(own_a))·B` for A's (its vectors over K
/// tracked, or only its own sources), and for B's `α²·‖a‖₁·Σ_k |a_k|·C_b,k` (B's rows over N;
/// their cross-covariances unknown — for ellipsoids, the Minkowski sum with weights
/// `‖a‖₁/|a_k|`) plus `α²·diag(Σ_k a_k²·own_b,kj)` (own sources: independent); where only B's
/// columns over K are tracked, their variances `m_j = aᵀC_j·a` and the bound
/// `(Σ_j √m_j)·diag(√m_j)`. Both operands: their sum with unknown cross-covariance. Also, per
/// element, `√(A's variance) + √(B's variance)` (exact where the row bound inflates it).
fn propagate(
    l: &MatMulLayout,
    al: &Laid,
    bl: &Laid,
    [a_cov, b_rows, b_cols]: [Option<&Cov>; 3],
    [a_own, b_own]: [Option<&Vec<f64>>; 2],
    batch: usize,
    alpha: f64,
) -> (Cov, Vec<f64>) {
    let (m, k, n) = (l.m as usize, l.k as usize, l.n as usize);
    let b_entries = if l.b_batched { batch } else { 1 };
    let a_random = a_cov.is_some() || a_own.is_some_and(|o| o.iter().any(|x| *x != 0.0));
    let b_random = b_rows.is_some() || b_cols.is_some() || b_own.is_some_and(|o| o.iter().any(|x| *x != 0.0));
    let a2 = alpha * alpha;
    // Bᵀ per entry (rows over K) and B's panels, for the congruence.
    let bts: Vec<Vec<f64>> =
        (0..b_entries).map(|bi| (0..n * k).map(|e| bl.v[(bi * k + e % k) * n + e / k]).collect()).collect();
    let panels: Vec<gemm64::Panels> =
        (0..b_entries).map(|bi| gemm64::Panels::new(&bl.v[bi * k * n..(bi + 1) * k * n], k, n)).collect();
    let rows: Vec<(Vec<f64>, Vec<f64>)> = (0..batch * m)
        .into_par_iter()
        .map(|row| {
            let (bi, i) = (row / m, row % m);
            let ai = if l.a_batched { bi } else { 0 } * m + i;
            let be = if l.b_batched { bi } else { 0 };
            let arow = &al.v[ai * k..(ai + 1) * k];
            // A's part.
            let a_part = if a_random {
                let mut c = a_cov.map_or_else(|| vec![0f64; k * k], |c| c.mat(ai).to_vec());
                if let Some(o) = a_own {
                    for q in 0..k {
                        c[q * k + q] += o[ai * k + q];
                    }
                }
                let mut t = cov::congruence(&c, k, n, &panels[be], &bts[be]);
                t.iter_mut().for_each(|x| *x *= a2);
                Some(t)
            } else {
                None
            };
            // B's part, and per element the variance of B's part where it is known exactly.
            let mut elem_b = vec![0f64; n];
            let b_part = if b_random {
                let mut c = vec![0f64; n * n];
                let l1: f64 = arow.iter().map(|x| x.abs()).sum();
                for q in 0..k {
                    let w = arow[q];
                    if w == 0.0 {
                        continue;
                    }
                    if let Some(br) = b_rows {
                        let cm = br.mat(be * k + q);
                        for (x, y) in c.iter_mut().zip(cm) {
                            *x += l1 * w.abs() * y;
                        }
                    }
                    if let Some(o) = b_own {
                        for j in 0..n {
                            let g = w * w * o[(be * k + q) * n + j];
                            c[j * n + j] += g;
                            elem_b[j] += g;
                        }
                    }
                }
                if let Some(bc) = b_cols {
                    let mj: Vec<f64> = (0..n)
                        .map(|j| {
                            let cm = bc.mat(be * n + j);
                            (0..k)
                                .map(|p| arow[p] * (0..k).map(|q| cm[p * k + q] * arow[q]).sum::<f64>())
                                .sum::<f64>()
                                .max(0.0)
                        })
                        .collect();
                    let total: f64 = mj.iter().map(|x| x.sqrt()).sum();
                    for j in 0..n {
                        c[j * n + j] += total * mj[j].sqrt();
                        elem_b[j] += mj[j];
                    }
                } else if b_rows.is_some() {
                    for j in 0..n {
                        elem_b[j] = c[j * n + j];
                    }
                }
                c.iter_mut().for_each(|x| *x *= a2);
                elem_b.iter_mut().for_each(|x| *x *= a2);
                Some(c)
            } else {
                None
            };
            let elem: Vec<f64> = (0..n)
                .map(|j| a_part.as_ref().map_or(0.0, |c| c[j * n + j].max(0.0).sqrt()) + elem_b[j].sqrt())
                .collect();
            let c = match (a_part, b_part) {
                (Some(x), Some(y)) => cov::sum_unknown(&x, &y, n),
                (Some(x), None) | (None, Some(x)) => x,
                (None, None) => vec![0f64; n * n],
            };
            (c, elem)
        })
        .collect();
    let mut mats = Vec::with_capacity(batch * m * n * n);
    let mut elems = Vec::with_capacity(batch * m * n);
    for (c, e) in rows {
        mats.extend(c);
        elems.extend(e);
    }
    (Cov { rows: true, d: n, last: n, m: mats }, elems)
}

/// The operands' tracked covariances where their layout fits the product: A's vectors over K,
/// B's over N, B's over K (`None`: zero); `None` where one is kept in another layout.
fn layouts<'a>(l: &MatMulLayout, x: &'a Bounds, y: &'a Bounds) -> Option<[Option<&'a Cov>; 3]> {
    let (k, n) = (l.k as usize, l.n as usize);
    let zero_sd = |x: &Bounds| x.sd.iter().all(|v| *v == 0.0);
    let a_c = match &x.cov {
        Some(c) if c.d == k && c.rows != l.ta => Some(c),
        _ if zero_sd(x) => None,
        _ => return None,
    };
    let (b_rows, b_cols) = match &y.cov {
        Some(c) if c.d == n && c.rows != l.tb => (Some(c), None),
        Some(c) if c.d == k && c.rows == l.tb => (None, Some(c)),
        _ if zero_sd(y) => (None, None),
        _ => return None,
    };
    Some([a_c, b_rows, b_cols])
}
