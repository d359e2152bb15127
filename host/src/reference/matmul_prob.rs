//! The probabilistic branch (`prob.rs`) of a matmul `c = α·Σ_k a_k·b_k`, at about the cost of
//! the f64 product per operand that carries errors, plus one pass for the partial sums.
//!
//! - **Carried** random parts, first order: `Σ_k s_a,k²·b_k²` and `Σ_k a_k²·s_b,k²` (model M2:
//!   one operand's elements along K uncorrelated), one f64 product each where that operand has
//!   errors; the two sides add in quadrature, or by Minkowski when both are the same tensor
//!   (`x·xᵀ` pairs an element with itself). Deterministic parts, which may all have one sign:
//!   `max_k d_a,k·Σ|b| + Σ|a|·max_k d_b,k`. The second-order `Σ Δa·Δb`: its random parts'
//!   products are mean-zero up to the operands' correlation, `≤ ‖s_a‖‖s_b‖`, with variance
//!   `Σ s_a²s_b²`; the products with a deterministic part by Cauchy–Schwarz.
//! - **Partial-sum roundings**: every K block (16 f16 / 32 FP8 values) of every K-split piece
//!   rounds the running sum to the accumulation type, each an independent source of scale
//!   `half_ulp(|S_j| + carried + Σ earlier c)` at the **exact partial sum** `S_j` (one pass over the
//!   operands gives the blocks' sums, `gemm64::product_ranges`): `√Σ_j c_j²`, the √n·u of Higham
//!   & Mary where the worst case has n·u. The carried "pin" passes ≤ 4 f32 additions per block
//!   (`4·half_ulp₃₂(S_j)` each), each product ≤ 7 within its block (scale `u₃₂·√(7·block·Σ a²b²)`
//!   with `Σ a²b² ≤ ‖a‖²·max b²`). The K-split merges (tk − 1 of them) round at most
//!   `Σ_p |piece_p| + carried` each (an f32 add, then the accumulation type).
//! - `alpha`: the f32 product and one f16 rounding of `α·total`.

use super::gemm64;
use super::prob::{half_ulp, Prob, LAMBDA};
use ipu_core::plan::matmul::split;
use ipu_schema::DType;
use rayon::prelude::*;

/// The shape and rounding points the probabilistic bound needs.
pub struct Shape {
    pub batch: usize,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub a_batched: bool,
    pub b_batched: bool,
    pub ta: bool,
    pub tb: bool,
    /// Accumulation type.
    pub acc: DType,
    /// K values per AMP block.
    pub block: usize,
    /// K-split pieces.
    pub tk: usize,
    /// The scalar applied last (rounded to f16 once more).
    pub alpha: Option<f64>,
    /// Both operands are one tensor.
    pub same: bool,
}

/// `f(x)` of an operand laid out as `[entries][rows][cols]` from its storage (transposed or not).
fn lay(entries: usize, rows: usize, cols: usize, transposed: bool, f: impl Fn(usize) -> f64) -> Vec<f64> {
    let mut out = vec![0f64; entries * rows * cols];
    for bi in 0..entries {
        for r in 0..rows {
            for c in 0..cols {
                let src = bi * rows * cols + if transposed { c * rows + r } else { r * cols + c };
                out[bi * rows * cols + r * cols + c] = f(src);
            }
        }
    }
    out
}

/// Per row (`[entries][rows][cols]`, over cols) or per column (over rows) of `x`: `√Σx²`,
/// `Σ|x|` and `max|x|`.
fn stats(x: &[f64], entries: usize, rows: usize, cols: usize, per_row: bool) -> [Vec<f64>; 3] {
    let per = if per_row { rows } else { cols };
    let (mut n2, mut s1, mut mx) =
        (vec![0f64; entries * per], vec![0f64; entries * per], vec![0f64; entries * per]);
    let at = |bi: usize, r: usize, c: usize| {
        (x[bi * rows * cols + r * cols + c], bi * per + if per_row { r } else { c })
    };
    for bi in 0..entries {
        for r in 0..rows {
            for c in 0..cols {
                let (v, o) = at(bi, r, c);
                s1[o] += v.abs();
                // NaN (an undefined bound) stays NaN; f64::max would drop it.
                mx[o] = if v.is_nan() || mx[o].is_nan() { f64::NAN } else { mx[o].max(v.abs()) };
            }
        }
    }
    // The norm scaled by the largest value: finite whenever the elements are (bounds of 10¹⁸⁰
    // after a loose softmax would overflow a plain sum of squares).
    for bi in 0..entries {
        for r in 0..rows {
            for c in 0..cols {
                let (v, o) = at(bi, r, c);
                if mx[o] > 0.0 && mx[o].is_finite() {
                    n2[o] += (v / mx[o]) * (v / mx[o]);
                }
            }
        }
    }
    // An infinite or NaN element makes the norm the same.
    n2.iter_mut().zip(&mx).for_each(|(v, m)| *v = if m.is_finite() { *m * v.sqrt() } else { *m });
    [n2, s1, mx]
}

/// The probabilistic bound of every output (`[batch][m][n]`, before an f16 output rounding of
/// f32 sums, which the caller adds), from the operands' f64 values and their `Prob`s.
pub fn matmul(
    sh: &Shape,
    (ea, ra, pa): (&[f64], &[f64], &Prob),
    (eb, rb, pb): (&[f64], &[f64], &Prob),
) -> (Vec<f64>, Vec<f64>, Prob) {
    let (m, k, n) = (sh.m, sh.k, sh.n);
    let (ae, be) = (if sh.a_batched { sh.batch } else { 1 }, if sh.b_batched { sh.batch } else { 1 });
    let (a_exact, b_exact) = (pa.is_exact(), pb.is_exact());
    let av = lay(ae, m, k, sh.ta, |i| ea[i]);
    let bv = lay(be, k, n, sh.tb, |i| eb[i]);
    let [a_norm, _, _] = stats(&av, ae, m, k, true);
    let [_, _, b_max] = stats(&bv, be, k, n, false);
    // The rigorous branch by Cauchy–Schwarz on the rows of A and columns of B over K.
    let ra_n = stats(&lay(ae, m, k, sh.ta, |i| ra[i]), ae, m, k, true)[0].clone();
    let rb_n = stats(&lay(be, k, n, sh.tb, |i| rb[i]), be, k, n, false)[0].clone();
    let ma_n = stats(&lay(ae, m, k, sh.ta, |i| ea[i].abs() + ra[i]), ae, m, k, true)[0].clone();
    let mb_n = stats(&lay(be, k, n, sh.tb, |i| eb[i].abs() + rb[i]), be, k, n, false)[0].clone();
    let roundings = k.div_ceil(sh.block) as u64 + sh.tk as u64;
    let round_rel = super::gamma(roundings, super::unit_roundoff(sh.acc)) + super::gamma(k as u64 + 8, U32);
    let under = roundings as f64 * super::underflow_error(sh.acc);
    // Deterministic and magnitude statistics of the operands with errors.
    let a_d = if a_exact { None } else { Some(stats(&lay(ae, m, k, sh.ta, |i| pa.d[i]), ae, m, k, true)) };
    let b_d = if b_exact { None } else { Some(stats(&lay(be, k, n, sh.tb, |i| pb.d[i]), be, k, n, false)) };
    let a_sn = if a_exact { None } else { Some(stats(&lay(ae, m, k, sh.ta, |i| pa.s[i]), ae, m, k, true)) };
    let b_sn = if b_exact { None } else { Some(stats(&lay(be, k, n, sh.tb, |i| pb.s[i]), be, k, n, false)) };
    let pack = |x: &[f64]| -> Vec<gemm64::Panels> {
        (0..be).map(|bi| gemm64::Panels::new(&x[bi * k * n..(bi + 1) * k * n], k, n)).collect()
    };
    let b_panels = pack(&bv);
    // A's random part against B², A² against B's random part.
    let a_s2 = (!a_exact).then(|| lay(ae, m, k, sh.ta, |i| pa.s[i] * pa.s[i]));
    let b2 = (!a_exact).then(|| pack(&bv.iter().map(|v| v * v).collect::<Vec<_>>()));
    let a2 = (!b_exact).then(|| av.iter().map(|v| v * v).collect::<Vec<_>>());
    let b_s2 = (!b_exact).then(|| pack(&lay(be, k, n, sh.tb, |i| pb.s[i] * pb.s[i])));
    // A's deterministic part against |B|, |A| against B's (where they are not all zero).
    let a_dl = (!a_exact && pa.d.iter().any(|v| *v != 0.0)).then(|| lay(ae, m, k, sh.ta, |i| pa.d[i]));
    let b_abs = a_dl.is_some().then(|| pack(&bv.iter().map(|v| v.abs()).collect::<Vec<_>>()));
    let b_dl = (!b_exact && pb.d.iter().any(|v| *v != 0.0)).then(|| pack(&lay(be, k, n, sh.tb, |i| pb.d[i])));
    let a_abs = b_dl.is_some().then(|| av.iter().map(|v| v.abs()).collect::<Vec<_>>());
    drop(bv);
    // K cuts: every block of every K-split piece.
    let mut cuts = vec![0usize];
    let mut piece_of = Vec::new();
    for p in 0..sh.tk.max(1) {
        let (k0, k1) = split(k as u64, sh.tk.max(1) as u64, p as u64);
        let mut c = k0 as usize;
        while c < k1 as usize {
            c = (c + sh.block).min(k1 as usize);
            cuts.push(c);
            piece_of.push(p);
        }
    }
    let alpha = sh.alpha.unwrap_or(1.0);
    let al = alpha.abs();
    const ROWS: usize = 16;
    // Written in place, row blocks of each batch entry in parallel (no per-block vectors to
    // concatenate: at attention sizes the page faults of fresh memory cost more than the sums).
    let len = sh.batch * m * n;
    let (mut s_all, mut d_all, mut x_all, mut r_all) =
        (vec![0f64; len], vec![0f64; len], vec![0f64; len], vec![0f64; len]);
    let mn = (m * n).max(1);
    let rn = ROWS * n.max(1);
    s_all
        .par_chunks_mut(mn)
        .zip(d_all.par_chunks_mut(mn))
        .zip(x_all.par_chunks_mut(mn).zip(r_all.par_chunks_mut(mn)))
        .enumerate()
        .flat_map(|(bi, ((sb, db), (xb, rbk)))| {
            sb.par_chunks_mut(rn)
                .zip(db.par_chunks_mut(rn))
                .zip(xb.par_chunks_mut(rn).zip(rbk.par_chunks_mut(rn)))
                .enumerate()
                .map(move |(q, ((so, dso), (xo, ro)))| (bi, q * ROWS, so, dso, xo, ro))
        })
        .for_each(|(bi, i0, s_out, d_out, x_out, r_out)| {
            let nr = ROWS.min(m - i0);
            let ai = if sh.a_batched { bi } else { 0 };
            let bb = if sh.b_batched { bi } else { 0 };
            let ar = (ai * m + i0) * k..(ai * m + i0 + nr) * k;
            let ranges = gemm64::product_ranges(&av[ar.clone()], &b_panels[bb], nr, &cuts);
            let va =
                a_s2.as_ref().map(|x| gemm64::product([&x[ar.clone()]], [&b2.as_ref().unwrap()[bb]], nr));
            let vb =
                a2.as_ref().map(|x| gemm64::product([&x[ar.clone()]], [&b_s2.as_ref().unwrap()[bb]], nr));
            let da_b =
                a_dl.as_ref().map(|x| gemm64::product([&x[ar.clone()]], [&b_abs.as_ref().unwrap()[bb]], nr));
            let a_db =
                a_abs.as_ref().map(|x| gemm64::product([&x[ar.clone()]], [&b_dl.as_ref().unwrap()[bb]], nr));
            let len = nr * n;
            // Pass 1, per output: the carried errors (first order, and Σ Δa·Δb).
            let mut var_c = vec![0f64; len];
            let mut carried = vec![0f64; len];
            for r in 0..nr {
                let ra = ai * m + i0 + r;
                for j in 0..n {
                    let (cb, e) = (bb * n + j, r * n + j);
                    let (xa, xb) = (va.as_ref().map_or(0.0, |v| v[e]), vb.as_ref().map_or(0.0, |v| v[e]));
                    let mut v = if sh.same { (xa.sqrt() + xb.sqrt()).powi(2) } else { xa + xb };
                    let mut det = da_b.as_ref().map_or(0.0, |v| v[e]) + a_db.as_ref().map_or(0.0, |v| v[e]);
                    if let (Some(sa), Some(sb), Some(da), Some(db)) = (&a_sn, &b_sn, &a_d, &b_d) {
                        // Σ Δa·Δb: the random parts' products, mean-zero up to their correlation
                        // (a tensor with itself: ≤ ‖s_a‖‖s_b‖), of variance Σ s_a²s_b² ≤ the
                        // smaller of ‖s_a‖²·max s_b² and max s_a²·‖s_b‖²; a deterministic part
                        // against a random one: random, of variance ≤ ‖d‖²·max s²; two
                        // deterministic parts: ‖d_a‖‖d_b‖.
                        v += (sa[0][ra] * sb[2][cb]).min(sa[2][ra] * sb[0][cb]).powi(2);
                        if sh.same {
                            det += sa[0][ra] * sb[0][cb];
                        }
                        v += (da[0][ra] * sb[2][cb]).powi(2) + (sa[2][ra] * db[0][cb]).powi(2);
                        det += da[0][ra] * db[0][cb];
                    }
                    var_c[e] = v;
                    carried[e] = LAMBDA * v.sqrt() + det;
                    d_out[e] = det;
                }
            }
            // Pass 2, block by block (contiguous over the outputs): the partial-sum roundings
            // at the exact partial sums; the value rounded is within `carried` and the earlier
            // roundings' worst case (`worst`) of the exact partial sum.
            let (mut part, mut total, mut pieces) = (vec![0f64; len], vec![0f64; len], vec![0f64; len]);
            let (mut own2, mut worst) = (vec![0f64; len], vec![0f64; len]);
            let mut piece = 0usize;
            for (q, &p) in piece_of.iter().enumerate() {
                if p != piece {
                    pieces.iter_mut().zip(&mut part).for_each(|(a, x)| {
                        *a += x.abs();
                        *x = 0.0;
                    });
                    piece = p;
                }
                let rq = &ranges[q * len..(q + 1) * len];
                for e in 0..len {
                    part[e] += rq[e];
                    total[e] += rq[e];
                    let t = part[e].abs() + carried[e] + worst[e];
                    let c = half_ulp(sh.acc, 0, t);
                    let pin = 4.0 * half_ulp(DType::F32, 0, t);
                    own2[e] += c * c + pin * pin;
                    worst[e] += c + pin;
                }
            }
            // Pass 3: K-split merges, the AMP's f32 additions, alpha, and the rigorous branch.
            for r in 0..nr {
                let ra = ai * m + i0 + r;
                for j in 0..n {
                    let (cb, e) = (bb * n + j, r * n + j);
                    let mut o2 = own2[e];
                    if sh.tk > 1 {
                        let t = pieces[e] + part[e].abs() + carried[e] + worst[e];
                        let c = half_ulp(sh.acc, 0, t) + half_ulp(DType::F32, 0, t);
                        o2 += (sh.tk - 1) as f64 * c * c;
                    }
                    // Products through ≤ 7 f32 additions within their block.
                    let f32s = U32 * a_norm[ra] * b_max[cb];
                    o2 += 7.0 * sh.block as f64 * f32s * f32s;
                    let mut s2 = al * al * (var_c[e] + o2);
                    let mut d = al * d_out[e];
                    if sh.alpha.is_some() {
                        let y = (alpha * total[e]).abs() + LAMBDA * s2.sqrt() + d;
                        d += half_ulp(DType::F32, 0, y);
                        let c = half_ulp(DType::F16, 0, y);
                        s2 += c * c;
                    }
                    s_out[e] = s2.sqrt();
                    d_out[e] = d;
                    x_out[e] = alpha * total[e];
                    // Rigorous: Σ(δa(|b| + δb) + |a|δb) ≤ ‖δa‖‖|b| + δb‖ + ‖a‖‖δb‖, the roundings
                    // γ(blocks + pieces, u_acc) + γ(K + 8, u₃₂) of Σ(|a| + δa)(|b| + δb) ≤ ‖·‖‖·‖.
                    let mag = ma_n[ra] * mb_n[cb];
                    let mut rig =
                        al * (ra_n[ra] * mb_n[cb] + a_norm[ra] * rb_n[cb] + round_rel * mag + under);
                    if sh.alpha.is_some() {
                        rig += super::unit_roundoff(DType::F16) * al * mag * (1.0 + round_rel)
                            + super::underflow_error(DType::F16);
                    }
                    r_out[e] = rig;
                }
            }
        });
    (x_all, r_all, Prob { s: s_all, d: d_all })
}

/// f32 unit roundoff.
const U32: f64 = 1.0 / 16_777_216.0;
