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

/// f64 layer normalisation of the exact inputs, per element a bound on |device − f64| and per
/// row a bound on the norm of the row's error (docs/reliability.md "The verdict", layernorm).
///
/// With `d = x − μ`, `σ = √(var + eps)`, `z = d/σ` of the exact row and the input's errors `Δx`
/// (`|Δx_i| ≤ b_i`, `‖Δx‖ ≤ ρ`): the centred error `δ = Δx − mean(Δx)` has `|δ_i| ≤ b_i + m₁`,
/// `m₁ = min(mean b, ρ/√D)`, and `‖δ‖ ≤ ρ`; `σ̂² − σ² = (2d·δ + ‖δ‖²)/D` with
/// `|d·δ| ≤ min(Σ|d|b, ‖d‖ρ)`, so `σ̂ ≥ σ_lo = √(σ² − 2|d·δ|/D)` and
/// `|σ̂ − σ| ≤ Δσ = (2|d·δ| + ρ²)/(D(σ_lo + σ))`; and exactly `ẑ − z = (δ − z(σ̂ − σ))/σ̂`, hence
/// `|Δz_i| ≤ (b_i + m₁ + |z_i|Δσ)/σ_lo` — no linearisation. Only when `σ_lo = 0` (errors as large
/// as the row's spread) the global `|ẑ_i| ≤ √D` is used. Then the kernel's f32 statistics at the
/// device's input, the affine step and one f16 rounding.
pub fn exact(
    ex: &[f64],
    bd: &[f64],
    rho: &[f64],
    d: usize,
    gamma: Affine<'_>,
    beta: Affine<'_>,
    eps: f32,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let u32r = super::unit_roundoff(ipu_schema::DType::F32);
    let (u16r, sub16) =
        (super::unit_roundoff(ipu_schema::DType::F16), super::underflow_error(ipu_schema::DType::F16));
    // The kernel's sums: an element goes through at most D/2 + 3 additions in its lane, one lane
    // merge and five merges of the workers' partials.
    let n_sum = d as u64 / 2 + 10;
    let g_sum = super::gamma(n_sum, u32r);
    // var: squares of rounded deviations, summed, scaled by the rounded 1/D; then eps, √, 1/x.
    let theta_r = 0.5 * super::gamma(n_sum + 6, u32r) + 3.0 * u32r;
    let theta_z = theta_r + 2.1 * u32r;
    let mut out_e = vec![0f64; ex.len()];
    let mut out_b = vec![0f64; ex.len()];
    let mut out_r = vec![0f64; rho.len()];
    out_e
        .par_chunks_mut(d)
        .zip(out_b.par_chunks_mut(d))
        .zip(out_r.par_iter_mut())
        .zip(ex.par_chunks(d).zip(bd.par_chunks(d)).zip(rho.par_iter()))
        .for_each(|(((oe, ob), or), ((x, e), &rho_in))| {
            let n = d as f64;
            let mu = x.iter().sum::<f64>() / n;
            let var = x.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / n;
            let sigma = (var + eps as f64).sqrt();
            let rho_in = rho_in.min(super::rows::norm(e));
            let e_sum = e.iter().sum::<f64>();
            let m1 = (e_sum / n).min(rho_in / n.sqrt());
            let dev: Vec<f64> = x.iter().map(|v| v - mu).collect();
            let d_dot = dev
                .iter()
                .zip(e)
                .map(|(a, b)| a.abs() * b)
                .sum::<f64>()
                .min(super::rows::norm(&dev) * rho_in);
            let sigma_lo = (sigma * sigma - 2.0 * d_dot / n).max(0.0).sqrt();
            let d_sigma = (2.0 * d_dot + rho_in * rho_in) / (n * (sigma_lo + sigma));
            // The kernel's mean at the device's input: |μ̂ − μ(x̂)| ≤ e_mu.
            let abs_mean = x.iter().map(|v| v.abs()).sum::<f64>() / n + e_sum / n;
            let e_mu = g_sum * abs_mean + 2.01 * u32r * (mu.abs() + m1);
            let fallback = sigma_lo <= 0.0;
            let z_norm = (dev.iter().map(|v| v * v).sum::<f64>()).sqrt() / sigma;
            let kappa = z_norm * z_norm / n;
            let c_max = 2.0 * sigma / (sigma_lo + sigma);
            let rho_dz = if fallback {
                f64::INFINITY
            } else {
                ((c_max * kappa - 1.0).max(1.0) * rho_in
                    + z_norm * rho_in * rho_in / (n * (sigma_lo + sigma)))
                    / sigma_lo
            };
            let g_max = (0..d)
                .map(|i| gamma.exact.map_or(1.0, |v| v[i].abs()) + gamma.bound.map_or(0.0, |v| v[i]))
                .fold(0f64, f64::max);
            let (mut fz_sq, mut dz_sq, mut other_sq) = (0f64, 0f64, 0f64);
            for i in 0..d {
                let z = dev[i] / sigma;
                let global = z.abs() + n.sqrt() * (1.0 + theta_z);
                let (dz, fz) = if fallback {
                    (global, 0.0)
                } else {
                    let dz = (e[i] + m1 + z.abs() * d_sigma) / sigma_lo;
                    // The f32 statistics: ẑ_dev = (x̂ − μ̂)/√(V + eps)·(1 + θ_z) with
                    // V = var(x̂) + (μ̂ − μ(x̂))².
                    let zh = z.abs() + dz;
                    let fz = e_mu / sigma_lo
                        + zh * e_mu * e_mu / (2.0 * sigma_lo * sigma_lo)
                        + theta_z * (zh + e_mu / sigma_lo);
                    if dz + fz > global {
                        (global, 0.0)
                    } else {
                        (dz, fz)
                    }
                };
                dz_sq += dz * dz;
                fz_sq += fz * fz;
                let dz = dz + fz;
                let (g, gb) = (gamma.exact.map_or(1.0, |v| v[i]), gamma.bound.map_or(0.0, |v| v[i]));
                let (b, bb) = (beta.exact.map_or(0.0, |v| v[i]), beta.bound.map_or(0.0, |v| v[i]));
                let y = z * g + b;
                let f32_affine = 4.0 * u32r * ((z.abs() + dz) * (g.abs() + gb) + b.abs());
                let carried = g.abs() * dz + (z.abs() + dz) * gb + bb + f32_affine;
                let fresh = u16r * (y.abs() + carried) + sub16;
                let other = (z.abs() + dz) * gb + bb + f32_affine + fresh;
                other_sq += other * other;
                oe[i] = y;
                ob[i] = carried + fresh;
            }
            let dz_row = rho_dz.min(dz_sq.sqrt()) + fz_sq.sqrt();
            *or = (g_max * dz_row + other_sq.sqrt()).min(super::rows::norm(ob));
        });
    (out_e, out_b, out_r)
}
