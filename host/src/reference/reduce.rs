//! `reduce_sum` / `reduce_mean` over the last axis: the device-precision rule of
//! `reduce_rows_f16` (docs/kernels.md) and the f64 value with both branches of its bound
//! (docs/reliability.md "The verdict").

use super::prob::{self, Prob, LAMBDA};
use super::{gamma, round, underflow_error, unit_roundoff, HostTensor};
use ipu_schema::DType;

/// f32 unit roundoff.
const U32: f64 = 1.0 / 16_777_216.0;

/// One row as `reduce_rows_f16` computes it: whole 4-value chunks summed in two f32 lanes (even
/// and odd values, each from 0 in order), the `D mod 4` tail values into lane 0, `s0 + s1`, times
/// the kernel's scale (`row_reduce::scale`), rounded once to f16 — the operations of
/// `layernorm_f16`'s sum, in the same order.
pub fn row_device(x: &[f32], mean: bool) -> f32 {
    let d = x.len();
    let full = 4 * (d / 4);
    let mut s = [0f32; 2];
    for (i, v) in x[..full].iter().enumerate() {
        s[i % 2] += *v;
    }
    for v in &x[full..] {
        s[0] += *v;
    }
    let k = ipu_core::plan::row_reduce::scale(mean, d as u64);
    round((s[0] + s[1]) * k, DType::F16)
}

/// The device values, the f64 values and the rigorous and probabilistic bounds of the reduction
/// of `x` (f64 values `ex`, bounds `bd`, probabilistic branch `p`) over its last axis.
///
/// Rigorous: the inputs' bounds summed and scaled; the f32 sum of D terms in two lanes and their
/// final add, the product by the f32-rounded 1/D and that product's rounding are within
/// γ(D + 3, 2⁻²⁴) of `Σ(|x| + b)` scaled; then one f16 rounding. Probabilistic: the rows' random
/// parts are uncorrelated (model M2, as a layer norm's row statistics), so their variances add;
/// the deterministic parts and the f32 arithmetic add up; the f16 rounding is a new source.
pub fn reduce(
    x: &HostTensor,
    ex: &[f64],
    bd: &[f64],
    p: &Prob,
    mean: bool,
) -> (HostTensor, Vec<f64>, Vec<f64>, Prob) {
    let d = *x.shape.last().unwrap_or(&1) as usize;
    let k = if mean { 1.0 / d as f64 } else { 1.0 };
    let g = gamma(d as u64 + 3, U32);
    let rows = x.data.len() / d.max(1);
    let mut shape = x.shape.clone();
    if let Some(last) = shape.last_mut() {
        *last = 1;
    }
    let (mut data, mut exact, mut bound) =
        (Vec::with_capacity(rows), Vec::with_capacity(rows), Vec::with_capacity(rows));
    let (mut ps, mut pd) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
    for r in 0..rows {
        let span = r * d..(r + 1) * d;
        data.push(row_device(&x.data[span.clone()], mean));
        let y = k * ex[span.clone()].iter().sum::<f64>();
        let carried: f64 = k * bd[span.clone()].iter().sum::<f64>();
        let arith = k * g * span.clone().map(|e| ex[e].abs() + bd[e]).sum::<f64>();
        let c = carried + arith;
        exact.push(y);
        bound.push(c + unit_roundoff(DType::F16) * (y.abs() + c) + underflow_error(DType::F16));
        let s = k * span.clone().map(|e| p.s[e] * p.s[e]).sum::<f64>().sqrt();
        let dd = k * span.clone().map(|e| p.d[e]).sum::<f64>()
            + k * g * span.map(|e| ex[e].abs() + LAMBDA * p.s[e] + p.d[e]).sum::<f64>();
        let (s, dd) = prob::rounded(y, s, dd, DType::F16, 0);
        ps.push(s);
        pd.push(dd);
    }
    (HostTensor { dtype: DType::F16, shape, data }, exact, bound, Prob { s: ps, d: pd })
}
