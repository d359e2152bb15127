//! The probabilistic branch of the f64 bound (docs/reliability.md "The f64 bound").
//!
//! Why a second branch: the rigorous bound (`mod.rs`, per element, worst case over every
//! rounding) adds `n·u` per sum of n terms and `Σ|w|·δ` per matmul with signed weights, so
//! through a model of a few layers it grows 10³–10⁵ times past the error it bounds. Rounding
//! errors do not line up like that; Higham & Mary (2019) model them as random.
//!
//! **The model.** (M1, Higham & Mary's) every rounding `ε_s` of the device — f16/FP8/f32
//! partial sums, casts, kernel outputs — is mean-zero given the earlier ones and `|ε_s| ≤ c_s`
//! (half an ulp of the value rounded, [`half_ulp`]). (M2, ours) the first-order errors of
//! distinct elements that one contraction combines (a matmul's row·column, a layer norm's row
//! statistics, a softmax's row) are uncorrelated, so their variances add; where correlation
//! is plausible by construction — the two operands of an add, sub or mul, the two sides of a
//! matmul of a tensor with itself — scales add instead (Minkowski, true for any correlation).
//!
//! Each tensor carries, per element, `s`: a bound on the standard deviation (sub-Gaussian scale)
//! of the random first-order part of its error, and `d`: a bound on the rest (the kernels'
//! approximation errors and the second-order remainders, evaluated at the probabilistic
//! magnitudes `λs + d` of the inputs, or for the softmax's exponential at their Gaussian mean,
//! model M3 in [`softmax`]). The bound is `λ·s + d` with λ = [`LAMBDA`]: by the
//! Azuma–Hoeffding inequality a sum of martingale differences with scale s exceeds λs with
//! probability at most `2·exp(−λ²/2) = 7·10⁻¹⁰`. Everything is a function of the f64 values:
//! the device-precision values are never read, so a reference that computed something else
//! cannot widen the bound.

use ipu_core::graph::{BinaryOp, GeluForm, MapFn};
use ipu_schema::DType;
use rayon::prelude::*;

/// λ of the probabilistic branch: `2·exp(−λ²/2) = 7.0·10⁻¹⁰ < 10⁻⁹` per element.
pub const LAMBDA: f64 = 6.6;

/// f32 unit roundoff.
const U32: f64 = 1.0 / 16_777_216.0;

/// Half the spacing of a format's values at magnitude `x` (values stand for `code · 2^scale`):
/// the largest error of rounding any value of magnitude at most `x` to nearest (subnormal
/// spacing below the smallest normal; beyond the largest finite value, the top binade's).
#[inline]
pub fn half_ulp(d: DType, scale: i8, x: f64) -> f64 {
    let (mant, emin, emax) = match d {
        DType::F32 => (23, -126, 127),
        DType::F16 => (10, -14, 15),
        DType::F8E4M3 => (3, -7, 7),
        DType::F8E5M2 => (2, -15, 15),
    };
    // The binade of |x|·2^-scale from the f64 exponent field (exact: no log2 rounding; f64
    // subnormals and zero fall below emin, infinity and NaN above emax).
    let field = ((x.to_bits() >> 52) & 0x7ff) as i32;
    let e = (field - 1023 - scale as i32).clamp(emin, emax);
    f64::from_bits(((e - mant - 1 + scale as i32 + 1023) as u64) << 52)
}

/// Per element of one tensor: the random part's scale `s` and the deterministic part `d`.
#[derive(Clone, Debug, Default)]
pub struct Prob {
    /// Scale (standard deviation bound) of the random first-order part.
    pub s: Vec<f64>,
    /// Bound on the rest.
    pub d: Vec<f64>,
}

impl Prob {
    /// Exact values (inputs, params).
    pub fn exact(len: usize) -> Prob {
        Prob { s: vec![0.0; len], d: vec![0.0; len] }
    }

    /// Whether no element carries an error (lets a matmul skip the products of errors).
    pub fn is_exact(&self) -> bool {
        self.s.iter().chain(&self.d).all(|v| *v == 0.0)
    }

    /// The probabilistic magnitude of element `e`'s error: `λs + d`.
    #[inline]
    pub fn mag(&self, e: usize) -> f64 {
        LAMBDA * self.s[e] + self.d[e]
    }

    /// The elements `from` (views: reshape, slice, transpose).
    pub fn pick(&self, from: &[usize]) -> Prob {
        Prob { s: from.iter().map(|&i| self.s[i]).collect(), d: from.iter().map(|&i| self.d[i]).collect() }
    }
}

/// One element `y` (f64) carrying `(s, d)` rounded to `dt` at `scale`: a new independent source.
#[inline]
pub fn rounded(y: f64, s: f64, d: f64, dt: DType, scale: i8) -> (f64, f64) {
    let c = half_ulp(dt, scale, y.abs() + LAMBDA * s + d);
    ((s * s + c * c).sqrt(), d)
}

/// The rounding of every element (a cast to a narrower format, an f16 output of f32 sums).
pub fn round_all(p: &Prob, ex: &[f64], dt: DType, scale: i8) -> Prob {
    let (s, d) = (0..ex.len()).map(|e| rounded(ex[e], p.s[e], p.d[e], dt, scale)).unzip();
    Prob { s, d }
}

/// `alpha·a` as `scale_f16` computes it (f32 product, then f16): the f32 rounding is tiny and
/// counted deterministically, the f16 one is a source.
pub fn scaled(p: &Prob, ex_scaled: &[f64], alpha: f64) -> Prob {
    let al = alpha.abs();
    let (s, d) = (0..ex_scaled.len())
        .map(|e| {
            let (s, d) = (al * p.s[e], al * p.d[e]);
            let d = d + half_ulp(DType::F32, 0, ex_scaled[e].abs() + LAMBDA * s + d);
            rounded(ex_scaled[e], s, d, DType::F16, 0)
        })
        .unzip();
    Prob { s, d }
}

/// GeLU's derivative at x (the tanh form's own, or `Φ(x) + xφ(x)` for the erf form).
fn gelu_slope(form: GeluForm, x: f64) -> f64 {
    match form {
        GeluForm::Tanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let t = (c * (x + 0.044715 * x * x * x)).tanh();
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x)
        }
        GeluForm::Erf => {
            let phi = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
            0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)) + x * phi
        }
        GeluForm::Sigmoid => {
            // σ(u) + u·σ(u)(1 − σ(u)), u = 1.702x.
            let u = 1.702 * x;
            let s = 1.0 / (1.0 + (-u).exp());
            s + u * s * (1.0 - s)
        }
    }
}

/// The f32 formula's own error of a GeLU form at magnitude `m` (|x| plus its carried error),
/// before the final f16 rounding. Tanh: ~40 ulps of 1 in t (exp, divide, the constants) times
/// 0.5|x|, kept at 64. Erf: A&S 7.1.26's 1.5e−7 in erf (0.75e−7 in Φ) plus ~40 f32 ulps of 1 in
/// Φ, times |x|. Sigmoid (`x/(e^{−1.702x} + 1)`): the rounding of 1.702 and of the product u
/// change e^{−u} by 2|u| ulps, exp by ≤ 2 more; through `1 + e` this moves y relatively by
/// (1 − σ)(2|u| + 2) ulps: |y|·(1 − σ)(2|u| + 2) = |x|·σ(1 − σ)(2|u| + 2) ≤ 0.95|x| ulps (σ(1 − σ)|u|
/// ≤ 0.224), and with the add and the divide (1 ulp of |y| ≤ |x| each) below 4 ulps of |x|.
pub fn gelu_formula(form: GeluForm, m: f64) -> f64 {
    match form {
        GeluForm::Tanh => 0.5 * m * 64.0 * U32,
        GeluForm::Erf => m * (0.75e-7 + 40.0 * U32),
        GeluForm::Sigmoid => m * 4.0 * U32,
    }
}

/// GeLU: the slope at the exact x carries the random part; the remainder `≤ ½·0.8·Δx²`
/// (sup|g''| ≤ 0.8 for the tanh and erf forms, ≤ 0.86 for the quick GeLU) at its Gaussian mean and fluctuation (model M3), never
/// above `min(0.4m², (1.13 + |g'|)·m)` at the probabilistic magnitude m (sup|g'| ≤ 1.13); the
/// formula's f32 error and one f16 rounding.
pub fn gelu(form: GeluForm, p: &Prob, ein: &[f64], ex: &[f64]) -> Prob {
    let (s, d) = (0..ex.len())
        .into_par_iter()
        .map(|e| {
            let (x, y) = (ein[e], ex[e]);
            let g1 = gelu_slope(form, x).abs();
            let (m, se, de) = (p.mag(e), p.s[e], p.d[e]);
            // The remainder ≤ 0.4Δ²: with the first-order error Gaussian (model M3) its mean
            // 0.4(s² + 2λsd + d²) and its fluctuation 0.4·√2·s² (random); never above the
            // worst case at the probabilistic magnitude.
            // Half of sup|g''|: 0.8 for the tanh and erf forms, 1.702·0.5 for the quick GeLU.
            let h = if form == GeluForm::Sigmoid { 0.43 } else { 0.4 };
            let (rem_d, rem_s) =
                (h * (se * se + de * (2.0 * LAMBDA * se + de)), h * std::f64::consts::SQRT_2 * se * se);
            let worst = (h * m * m).min((1.13 + g1) * m);
            let (rem_d, rem_s) = if rem_d + LAMBDA * rem_s < worst { (rem_d, rem_s) } else { (worst, 0.0) };
            let formula = gelu_formula(form, x.abs() + m) + 8.0 * U32 * y.abs();
            rounded(y, (g1 * se).hypot(rem_s), g1 * de + rem_d + formula, DType::F16, 0)
        })
        .unzip();
    Prob { s, d }
}

/// A map function: the slope at x carries the random part; the remainder over `[x − m, x + m]`
/// (`map::remainder`, infinite where that leaves the domain), the formula's error and one f16
/// rounding are the rest.
pub fn map(func: MapFn, exponent: f32, p: &Prob, ein: &[f64], ex: &[f64]) -> Prob {
    let (s, d) = (0..ex.len())
        .into_par_iter()
        .map(|e| {
            let (x, y) = (ein[e], ex[e]);
            if p.s[e] == 0.0 && p.d[e] == 0.0 {
                // An exact input: only the formula and the output rounding.
                return rounded(y, 0.0, super::map::formula_error(func, exponent, x, y), DType::F16, 0);
            }
            let g1 = super::map::slope(func, exponent, x).abs();
            let rem = super::map::remainder(func, exponent, x, p.mag(e));
            let d = g1 * p.d[e] + rem + super::map::formula_error(func, exponent, x, y);
            rounded(y, g1 * p.s[e], d, DType::F16, 0)
        })
        .unzip();
    Prob { s, d }
}

/// add, sub, mul (f32, one f16 rounding) of broadcast operands (`ia`, `ib`: each output
/// element's operand indices). The operands' errors may be correlated (a residual adds a tensor
/// to a function of itself), so their scales add: `s_p + s_q`, `|q|s_p + |p|s_q`; the product's
/// `Δp·Δq` is second order.
#[allow(clippy::too_many_arguments)]
pub fn binary(
    op: BinaryOp,
    (pa, ea): (&Prob, &[f64]),
    (pb, eb): (&Prob, &[f64]),
    ia: &[usize],
    ib: &[usize],
    ex: &[f64],
) -> Prob {
    let (s, d) = (0..ex.len())
        .into_par_iter()
        .map(|i| {
            let (x, y) = (ia[i], ib[i]);
            let (s, d) = match op {
                BinaryOp::Add | BinaryOp::Sub => (pa.s[x] + pb.s[y], pa.d[x] + pb.d[y]),
                BinaryOp::Mul => {
                    let (p, q) = (ea[x].abs(), eb[y].abs());
                    (q * pa.s[x] + p * pb.s[y], q * pa.d[x] + p * pb.d[y] + pa.mag(x) * pb.mag(y))
                }
            };
            let d = d + half_ulp(DType::F32, 0, ex[i].abs() + LAMBDA * s + d);
            rounded(ex[i], s, d, DType::F16, 0)
        })
        .unzip();
    Prob { s, d }
}

/// `e^t − 1 − t` of a Gaussian t of standard deviation σ (model M3 below): its mean
/// `e^{σ²/2} − 1` and its variance `E r² − (E r)²`, `E r² = e^{2σ²} − 2(1 + σ²)e^{σ²/2} + 1 + σ²`.
fn second_moments(sig: f64) -> (f64, f64) {
    let v = sig * sig;
    if v < 1e-2 {
        // Where σ is small (the closed form cancels, and exp is the cost of a whole softmax):
        // the series, each truncated above (E r² = ¾v² + 1.0417v³ + 0.62v⁴ + …).
        let mean = v * (0.5 + v * (0.125 + v * (1.0 / 48.0 + v / 300.0)));
        let er2 = v * v * (0.75 + v * (1.05 + v));
        return (mean, (er2 - mean * mean).max(0.0));
    }
    let mean = (0.5 * v).exp_m1();
    let er2 = (2.0 * v).exp() - 2.0 * (1.0 + v) * (0.5 * v).exp() + 1.0 + v;
    (mean, (er2 - mean * mean).max(0.0))
}

/// `e^x` and `e^x − 1`, never below the true values: their second-order series where
/// `|x| < 10⁻³` (cheap: a softmax calls them per element), libm's otherwise.
#[inline]
fn exp_up(x: f64) -> (f64, f64) {
    if x.abs() < 1e-3 {
        let m1 = x + 0.5005 * x * x;
        (1.0 + m1, m1)
    } else {
        (x.exp(), x.exp_m1())
    }
}

/// Softmax of rows of `n` (`p`: the f64 probabilities). Exactly `p̂_j = p_j·e^{φ_j}` with
/// `φ_j = Δx_j − ln Σ_l p_l e^{Δx_l}`. First order `φ_j = (1 − p_j)Δx_j − Σ_{l≠j} p_l Δx_l`,
/// of scale `σ_j = √((1 − p_j)²s_j² + Σ_{l≠j} p_l²s_l²)` (model M2: the row's elements
/// uncorrelated). The exponential's second order `r(t) = e^t − 1 − t ≥ 0` is where a bound at
/// λ² times the variance would swamp everything downstream (every later matmul adds it up with
/// one sign); with the first-order errors Gaussian (model M3: sums of many roundings) its mean
/// is `e^{σ²/2} − 1` and its fluctuation random ([`second_moments`]): `p̂_j − p_j =
/// p_j(e^δ(φ_lin + r(φ_lin)) + e^δ − 1)`, δ the deterministic parts (Minkowski) plus
/// `ln Σ p e^{Δx} − Σ pΔx ∈ [0, Σ p r(Δx)]`. Then the kernel's f32 arithmetic `γ(n + 5)` and
/// one rounding to `out`.
pub fn softmax(pin: &Prob, p: &[f64], n: usize, out: DType) -> Prob {
    let f32_rel = super::gamma(n as u64 + 5, U32);
    let mut s = vec![0f64; p.len()];
    let mut d = vec![0f64; p.len()];
    s.par_chunks_mut(n).zip(d.par_chunks_mut(n)).zip(p.par_chunks(n)).enumerate().for_each(
        |(r, ((so, dso), prow))| {
            let base = r * n;
            let (mut s2bar, mut dbar, mut lmean, mut lvar) = (0f64, 0f64, 0f64, 0f64);
            for (j, pj) in prow.iter().enumerate() {
                let (sj, dj) = (pin.s[base + j], pin.d[base + j]);
                s2bar += pj * pj * sj * sj;
                dbar += pj * dj;
                let (mr, vr) = second_moments(sj);
                let (e1, em1) = exp_up(dj);
                lmean += pj * (mr * e1 + (em1 - dj));
                lvar += pj * pj * vr * e1 * e1;
            }
            // ln Σ p e^{Δx} − Σ pΔx ≤ Σ p r(Δx): its mean plus λ standard deviations.
            let ell = lmean + LAMBDA * lvar.sqrt();
            for (j, pj) in prow.iter().enumerate() {
                let (sj, dj) = (pin.s[base + j], pin.d[base + j]);
                let sig = ((1.0 - pj).powi(2) * sj * sj + (s2bar - pj * pj * sj * sj).max(0.0)).sqrt();
                let del = (1.0 - pj) * dj + (dbar - pj * dj).max(0.0) + ell;
                let (mr, vr) = second_moments(sig);
                let (g, gm1) = exp_up(del);
                let sd = pj * g * (sig * sig + vr).sqrt();
                let dd = pj * (g * mr + gm1) + pj * f32_rel * exp_up(LAMBDA * sig).0 * g;
                // Beyond what this bounds (or not finite: e^{2v} overflows), the fact that both
                // probabilities are in [0, 1], as a deterministic part.
                let cap = pj.max(1.0 - pj);
                let (sd, dd) = if LAMBDA * sd + dd <= cap { (sd, dd) } else { (0.0, cap) };
                let (a, b) = rounded(*pj, sd, dd, out, 0);
                so[j] = a;
                dso[j] = b;
            }
        },
    );
    Prob { s, d }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_ulp_is_the_rounding_error_bound_of_each_format() {
        // f16: 1.0 has spacing 2^-10; 1.5 the same binade; 2^-20 is subnormal (spacing 2^-24).
        assert_eq!(half_ulp(DType::F16, 0, 1.0), 2f64.powi(-11));
        assert_eq!(half_ulp(DType::F16, 0, 1.999), 2f64.powi(-11));
        assert_eq!(half_ulp(DType::F16, 0, 2f64.powi(-20)), 2f64.powi(-25));
        // E4M3 at scale 2: values code·4, 3 mantissa bits.
        assert_eq!(half_ulp(DType::F8E4M3, 2, 4.0), 4.0 * 2f64.powi(-4));
        assert_eq!(half_ulp(DType::F32, 0, 0.0), 2f64.powi(-150));
        // Every f16 value's rounding error is within it (a sweep of magnitudes).
        for i in 1..2000 {
            let x = i as f64 * 0.0371;
            let r = half::f16::from_f64(x).to_f64();
            assert!((r - x).abs() <= half_ulp(DType::F16, 0, x), "{x}");
        }
    }

    #[test]
    fn softmax_of_exact_rows_is_one_rounding() {
        let p = [0.25, 0.75];
        let out = softmax(&Prob::exact(2), &p, 2, DType::F16);
        assert_eq!(out.s[0], half_ulp(DType::F16, 0, 0.25));
        assert!(out.d[1] > 0.0 && out.d[1] < 1e-6);
    }
}
