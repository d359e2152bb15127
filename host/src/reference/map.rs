//! The elementwise functions of `OpKind::Map` in the reference: each function as the kernel
//! computes it (the f32 operations of docs/kernels.md `map_f16` in the kernel's order, libm's
//! `expf`, `logf` and `sqrtf` as the simulator's `f32exp`, `f32ln` and `f32sqrt`), its f64
//! definition, and the bound on the distance between the two.

use ipu_core::graph::MapFn;
use ipu_core::plan::map::ERF_CONSTANTS;
use ipu_schema::DType;

use super::{round, underflow_error, unit_roundoff};

/// `f(h)` as `map_f16` computes it, rounded once to f16.
pub fn device(func: MapFn, exponent: f32, h: f32) -> f32 {
    let x = h;
    let y = match func {
        MapFn::Tanh => 1.0 - 2.0 / (libm::expf(x + x) + 1.0),
        // The kernel multiplies by −1: the same bits as negating.
        MapFn::Sigmoid => 1.0 / (libm::expf(-x) + 1.0),
        MapFn::Exp => libm::expf(x),
        MapFn::Log => libm::logf(x),
        MapFn::Sqrt => libm::sqrtf(x),
        MapFn::Reciprocal => 1.0 / x,
        MapFn::Abs => libm::sqrtf(x * x),
        MapFn::Erf => {
            let [p, one, minus_one, a5, a4, a3, a2, a1, floor] = ERF_CONSTANTS;
            let sq = x * x;
            let ab = libm::sqrtf(sq);
            let t = one / (ab * p + one);
            let sign = x / ab.max(floor);
            let e = libm::expf(sq * minus_one);
            let q = ((((((((t * a5) + a4) * t) + a3) * t) + a2) * t) + a1) * t;
            sign * (one - q * e)
        }
        MapFn::Pow => libm::expf(libm::logf(x) * exponent),
        // `f32max` as the simulator computes it (maxNum).
        MapFn::Max => x.max(exponent),
        // The kernel multiplies by −1: the same bits as negating.
        MapFn::Min => -((-x).max(-exponent)),
        MapFn::LeakyRelu => x.max(x * exponent),
    };
    round(y, DType::F16)
}

/// `f(x)` in f64 from the definition.
pub fn exact(func: MapFn, exponent: f32, x: f64) -> f64 {
    match func {
        MapFn::Tanh => x.tanh(),
        MapFn::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        MapFn::Exp => x.exp(),
        MapFn::Log => x.ln(),
        MapFn::Sqrt => x.sqrt(),
        MapFn::Reciprocal => 1.0 / x,
        MapFn::Abs => x.abs(),
        MapFn::Erf => libm::erf(x),
        // `pow` is defined as e^{c·ln x} (docs/model-format.md): NaN below 0, whatever the
        // exponent (`powf` gives a value for integer exponents, which the op does not compute).
        MapFn::Pow if x < 0.0 => f64::NAN,
        MapFn::Pow => x.powf(exponent as f64),
        MapFn::Max => x.max(exponent as f64),
        MapFn::Min => x.min(exponent as f64),
        MapFn::LeakyRelu if x >= 0.0 => x,
        MapFn::LeakyRelu => exponent as f64 * x,
    }
}

/// The f32 formula's own error at `x` (result `y`), before the f16 rounding: one ulp for libm's
/// `expf`/`logf`, half an ulp per rounded operation, Abramowitz & Stegun's 1.5e−7 for erf. Each
/// is checked against the f64 definition on every f16 input (`tests/tests/map.rs`).
pub fn formula_error(func: MapFn, exponent: f32, x: f64, y: f64) -> f64 {
    let ulp = 2f64.powi(-24);
    match func {
        // 1 − q with q = 2/(e + 1) ≤ 2: four roundings and expf's ulp, each ≤ 2 ulps of 1.
        MapFn::Tanh => 16.0 * ulp,
        MapFn::Sigmoid => 8.0 * ulp * y.abs(),
        MapFn::Exp | MapFn::Log => 2.0 * ulp * y.abs(),
        MapFn::Sqrt | MapFn::Reciprocal => ulp * y.abs(),
        MapFn::Abs | MapFn::Max | MapFn::Min => 0.0,
        // α·x rounded once to f32.
        MapFn::LeakyRelu => ulp * y.abs(),
        MapFn::Erf => 1.5e-7 + 40.0 * ulp,
        // e^{c·ln x}: ln's ulp and the product's rounding move the exponent by ≤ 3 ulps of it,
        // which is that much relative error in y, then expf's own ulp.
        MapFn::Pow if y == 0.0 => 0.0,
        MapFn::Pow => y.abs() * ulp * (4.0 * (exponent as f64 * x.ln()).abs() + 4.0),
    }
}

/// Where the function's argument `t` leaves its domain (NaN) or meets a pole.
fn singular(func: MapFn, t: f64) -> bool {
    match func {
        MapFn::Log | MapFn::Sqrt | MapFn::Pow => t <= 0.0,
        MapFn::Reciprocal => t == 0.0,
        _ => false,
    }
}

/// The bound on `|device − f(x)|` when the input is within `b` of the exact `x` and the f64
/// result is `y`: how far f moves over `[x − b, x + b]` (every function is monotone there, or
/// 1-Lipschitz for abs; unbounded when the interval meets a pole or leaves the domain), the
/// formula's error and one f16 rounding (unbounded where that rounding can overflow).
pub fn bound(func: MapFn, exponent: f32, x: f64, b: f64, y: f64) -> f64 {
    if y.is_nan() && b == 0.0 {
        return 0.0;
    }
    let total = carried(func, exponent, x, b, y) + formula_error(func, exponent, x, y);
    if y.abs() + total >= 65520.0 {
        return f64::INFINITY;
    }
    total + unit_roundoff(DType::F16) * (y.abs() + total) + underflow_error(DType::F16)
}

/// How far f moves over `[x − b, x + b]` from `y = f(x)` (every function is monotone there, or
/// 1-Lipschitz for abs; unbounded when the interval meets a pole or leaves the domain).
pub fn carried(func: MapFn, exponent: f32, x: f64, b: f64, y: f64) -> f64 {
    if b == 0.0 {
        0.0
    } else if matches!(func, MapFn::Abs | MapFn::Max | MapFn::Min) {
        // 1-Lipschitz.
        b
    } else if func == MapFn::LeakyRelu {
        // Lipschitz with max(1, |α|) (not monotone for α < 0).
        b * (exponent.abs() as f64).max(1.0) * (1.0 + 1e-12)
    } else if (singular(func, x - b) && !singular(func, x + b))
        || (func == MapFn::Reciprocal && x - b < 0.0 && x + b > 0.0)
    {
        f64::INFINITY
    } else {
        let d = (exact(func, exponent, x + b) - y).abs().max((exact(func, exponent, x - b) - y).abs());
        d * (1.0 + 1e-12)
    }
}

/// `|f'(x)|` at the exact input (NaN outside the domain).
pub fn slope(func: MapFn, exponent: f32, x: f64) -> f64 {
    match func {
        MapFn::Tanh => 1.0 - x.tanh().powi(2),
        MapFn::Sigmoid => {
            let s = 1.0 / (1.0 + (-x).exp());
            s * (1.0 - s)
        }
        MapFn::Exp => x.exp(),
        MapFn::Log if x > 0.0 => 1.0 / x,
        MapFn::Sqrt if x > 0.0 => 0.5 / x.sqrt(),
        MapFn::Reciprocal if x != 0.0 => 1.0 / (x * x),
        MapFn::Abs => 1.0,
        MapFn::Erf => 2.0 / std::f64::consts::PI.sqrt() * (-x * x).exp(),
        MapFn::Pow if x > 0.0 => (exponent as f64 * x.powf(exponent as f64 - 1.0)).abs(),
        _ => f64::NAN,
    }
}

/// A bound on `|f(x + Δ) − f(x) − f'(x)·Δ|` for `|Δ| ≤ r`: `½·sup|f''|·r²` over `[x − r, x + r]`
/// (`sup|tanh''| = 4/(3√3)`, `sup|σ''| = √3/18`, `sup|erf''| = (4/√π)e^{−1/2}/√2`; the others are
/// monotone in |f''| on each side of their pole, so the sup is at an end); abs: 0 unless the
/// interval reaches 0, then 2r. Infinite where the interval leaves the domain.
pub fn remainder(func: MapFn, exponent: f32, x: f64, r: f64) -> f64 {
    if r == 0.0 {
        return 0.0;
    }
    let (lo, hi) = (x - r, x + r);
    let curvature = match func {
        MapFn::Tanh => 0.7699,
        MapFn::Sigmoid => 0.0963,
        MapFn::Erf => 0.968,
        MapFn::Exp => hi.exp(),
        MapFn::Log if lo > 0.0 => 1.0 / (lo * lo),
        MapFn::Sqrt if lo > 0.0 => 0.25 * lo.powf(-1.5),
        MapFn::Reciprocal if lo > 0.0 || hi < 0.0 => 2.0 / lo.abs().min(hi.abs()).powi(3),
        MapFn::Pow if lo > 0.0 => {
            let c = exponent as f64;
            (c * (c - 1.0)).abs() * lo.powf(c - 2.0).max(hi.powf(c - 2.0))
        }
        MapFn::Abs => return if x.abs() > r { 0.0 } else { 2.0 * r },
        _ => f64::INFINITY,
    };
    0.5 * curvature * r * r * (1.0 + 1e-9)
}
