//! Layer normalisation: the device-precision rule of `layernorm_f16` (docs/kernels.md) and the
//! f64 value with a per-element error bound (docs/reliability.md "The verdict").

use half::f16;
use rayon::prelude::*;

/// One row as `layernorm_f16` computes it with the row's columns shared by `parts` workers (1: one
/// worker takes the row; 6: `layernorm_sum`/`_var`/`_apply`): each worker sums its whole 4-value
/// chunks in two f32 lanes (even and odd values; the last worker's tail values in lane 0), its
/// partial is `s0 + s1`, the partials are added in worker order, `μ = Σ·(1/D)`; deviations are
/// `x + (0 − μ)` and their squares summed the same way, `var = Σ·(1/D)`, `r = 1 / √(var + eps)`,
/// `y = f16(((x + (−μ))·r)·γ + β)`: the same operations in the same order as the kernels.
fn row_device(x: &[f32], g: &[f32], b: &[f32], eps: f32, parts: u64, out: &mut [f32]) {
    let d = x.len();
    let inv_d = 1.0f32 / d as f32;
    let chunks = (d / 4) as u64;
    let total = |f: &dyn Fn(f32) -> f32| {
        let mut sum = 0f32;
        for w in 0..parts {
            let (c0, c1) = ipu_core::plan::matmul::split(chunks, parts, w);
            let mut s = [0f32; 2];
            for (i, v) in x[4 * c0 as usize..4 * c1 as usize].iter().enumerate() {
                s[i % 2] += f(*v);
            }
            if w + 1 == parts {
                for v in &x[4 * chunks as usize..] {
                    s[0] += f(*v);
                }
            }
            let p = s[0] + s[1];
            sum = if w == 0 { p } else { sum + p };
        }
        sum
    };
    let mean = total(&|v| v) * inv_d;
    let neg = 0.0f32 - mean;
    let var = total(&|v| {
        let t = v + neg;
        t * t
    }) * inv_d;
    let r = 1.0f32 / libm::sqrtf(var + eps);
    for i in 0..d {
        out[i] = f16::from_f32(((x[i] + neg) * r) * g[i] + b[i]).to_f32();
    }
}

/// Device-precision layer normalisation of every row (last axis `d`); `gamma`/`beta` default to
/// 1 and 0 as the planner's constant buffers do; `parts(row)` is how many workers share the row.
pub fn device(
    x: &[f32],
    d: usize,
    gamma: Option<&[f32]>,
    beta: Option<&[f32]>,
    eps: f32,
    parts: &(dyn Fn(usize) -> u64 + Sync),
) -> Vec<f32> {
    let (ones, zeros) = (vec![1f32; d], vec![0f32; d]);
    let (g, b) = (gamma.unwrap_or(&ones), beta.unwrap_or(&zeros));
    let mut out = vec![0f32; x.len()];
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .enumerate()
        .for_each(|(r, (o, row))| row_device(row, g, b, eps, parts(r), o));
    out
}

/// Exact values and bounds of an affine parameter (absent: exact 1 or 0).
pub struct Affine<'a> {
    /// f64 values.
    pub exact: Option<&'a [f64]>,
    /// Their bounds.
    pub bound: Option<&'a [f64]>,
}

/// f64 layer normalisation of the exact inputs, and per element a bound on |device − f64|:
/// the inputs' own bounds carried through the normalisation (first order, doubled, while the
/// largest input bound is under a quarter of the row's σ; otherwise the global bound
/// |z| ≤ √D), the f32 arithmetic of the statistics (γ over 2D + 16 roundings, scaled by
/// mean|x|/σ for the cancellation in `x − μ`), the affine step and the final f16 rounding.
pub fn exact(
    ex: &[f64],
    bd: &[f64],
    d: usize,
    gamma: Affine<'_>,
    beta: Affine<'_>,
    eps: f32,
) -> (Vec<f64>, Vec<f64>) {
    let u32r = super::unit_roundoff(ipu_schema::DType::F32);
    let (u16r, sub16) =
        (super::unit_roundoff(ipu_schema::DType::F16), super::underflow_error(ipu_schema::DType::F16));
    let gam = super::gamma(2 * d as u64 + 16, u32r);
    let mut out_e = vec![0f64; ex.len()];
    let mut out_b = vec![0f64; ex.len()];
    out_e
        .par_chunks_mut(d)
        .zip(out_b.par_chunks_mut(d))
        .zip(ex.par_chunks(d).zip(bd.par_chunks(d)))
        .for_each(|((oe, ob), (x, e))| {
            let n = d as f64;
            let mu = x.iter().sum::<f64>() / n;
            let var = x.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / n;
            let sigma = (var + eps as f64).sqrt();
            let e_max = e.iter().copied().fold(0f64, f64::max);
            let e_mean = e.iter().sum::<f64>() / n;
            let a = x.iter().map(|v| v.abs()).sum::<f64>() / n;
            for i in 0..d {
                let z = (x[i] - mu) / sigma;
                let dz = if e_max <= sigma / 4.0 {
                    2.0 * ((e[i] + e_mean) / sigma + z.abs() * 2.0 * e_max / sigma)
                } else {
                    2.0 * n.sqrt() + 1.0
                };
                let fz = gam * ((a / sigma) * (2.0 + 2.0 * z.abs()) + 2.0 * z.abs() + 2.0);
                let dz = dz + fz;
                let (g, gb) = (gamma.exact.map_or(1.0, |v| v[i]), gamma.bound.map_or(0.0, |v| v[i]));
                let (b, bb) = (beta.exact.map_or(0.0, |v| v[i]), beta.bound.map_or(0.0, |v| v[i]));
                let y = z * g + b;
                let carried = g.abs() * dz
                    + (z.abs() + dz) * gb
                    + bb
                    + 4.0 * u32r * ((z.abs() + dz) * (g.abs() + gb) + b.abs());
                oe[i] = y;
                ob[i] = carried + u16r * (y.abs() + carried) + sub16;
            }
        });
    (out_e, out_b)
}

/// The probabilistic branch (`prob.rs`) of a layer norm, from the exact row: with
/// `z = (x − μ)/σ`, `δ = Δx − mean(Δx)`, `T = z·δ/D` and `r = ‖δ‖²/D`, exactly
/// `σ̂ = σ√(1 + a)`, `a = 2T/σ + r/σ²`, and `ẑ − z = (δ/σ − z·w)/(1 + w)`, `w = σ̂/σ − 1`.
/// First order `Δz = (δ − z·T)/σ`: its variance with the row's errors uncorrelated (model M2) is
/// `((1 − 2a_i)s_i² + (Σs² + 2z_iΣzs² + z_i²Σz²s²)/D²)/σ²`, `a_i = (1 + z_i²)/D`. The rest:
/// the deterministic parts by Minkowski, the remainder of `w` (`|√(1+a) − 1 − a/2| ≤
/// a²/(8(1 − |a|)^{3/2})` plus `r/(2σ²)`), that of `1/(1 + w)`, with `|T|` at its probabilistic
/// bound `(λ√Σz²s² + Σ|z|d)/D` and `‖δ‖² ≤ ‖Δx‖²` at its mean `Σs²` plus λ standard deviations
/// (Gaussian first-order errors, model M3 of `prob.rs`; two more statements per row,
/// [`prob_events`]);
/// infinite where `|a|` can reach ½ (the errors comparable to the row's spread). Then the
/// kernel's f32 statistics (as [`exact`], but its roundings random: `√n·u` for `n·u`), γ and β
/// (and their errors) and one f16 rounding.
pub fn prob(
    ex: &[f64],
    pin: &super::prob::Prob,
    d: usize,
    gamma: (Option<&[f64]>, Option<&super::prob::Prob>),
    beta: (Option<&[f64]>, Option<&super::prob::Prob>),
    eps: f32,
) -> super::prob::Prob {
    use super::prob::{rounded, Prob, LAMBDA};
    let u32r = super::unit_roundoff(ipu_schema::DType::F32);
    let gam_s = ((2 * d + 16) as f64).sqrt() * u32r;
    let mut s_out = vec![0f64; ex.len()];
    let mut d_out = vec![0f64; ex.len()];
    s_out.par_chunks_mut(d).zip(d_out.par_chunks_mut(d)).zip(ex.par_chunks(d)).enumerate().for_each(
        |(r, ((so, dso), x))| {
            let base = r * d;
            let n = d as f64;
            let mu = x.iter().sum::<f64>() / n;
            let var = x.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / n;
            let sigma = (var + eps as f64).sqrt();
            let a_mean = x.iter().map(|v| v.abs()).sum::<f64>() / n;
            let z: Vec<f64> = x.iter().map(|v| (v - mu) / sigma).collect();
            let (s, dd) = (&pin.s[base..base + d], &pin.d[base..base + d]);
            let m: Vec<f64> = (0..d).map(|i| pin.mag(base + i)).collect();
            let (mut ss, mut zs, mut zzs, mut zd, mut dm, mut zdm, mut mm) = (0f64, 0., 0., 0., 0., 0., 0.);
            for i in 0..d {
                let s2 = s[i] * s[i];
                ss += s2;
                zs += z[i] * s2;
                zzs += z[i] * z[i] * s2;
                zd += z[i].abs() * dd[i];
                dm += dd[i];
                zdm += z[i].abs() * dd[i];
                mm += m[i] * m[i];
            }
            let (m_mean, d_mean, zd_mean) = (m.iter().sum::<f64>() / n, dm / n, zdm / n);
            let t = (LAMBDA * zzs.sqrt() + zd) / n;
            // ‖δ‖² ≤ ‖Δx‖²: at most Σ m², and (model M3, Gaussian first-order errors) its mean
            // Σ s² plus λ standard deviations √(2Σ s⁴), plus the deterministic parts' share.
            let (s4, sd_x): (f64, f64) = (0..d).fold((0.0, 0.0), |(a, b), i| {
                (a + 2.0 * s[i].powi(4), b + dd[i] * (2.0 * LAMBDA * s[i] + dd[i]))
            });
            let rr = mm.min(ss + LAMBDA * s4.sqrt() + sd_x) / n;
            let a = 2.0 * t / sigma + rr / (sigma * sigma);
            // Where |a| can reach ½ (or is NaN: a row of NaNs) the remainders are not bounded here.
            if a.is_nan() || a >= 0.5 {
                so.fill(f64::INFINITY);
                dso.fill(f64::INFINITY);
                return;
            }
            let r_w = a * a / (8.0 * (1.0 - a).powf(1.5)) + rr / (2.0 * sigma * sigma);
            let w = (1.0 - a).sqrt().recip() - 1.0;
            // |w| ≤ max(√(1+a) − 1, 1 − √(1−a)) ≤ 1/√(1−a) − 1 = w above.
            let w_abs = w.max((1.0 + a).sqrt() - 1.0);
            for i in 0..d {
                let zi = z[i].abs();
                let ai = (1.0 + z[i] * z[i]) / n;
                let v = ((1.0 - 2.0 * ai) * s[i] * s[i]
                    + (ss + 2.0 * z[i] * zs + z[i] * z[i] * zzs) / (n * n))
                    .max(s[i] * s[i] * (1.0 - 2.0 * ai).max(0.0));
                let sz = v.sqrt() / sigma;
                let dz1 = (dd[i] + d_mean + zi * zd_mean) / sigma;
                let delta = m[i] + m_mean;
                let second = (delta / sigma + zi * w_abs) * w_abs / (1.0 - w_abs).max(0.0) + zi * r_w;
                // The kernel's f32 statistics: the 2D + 16 roundings of `exact`'s γ, random
                // (model M1): scale √(2D + 16)·u₃₂ in place of (2D + 16)·u₃₂.
                let fz = gam_s * ((a_mean / sigma) * (2.0 + 2.0 * zi) + 2.0 * zi + 2.0);
                let sz = sz.hypot(fz);
                let dz = dz1 + second;
                let mz = LAMBDA * sz + dz;
                let (g, gp) = (gamma.0.map_or(1.0, |v| v[i]), gamma.1);
                let (b, bp) = (beta.0.map_or(0.0, |v| v[i]), beta.1);
                let (gs, gd, gm) = gp.map_or((0.0, 0.0, 0.0), |p| (p.s[i], p.d[i], p.mag(i)));
                let (bs, bd) = bp.map_or((0.0, 0.0), |p| (p.s[i], p.d[i]));
                let y = z[i] * g + b;
                let sy = g.abs() * sz + zi * gs + bs;
                let dy = g.abs() * dz
                    + zi * gd
                    + bd
                    + mz * gm
                    + 4.0 * u32r * ((zi + mz) * (g.abs() + gm) + b.abs());
                let (a, b) = rounded(y, sy, dy, ipu_schema::DType::F16, 0);
                so[i] = a;
                dso[i] = b;
            }
        },
    );
    Prob { s: s_out, d: d_out }
}

/// The probabilistic statements a layer norm adds beside its elements' own: two per row (the
/// bounds on `z·Δx` and `‖Δx‖²`).
pub fn prob_events(len: usize, d: usize) -> u64 {
    2 * (len / d.max(1)) as u64
}
