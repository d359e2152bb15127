//! The host reference, computed in device precision: the same rounding points and summation
//! order as the AMP (docs/target.md §4.4) and the K-split reduction, so the device's answer can be
//! compared bit for bit. Rows are computed in parallel; each element's arithmetic is sequential,
//! so the result does not depend on the thread count. An f64 reference is kept alongside as an
//! independent check of the device-precision one.

use half::f16;
use ipu_core::graph::{Graph, OpKind};
use ipu_schema::DType;
use rayon::prelude::*;
use std::collections::BTreeMap;

/// A tensor on the host, as f32 values of its dtype (exact for f16 and FP8).
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u64>,
    /// Values.
    pub data: Vec<f32>,
}

fn split(total: u64, parts: u64, i: u64) -> (u64, u64) {
    let base = total / parts;
    let extra = total % parts;
    let start = i * base + i.min(extra);
    (start, start + base + u64::from(i < extra))
}

fn round(x: f32, d: DType) -> f32 {
    if d == DType::F16 {
        f16::from_f32(x).to_f32()
    } else {
        x
    }
}

/// `C = A·B` as the device computes it with `grid = [tm, tn, tk]`.
#[allow(clippy::too_many_arguments, reason = "the matmul's full description")]
pub fn matmul_device(
    a: &HostTensor,
    b: &HostTensor,
    ta: bool,
    tb: bool,
    acc: DType,
    tk: u64,
) -> (Vec<f32>, Vec<f64>, u64, u64) {
    let (m, k) = if ta { (a.shape[1], a.shape[0]) } else { (a.shape[0], a.shape[1]) };
    let n = if tb { b.shape[0] } else { b.shape[1] };
    let av = |i: u64, kk: u64| {
        if kk >= k {
            0.0
        } else if ta {
            a.data[(kk * m + i) as usize]
        } else {
            a.data[(i * k + kk) as usize]
        }
    };
    let bv = |kk: u64, j: u64| {
        if kk >= k {
            0.0
        } else if tb {
            b.data[(j * k + kk) as usize]
        } else {
            b.data[(kk * n + j) as usize]
        }
    };
    let kb = k.div_ceil(16);
    let cols = if acc == DType::F32 { 8 } else { 16 };
    let group = cols / 4; // outputs per phase
    let rows: Vec<(Vec<f32>, Vec<f64>)> = (0..m)
        .into_par_iter()
        .map(|i| {
            let mut out = Vec::with_capacity(n as usize);
            let mut exact = Vec::with_capacity(n as usize);
            for j in 0..n {
                let phase_of_pin = (j % cols) / group;
                let mut total = 0f32;
                for l in 0..tk {
                    let (kb0, kb1) = split(kb, tk, l);
                    let mut pin = 0f32;
                    for blk in kb0..kb1 {
                        let mut acc32 = 0f32;
                        for p in 0..4 {
                            if p == phase_of_pin {
                                acc32 += pin;
                            }
                            let kk = blk * 16 + 4 * p;
                            let pr: [f32; 4] =
                                std::array::from_fn(|q| av(i, kk + q as u64) * bv(kk + q as u64, j));
                            acc32 += (pr[0] + pr[1]) + (pr[2] + pr[3]);
                        }
                        pin = round(acc32, acc);
                    }
                    total = if l == 0 { pin } else { round(total + pin, acc) };
                }
                out.push(total);
                exact.push((0..k).map(|kk| av(i, kk) as f64 * bv(kk, j) as f64).sum());
            }
            (out, exact)
        })
        .collect();
    let mut c = Vec::with_capacity((m * n) as usize);
    let mut e = Vec::with_capacity((m * n) as usize);
    for (r, x) in rows {
        c.extend(r);
        e.extend(x);
    }
    (c, e, m, n)
}

/// Device-precision tensors and f64 values by tensor name.
pub type Evaluated = (BTreeMap<String, HostTensor>, BTreeMap<String, Vec<f64>>);

/// Evaluate every op of the graph; returns device-precision values and f64 values per tensor.
pub fn evaluate(
    g: &Graph,
    inputs: &BTreeMap<String, HostTensor>,
    grids: &[[u32; 3]],
) -> Result<Evaluated, String> {
    let mut vals = inputs.clone();
    let mut exact = BTreeMap::new();
    for (i, op) in g.ops.iter().enumerate() {
        let out = g.tensor(op.output);
        match &op.kind {
            OpKind::MatMul { a, b, transpose_a, transpose_b, accumulate } => {
                let (an, bn) = (&g.tensor(*a).name, &g.tensor(*b).name);
                let at = vals.get(an).ok_or(format!("op {i}: no value for `{an}`"))?;
                let bt = vals.get(bn).ok_or(format!("op {i}: no value for `{bn}`"))?;
                let tk = grids.get(i).map(|g| g[2] as u64).unwrap_or(1);
                let (c, e, m, n) = matmul_device(at, bt, *transpose_a, *transpose_b, *accumulate, tk);
                vals.insert(out.name.clone(), HostTensor { dtype: out.dtype, shape: vec![m, n], data: c });
                exact.insert(out.name.clone(), e);
            }
        }
    }
    Ok((vals, exact))
}
