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

/// Row statistics of the input's errors a bound set gives: `m₁ ≥ |mean Δx|`, `‖δ‖ ≤ ρ`,
/// `|d·δ| ≤ d_dot`, `σ̂ ≥ σ_lo`, `|σ̂ − σ| ≤ Δσ`, and per element `|Δz_i| ≤ (e_i + m₁ + |z_i|Δσ)/σ_lo`.
struct Perturbation {
    m1: f64,
    rho: f64,
    d_dot: f64,
    sigma_lo: f64,
    d_sigma: f64,
}

fn perturbation(dev: &[f64], e: &[f64], rho: f64, sigma: f64) -> Perturbation {
    let n = dev.len() as f64;
    let rho = rho.min(super::rows::norm(e));
    let m1 = (e.iter().sum::<f64>() / n).min(rho / n.sqrt());
    let d_dot = dev.iter().zip(e).map(|(a, b)| a.abs() * b).sum::<f64>().min(super::rows::norm(dev) * rho);
    let sigma_lo = (sigma * sigma - 2.0 * d_dot / n).max(0.0).sqrt();
    let d_sigma = (2.0 * d_dot + rho * rho) / (n * (sigma_lo + sigma));
    Perturbation { m1, rho, d_dot, sigma_lo, d_sigma }
}

/// f64 layer normalisation of the exact inputs and its bounds (docs/reliability.md "The
/// verdict", layernorm).
///
/// With `d = x − μ`, `σ = √(var + eps)`, `z = d/σ` of the exact row and the input's errors `Δx`
/// (`|Δx_i| ≤ b_i`, `‖Δx‖ ≤ ρ`): the centred error `δ = Δx − mean(Δx)` has `|δ_i| ≤ b_i + m₁`,
/// `m₁ = min(mean b, ρ/√D)`, and `‖δ‖ ≤ ρ`; `σ̂² − σ² = (2d·δ + ‖δ‖²)/D` with
/// `|d·δ| ≤ min(Σ|d|b, ‖d‖ρ)`, so `σ̂ ≥ σ_lo = √(σ² − 2|d·δ|/D)` and
/// `|σ̂ − σ| ≤ Δσ = (2|d·δ| + ρ²)/(D(σ_lo + σ))`; and exactly `ẑ − z = (δ − z(σ̂ − σ))/σ̂`, hence
/// `|Δz_i| ≤ (b_i + m₁ + |z_i|Δσ)/σ_lo` — no linearisation. Only when `σ_lo = 0` (errors as large
/// as the row's spread) the global `|ẑ_i| ≤ √D` is used. Then the kernel's f32 statistics at the
/// device's input, the affine step and one f16 rounding.
///
/// Probabilistic branch: the linear part `J·Δx`, `J = (I − 11ᵀ/D − zzᵀ/D)/σ` (`‖J‖₂ = 1/σ`,
/// row i of norm `√(1 − 1/D − z_i²(2 − κ)/D)/σ`, `κ = ‖z‖²/D`), maps the random part; the
/// remainder `(ẑ − z) − J·Δx = δ(1/σ̂ − 1/σ) − z((σ̂ − σ)/σ̂ − z·δ/(Dσ))` is at most
/// `(e_i + m₁)Δσ/(σσ_lo) + |z_i|(2|d·δ|Δσ/(Dσ²σ_lo) + ρ²/(Dσ_lo(σ_lo + σ)))` (second order).
pub fn exact(
    ex: &[f64],
    bounds: &super::bounds::Bounds,
    d: usize,
    gamma: Affine<'_>,
    beta: Affine<'_>,
    eps: f32,
) -> (Vec<f64>, super::bounds::Bounds) {
    use super::bounds::half_ulp;
    use ipu_schema::DType;
    let u32r = super::unit_roundoff(DType::F32);
    // The kernel's sums: an element goes through at most D/2 + 3 additions in its lane, one lane
    // merge and five merges of the workers' partials.
    let n_sum = d as u64 / 2 + 10;
    let g_sum = super::gamma(n_sum, u32r);
    // var: squares of rounded deviations, summed, scaled by the rounded 1/D; then eps, √, 1/x.
    let theta_r = 0.5 * super::gamma(n_sum + 6, u32r) + 3.0 * u32r;
    let theta_z = theta_r + 2.1 * u32r;
    let rows = ex.len() / d;
    // The input's ellipsoids as row vectors (or folded into its box), and the covariances of
    // its whole random part (shared and own) per row.
    let folded;
    let bounds = if bounds.q.is_some() && bounds.row_q(d).is_none() {
        folded = bounds.folded();
        &folded
    } else {
        bounds
    };
    let cin = bounds.row_cov(d).map(|mut c| {
        c.add_diagonal(&bounds.dg);
        c
    });
    let qin = bounds.row_q(d);
    let quad = |m: &[f64], v: &[f64]| -> f64 {
        (0..d).map(|i| v[i] * (0..d).map(|j| m[i * d + j] * v[j]).sum::<f64>()).sum::<f64>().max(0.0)
    };
    // Per row: [b, sd, dg, det] per element, [ρ, sv, dr], the rank-one ellipsoid's scale
    // (directed remainder), and whether the probabilistic branch holds.
    type Row = (Vec<f64>, [Vec<f64>; 4], [f64; 3], f64, bool);
    let out: Vec<Row> = (0..rows)
        .into_par_iter()
        .map(|r| {
            let row = r * d..(r + 1) * d;
            let x = &ex[row.clone()];
            let (e, comb) = (&bounds.b[row.clone()], &bounds.comb[row.clone()]);
            let (sd_in, dg_in, det_in) =
                (&bounds.sd[row.clone()], &bounds.dg[row.clone()], &bounds.det[row.clone()]);
            let n = d as f64;
            let mu = x.iter().sum::<f64>() / n;
            let dev: Vec<f64> = x.iter().map(|v| v - mu).collect();
            let var = dev.iter().map(|v| v * v).sum::<f64>() / n;
            let sigma = (var + eps as f64).sqrt();
            let z: Vec<f64> = dev.iter().map(|v| v / sigma).collect();
            let z_norm = super::rows::norm(&z);
            let kappa = z_norm * z_norm / n;
            let rig = perturbation(&dev, e, bounds.rho[r], sigma);
            let mut pc = perturbation(&dev, comb, bounds.rho[r], sigma);
            // Probabilistic: z·Δx and mean(Δx) are linear functionals of the errors; their
            // random parts (covariance C) are within λ·√(vᵀCv), the ellipsoid's within
            // √(vᵀQv), the box's within Σ|v|·det (two more probabilistic statements per row).
            if let Some(c) = &cin {
                let (cm, ones) = (c.mat(r), vec![1.0; d]);
                let (qz, q1) =
                    qin.as_ref().map_or((0.0, 0.0), |q| (quad(q.mat(r), &z), quad(q.mat(r), &ones)));
                let det_row = &bounds.det[row.clone()];
                let zdx = super::bounds::LAMBDA * quad(cm, &z).sqrt()
                    + qz.sqrt()
                    + z.iter().zip(det_row).map(|(z, t)| z.abs() * t).sum::<f64>();
                let mdx = (super::bounds::LAMBDA * quad(cm, &ones).sqrt()
                    + q1.sqrt()
                    + det_row.iter().sum::<f64>())
                    / n;
                pc.d_dot = pc.d_dot.min(sigma * zdx);
                pc.m1 = pc.m1.min(mdx);
                pc.sigma_lo = (sigma * sigma - 2.0 * pc.d_dot / n).max(0.0).sqrt();
                pc.d_sigma = (2.0 * pc.d_dot + pc.rho * pc.rho) / (n * (pc.sigma_lo + sigma));
            }
            // The kernel's mean at the device's input: |μ̂ − μ(x̂)| ≤ e_mu (with the input's bound e).
            let abs_mean = x.iter().map(|v| v.abs()).sum::<f64>() / n;
            let e_mu = |p: &Perturbation, e: &[f64]| {
                g_sum * (abs_mean + e.iter().sum::<f64>() / n) + 2.01 * u32r * (mu.abs() + p.m1)
            };
            let (e_mu_r, e_mu_c) = (e_mu(&rig, e), e_mu(&pc, comb));
            // The f32 statistics: ẑ_dev = (x̂ − μ̂)/√(V + eps)·(1 + θ_z), V = var(x̂) + (μ̂ − μ(x̂))².
            let f32_err = |zh: f64, e_mu: f64, s_lo: f64| {
                e_mu / s_lo + zh * e_mu * e_mu / (2.0 * s_lo * s_lo) + theta_z * (zh + e_mu / s_lo)
            };
            // Rigorous |Δz_i| (carried, with the f32 statistics) per element.
            let dz_rig = |i: usize| -> (f64, f64) {
                let global = z[i].abs() + n.sqrt() * (1.0 + theta_z);
                if rig.sigma_lo <= 0.0 {
                    return (global, 0.0);
                }
                let dz = (e[i] + rig.m1 + z[i].abs() * rig.d_sigma) / rig.sigma_lo;
                let fz = f32_err(z[i].abs() + dz, e_mu_r, rig.sigma_lo);
                if dz + fz > global {
                    (global, 0.0)
                } else {
                    (dz, fz)
                }
            };
            let c_max = 2.0 * sigma / (rig.sigma_lo + sigma);
            let rho_dz = if rig.sigma_lo <= 0.0 {
                f64::INFINITY
            } else {
                ((c_max * kappa - 1.0).max(1.0) * rig.rho
                    + z_norm * rig.rho * rig.rho / (n * (rig.sigma_lo + sigma)))
                    / rig.sigma_lo
            };
            // Probabilistic: the linear map J of the random and deterministic parts.
            let prob = pc.sigma_lo > 0.0;
            let s_dir = if prob {
                2.0 * pc.d_dot * pc.d_sigma / (n * sigma * sigma * pc.sigma_lo)
                    + pc.rho * pc.rho / (n * pc.sigma_lo * (pc.sigma_lo + sigma))
            } else {
                0.0
            };
            // Without ellipsoids (over the budget) the directed remainder joins the box.
            let s_box = if qin.is_none() { s_dir } else { 0.0 };
            let mean = |v: &[f64]| v.iter().sum::<f64>() / n;
            let zmean = |v: &[f64]| z.iter().zip(v).map(|(z, s)| z.abs() * s).sum::<f64>() / n;
            let (mean_sd, zsd, mean_det, zdet) = (mean(sd_in), zmean(sd_in), mean(det_in), zmean(det_in));
            let dg2: Vec<f64> = dg_in.iter().map(|x| x * x).collect();
            let (dg_a, dg_b, dg_c) = (
                dg2.iter().sum::<f64>(),
                z.iter().zip(&dg2).map(|(z, g)| z * g).sum::<f64>(),
                z.iter().zip(&dg2).map(|(z, g)| z * z * g).sum::<f64>(),
            );
            let dg_max = dg_in.iter().fold(0f64, |m, x| m.max(*x));
            let g_at = |i: usize| gamma.exact.map_or(1.0, |v| v[i]);
            let g_max =
                (0..d).map(|i| g_at(i).abs() + gamma.bound.map_or(0.0, |v| v[i])).fold(0f64, f64::max);
            let g_max_exact = (0..d).map(|i| g_at(i).abs()).fold(0f64, f64::max);
            let (mut fz_sq, mut dz_sq, mut other_sq, mut new_det_sq) = (0f64, 0f64, 0f64, 0f64);
            let mut cols: [Vec<f64>; 4] = std::array::from_fn(|_| Vec::with_capacity(d));
            let mut y_out = Vec::with_capacity(d);
            for i in 0..d {
                let (dz, fz) = dz_rig(i);
                dz_sq += dz * dz;
                fz_sq += fz * fz;
                let dz = dz + fz;
                let (g, gb) = (g_at(i), gamma.bound.map_or(0.0, |v| v[i]));
                let (b, bb) = (beta.exact.map_or(0.0, |v| v[i]), beta.bound.map_or(0.0, |v| v[i]));
                let y = z[i] * g + b;
                let f32_affine = 4.0 * u32r * ((z[i].abs() + dz) * (g.abs() + gb) + b.abs());
                let carried = g.abs() * dz + (z[i].abs() + dz) * gb + bb + f32_affine;
                let fresh = half_ulp(DType::F16, 0, y.abs() + carried);
                let other = (z[i].abs() + dz) * gb + bb + f32_affine + fresh;
                other_sq += other * other;
                let bd = carried + fresh;
                // Probabilistic branch of the same element.
                let (sd, dg, det) = if prob {
                    let row_i = (1.0 - 1.0 / n - z[i] * z[i] * (2.0 - kappa) / n).max(0.0).sqrt();
                    let sd_z =
                        ((sd_in[i] + mean_sd + z[i].abs() * zsd) / sigma).min(bounds.sv[r] * row_i / sigma);
                    let ci = (1.0 + z[i] * z[i]) / n;
                    let dg_j = ((dg2[i] * (1.0 - 2.0 * ci)
                        + (dg_a + 2.0 * z[i] * dg_b + z[i] * z[i] * dg_c) / (n * n))
                        .max(0.0))
                    .sqrt()
                        / sigma;
                    let det_lin = ((det_in[i] + mean_det + z[i].abs() * zdet) / sigma)
                        .min(bounds.dr[r] * row_i / sigma);
                    // The remainder: δ(1/σ̂ − 1/σ) (a box) and z·s (the direction z, |s| ≤ s_dir:
                    // an ellipsoid of rank one).
                    let rem = (comb[i] + pc.m1) * pc.d_sigma / (sigma * pc.sigma_lo) + z[i].abs() * s_box;
                    let dz_c = (comb[i] + pc.m1 + z[i].abs() * pc.d_sigma) / pc.sigma_lo;
                    let fz_c = f32_err(z[i].abs() + dz_c, e_mu_c, pc.sigma_lo);
                    let dzc = (dz_c + fz_c).min(dz);
                    let new_det = g.abs() * (rem + fz_c)
                        + (z[i].abs() + dzc) * gb
                        + bb
                        + 4.0 * u32r * ((z[i].abs() + dzc) * (g.abs() + gb) + b.abs());
                    new_det_sq += new_det * new_det;
                    let carried_c = g.abs() * dzc
                        + (z[i].abs() + dzc) * gb
                        + bb
                        + 4.0 * u32r * ((z[i].abs() + dzc) * (g.abs() + gb) + b.abs());
                    (
                        g.abs() * (sd_z + dg_j),
                        half_ulp(DType::F16, 0, y.abs() + carried_c),
                        g.abs() * det_lin + new_det,
                    )
                } else {
                    (0.0, 0.0, bd)
                };
                y_out.push(y);
                cols[0].push(bd);
                cols[1].push(sd);
                cols[2].push(dg);
                cols[3].push(det);
            }
            let dz_row = rho_dz.min(dz_sq.sqrt()) + fz_sq.sqrt();
            let rho = g_max * dz_row + other_sq.sqrt();
            let (sv, dr) = if prob {
                (
                    g_max_exact * (bounds.sv[r] + dg_max) / sigma,
                    g_max_exact * bounds.dr[r] / sigma + new_det_sq.sqrt(),
                )
            } else {
                (0.0, f64::NAN)
            };
            (y_out, cols, [rho, sv, dr], s_dir, prob)
        })
        .collect();
    let mut ys = Vec::with_capacity(ex.len());
    let mut el: [Vec<f64>; 4] = std::array::from_fn(|_| Vec::with_capacity(ex.len()));
    let mut rw: [Vec<f64>; 3] = std::array::from_fn(|_| Vec::with_capacity(rows));
    let (mut s_dirs, mut probs) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
    for (y, c, q, s_dir, prob) in out {
        s_dirs.push(s_dir);
        probs.push(prob);
        ys.extend(y);
        for (dst, src) in el.iter_mut().zip(c) {
            dst.extend(src);
        }
        for (dst, src) in rw.iter_mut().zip(q) {
            dst.push(src);
        }
    }
    let [b, sd, dg, det] = el;
    let [rho, sv, dr] = rw;
    // Per row, G·J·M·Jᵀ·G for the covariances (M = C + diag(dg²)) and the ellipsoids (M = Q, and
    // the remainder's rank-one (s·g∘z)(s·g∘z)ᵀ beside it); rows whose probabilistic branch fell
    // back to the rigorous bound carry neither.
    let g: Vec<f64> = (0..d).map(|i| gamma.exact.map_or(1.0, |v| v[i])).collect();
    let map_rows = |c: Option<super::cov::Cov>, rank_one: bool| {
        c.map(|mut c| {
            c.m.par_chunks_mut(d * d).zip(ex.par_chunks(d)).enumerate().for_each(|(r, (m, x))| {
                if !probs[r] {
                    m.iter_mut().for_each(|v| *v = 0.0);
                    return;
                }
                let n = d as f64;
                let mu = x.iter().sum::<f64>() / n;
                let var = x.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / n;
                let sigma = (var + eps as f64).sqrt();
                let z: Vec<f64> = x.iter().map(|v| (v - mu) / sigma).collect();
                let mut out = super::cov::layernorm_map(m, &z, sigma);
                for i in 0..d {
                    for j in 0..d {
                        out[i * d + j] *= g[i] * g[j];
                    }
                }
                if rank_one && s_dirs[r] > 0.0 {
                    let u: Vec<f64> = (0..d).map(|i| s_dirs[r] * g[i] * z[i]).collect();
                    let uu: Vec<f64> = (0..d * d).map(|e| u[e / d] * u[e % d]).collect();
                    out = super::cov::sum_unknown(&out, &uu, d);
                }
                m.copy_from_slice(&out);
            });
            c
        })
    };
    let cov = map_rows(cin, false);
    let q = map_rows(qin, true);
    let extra = 2 * probs.iter().filter(|p| **p).count() as u64;
    let mut out = super::bounds::Bounds::new(super::bounds::Parts { b, rho, sd, dg, sv, det, dr }, d)
        .with_cov(cov, d)
        .with_q(q);
    out.extra_events = extra;
    (ys, out)
}
