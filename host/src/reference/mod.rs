//! The host reference, computed in device precision: the same rounding points and summation
//! order as the device (docs/target.md §4.4 for the AMP, docs/kernels.md for the other kernels,
//! the K-split reduction order from the package's recorded grid), so the device's answer can be
//! compared bit for bit. FP8 casts use `ipu_core::fp8`, which is checked bit-exact against ml_dtypes.
//! Alongside, every op is evaluated in f64 on the real values as an independent check. Rows run
//! in parallel; each element's arithmetic is sequential, so results do not depend on threads.

use half::f16;
use ipu_core::fp8::{self, Fp8Format};
use ipu_core::graph::{matmul_shape, BinaryOp, GeluForm, Graph, OpKind};
use ipu_core::plan::matmul::{fan_in, reduction_rounds, Grid, MatMul};
use ipu_schema::DType;
use rayon::prelude::*;

mod amp_order;
mod gemm64;
mod layernorm;
pub mod map;
mod matmul;
mod matmul_bound;
mod rows;
pub use matmul::{matmul_device, matmul_device_scalar, round_f16, MatMulArgs};
pub use matmul_bound::LAMBDA;
use matmul_bound::{matmul_exact, MatMulLayout, Operand, Rounding};
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
        round_f16(x)
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

/// The device's softmax (`k_softmax_f16`, docs/kernels.md): per row the max; `e = exp(x + (−max))`
/// summed in two f32 lanes — lane 0 takes values 0 and 2 of each group of four, lane 1 values 1 and
/// 3, the last `n mod 4` values lane 0 — `sum = s₀ + s₁`, `r = 1 / sum`; then `f16(e · r)`.
fn softmax_device(x: &HostTensor) -> Vec<f32> {
    let n = *x.shape.last().unwrap() as usize;
    x.data
        .par_chunks(n)
        .flat_map_iter(|row| {
            let mx = row.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
            let neg = 0.0 - mx;
            let mut lanes = [0f32; 2];
            for (i, v) in row.iter().enumerate() {
                let lane = if i < n / 4 * 4 { i % 2 } else { 0 };
                lanes[lane] += libm::expf(v + neg);
            }
            let r = 1.0 / (lanes[0] + lanes[1]);
            row.iter().map(move |v| f16::from_f32(libm::expf(v + neg) * r).to_f32()).collect::<Vec<_>>()
        })
        .collect()
}

/// The host reference of every tensor of a graph.
#[derive(Clone, Debug, Default)]
pub struct Evaluated {
    /// Device-precision tensors by name: what the device must produce, bit for bit.
    pub device: BTreeMap<String, HostTensor>,
    /// f64 values of the same graph on the real numbers (no rounding anywhere, casts included).
    pub exact: BTreeMap<String, Vec<f64>>,
    /// Per element, a bound on |device-precision value − f64 value| derived from each op's
    /// rounding points and the bounds of its operands (docs/reliability.md "The verdict").
    pub bound: BTreeMap<String, Vec<f64>>,
}

/// Unit roundoff (half an ulp, relative) of round-to-nearest in a dtype.
pub fn unit_roundoff(d: DType) -> f64 {
    match d {
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::F8E4M3 => 2f64.powi(-4),
        DType::F8E5M2 => 2f64.powi(-3),
    }
}

/// Half the smallest subnormal spacing of a dtype: the absolute error of rounding near zero.
pub fn underflow_error(d: DType) -> f64 {
    match d {
        DType::F32 => 2f64.powi(-150),
        DType::F16 => 2f64.powi(-25),
        DType::F8E4M3 => 2f64.powi(-11),
        DType::F8E5M2 => 2f64.powi(-18),
    }
}

/// Higham's γ_n = n·u / (1 − n·u): the relative error bound of n rounded additions.
pub fn gamma(n: u64, u: f64) -> f64 {
    let nu = n as f64 * u;
    if nu < 1.0 {
        nu / (1.0 - nu)
    } else {
        f64::INFINITY
    }
}

/// GeLU (tanh form) as `gelu_f16` computes it: f32 operations in the kernel's order, libm's
/// `expf` (as the simulator's `f32exp`), the constants of `plan::matmul::GELU_CONSTANTS`, one f16
/// rounding at the end.
pub fn gelu_device(h: f32) -> f32 {
    let [c, k, half, one, minus_two] = ipu_core::plan::matmul::GELU_CONSTANTS;
    let x = h;
    let x3 = (x * x) * x;
    let inner = x + x3 * k;
    let u = inner * c;
    let e = libm::expf(u + u);
    // 1 + (−2)/(e + 1): the bits of 1 − 2/(e + 1).
    let t = one + minus_two / (e + one);
    let y = (x * half) * (one + t);
    round(y, DType::F16)
}

/// GeLU (erf form) as `gelu_erf_f16` computes it: f32 operations in the kernel's order with the
/// constants of `plan::matmul::GELU_ERF_CONSTANTS`, libm's `sqrtf` and `expf` (as the
/// simulator's `f32sqrt` and `f32exp`), one f16 rounding at the end.
pub fn gelu_erf_device(h: f32) -> f32 {
    let [p, one, mhalf, a5, a4, a3, a2, a1, half] = ipu_core::plan::matmul::GELU_ERF_CONSTANTS;
    let x = h;
    let sq = x * x;
    let ab = libm::sqrtf(sq);
    let r = x + ab;
    let t = one / (ab * p + one);
    let e = (libm::expf(sq * mhalf) * ab) * t;
    let s = ((((((((t * a5) + a4) * t) + a3) * t) + a2) * t) + a1) * e;
    round((r - s) * half, DType::F16)
}

/// GeLU (erf form) in f64: `0.5x(1 + erf(x/√2))`.
pub fn gelu_erf_f64(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

/// GeLU (tanh form, `gelu_pytorch_tanh`) in f64.
pub fn gelu_f64(x: f64) -> f64 {
    let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    0.5 * x * (1.0 + u.tanh())
}

/// The flat index into a tensor of shape `from` that NumPy broadcasting reads for flat index `i`
/// of a result of shape `to`.
fn broadcast_index(to: &[u64], from: &[u64], mut i: usize) -> usize {
    let (mut idx, mut stride) = (0usize, 1usize);
    for d in (0..to.len()).rev() {
        let coord = i % to[d] as usize;
        i /= to[d] as usize;
        if let Some(fd) = (d + from.len()).checked_sub(to.len()) {
            if from[fd] != 1 {
                idx += coord * stride;
            }
            stride *= from[fd] as usize;
        }
    }
    idx
}

/// For each element of `input.transpose(perm)` (row-major), its index in `input`.
pub fn transpose_index(shape: &[u64], perm: &[usize]) -> Vec<usize> {
    let r = shape.len();
    let mut stride = vec![1usize; r];
    for d in (0..r.saturating_sub(1)).rev() {
        stride[d] = stride[d + 1] * shape[d + 1] as usize;
    }
    let out_shape: Vec<usize> = perm.iter().map(|&a| shape[a] as usize).collect();
    let n: usize = out_shape.iter().product();
    (0..n)
        .map(|mut i| {
            let mut src = 0;
            for k in (0..r).rev() {
                src += (i % out_shape[k]) * stride[perm[k]];
                i /= out_shape[k];
            }
            src
        })
        .collect()
}

/// Evaluate every op of the graph: `grids` and `alpha_on_a` are the package plan's (the K split
/// per op, and the ops whose alpha the tiles apply to operand `a`).
pub fn evaluate(
    g: &Graph,
    inputs: &BTreeMap<String, HostTensor>,
    grids: &[[u32; 3]],
    alpha_on_a: &[u32],
) -> Result<Evaluated, String> {
    for &i in alpha_on_a {
        let ok = g.ops.get(i as usize).is_some_and(|op| {
            matches!(op.kind, OpKind::MatMul { a, alpha: Some(_), .. } if g.tensor(a).dtype == DType::F16)
        });
        if !ok {
            return Err(format!(
                "the package's plan applies alpha to operand `a` of op {i}, which is not a matmul with alpha and an f16 `a` in this model"
            ));
        }
    }
    let mut vals = inputs.clone();
    let mut exact: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut bound: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    // Per row of the last axis, a bound on the norm of the row's error (`rows.rs`).
    let mut row_bound: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let last = |shape: &[u64]| shape.last().copied().unwrap_or(1) as usize;
    for (name, t) in inputs {
        // FP8 sources (params) stand for code · 2^scale.
        let scale = g.find(name).map(|id| g.tensor(id).scale).unwrap_or(0);
        exact.insert(name.clone(), (0..t.data.len()).map(|i| real(t, scale, i)).collect());
        bound.insert(name.clone(), vec![0.0; t.data.len()]);
        row_bound.insert(name.clone(), vec![0.0; rows::count(t.data.len(), last(&t.shape))]);
    }
    for (i, op) in g.ops.iter().enumerate() {
        let out = g.tensor(op.output);
        let get = |id| {
            let t = g.tensor(id);
            vals.get(&t.name).map(|v| (v, t.scale)).ok_or(format!("op {i}: no value for `{}`", t.name))
        };
        let (value, ex, bd, rho): (HostTensor, Vec<f64>, Vec<f64>, Vec<f64>) = match &op.kind {
            OpKind::MatMul { a, b, transpose_a, transpose_b, accumulate, alpha } => {
                let ((at, sa), (bt, sb)) = (get(*a)?, get(*b)?);
                let (ta, tb) = (g.tensor(*a), g.tensor(*b));
                // Alpha on `a` (docs/kernels.md): each value of `a` becomes f16(f32(a)·alpha), as
                // `scale_f16` computes it, and the product is taken unscaled. The f64 value of
                // the scaled operand is alpha·a; its bound adds that product's f32 and f16
                // roundings (relative 2⁻²⁴ + 2⁻¹¹, beside an f16 underflow spacing).
                let on_a = alpha_on_a.contains(&(i as u32));
                let scaled_a = alpha.filter(|_| on_a).map(|al| {
                    let data = at.data.iter().map(|v| round(v * al, DType::F16)).collect();
                    let al = al as f64;
                    let rel = unit_roundoff(DType::F16)
                        + unit_roundoff(DType::F32) * (1.0 + unit_roundoff(DType::F16));
                    let ex: Vec<f64> = exact[&ta.name].iter().map(|e| al * e).collect();
                    let fresh: Vec<f64> = exact[&ta.name]
                        .iter()
                        .zip(&bound[&ta.name])
                        .map(|(e, d)| rel * al.abs() * (e.abs() + d) + underflow_error(DType::F16))
                        .collect();
                    let bd: Vec<f64> =
                        bound[&ta.name].iter().zip(&fresh).map(|(d, f)| al.abs() * d + f).collect();
                    let d = last(&ta.shape);
                    let rho: Vec<f64> = row_bound[&ta.name]
                        .iter()
                        .zip(rows::from_elements(&fresh, d))
                        .map(|(r, f)| al.abs() * r + f)
                        .collect();
                    let rho = rows::clamp(rho, &bd, d);
                    (HostTensor { dtype: at.dtype, shape: at.shape.clone(), data }, ex, bd, rho)
                });
                let alpha = if on_a { &None } else { alpha };
                let at = scaled_a.as_ref().map_or(at, |s| &s.0);
                let grid = grids.get(i).map(|g| Grid { tm: g[0] as u64, tn: g[1] as u64, tk: g[2] as u64 });
                let grid = grid.unwrap_or(Grid { tm: 1, tn: 1, tk: 1 });
                let tk = grid.tk;
                let mm = MatMul::new(g, *a, *b, op.output, *transpose_a, *transpose_b, *accumulate);
                let rounds = reduction_rounds(tk, fan_in(&mm, grid));
                let args = MatMulArgs {
                    rounds: rounds.clone(),
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
                let (_, m, k, n) = matmul_shape(ta, tb, *transpose_a, *transpose_b).unwrap();
                let layout = MatMulLayout {
                    m,
                    k,
                    n,
                    ta: *transpose_a,
                    tb: *transpose_b,
                    a_batched: ta.shape.len() > 2,
                    b_batched: tb.shape.len() > 2,
                };
                let a_op = match &scaled_a {
                    Some(s) => Operand { exact: &s.1, bound: &s.2, rows: &s.3 },
                    None => Operand {
                        exact: &exact[&ta.name],
                        bound: &bound[&ta.name],
                        rows: &row_bound[&ta.name],
                    },
                };
                let b_op =
                    Operand { exact: &exact[&tb.name], bound: &bound[&tb.name], rows: &row_bound[&tb.name] };
                let rounding = Rounding {
                    acc: *accumulate,
                    block: if is_fp8(ta.dtype) { 32 } else { 16 },
                    tk,
                    rounds,
                    alpha: alpha.map(|a| a as f64),
                };
                let (ex, mut bd, mut rho) = matmul_exact(&layout, a_op, b_op, c.len() as u64, &rounding);
                let mut c = c;
                if out.dtype != *accumulate {
                    // f16 output of an f32 accumulation: one rounding of the finished sum.
                    let (u, sub) = (unit_roundoff(out.dtype), underflow_error(out.dtype));
                    c.iter_mut().for_each(|v| *v = round(*v, out.dtype));
                    let fresh: Vec<f64> = bd.iter().zip(&ex).map(|(b, e)| u * (e.abs() + b) + sub).collect();
                    bd.iter_mut().zip(&fresh).for_each(|(b, f)| *b += f);
                    let d = n as usize;
                    rho = rows::clamp(
                        rho.iter().zip(rows::from_elements(&fresh, d)).map(|(r, f)| r + f).collect(),
                        &bd,
                        d,
                    );
                }
                (HostTensor { dtype: out.dtype, shape, data: c }, ex, bd, rho)
            }
            OpKind::Cast { input } => {
                let (x, sin) = get(*input)?;
                let data: Vec<f32> = if !is_fp8(out.dtype) && !is_fp8(x.dtype) {
                    // f32 → f16 rounds to nearest even; f16 → f32 is exact.
                    x.data.iter().map(|v| round(*v, out.dtype)).collect()
                } else if is_fp8(out.dtype) {
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
                // A cast stands for the same real number: the f64 value passes through, and the
                // bound grows by one rounding to the output format (relative, plus underflow
                // spacing at the output's scale).
                let name = &g.tensor(*input).name;
                let (u, sub) =
                    (unit_roundoff(out.dtype), underflow_error(out.dtype) * 2f64.powi(out.scale as i32));
                let ex = exact[name].clone();
                let fresh: Vec<f64> =
                    ex.iter().zip(&bound[name]).map(|(e, b)| u * (e.abs() + b) + sub).collect();
                let bd: Vec<f64> = bound[name].iter().zip(&fresh).map(|(b, f)| b + f).collect();
                let d = last(&x.shape);
                let rho =
                    row_bound[name].iter().zip(rows::from_elements(&fresh, d)).map(|(r, f)| r + f).collect();
                let rho = rows::clamp(rho, &bd, d);
                (t, ex, bd, rho)
            }
            OpKind::Gelu { input, form } => {
                let (x, _) = get(*input)?;
                let name = &g.tensor(*input).name;
                let (ein, bin) = (&exact[name], &bound[name]);
                let device: fn(f32) -> f32 = match form {
                    GeluForm::Tanh => gelu_device,
                    GeluForm::Erf => gelu_erf_device,
                };
                let f64_form: fn(f64) -> f64 = match form {
                    GeluForm::Tanh => gelu_f64,
                    GeluForm::Erf => gelu_erf_f64,
                };
                let data = x.data.iter().map(|v| device(*v)).collect();
                let ex: Vec<f64> = ein.iter().map(|v| f64_form(*v)).collect();
                // Per element: the slope bound over [x − b, x + b], the carried error, the fresh one.
                let parts: Vec<(f64, f64, f64)> = ex
                    .iter()
                    .zip(ein.iter().zip(bin))
                    .map(|(y, (x, b))| {
                        let (slope, carried) = gelu_carried(*form, *x, *b);
                        // The tanh formula's own f32 error is at most ~40 ulps of 1 in t (exp,
                        // divide and the constants), times 0.5|x|; the erf form's is A&S 7.1.26's
                        // 1.5e-7 in erf (0.75e-7 in Φ) plus ~40 f32 ulps of 1 in Φ, times |x|;
                        // then one f16 rounding.
                        let formula = match form {
                            GeluForm::Tanh => 0.5 * (x.abs() + b) * 64.0 * 2f64.powi(-24),
                            GeluForm::Erf => (x.abs() + b) * (0.75e-7 + 40.0 * 2f64.powi(-24)),
                        } + 8.0 * 2f64.powi(-24) * y.abs();
                        let fresh = formula
                            + unit_roundoff(DType::F16) * (y.abs() + carried + formula)
                            + underflow_error(DType::F16);
                        (slope, carried, fresh)
                    })
                    .collect();
                let bd: Vec<f64> = parts.iter().map(|(_, c, f)| c + f).collect();
                let d = last(&x.shape);
                let rho: Vec<f64> = row_bound[name]
                    .iter()
                    .zip(parts.chunks(d.max(1)))
                    .map(|(r, row)| {
                        let slope = row.iter().fold(0f64, |m, p| m.max(p.0));
                        slope * r + row.iter().map(|p| p.2 * p.2).sum::<f64>().sqrt()
                    })
                    .collect();
                let rho = rows::clamp(rho, &bd, d);
                (HostTensor { dtype: out.dtype, shape: x.shape.clone(), data }, ex, bd, rho)
            }
            OpKind::Map { input, func, exponent } => {
                let (x, _) = get(*input)?;
                let name = &g.tensor(*input).name;
                let (ein, bin) = (&exact[name], &bound[name]);
                let data = x.data.iter().map(|v| map::device(*func, *exponent, *v)).collect();
                let ex: Vec<f64> = ein.iter().map(|v| map::exact(*func, *exponent, *v)).collect();
                let bd: Vec<f64> = ex
                    .iter()
                    .zip(ein.iter().zip(bin))
                    .map(|(y, (x, b))| map::bound(*func, *exponent, *x, *b, *y))
                    .collect();
                let rho = rows::from_elements(&bd, last(&x.shape));
                (HostTensor { dtype: out.dtype, shape: x.shape.clone(), data }, ex, bd, rho)
            }
            OpKind::Binary { op, a, b } => {
                let ((x, _), (y, _)) = (get(*a)?, get(*b)?);
                let (na, nb) = (&g.tensor(*a).name, &g.tensor(*b).name);
                let (ea, eb, ba, bb) = (&exact[na], &exact[nb], &bound[na], &bound[nb]);
                let n = out.elements() as usize;
                let (ia, ib): (Vec<usize>, Vec<usize>) = (0..n)
                    .map(|i| {
                        (broadcast_index(&out.shape, &x.shape, i), broadcast_index(&out.shape, &y.shape, i))
                    })
                    .unzip();
                // The device computes in f32 and rounds once to f16 (`f16v4add`/`sub`/`mul`).
                let data =
                    (0..n).map(|i| round(op.apply(x.data[ia[i]], y.data[ib[i]]), DType::F16)).collect();
                let (u, sub) = (unit_roundoff(DType::F16), underflow_error(DType::F16));
                let ex: Vec<f64> = (0..n).map(|i| op.apply(ea[ia[i]], eb[ib[i]])).collect();
                let (carried, fresh): (Vec<f64>, Vec<f64>) = (0..n)
                    .map(|i| {
                        let (p, q, bp, bq) = (ea[ia[i]], eb[ib[i]], ba[ia[i]], bb[ib[i]]);
                        // Operand errors carried: |Δ(p ± q)| ≤ bp + bq; |Δ(pq)| ≤ |p|bq + |q|bp + bp·bq.
                        let carried = match op {
                            BinaryOp::Add | BinaryOp::Sub => bp + bq,
                            BinaryOp::Mul => p.abs() * bq + q.abs() * bp + bp * bq,
                        };
                        (carried, u * (ex[i].abs() + carried) + sub)
                    })
                    .unzip();
                let bd: Vec<f64> = carried.iter().zip(&fresh).map(|(c, f)| c + f).collect();
                let d = last(&out.shape);
                // Row bounds: an operand that varies along the last axis as the output does
                // brings its row's ρ; one broadcast along it (a column) √D times its element's
                // bound; times the other operand's largest magnitude for a product.
                let operand_rows = |shape: &[u64], idx: &[usize], name: &String| -> Vec<f64> {
                    let along = shape.len() > 0 && last(shape) == d && d > 1;
                    let dl = last(shape);
                    (0..rows::count(n, d))
                        .map(|r| {
                            if along {
                                row_bound[name][idx[r * d] / dl]
                            } else {
                                (d as f64).sqrt() * bound[name][idx[r * d]]
                            }
                        })
                        .collect()
                };
                let (ra, rb) = (operand_rows(&x.shape, &ia, na), operand_rows(&y.shape, &ib, nb));
                let rho: Vec<f64> = (0..rows::count(n, d))
                    .map(|r| {
                        let row = r * d..(r + 1) * d;
                        let fresh_norm = rows::norm(&fresh[row.clone()]);
                        match op {
                            BinaryOp::Add | BinaryOp::Sub => ra[r] + rb[r] + fresh_norm,
                            BinaryOp::Mul => {
                                let max_abs = |e: &[f64], bnd: &[f64], idx: &[usize]| {
                                    row.clone().map(|o| e[idx[o]].abs() + bnd[idx[o]]).fold(0f64, f64::max)
                                };
                                let max_a = row.clone().map(|o| ea[ia[o]].abs()).fold(0f64, f64::max);
                                max_a * rb[r] + max_abs(eb, bb, &ib) * ra[r] + fresh_norm
                            }
                        }
                    })
                    .collect();
                let rho = rows::clamp(rho, &bd, d);
                (HostTensor { dtype: out.dtype, shape: out.shape.clone(), data }, ex, bd, rho)
            }
            OpKind::LayerNorm { input, gamma, beta, eps } => {
                let (x, _) = get(*input)?;
                let d = *x.shape.last().unwrap_or(&1) as usize;
                let g_dev = gamma.map(get).transpose()?.map(|(t, _)| t.data.as_slice());
                let b_dev = beta.map(get).transpose()?.map(|(t, _)| t.data.as_slice());
                // Rows over `tm` tiles as `plan::rows` splits them; a tile that shares its rows
                // among the six workers (`plan::rows::share_rows`) sums in six parts.
                let rows_total = (x.data.len() / d.max(1)) as u64;
                let tm = grids.get(i).map_or(1, |g| g[0] as u64).max(1);
                let split = ipu_core::plan::matmul::split;
                let parts = move |r: usize| {
                    // The tile holding row r: the first whose range ends after it (binary search).
                    let (mut lo, mut hi) = (0, tm - 1);
                    while lo < hi {
                        let mid = (lo + hi) / 2;
                        if split(rows_total, tm, mid).1 > r as u64 {
                            hi = mid;
                        } else {
                            lo = mid + 1;
                        }
                    }
                    let (r0, r1) = split(rows_total, tm, lo);
                    if ipu_core::plan::rows::share_rows(r1 - r0, d as u64) {
                        ipu_core::target::WORKERS as u64
                    } else {
                        1
                    }
                };
                let data = layernorm::device(&x.data, d, g_dev, b_dev, *eps, &parts);
                let name = |t: ipu_core::graph::TensorId| g.tensor(t).name.clone();
                let affine = |t: Option<ipu_core::graph::TensorId>| layernorm::Affine {
                    exact: t.map(|t| exact[&name(t)].as_slice()),
                    bound: t.map(|t| bound[&name(t)].as_slice()),
                };
                let n = name(*input);
                let (ex, bd, rho) = layernorm::exact(
                    &exact[&n],
                    &bound[&n],
                    &row_bound[&n],
                    d,
                    affine(*gamma),
                    affine(*beta),
                    *eps,
                );
                (HostTensor { dtype: out.dtype, shape: x.shape.clone(), data }, ex, bd, rho)
            }
            OpKind::Reshape { input } => {
                let (x, _) = get(*input)?;
                let n = &g.tensor(*input).name;
                let t = HostTensor { dtype: out.dtype, shape: out.shape.clone(), data: x.data.clone() };
                let rho = rows::view(&[], last(&x.shape), last(&out.shape), &row_bound[n], &bound[n]);
                (t, exact[n].clone(), bound[n].clone(), rho)
            }
            OpKind::Slice { input, starts } => {
                let (x, _) = get(*input)?;
                let n = &g.tensor(*input).name;
                let from = slice_index(&x.shape, starts, &out.shape);
                let pick = |v: &[f64]| from.iter().map(|&i| v[i]).collect::<Vec<f64>>();
                let data = from.iter().map(|&i| x.data[i]).collect();
                let t = HostTensor { dtype: out.dtype, shape: out.shape.clone(), data };
                let bd = pick(&bound[n]);
                let rho = rows::view(&from, last(&x.shape), last(&out.shape), &row_bound[n], &bd);
                (t, pick(&exact[n]), bd, rho)
            }
            OpKind::Transpose { input, perm } => {
                let (x, _) = get(*input)?;
                let n = &g.tensor(*input).name;
                let from = transpose_index(&x.shape, perm);
                let pick = |v: &[f64]| from.iter().map(|&i| v[i]).collect::<Vec<f64>>();
                let data = from.iter().map(|&i| x.data[i]).collect();
                let t = HostTensor { dtype: out.dtype, shape: out.shape.clone(), data };
                let bd = pick(&bound[n]);
                let rho = rows::view(&from, last(&x.shape), last(&out.shape), &row_bound[n], &bd);
                (t, pick(&exact[n]), bd, rho)
            }
            OpKind::Softmax { input } => {
                let (x, _) = get(*input)?;
                let data = softmax_device(x);
                let name = &g.tensor(*input).name;
                let n = *x.shape.last().unwrap() as usize;
                let (ex, bd, rho) = softmax_exact(&exact[name], &bound[name], &row_bound[name], n, out.dtype);
                (HostTensor { dtype: out.dtype, shape: x.shape.clone(), data }, ex, bd, rho)
            }
        };
        exact.insert(out.name.clone(), ex);
        bound.insert(out.name.clone(), bd);
        row_bound.insert(out.name.clone(), rho);
        vals.insert(out.name.clone(), value);
    }
    Ok(Evaluated { device: vals, exact, bound })
}

/// GeLU's carried error for an input within `b` of the exact `x`: `|g(x̂) − g(x)| ≤
/// |g'(x)|·b + ½·M₂·b²` with `M₂ = sup|g''| ≤ 0.8` (0.7979 = 2φ(0), at 0, for either form), and
/// never more than the global slope 1.13 (sup |g'| = 1.1290) times b. Returns the slope bound
/// over `[x − b, x + b]` (for the row norm) and the carried error.
fn gelu_carried(form: GeluForm, x: f64, b: f64) -> (f64, f64) {
    const M2: f64 = 0.8;
    const LIP: f64 = 1.13;
    let slope = match form {
        GeluForm::Erf => {
            let phi = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
            0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)) + x * phi
        }
        GeluForm::Tanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let t = (c * (x + 0.044715 * x * x * x)).tanh();
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x)
        }
    };
    // 1 + 1e-9: the f64 evaluation of g'.
    let local = slope.abs() * (1.0 + 1e-9) + 1e-15;
    ((local + M2 * b).min(LIP), (local * b + 0.5 * M2 * b * b).min(LIP * b))
}

/// For each element of the box `starts .. starts + out` of a tensor of `shape` (row-major), its
/// flat index in the tensor.
fn slice_index(shape: &[u64], starts: &[u64], out: &[u64]) -> Vec<usize> {
    let total: u64 = out.iter().product();
    (0..total)
        .map(|mut e| {
            let (mut src, mut stride) = (0u64, 1u64);
            for k in (0..out.len()).rev() {
                src += (e % out[k] + starts[k]) * stride;
                e /= out[k];
                stride *= shape[k];
            }
            src as usize
        })
        .collect()
}

/// f64 softmax of each row, per element a bound on |device − f64| and per row one on the norm
/// of the row's error (docs/reliability.md "The verdict", softmax). With input errors
/// `|Δx_l| ≤ b_l` (row norm ≤ ρ), `p̂_j/p_j = e^{Δx_j}/Σ_l p_l e^{Δx_l}` exactly, and
/// `|ln Σ_l p_l e^{Δx_l}| ≤ L = min(ln Σ_l p_l e^{b_l}, m + ½e^{max b}·Σ_l p_l b_l²)`,
/// `m = min(Σ p_l b_l, ‖p‖·ρ)` (Jensen below, `e^t ≤ 1 + t + ½t²e^{|t|}` above), so each
/// probability moves by a factor within `e^{±(b_j + L)}`: its own input's error plus the
/// p-weighted mean of the row's. The device's f32 arithmetic: `x − max` rounded (relative error
/// of the exponential `e^{u·|x − max|} − 1`), `expf` within 2 u, the two-lane sum `γ(n/2 + 3)`,
/// the reciprocal and the product; then one rounding to the output type.
fn softmax_exact(e: &[f64], d: &[f64], rho: &[f64], n: usize, out: DType) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let u32r = unit_roundoff(DType::F32);
    let (u, sub) = (unit_roundoff(out), underflow_error(out));
    let g_sum = gamma(n as u64 / 2 + 3, u32r);
    let rows: Vec<(Vec<f64>, Vec<f64>, f64)> = e
        .par_chunks(n)
        .zip(d.par_chunks(n))
        .zip(rho.par_iter())
        .map(|((row, drow), &rho)| {
            let mx = row.iter().fold(f64::NEG_INFINITY, |m, v| m.max(*v));
            let s: f64 = row.iter().map(|v| (v - mx).exp()).sum();
            let p: Vec<f64> = row.iter().map(|v| (v - mx).exp() / s).collect();
            let b_max = drow.iter().fold(0f64, |m, v| m.max(*v));
            let rho = rho.min(rows::norm(drow));
            let l1 = p.iter().zip(drow).map(|(p, b)| p * b.exp()).sum::<f64>().ln();
            let pb: f64 = p.iter().zip(drow).map(|(p, b)| p * b).sum();
            let pb2: f64 = p.iter().zip(drow).map(|(p, b)| p * b * b).sum();
            let m = pb.min(rows::norm(&p) * rho);
            let l = l1.min(m + 0.5 * b_max.exp() * pb2);
            // Relative error of each exponential the device sums, and of the sum.
            let theta: Vec<f64> = row
                .iter()
                .zip(drow)
                .map(|(x, b)| (u32r * ((x - mx).abs() + b + b_max)).exp_m1() + 2.0 * u32r)
                .collect();
            let theta_mean: f64 =
                p.iter().zip(drow).zip(&theta).map(|((p, b), t)| p * (b + l).exp() * t).sum();
            let theta_s = g_sum * (1.0 + theta_mean) + theta_mean;
            let mut bounds = Vec::with_capacity(n);
            for j in 0..n {
                let psi = (1.0 + theta[j]) * (1.0 + u32r).powi(2) / (1.0 - theta_s) - 1.0;
                let carried = p[j] * ((drow[j] + l).exp() * (1.0 + psi) - 1.0);
                bounds.push(carried + u * (p[j] + carried) + sub);
            }
            let r = rows::norm(&bounds);
            (p, bounds, r)
        })
        .collect();
    let mut ex = Vec::with_capacity(e.len());
    let mut bd = Vec::with_capacity(e.len());
    let mut rs = Vec::with_capacity(rows.len());
    for (p, b, r) in rows {
        ex.extend(p);
        bd.extend(b);
        rs.push(r);
    }
    (ex, bd, rs)
}
