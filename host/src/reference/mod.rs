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
mod bounds;
mod cov;
mod gemm64;
mod layernorm;
pub mod map;
mod matmul;
mod matmul_bound;
mod rows;
pub use bounds::LAMBDA;
use bounds::{half_ulp, Bounds, Elem, Parts};
pub use matmul::{matmul_device, matmul_device_scalar, round_f16, MatMulArgs};
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
    /// rounding points and the bounds of its operands (docs/reliability.md "The verdict"): the
    /// smaller of the rigorous bound and the probabilistic one.
    pub bound: BTreeMap<String, Vec<f64>>,
    /// Per element, the rigorous bound alone (never smaller than `bound`).
    pub rigorous: BTreeMap<String, Vec<f64>>,
    /// Elements (of every tensor) whose bound came from the probabilistic branch: every bound
    /// of the run holds with probability at least `1 − events·2·exp(−λ²/2)` under its model.
    pub events: u64,
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
    let mut all: BTreeMap<String, Bounds> = BTreeMap::new();
    let last = |shape: &[u64]| shape.last().copied().unwrap_or(1) as usize;
    for (name, t) in inputs {
        // FP8 sources (params) stand for code · 2^scale.
        let scale = g.find(name).map(|id| g.tensor(id).scale).unwrap_or(0);
        exact.insert(name.clone(), (0..t.data.len()).map(|i| real(t, scale, i)).collect());
        all.insert(name.clone(), Bounds::exact(t.data.len(), last(&t.shape)));
    }
    // The last op that reads each tensor: its covariance matrices are dropped after it (they are
    // the large part of the bounds; the per-element bounds stay).
    let mut last_use: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, op) in g.ops.iter().enumerate() {
        for t in op.kind.operands() {
            last_use.insert(&g.tensor(t).name, i);
        }
    }
    for (i, op) in g.ops.iter().enumerate() {
        let out = g.tensor(op.output);
        let get = |id| {
            let t = g.tensor(id);
            vals.get(&t.name).map(|v| (v, t.scale)).ok_or(format!("op {i}: no value for `{}`", t.name))
        };
        let (value, ex, bd): (HostTensor, Vec<f64>, Bounds) = match &op.kind {
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
                    let (ea, ba) = (&exact[&ta.name], &all[&ta.name]);
                    let ex: Vec<f64> = ea.iter().map(|e| al * e).collect();
                    let parts: Vec<Elem> = (0..ea.len())
                        .map(|e| {
                            // f16(f32(a·alpha)): the product's f32 rounding, then f16's.
                            let h = |b: f64| {
                                let y = al.abs() * (ea[e].abs() + b);
                                let h32 = half_ulp(DType::F32, 0, y);
                                (h32, half_ulp(DType::F16, 0, y + h32))
                            };
                            let ((h32, h16), (p32, p16)) = (h(ba.b[e]), h(ba.comb[e]));
                            Elem {
                                slope: al.abs(),
                                slope_r: al.abs(),
                                carried: al.abs() * ba.b[e],
                                fresh: h32 + h16,
                                rand: p16,
                                det: p32,
                            }
                        })
                        .collect();
                    let bounds = bounds::elementwise(ba, &parts, last(&ta.shape));
                    (HostTensor { dtype: at.dtype, shape: at.shape.clone(), data }, ex, bounds)
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
                    Some(s) => Operand { exact: &s.1, bounds: &s.2 },
                    None => Operand { exact: &exact[&ta.name], bounds: &all[&ta.name] },
                };
                let b_op = Operand { exact: &exact[&tb.name], bounds: &all[&tb.name] };
                let rounding = Rounding {
                    acc: *accumulate,
                    block: if is_fp8(ta.dtype) { 32 } else { 16 },
                    tk,
                    rounds,
                    alpha: alpha.map(|a| a as f64),
                };
                let (ex, mut bd) = matmul_exact(&layout, a_op, b_op, c.len() as u64, &rounding);
                let mut c = c;
                if out.dtype != *accumulate {
                    // f16 output of an f32 accumulation: one rounding of the finished sum.
                    c.iter_mut().for_each(|v| *v = round(*v, out.dtype));
                    bd = bounds::elementwise(&bd, &rounding_parts(&ex, &bd, out.dtype, 0), n as usize);
                }
                (HostTensor { dtype: out.dtype, shape, data: c }, ex, bd)
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
                let ex = exact[name].clone();
                let parts = rounding_parts(&ex, &all[name], out.dtype, out.scale);
                let bd = bounds::elementwise(&all[name], &parts, last(&x.shape));
                (t, ex, bd)
            }
            OpKind::Gelu { input, form } => {
                let (x, _) = get(*input)?;
                let name = &g.tensor(*input).name;
                let (ein, bin) = (&exact[name], &all[name]);
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
                let parts: Vec<Elem> = (0..ex.len())
                    .map(|e| {
                        let (y, x, b, c) = (ex[e], ein[e], bin.b[e], bin.comb[e]);
                        let (slope_r, carried) = gelu_carried(*form, x, b);
                        let (_, carried_c) = gelu_carried(*form, x, c);
                        let slope = gelu_carried(*form, x, 0.0).0;
                        // The tanh formula's own f32 error is at most ~40 ulps of 1 in t (exp,
                        // divide and the constants), times 0.5|x|; the erf form's is A&S 7.1.26's
                        // 1.5e-7 in erf (0.75e-7 in Φ) plus ~40 f32 ulps of 1 in Φ, times |x|;
                        // then one f16 rounding.
                        let formula = |b: f64| {
                            let f = match form {
                                GeluForm::Tanh => 0.5 * (x.abs() + b) * 64.0 * 2f64.powi(-24),
                                GeluForm::Erf => (x.abs() + b) * (0.75e-7 + 40.0 * 2f64.powi(-24)),
                            };
                            f + 8.0 * 2f64.powi(-24) * y.abs()
                        };
                        let h = half_ulp(DType::F16, 0, y.abs() + carried + formula(b));
                        let rand = half_ulp(DType::F16, 0, y.abs() + carried_c + formula(c));
                        // Linearisation remainder ½·M₂·c² (M₂ = sup|g''| ≤ 0.8).
                        let det = (0.4 * c * c).min(carried_c + slope * c) + formula(c);
                        Elem { slope, slope_r, carried, fresh: formula(b) + h, rand, det }
                    })
                    .collect();
                let bd = bounds::elementwise(bin, &parts, last(&x.shape));
                (HostTensor { dtype: out.dtype, shape: x.shape.clone(), data }, ex, bd)
            }
            OpKind::Map { input, func, exponent } => {
                let (x, _) = get(*input)?;
                let name = &g.tensor(*input).name;
                let (ein, bin) = (&exact[name], &all[name]);
                let data = x.data.iter().map(|v| map::device(*func, *exponent, *v)).collect();
                let ex: Vec<f64> = ein.iter().map(|v| map::exact(*func, *exponent, *v)).collect();
                let parts: Vec<Elem> = (0..ex.len())
                    .map(|e| {
                        let (y, x, b, c) = (ex[e], ein[e], bin.b[e], bin.comb[e]);
                        let total = map::bound(*func, *exponent, x, b, y);
                        let slope = map::slope(*func, *exponent, x);
                        let rem = map::remainder(*func, *exponent, x, c);
                        let carried_c = map::carried(*func, *exponent, x, c, y);
                        let prob = slope.is_finite()
                            && rem.is_finite()
                            && carried_c.is_finite()
                            && total.is_finite();
                        // Row norms from the elements (slope_r unknown); where the probabilistic
                        // branch has no slope or remainder, its deterministic part is the
                        // rigorous bound.
                        let (slope, rand, det) = if prob {
                            let rem = rem.min(carried_c + slope * c);
                            let f = map::formula_error(*func, *exponent, x, y);
                            (slope, half_ulp(DType::F16, 0, y.abs() + carried_c + f), rem + f)
                        } else {
                            (0.0, 0.0, total)
                        };
                        // The whole rigorous bound as the op's own part: with no slope bound
                        // the row norm is then the elements' (`√Σ b²`), the input's row norm
                        // only where it is zero.
                        Elem { slope, slope_r: f64::INFINITY, carried: 0.0, fresh: total, rand, det }
                    })
                    .collect();
                let bd = bounds::elementwise(bin, &parts, last(&x.shape));
                (HostTensor { dtype: out.dtype, shape: x.shape.clone(), data }, ex, bd)
            }
            OpKind::Binary { op, a, b } => {
                let ((x, _), (y, _)) = (get(*a)?, get(*b)?);
                let (na, nb) = (&g.tensor(*a).name, &g.tensor(*b).name);
                let (ea, eb, ba, bb) = (&exact[na], &exact[nb], &all[na], &all[nb]);
                let n = out.elements() as usize;
                let (ia, ib): (Vec<usize>, Vec<usize>) = (0..n)
                    .map(|i| {
                        (broadcast_index(&out.shape, &x.shape, i), broadcast_index(&out.shape, &y.shape, i))
                    })
                    .unzip();
                // The device computes in f32 and rounds once to f16 (`f16v4add`/`sub`/`mul`).
                let data =
                    (0..n).map(|i| round(op.apply(x.data[ia[i]], y.data[ib[i]]), DType::F16)).collect();
                let ex: Vec<f64> = (0..n).map(|i| op.apply(ea[ia[i]], eb[ib[i]])).collect();
                let d = last(&out.shape);
                let bd = binary_bounds(*op, [(ea, ba, &ia, &x.shape), (eb, bb, &ib, &y.shape)], &ex, d);
                (HostTensor { dtype: out.dtype, shape: out.shape.clone(), data }, ex, bd)
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
                    bound: t.map(|t| all[&name(t)].b.as_slice()),
                };
                let n = name(*input);
                let (ex, bd) = layernorm::exact(&exact[&n], &all[&n], d, affine(*gamma), affine(*beta), *eps);
                (HostTensor { dtype: out.dtype, shape: x.shape.clone(), data }, ex, bd)
            }
            OpKind::Reshape { input } => {
                let (x, _) = get(*input)?;
                let n = &g.tensor(*input).name;
                let t = HostTensor { dtype: out.dtype, shape: out.shape.clone(), data: x.data.clone() };
                let bd = all[n].view(&[], last(&x.shape), last(&out.shape));
                (t, exact[n].clone(), bd)
            }
            OpKind::Slice { input, starts } => {
                let (x, _) = get(*input)?;
                let n = &g.tensor(*input).name;
                let from = slice_index(&x.shape, starts, &out.shape);
                let data = from.iter().map(|&i| x.data[i]).collect();
                let t = HostTensor { dtype: out.dtype, shape: out.shape.clone(), data };
                let bd = all[n].view(&from, last(&x.shape), last(&out.shape));
                (t, from.iter().map(|&i| exact[n][i]).collect(), bd)
            }
            OpKind::Transpose { input, perm } => {
                let (x, _) = get(*input)?;
                let n = &g.tensor(*input).name;
                let from = transpose_index(&x.shape, perm);
                let data = from.iter().map(|&i| x.data[i]).collect();
                let t = HostTensor { dtype: out.dtype, shape: out.shape.clone(), data };
                let mut bd = all[n].view(&from, last(&x.shape), last(&out.shape));
                // Swapping the last two axes makes row vectors column vectors and back: the same
                // covariance matrices, enumerated the same way.
                let r = perm.len();
                let swap = r >= 2
                    && perm[r - 1] == r - 2
                    && perm[r - 2] == r - 1
                    && (0..r - 2).all(|a| perm[a] == a);
                if swap {
                    let relabel = |c: &cov::Cov| cov::Cov {
                        rows: !c.rows,
                        d: c.d,
                        last: if c.rows { x.shape[r - 2] as usize } else { c.d },
                        m: c.m.clone(),
                    };
                    bd.cov = all[n].cov.as_ref().map(relabel);
                    if let Some(q) = &all[n].q {
                        // The view above folded the ellipsoid (rows gather from many rows):
                        // keep it relabelled instead, with the box of the input.
                        let unfolded = Bounds { q: None, ..all[n].clone() }.view(
                            &from,
                            last(&x.shape),
                            last(&out.shape),
                        );
                        bd.det = unfolded.det;
                        bd.dr = unfolded.dr;
                        bd = bd.with_q(Some(relabel(q)));
                    }
                }
                (t, from.iter().map(|&i| exact[n][i]).collect(), bd)
            }
            OpKind::Softmax { input } => {
                let (x, _) = get(*input)?;
                let data = softmax_device(x);
                let name = &g.tensor(*input).name;
                let n = *x.shape.last().unwrap() as usize;
                let (ex, bd) = softmax_exact(&exact[name], &all[name], n, out.dtype);
                (HostTensor { dtype: out.dtype, shape: x.shape.clone(), data }, ex, bd)
            }
        };
        exact.insert(out.name.clone(), ex);
        all.insert(out.name.clone(), bd);
        vals.insert(out.name.clone(), value);
        for t in op.kind.operands() {
            let name = &g.tensor(t).name;
            if last_use.get(name.as_str()) == Some(&i) {
                if let Some(b) = all.get_mut(name) {
                    // Only the bounds `evaluate` returns stay.
                    *b = Bounds {
                        b: std::mem::take(&mut b.b),
                        comb: std::mem::take(&mut b.comb),
                        ..Bounds::default()
                    };
                }
            }
        }
    }
    let events = g.ops.iter().map(|op| all[&g.tensor(op.output).name].events()).sum();
    let rigorous = all.iter().map(|(k, v)| (k.clone(), v.b.clone())).collect();
    let bound = all.into_iter().map(|(k, v)| (k, v.comb)).collect();
    Ok(Evaluated { device: vals, exact, bound, rigorous, events })
}

/// One rounding to a format (`dtype`, FP8 `scale`) of values whose exact values are `ex`: at
/// most half an ulp at the magnitude the value can have, a random source in the probabilistic
/// branch.
fn rounding_parts(ex: &[f64], input: &Bounds, dtype: DType, scale: i8) -> Vec<Elem> {
    (0..ex.len())
        .map(|e| {
            let h = half_ulp(dtype, scale, ex[e].abs() + input.b[e]);
            let rand = half_ulp(dtype, scale, ex[e].abs() + input.comb[e]);
            Elem { slope: 1.0, slope_r: 1.0, carried: input.b[e], fresh: h, rand, det: 0.0 }
        })
        .collect()
}

/// Bounds of `a ± b` or `a·b` with broadcasting (`idx`: each output element's operand element),
/// computed in f32 and rounded once to f16. Rigorous: `|Δ(p ± q)| ≤ bp + bq`,
/// `|Δ(pq)| ≤ |p|bq + |q|bp + bp·bq`; row norms from the operands' rows where they vary along
/// the last axis as the output does, else (a column broadcast along it) √D times the element's.
/// Probabilistic: the random parts add (the operands may share sources: triangle inequality;
/// an operand's own sources stay its element's own only when the other operand is exact and
/// the operand is not broadcast), the product's first-order parts scale by the other operand's
/// value, `Δp·Δq` is deterministic.
/// One operand of a binary op: f64 values, bounds, the operand element of each output
/// element, the operand's shape.
type BinaryOperand<'a> = (&'a Vec<f64>, &'a Bounds, &'a Vec<usize>, &'a Vec<u64>);

fn binary_bounds(op: BinaryOp, operands: [BinaryOperand<'_>; 2], ex: &[f64], d: usize) -> Bounds {
    let [(ea, ba, ia, sa), (eb, bb, ib, sb)] = operands;
    let n = ex.len();
    let whole = |shape: &[u64]| shape.iter().product::<u64>() as usize == n;
    // The operands' ellipsoids move where each output element reads one element of the random
    // operand(s) in the same layout; otherwise they are folded into the box first.
    let q_path = (bb.is_exact() && whole(sa))
        || (ba.is_exact() && whole(sb))
        || (whole(sa) && whole(sb) && ba.row_q(d).is_some() && bb.row_q(d).is_some());
    let (fa, fb);
    let (ba, bb) = if q_path {
        (ba, bb)
    } else {
        fa = ba.folded();
        fb = bb.folded();
        (&fa, &fb)
    };
    // Whether each operand's own sources stay one output element's own.
    let own = [whole(sa) && bb.is_exact(), whole(sb) && ba.is_exact()];
    let mul = op == BinaryOp::Mul;
    let (mut b, mut sd, mut dg, mut det, mut fresh, mut new_det) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for i in 0..n {
        let (p, q) = (ea[ia[i]], eb[ib[i]]);
        let (bp, bq, cp, cq) = (ba.b[ia[i]], bb.b[ib[i]], ba.comb[ia[i]], bb.comb[ib[i]]);
        // First-order scale of each operand's error: 1, or the other operand's value.
        let (wa, wb) = if mul { (q.abs(), p.abs()) } else { (1.0, 1.0) };
        let carried = if mul { p.abs() * bq + q.abs() * bp + bp * bq } else { bp + bq };
        let carried_c = if mul { p.abs() * cq + q.abs() * cp + cp * cq } else { cp + cq };
        let h = half_ulp(DType::F16, 0, ex[i].abs() + carried);
        b.push(carried + h);
        fresh.push(h);
        let (ga, gb) = (wa * ba.dg[ia[i]], wb * bb.dg[ib[i]]);
        let mut s = wa * ba.sd[ia[i]] + wb * bb.sd[ib[i]];
        let mut g = half_ulp(DType::F16, 0, ex[i].abs() + carried_c.min(carried));
        for (keep, x) in [(own[0], ga), (own[1], gb)] {
            if keep {
                g = g.hypot(x);
            } else {
                s += x;
            }
        }
        sd.push(s);
        dg.push(g);
        let nd = if mul { cp * cq } else { 0.0 };
        new_det.push(nd);
        det.push(wa * ba.det[ia[i]] + wb * bb.det[ib[i]] + nd);
    }
    // Per output row, each operand's row bound: its own row where it varies along the last axis
    // as the output does, else √D times its element's.
    let operand_rows = |shape: &[u64], idx: &[usize], rows: &[f64], elems: &[f64]| -> Vec<f64> {
        let dl = shape.last().copied().unwrap_or(1) as usize;
        let along = !shape.is_empty() && dl == d && d > 1;
        (0..rows::count(n, d))
            .map(|r| if along { rows[idx[r * d] / dl] } else { (d as f64).sqrt() * elems[idx[r * d]] })
            .collect()
    };
    let row_max =
        |v: &[f64], idx: &[usize], r: usize| (r * d..(r + 1) * d).map(|o| v[idx[o]]).fold(0f64, f64::max);
    let (ra, rb) = (operand_rows(sa, ia, &ba.rho, &ba.b), operand_rows(sb, ib, &bb.rho, &bb.b));
    let (va, vb) = (operand_rows(sa, ia, &ba.sv, &ba.sd), operand_rows(sb, ib, &bb.sv, &bb.sd));
    let (da, db) = (operand_rows(sa, ia, &ba.dr, &ba.det), operand_rows(sb, ib, &bb.dr, &bb.det));
    let (ga, gb) = (
        operand_rows(sa, ia, &ba.dg_max(last_dim(sa)), &ba.dg),
        operand_rows(sb, ib, &bb.dg_max(last_dim(sb)), &bb.dg),
    );
    let abs_a: Vec<f64> = ea.iter().map(|x| x.abs()).collect();
    let abs_b: Vec<f64> = eb.iter().map(|x| x.abs()).collect();
    let mag_b: Vec<f64> = eb.iter().zip(&bb.b).map(|(x, b)| x.abs() + b).collect();
    let mut rho = Vec::new();
    let mut sv = Vec::new();
    let mut dr = Vec::new();
    for r in 0..rows::count(n, d) {
        let row = r * d..(r + 1) * d;
        let fresh_norm = rows::norm(&fresh[row.clone()]);
        let new_det_norm = rows::norm(&new_det[row.clone()]);
        // Largest first-order scale of each operand over the row.
        let (wa, wb, wa_r) = if mul {
            (row_max(&abs_b, ib, r), row_max(&abs_a, ia, r), row_max(&mag_b, ib, r))
        } else {
            (1.0, 1.0, 1.0)
        };
        rho.push(wa_r * ra[r] + wb * rb[r] + fresh_norm);
        // The operands' own sources that become shared join the shared part's covariance.
        let shared_dg = |keep: bool, g: f64| if keep { 0.0 } else { g };
        sv.push(wa * (va[r] + shared_dg(own[0], ga[r])) + wb * (vb[r] + shared_dg(own[1], gb[r])));
        dr.push(wa * da[r] + wb * db[r] + new_det_norm);
    }
    // Covariances, where each operand is whole (not broadcast): scaled by the first-order
    // factor; with both random, the operands' own parts join and the sum's cross-covariance is
    // unknown.
    let other_a: Vec<f64> = (0..n).map(|i| ea[ia[i]]).collect();
    let other_b: Vec<f64> = (0..n).map(|i| eb[ib[i]]).collect();
    let scale = |e: &[f64]| -> Vec<f64> {
        if mul {
            (0..n).map(|i| e[i].abs()).collect()
        } else {
            vec![1.0; n]
        }
    };
    let c = if bb.is_exact() && whole(sa) {
        // The exact operand's values at each output element.
        let other: Vec<f64> = (0..n).map(|i| eb[ib[i]]).collect();
        ba.row_cov(d).or(ba.cov.clone()).map(|c| c.scaled(&scale(&other)))
    } else if ba.is_exact() && whole(sb) {
        let other: Vec<f64> = (0..n).map(|i| ea[ia[i]]).collect();
        bb.row_cov(d).or(bb.cov.clone()).map(|c| c.scaled(&scale(&other)))
    } else if !(whole(sa) && whole(sb)) {
        None
    } else {
        match (ba.row_cov(d), bb.row_cov(d)) {
            (Some(mut ca), Some(mut cb)) => {
                ca.add_diagonal(&ba.dg);
                cb.add_diagonal(&bb.dg);
                let other_b: Vec<f64> = (0..n).map(|i| eb[ib[i]]).collect();
                let other_a: Vec<f64> = (0..n).map(|i| ea[ia[i]]).collect();
                let (ca, cb) = (ca.scaled(&scale(&other_b)), cb.scaled(&scale(&other_a)));
                let m =
                    ca.m.chunks(d * d)
                        .zip(cb.m.chunks(d * d))
                        .flat_map(|(x, y)| cov::sum_unknown(x, y, d))
                        .collect();
                Some(cov::Cov { m, ..ca })
            }
            _ => None,
        }
    };
    let q = if !q_path {
        None
    } else if bb.is_exact() && whole(sa) {
        ba.q.as_ref().map(|q| q.scaled(&scale(&other_b)))
    } else if ba.is_exact() && whole(sb) {
        bb.q.as_ref().map(|q| q.scaled(&scale(&other_a)))
    } else {
        match (ba.row_q(d), bb.row_q(d)) {
            (Some(qa), Some(qb)) => {
                let (qa, qb) = (qa.scaled(&scale(&other_b)), qb.scaled(&scale(&other_a)));
                let m =
                    qa.m.chunks(d * d)
                        .zip(qb.m.chunks(d * d))
                        .flat_map(|(x, y)| cov::sum_unknown(x, y, d))
                        .collect();
                Some(cov::Cov { m, ..qa })
            }
            _ => None,
        }
    };
    Bounds::new(Parts { b, rho, sd, dg, sv, det, dr }, d).with_cov(c, d).with_q(q)
}

/// The last axis of a shape (1 for a scalar).
fn last_dim(shape: &[u64]) -> usize {
    shape.last().copied().unwrap_or(1) as usize
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

/// f64 softmax of each row and its bounds (docs/reliability.md "The verdict", softmax). With
/// input errors `|Δx_l| ≤ b_l` (row norm ≤ ρ), `p̂_j/p_j = e^{φ_j}`, `φ_j = Δx_j − ln Σ_l p_l e^{Δx_l}`
/// exactly, and `|ln Σ_l p_l e^{Δx_l}| ≤ L = min(ln Σ_l p_l e^{b_l}, m + ½e^{max b}·Σ_l p_l b_l²)`,
/// `m = min(Σ p_l b_l, ‖p‖·ρ)` (Jensen below, `e^t ≤ 1 + t + ½t²e^{|t|}` above), so each
/// probability moves by a factor within `e^{±(b_j + L)}`: its own input's error plus the
/// p-weighted mean of the row's. The device's f32 arithmetic: `x − max` rounded (relative error
/// of the exponential `e^{u·|x − max|} − 1`), `expf` within 2 u, the two-lane sum `γ(n/2 + 3)`,
/// the reciprocal and the product; then one rounding to the output type.
///
/// Probabilistic branch: the linear part `p_j(Δx_j − p·Δx)` (`J = diag(p) − ppᵀ`,
/// `‖J‖₂ ≤ max p`, row j of norm `p_j√(1 − 2p_j + ‖p‖²)`) maps the random part; the remainder
/// `p_j((e^φ − 1 − φ) + (φ − φ_lin))` is at most `p_j(½Φ_j²e^{Φ_j} + ½e^{max B}Σ p_l B_l²)`,
/// `Φ_j = B_j + L(B)` with the combined bounds B.
fn softmax_exact(e: &[f64], input: &bounds::Bounds, n: usize, out: DType) -> (Vec<f64>, bounds::Bounds) {
    let u32r = unit_roundoff(DType::F32);
    let g_sum = gamma(n as u64 / 2 + 3, u32r);
    let folded;
    let input = if input.q.is_some() && input.row_q(n).is_none() {
        folded = input.folded();
        &folded
    } else {
        input
    };
    let qin = input.row_q(n);
    // Per row: values, [b, sd, dg, det], [ρ, sv, dr], the scale of the directed remainder −s·p.
    type Row = (Vec<f64>, [Vec<f64>; 4], [f64; 3], f64);
    let rows_out: Vec<Row> = (0..e.len() / n.max(1))
        .into_par_iter()
        .map(|r| {
            let range = r * n..(r + 1) * n;
            let (row, drow, crow) = (&e[range.clone()], &input.b[range.clone()], &input.comb[range.clone()]);
            let (sd_in, dg_in, det_in) =
                (&input.sd[range.clone()], &input.dg[range.clone()], &input.det[range.clone()]);
            let mx = row.iter().fold(f64::NEG_INFINITY, |m, v| m.max(*v));
            let s: f64 = row.iter().map(|v| (v - mx).exp()).sum();
            let p: Vec<f64> = row.iter().map(|v| (v - mx).exp() / s).collect();
            let p_norm = rows::norm(&p);
            // L for a set of input bounds (rigorous b or combined B).
            let ell = |bd: &[f64], rho: f64| {
                let b_max = bd.iter().fold(0f64, |m, v| m.max(*v));
                let rho = rho.min(rows::norm(bd));
                let l1 = p.iter().zip(bd).map(|(p, b)| p * b.exp()).sum::<f64>().ln();
                let pb: f64 = p.iter().zip(bd).map(|(p, b)| p * b).sum();
                let pb2: f64 = p.iter().zip(bd).map(|(p, b)| p * b * b).sum();
                (l1.min(pb.min(p_norm * rho) + 0.5 * b_max.exp() * pb2), b_max, pb2)
            };
            let (l, b_max, _) = ell(drow, input.rho[r]);
            let (lc, c_max, pc2) = ell(crow, input.rho[r]);
            // Relative error of each exponential the device sums, and of the sum (with each set
            // of input bounds).
            let f32_rel = |bd: &[f64], b_max: f64, l: f64| -> (Vec<f64>, f64) {
                let theta: Vec<f64> = row
                    .iter()
                    .zip(bd)
                    .map(|(x, b)| (u32r * ((x - mx).abs() + b + b_max)).exp_m1() + 2.0 * u32r)
                    .collect();
                let theta_mean: f64 =
                    p.iter().zip(bd).zip(&theta).map(|((p, b), t)| p * (b + l).exp() * t).sum();
                let theta_s = g_sum * (1.0 + theta_mean) + theta_mean;
                let psi = theta
                    .iter()
                    .map(|t| {
                        if theta_s < 1.0 {
                            (1.0 + t) * (1.0 + u32r).powi(2) / (1.0 - theta_s) - 1.0
                        } else {
                            f64::INFINITY
                        }
                    })
                    .collect();
                (psi, theta_s)
            };
            let (psi_r, _) = f32_rel(drow, b_max, l);
            let (psi_c, _) = f32_rel(crow, c_max, lc);
            let pmean = |v: &[f64]| p.iter().zip(v).map(|(p, s)| p * s).sum::<f64>();
            let (mean_sd, mean_det) = (pmean(sd_in), pmean(det_in));
            let pdg2: f64 = p.iter().zip(dg_in).map(|(p, g)| p * p * g * g).sum();
            let dg_max = dg_in.iter().fold(0f64, |m, x| m.max(*x));
            let mut cols: [Vec<f64>; 4] = std::array::from_fn(|_| Vec::with_capacity(n));
            let (mut p_max, mut new_det_sq) = (0f64, 0f64);
            for j in 0..n {
                let (psi, psic) = (psi_r[j], psi_c[j]);
                // Whatever the inputs, the device's probability is in [0, 1]: where the input's
                // errors are that large, |p̂ − p| ≤ max(p, 1 − p) (the only global fallback).
                let cap = p[j].max(1.0 - p[j]) + 2f64.powi(-20);
                let capped = |c: f64| if c.is_nan() || c > cap { cap } else { c };
                let carried = capped(p[j] * ((drow[j] + l).exp() * (1.0 + psi) - 1.0));
                let h = half_ulp(out, 0, p[j] + carried);
                cols[0].push(carried + h);
                let phi = crow[j] + lc;
                let carried_c = capped(p[j] * (phi.exp() * (1.0 + psic) - 1.0));
                let h_c = half_ulp(out, 0, p[j] + carried_c.min(carried));
                // Probabilistic branch: J = diag(p) − ppᵀ maps the random part (row j of norm
                // p_j·‖e_j − p‖; the own sources exactly: p_j·√(dg_j²(1 − 2p_j) + Σ p_l²dg_l²)).
                let row_j = (1.0 - 2.0 * p[j] + p_norm * p_norm).max(0.0).sqrt();
                let sd = p[j] * (sd_in[j] + mean_sd).min(input.sv[r] * row_j)
                    + p[j] * (dg_in[j] * dg_in[j] * (1.0 - 2.0 * p[j]) + pdg2).max(0.0).sqrt();
                // The remainder p_j((e^φ − 1 − φ) + (φ − φ_lin)): the first a box, the second
                // −s·p_j with 0 ≤ s ≤ ½e^{max B}Σ p B², the direction p (an ellipsoid of rank one,
                // or the box without ellipsoids).
                let s_box = if qin.is_none() { 0.5 * c_max.exp() * pc2 } else { 0.0 };
                let new_det = p[j] * (0.5 * phi * phi * phi.exp() + s_box) + p[j] * phi.exp() * psic;
                new_det_sq += new_det * new_det;
                let det = p[j] * (det_in[j] + mean_det).min(input.dr[r] * row_j) + new_det;
                cols[1].push(sd);
                cols[2].push(h_c);
                cols[3].push(det);
                p_max = p_max.max(p[j]);
            }
            let rho = rows::norm(&cols[0]);
            let sv = p_max * (input.sv[r] + dg_max);
            let dr = p_max * input.dr[r] + new_det_sq.sqrt();
            (p, cols, [rho, sv, dr], 0.5 * c_max.exp() * pc2)
        })
        .collect();
    let mut ex = Vec::with_capacity(e.len());
    let mut el: [Vec<f64>; 4] = std::array::from_fn(|_| Vec::with_capacity(e.len()));
    let mut rw: [Vec<f64>; 3] = std::array::from_fn(|_| Vec::new());
    let mut s_dirs = Vec::new();
    for (p, c, q, s_dir) in rows_out {
        s_dirs.push(s_dir);
        ex.extend(p);
        for (dst, src) in el.iter_mut().zip(c) {
            dst.extend(src);
        }
        for (dst, src) in rw.iter_mut().zip(q) {
            dst.push(src);
        }
    }
    let [b, sd, dg, det] = el;
    let [rho, sv, dr] = rw;
    // Covariances: C ↦ J·(C + diag(dg²))·Jᵀ per row.
    let cov = input.row_cov(n).map(|mut c| {
        c.add_diagonal(&input.dg);
        c.m.par_chunks_mut(n * n).zip(ex.par_chunks(n)).for_each(|(m, p)| {
            let out = cov::softmax_map(m, p);
            m.copy_from_slice(&out);
        });
        c
    });
    // Ellipsoids: Q ↦ J·Q·Jᵀ, beside the remainder's (s·p)(s·p)ᵀ.
    let q = qin.map(|mut c| {
        c.m.par_chunks_mut(n * n).zip(ex.par_chunks(n)).zip(s_dirs.par_iter()).for_each(|((m, p), s)| {
            let mut out = cov::softmax_map(m, p);
            if *s > 0.0 {
                let uu: Vec<f64> = (0..n * n).map(|e| s * s * p[e / n] * p[e % n]).collect();
                out = cov::sum_unknown(&out, &uu, n);
            }
            m.copy_from_slice(&out);
        });
        c
    });
    (ex, bounds::Bounds::new(Parts { b, rho, sd, dg, sv, det, dr }, n).with_cov(cov, n).with_q(q))
}
