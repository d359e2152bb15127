//! The host reference, computed in device precision: the same rounding points and summation
//! order as the device (docs/target.md §4.4 for the AMP, docs/kernels.md for the other kernels,
//! the K-split reduction order from the package's recorded grid), so the device's answer can be
//! compared bit for bit. FP8 casts use `ipu_core::fp8`, which is checked bit-exact against ml_dtypes.
//! Alongside, every op is evaluated in f64 on the real values as an independent check. Rows run
//! in parallel; each element's arithmetic is sequential, so results do not depend on threads.

use half::f16;
use ipu_core::fp8::{self, Fp8Format};
use ipu_core::graph::{matmul_shape, Graph, OpKind};
use ipu_core::plan::matmul::split;
use ipu_schema::DType;
use rayon::prelude::*;
use std::collections::BTreeMap;

/// A tensor on the host: f32 values of its dtype (exact for f16), or FP8 codes as 0..=255.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u64>,
    /// Values (FP8: codes).
    pub data: Vec<f32>,
}

fn round(x: f32, d: DType) -> f32 {
    if d == DType::F16 {
        f16::from_f32(x).to_f32()
    } else {
        x
    }
}

fn fmt(d: DType) -> Fp8Format {
    if d == DType::F8E5M2 {
        Fp8Format::E5M2
    } else {
        Fp8Format::E4M3
    }
}

fn is_fp8(d: DType) -> bool {
    matches!(d, DType::F8E4M3 | DType::F8E5M2)
}

/// Real value of an element (FP8 codes decoded with the tensor's scale).
fn real(t: &HostTensor, scale: i8, i: usize) -> f64 {
    if is_fp8(t.dtype) {
        fp8::to_f32(t.data[i] as u8, fmt(t.dtype)) as f64 * 2f64.powi(scale as i32)
    } else {
        t.data[i] as f64
    }
}

struct MatMulArgs<'a> {
    a: &'a HostTensor,
    b: &'a HostTensor,
    ta: bool,
    tb: bool,
    acc: DType,
    tk: u64,
    iscl: i32,
    alpha: Option<f32>,
}

/// Batched `C = alpha · A·B` as the device computes it.
fn matmul_device(p: &MatMulArgs<'_>) -> (Vec<f32>, Vec<u64>) {
    let (a, b) = (p.a, p.b);
    let ra = a.shape.len();
    let rb = b.shape.len();
    let (m, k) = if p.ta { (a.shape[ra - 1], a.shape[ra - 2]) } else { (a.shape[ra - 2], a.shape[ra - 1]) };
    let n = if p.tb { b.shape[rb - 2] } else { b.shape[rb - 1] };
    let batch: u64 = a.shape[..ra - 2].iter().product::<u64>().max(b.shape[..rb - 2].iter().product());
    let a_batched = ra > 2;
    let b_batched = rb > 2;
    let f8 = is_fp8(a.dtype);
    let (fa, fb) = (fmt(a.dtype), fmt(b.dtype));
    let val_a = |bi: u64, i: u64, kk: u64| -> f32 {
        if kk >= k {
            return 0.0;
        }
        let base = if a_batched { bi * m * k } else { 0 };
        let v =
            if p.ta { a.data[(base + kk * m + i) as usize] } else { a.data[(base + i * k + kk) as usize] };
        if f8 {
            fp8::to_f32(v as u8, fa)
        } else {
            v
        }
    };
    let val_b = |bi: u64, kk: u64, j: u64| -> f32 {
        if kk >= k {
            return 0.0;
        }
        let base = if b_batched { bi * k * n } else { 0 };
        let v =
            if p.tb { b.data[(base + j * k + kk) as usize] } else { b.data[(base + kk * n + j) as usize] };
        if f8 {
            fp8::to_f32(v as u8, fb)
        } else {
            v
        }
    };
    let be = if f8 { 32 } else { 16 };
    let kb = k.div_ceil(be);
    let cols = if p.acc == DType::F32 { 8 } else { 16 };
    let group = cols / 4;
    let rows: Vec<Vec<f32>> = (0..batch * m)
        .into_par_iter()
        .map(|row| {
            let (bi, i) = (row / m, row % m);
            (0..n)
                .map(|j| {
                    let pin_phase = (j % cols) / group;
                    let mut total = 0f32;
                    for l in 0..p.tk {
                        let (kb0, kb1) = split(kb, p.tk, l);
                        let mut pin = 0f32;
                        for blk in kb0..kb1 {
                            let mut acc = 0f32;
                            for ph in 0..4 {
                                if ph == pin_phase {
                                    acc += pin;
                                }
                                if f8 {
                                    let base = blk * 32 + 8 * ph;
                                    let pr: [f32; 8] = std::array::from_fn(|q| {
                                        val_a(bi, i, base + q as u64) * val_b(bi, base + q as u64, j)
                                    });
                                    let s = ((pr[0] + pr[1]) + (pr[2] + pr[3]))
                                        + ((pr[4] + pr[5]) + (pr[6] + pr[7]));
                                    acc += fp8::scale_pow2(s, p.iscl);
                                } else {
                                    let base = blk * 16 + 4 * ph;
                                    let pr: [f32; 4] = std::array::from_fn(|q| {
                                        val_a(bi, i, base + q as u64) * val_b(bi, base + q as u64, j)
                                    });
                                    acc += (pr[0] + pr[1]) + (pr[2] + pr[3]);
                                }
                            }
                            pin = round(acc, p.acc);
                        }
                        total = if l == 0 { pin } else { round(total + pin, p.acc) };
                    }
                    match p.alpha {
                        Some(al) => f16::from_f32(total * al).to_f32(),
                        None => total,
                    }
                })
                .collect()
        })
        .collect();
    let mut shape: Vec<u64> = if a_batched { a.shape[..ra - 2].to_vec() } else { b.shape[..rb - 2].to_vec() };
    shape.extend([m, n]);
    (rows.concat(), shape)
}

fn softmax_device(x: &HostTensor) -> Vec<f32> {
    let n = *x.shape.last().unwrap() as usize;
    x.data
        .par_chunks(n)
        .flat_map_iter(|row| {
            let mx = row.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
            let mut sum = 0f32;
            for v in row {
                sum += libm::expf(v - mx);
            }
            row.iter().map(move |v| f16::from_f32(libm::expf(v - mx) / sum).to_f32()).collect::<Vec<_>>()
        })
        .collect()
}

/// Device-precision tensors and f64 values (real numbers) by tensor name.
pub type Evaluated = (BTreeMap<String, HostTensor>, BTreeMap<String, Vec<f64>>);

/// Evaluate every op of the graph.
pub fn evaluate(
    g: &Graph,
    inputs: &BTreeMap<String, HostTensor>,
    grids: &[[u32; 3]],
) -> Result<Evaluated, String> {
    let mut vals = inputs.clone();
    let mut exact: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (name, t) in inputs {
        exact.insert(name.clone(), (0..t.data.len()).map(|i| real(t, 0, i)).collect());
    }
    for (i, op) in g.ops.iter().enumerate() {
        let out = g.tensor(op.output);
        let get = |id| {
            let t = g.tensor(id);
            vals.get(&t.name).map(|v| (v, t.scale)).ok_or(format!("op {i}: no value for `{}`", t.name))
        };
        let (value, ex): (HostTensor, Vec<f64>) = match &op.kind {
            OpKind::MatMul { a, b, transpose_a, transpose_b, accumulate, alpha } => {
                let ((at, sa), (bt, sb)) = (get(*a)?, get(*b)?);
                let tk = grids.get(i).map(|g| g[2] as u64).unwrap_or(1);
                let args = MatMulArgs {
                    a: at,
                    b: bt,
                    ta: *transpose_a,
                    tb: *transpose_b,
                    acc: *accumulate,
                    tk,
                    iscl: sa as i32 + sb as i32,
                    alpha: *alpha,
                };
                let (c, shape) = matmul_device(&args);
                let (ea, eb) = (&exact[&g.tensor(*a).name], &exact[&g.tensor(*b).name]);
                let (_, m, k, n) =
                    matmul_shape(g.tensor(*a), g.tensor(*b), *transpose_a, *transpose_b).unwrap();
                let (ab, bb) = (g.tensor(*a).shape.len() > 2, g.tensor(*b).shape.len() > 2);
                let ex: Vec<f64> = (0..c.len() as u64)
                    .into_par_iter()
                    .map(|idx| {
                        let (bi, r) = (idx / (m * n), idx % (m * n));
                        let (ii, j) = (r / n, r % n);
                        let mut s = 0f64;
                        for kk in 0..k {
                            let ai = if *transpose_a { kk * m + ii } else { ii * k + kk }
                                + if ab { bi * m * k } else { 0 };
                            let bi2 = if *transpose_b { j * k + kk } else { kk * n + j }
                                + if bb { bi * k * n } else { 0 };
                            s += ea[ai as usize] * eb[bi2 as usize];
                        }
                        s * alpha.unwrap_or(1.0) as f64
                    })
                    .collect();
                (HostTensor { dtype: out.dtype, shape, data: c }, ex)
            }
            OpKind::Cast { input } => {
                let (x, sin) = get(*input)?;
                let data: Vec<f32> = if is_fp8(out.dtype) {
                    x.data
                        .iter()
                        .map(|v| {
                            fp8::from_f16_scaled(f16::from_f32(*v), fmt(out.dtype), out.scale as i32) as f32
                        })
                        .collect()
                } else {
                    x.data
                        .iter()
                        .map(|c| fp8::to_f16_scaled(*c as u8, fmt(x.dtype), sin as i32).to_f32())
                        .collect()
                };
                let t = HostTensor { dtype: out.dtype, shape: x.shape.clone(), data };
                // The cast's rounding is defined by the format: the exact value is the rounded one.
                let ex = (0..t.data.len()).map(|i| real(&t, out.scale, i)).collect();
                (t, ex)
            }
            OpKind::Softmax { input } => {
                let (x, _) = get(*input)?;
                let data = softmax_device(x);
                let ein = &exact[&g.tensor(*input).name];
                let n = *x.shape.last().unwrap() as usize;
                let ex = ein
                    .chunks(n)
                    .flat_map(|row| {
                        let mx = row.iter().fold(f64::NEG_INFINITY, |m, v| m.max(*v));
                        let s: f64 = row.iter().map(|v| (v - mx).exp()).sum();
                        row.iter().map(move |v| (v - mx).exp() / s).collect::<Vec<_>>()
                    })
                    .collect();
                (HostTensor { dtype: out.dtype, shape: x.shape.clone(), data }, ex)
            }
        };
        exact.insert(out.name.clone(), ex);
        vals.insert(out.name.clone(), value);
    }
    Ok((vals, exact))
}
