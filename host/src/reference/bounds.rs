//! The error bounds a tensor carries through the graph (docs/reliability.md "The verdict").
//!
//! Two branches, propagated side by side from the f64 values (never from the device-precision
//! values, so that a reference computing something else cannot widen them):
//!
//! - **rigorous**: per element `b` with `|device − f64| ≤ b` whatever the rounding errors are,
//!   and per row of the last axis `ρ ≥ ‖row error‖₂` (`rows.rs`);
//! - **probabilistic** (the model of Higham & Mary 2019): every rounding is a source `ε_s` with
//!   `|ε_s| ≤ c_s` (half an ulp of the value rounded), the `ε_s` independent and mean-zero. To
//!   first order an element's error is `Σ_s a_s·ε_s` with coefficients fixed by the exact values,
//!   plus terms bounded deterministically (`det`: the kernels' approximation errors, f32
//!   arithmetic, underflow, the second-order remainders). The random part is bounded by its
//!   coefficients' norm `√Σ (a_s c_s)²`, kept in two pieces: `dg` for sources no other element
//!   of the tensor depends on (added in quadrature by a later sum: they are independent), and
//!   `sd` for the others; per row, `sv ≥ √λ_max` of the second piece's covariance, and
//!   `dr ≥ ‖det‖₂`, which a linear map of the row cannot amplify beyond its norm. Hoeffding's
//!   inequality gives `|Σ_s a_s ε_s| ≤ λ·√(sd² + dg²)` with probability at least
//!   `1 − 2·exp(−λ²/2)`.
//!
//! The bound of an element is `min(b, λ·√(sd² + dg²) + det)`. Second-order remainders downstream
//! use these combined bounds, so for a whole run the statement is a union: every bound holds
//! with probability at least `1 − N·2·exp(−λ²/2)`, N the number of elements (outputs and
//! intermediates) whose bound came from the probabilistic branch ([`Bounds::events`]).

use super::cov::{self, Cov};
use super::rows;
use ipu_schema::DType;

/// λ of the probabilistic branch: `2·exp(−λ²/2) = 7.0·10⁻¹⁰ < 10⁻⁹` per element.
pub const LAMBDA: f64 = 6.6;

/// Half the spacing of a format's values at magnitude `x` (values stand for `code · 2^scale`):
/// the largest error of rounding any value of magnitude at most `x` to nearest (beyond the
/// largest finite value, the spacing of the top binade).
pub fn half_ulp(d: DType, scale: i8, x: f64) -> f64 {
    let (mant, emin, emax) = match d {
        DType::F32 => (23, -126, 127),
        DType::F16 => (10, -14, 15),
        DType::F8E4M3 => (3, -7, 7),
        DType::F8E5M2 => (2, -15, 15),
    };
    let xs = x.abs() * 2f64.powi(-(scale as i32));
    let e = if xs > 0.0 && xs.is_finite() {
        xs.log2().floor() as i32
    } else if xs.is_finite() {
        emin
    } else {
        emax
    };
    // log2 of a value just under a power of two can round up: the spacing below it is then the
    // one of the lower binade, which is smaller, so taking the upper one stays an upper bound.
    let e = e.clamp(emin, emax);
    2f64.powi(e - mant - 1 + scale as i32)
}

/// Error bounds of one tensor.
#[derive(Clone, Debug, Default)]
pub struct Bounds {
    /// Rigorous, per element.
    pub b: Vec<f64>,
    /// Rigorous, per row: a bound on the Euclidean norm of the row's errors.
    pub rho: Vec<f64>,
    /// Probabilistic, per element: the random part from sources other elements share.
    pub sd: Vec<f64>,
    /// Probabilistic, per element: the random part from sources only this element has.
    pub dg: Vec<f64>,
    /// Probabilistic, per row: `√λ_max` of the covariance of the `sd` part.
    pub sv: Vec<f64>,
    /// Probabilistic, per element: the deterministic part.
    pub det: Vec<f64>,
    /// Probabilistic, per row: the Euclidean norm of the deterministic parts.
    pub dr: Vec<f64>,
    /// Per element, the bound used: `min(b, λ·√(sd² + dg²) + det)`.
    pub comb: Vec<f64>,
    /// Where kept, the covariance matrices of the `sd` part (`cov.rs`); `sd` and `sv` are
    /// then never above what they give.
    pub cov: Option<Cov>,
    /// Where kept, the deterministic part that has a direction: per row an ellipsoid
    /// `{Q^½·v : ‖v‖ ≤ 1}` (shape matrices `Q`, in the layout of `cov`) holding it; `det` and
    /// `dr` are then the rest (a box), and an element's deterministic bound is
    /// `det + √Q_ee`. Linear maps move an ellipsoid exactly, where a box would grow.
    pub q: Option<Cov>,
    /// Probabilistic statements used beside the elements' own (per row, in layer norms).
    pub extra_events: u64,
}

/// Per-element parts of [`Bounds`] (row parts computed by [`Bounds::new`]'s caller).
pub struct Parts {
    pub b: Vec<f64>,
    pub rho: Vec<f64>,
    pub sd: Vec<f64>,
    pub dg: Vec<f64>,
    pub sv: Vec<f64>,
    pub det: Vec<f64>,
    pub dr: Vec<f64>,
}

impl Bounds {
    /// The bounds of exact values (inputs and params).
    pub fn exact(len: usize, d: usize) -> Bounds {
        let rows = rows::count(len, d);
        Bounds {
            b: vec![0.0; len],
            rho: vec![0.0; rows],
            sd: vec![0.0; len],
            dg: vec![0.0; len],
            sv: vec![0.0; rows],
            det: vec![0.0; len],
            dr: vec![0.0; rows],
            comb: vec![0.0; len],
            cov: None,
            q: None,
            extra_events: 0,
        }
    }

    /// Bounds from their parts: row bounds never above what the elements give (`√Σ b²`,
    /// `√Σ sd²` — the trace bounds the largest eigenvalue —, `√Σ det²`), NaN row bounds
    /// (unknown) replaced by those, and the combined bound.
    pub fn new(p: Parts, d: usize) -> Bounds {
        let rho = rows::clamp(p.rho, &p.b, d);
        let sv = rows::clamp(p.sv, &p.sd, d);
        let dr = rows::clamp(p.dr, &p.det, d);
        let mut out = Bounds {
            comb: p.b.clone(),
            b: p.b,
            rho,
            sd: p.sd,
            dg: p.dg,
            sv,
            det: p.det,
            dr,
            cov: None,
            q: None,
            extra_events: 0,
        };
        out.recombine();
        out
    }

    /// The deterministic bound of each element: the box part plus the ellipsoid's extent.
    pub fn det_total(&self) -> Vec<f64> {
        match &self.q {
            Some(q) => self
                .det
                .iter()
                .zip(q.variances(self.det.len()))
                .map(|(d, v)| d + v.sqrt() * (1.0 + 1e-9))
                .collect(),
            None => self.det.clone(),
        }
    }

    /// Recomputes the combined bound `min(b, λ·√(sd² + dg²) + det_total)`.
    fn recombine(&mut self) {
        let det = self.det_total();
        for (e, c) in self.comb.iter_mut().enumerate() {
            let q = LAMBDA * self.sd[e].hypot(self.dg[e]) + det[e];
            *c = if q < self.b[e] { q } else { self.b[e] };
        }
    }

    /// These bounds with the covariances of their shared random part: `sd` and `sv` tightened to
    /// what the covariances give, and the combined bound recomputed.
    pub fn with_cov(mut self, c: Option<Cov>, d: usize) -> Bounds {
        let Some(c) = c else { return self };
        for (s, v) in self.sd.iter_mut().zip(c.variances(self.b.len())) {
            *s = s.min(v.sqrt() * (1.0 + 1e-9));
        }
        if c.rows && c.d == d {
            for (s, v) in self.sv.iter_mut().zip(c.sqrt_lambda_max()) {
                *s = s.min(v);
            }
        }
        self.sv = rows::clamp(std::mem::take(&mut self.sv), &self.sd, d);
        self.cov = Some(c);
        self.recombine();
        self
    }

    /// These bounds with an ellipsoid for the directed deterministic part (`det`, `dr` being
    /// the rest).
    pub fn with_q(mut self, q: Option<Cov>) -> Bounds {
        self.q = q;
        self.recombine();
        self
    }

    /// The same bounds with the ellipsoid folded into the box (`det + √Q_ee`, and the row norms
    /// by `√λ_max`), for an op that cannot move it.
    pub fn folded(&self) -> Bounds {
        let Some(q) = &self.q else { return self.clone() };
        let mut out = self.clone();
        out.det = self.det_total();
        if q.rows && q.vectors() == out.dr.len() {
            for (r, v) in out.dr.iter_mut().zip(q.sqrt_lambda_max()) {
                *r += v;
            }
        } else {
            out.dr.iter_mut().for_each(|r| *r = f64::NAN);
        }
        let d = out.b.len() / out.dr.len().max(1);
        out.dr = rows::clamp(std::mem::take(&mut out.dr), &out.det, d);
        out.q = None;
        out
    }

    /// The ellipsoids as row vectors of length `d`: the kept ones, or zero ones where there are
    /// none; `None` where they are kept in another layout (or over the budget).
    pub fn row_q(&self, d: usize) -> Option<Cov> {
        match &self.q {
            Some(c) if c.rows && c.d == d => Some(c.clone()),
            Some(_) => None,
            None if cov::fits(self.b.len(), d) => Some(Cov::zero_rows(self.b.len(), d)),
            None => None,
        }
    }

    /// The covariances of the shared part as row vectors of length `d`: the kept ones, or zero
    /// ones where the shared part is zero; `None` where neither (or over the budget).
    pub fn row_cov(&self, d: usize) -> Option<Cov> {
        match &self.cov {
            Some(c) if c.rows && c.d == d => Some(c.clone()),
            Some(_) => None,
            None if self.sd.iter().all(|x| *x == 0.0) && cov::fits(self.b.len(), d) => {
                Some(Cov::zero_rows(self.b.len(), d))
            }
            None => None,
        }
    }

    /// Elements whose combined bound came from the probabilistic branch.
    pub fn events(&self) -> u64 {
        self.b.iter().zip(&self.comb).filter(|(b, c)| c < b).count() as u64 + self.extra_events
    }

    /// Whether the tensor carries any error at all.
    pub fn is_exact(&self) -> bool {
        self.b.iter().all(|x| *x == 0.0)
    }

    /// The bounds of a view: element `o` is input element `from[o]` (`from` empty: the same
    /// element); row bounds as [`rows::view`] derives them. A view moves elements one to one,
    /// so a source only one element had still has one.
    pub fn view(&self, from: &[usize], d_in: usize, d_out: usize) -> Bounds {
        let len = if from.is_empty() { self.b.len() } else { from.len() };
        let q = self.q.as_ref().map(|q| view_cov(q, from, d_in, d_out, len));
        if let Some(None) = q {
            return self.folded().view(from, d_in, d_out);
        }
        let pick =
            |v: &[f64]| if from.is_empty() { v.to_vec() } else { from.iter().map(|&i| v[i]).collect() };
        let (b, sd, dg, det, comb) =
            (pick(&self.b), pick(&self.sd), pick(&self.dg), pick(&self.det), pick(&self.comb));
        let rho = rows::view(from, d_in, d_out, &self.rho, &b);
        let sv = rows::view(from, d_in, d_out, &self.sv, &sd);
        let dr = rows::view(from, d_in, d_out, &self.dr, &det);
        let cov = self.cov.as_ref().and_then(|c| view_cov(c, from, d_in, d_out, b.len()));
        Bounds { b, rho, sd, dg, sv, det, dr, comb, cov, q: q.flatten(), extra_events: 0 }
    }

    /// Per row, the largest `dg`: `√λ_max` of the (diagonal) covariance of the `dg` part.
    pub fn dg_max(&self, d: usize) -> Vec<f64> {
        self.dg.chunks(d.max(1)).map(|r| r.iter().fold(0f64, |m, x| m.max(*x))).collect()
    }
}

/// What an elementwise op does to one element's error.
#[derive(Clone, Copy, Debug, Default)]
pub struct Elem {
    /// `|f'(x)|` at the exact input.
    pub slope: f64,
    /// `sup |f'|` over `[x − b, x + b]` (rigorous; infinite when unknown).
    pub slope_r: f64,
    /// Rigorous: the input's error carried through f.
    pub carried: f64,
    /// Rigorous: the op's own errors (formula, f32 arithmetic, output rounding, underflow).
    pub fresh: f64,
    /// Probabilistic: the op's own random error (its output rounding).
    pub rand: f64,
    /// Probabilistic: the op's deterministic errors and the second-order remainder.
    pub det: f64,
}

/// `a·b` with `0·∞ = 0` (a zero slope removes an unknown error's first-order part).
pub fn smul(a: f64, b: f64) -> f64 {
    if a == 0.0 || b == 0.0 {
        0.0
    } else {
        a * b
    }
}

/// The bounds after an elementwise op on `input` (rows of `d`).
pub fn elementwise(input: &Bounds, parts: &[Elem], d: usize) -> Bounds {
    let n = parts.len();
    let b: Vec<f64> = parts.iter().map(|p| p.carried + p.fresh).collect();
    let sd: Vec<f64> = (0..n).map(|e| smul(parts[e].slope, input.sd[e])).collect();
    let dg: Vec<f64> = (0..n).map(|e| smul(parts[e].slope, input.dg[e]).hypot(parts[e].rand)).collect();
    let det: Vec<f64> = (0..n).map(|e| smul(parts[e].slope, input.det[e]) + parts[e].det).collect();
    let mut rho = Vec::with_capacity(input.rho.len());
    let mut sv = Vec::with_capacity(input.rho.len());
    let mut dr = Vec::with_capacity(input.rho.len());
    for (r, row) in parts.chunks(d.max(1)).enumerate() {
        let slope_r = row.iter().fold(0f64, |m, p| m.max(p.slope_r));
        let fresh = row.iter().map(|p| p.fresh * p.fresh).sum::<f64>().sqrt();
        rho.push(smul(slope_r, input.rho[r]) + fresh);
        let slope = row.iter().fold(0f64, |m, p| m.max(p.slope));
        sv.push(smul(slope, input.sv[r]));
        dr.push(smul(slope, input.dr[r]) + row.iter().map(|p| p.det * p.det).sum::<f64>().sqrt());
    }
    let slopes: Vec<f64> = parts.iter().map(|p| p.slope).collect();
    let c = input.cov.as_ref().map(|c| c.scaled(&slopes));
    let q = input.q.as_ref().map(|q| q.scaled(&slopes));
    Bounds::new(Parts { b, rho, sd, dg, sv, det, dr }, d).with_cov(c, d).with_q(q)
}

/// The covariances of a view's row vectors: an output row inside one input row takes the
/// sub-matrix of its positions; one made of whole input rows (a merge) the block-diagonal bound
/// of their sum with unknown cross-covariances (`C ≼ ⊕ c_g·C_g`, `Σ 1/c_g = 1`,
/// `c_g = Σ_h √tr C_h / √tr C_g`). Column vectors and anything else: not kept.
fn view_cov(c: &Cov, from: &[usize], d_in: usize, d_out: usize, len: usize) -> Option<Cov> {
    if !c.rows || d_out == 0 || !cov::fits(len, d_out) {
        return None;
    }
    let src = |o: usize| if from.is_empty() { o } else { from[o] };
    let rows = len / d_out;
    let mut m = vec![0f64; rows * d_out * d_out];
    for r in 0..rows {
        let first = src(r * d_out) / d_in;
        let out = &mut m[r * d_out * d_out..(r + 1) * d_out * d_out];
        if (0..d_out).all(|q| src(r * d_out + q) / d_in == first) {
            let pos: Vec<usize> = (0..d_out).map(|q| src(r * d_out + q) % d_in).collect();
            let cm = c.mat(first);
            for i in 0..d_out {
                for j in 0..d_out {
                    out[i * d_out + j] = cm[pos[i] * d_in + pos[j]];
                }
            }
        } else if d_out.is_multiple_of(d_in)
            && (0..d_out / d_in).all(|g| {
                let row = src(r * d_out + g * d_in) / d_in;
                (0..d_in).all(|q| src(r * d_out + g * d_in + q) == row * d_in + q)
            })
        {
            let groups: Vec<usize> = (0..d_out / d_in).map(|g| src(r * d_out + g * d_in) / d_in).collect();
            let tr = |v: usize| (0..d_in).map(|i| c.mat(v)[i * d_in + i].max(0.0)).sum::<f64>().sqrt();
            let total: f64 = groups.iter().map(|&v| tr(v)).sum();
            for (g, &v) in groups.iter().enumerate() {
                let t = tr(v);
                if t == 0.0 {
                    continue;
                }
                let w = total / t;
                let cm = c.mat(v);
                for i in 0..d_in {
                    for j in 0..d_in {
                        out[(g * d_in + i) * d_out + g * d_in + j] = w * cm[i * d_in + j];
                    }
                }
            }
        } else {
            return None;
        }
    }
    Some(Cov { rows: true, d: d_out, last: d_out, m })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_ulp_is_the_rounding_error_bound_of_each_format() {
        // f16: 1 ≤ x < 2 has spacing 2⁻¹⁰; subnormals 2⁻²⁴; 65504 is in the top binade.
        assert_eq!(half_ulp(DType::F16, 0, 1.0), 2f64.powi(-11));
        assert_eq!(half_ulp(DType::F16, 0, 1.999), 2f64.powi(-11));
        assert_eq!(half_ulp(DType::F16, 0, 2.0), 2f64.powi(-10));
        assert_eq!(half_ulp(DType::F16, 0, 1e-7), 2f64.powi(-25));
        assert_eq!(half_ulp(DType::F16, 0, 0.0), 2f64.powi(-25));
        assert_eq!(half_ulp(DType::F16, 0, 65504.0), 16.0);
        // E4M3 (3 mantissa bits, bias 8): spacing 2⁻³ on [1, 2), subnormal spacing 2⁻¹⁰; a scale
        // moves the grid.
        assert_eq!(half_ulp(DType::F8E4M3, 0, 1.5), 2f64.powi(-4));
        assert_eq!(half_ulp(DType::F8E4M3, 0, 1e-5), 2f64.powi(-11));
        assert_eq!(half_ulp(DType::F8E4M3, -3, 1.5 / 8.0), 2f64.powi(-7));
        assert_eq!(half_ulp(DType::F8E5M2, 0, 3.0), 2f64.powi(-2));
        assert_eq!(half_ulp(DType::F32, 0, 1.0), 2f64.powi(-24));
        // Against the real roundings: every f16 rounding error of an f32 value is within it.
        let mut x = 0x2545_F491u32;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let v = f32::from_bits(x & 0x47ff_ffff);
            let r = half::f16::from_f32(v).to_f32();
            if r.is_finite() {
                assert!(((r - v) as f64).abs() <= half_ulp(DType::F16, 0, v as f64), "{v}");
            }
        }
    }
}
