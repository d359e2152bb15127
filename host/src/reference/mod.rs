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
mod matmul_prob;
mod prob;
pub mod reduce;
pub use matmul::{matmul_device, matmul_device_scalar, round_f16, MatMulArgs};
use prob::Prob;
pub use prob::LAMBDA;
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
    /// rounding points and the bounds of its operands (docs/reliability.md "The f64 bound"):
    /// the smaller of the rigorous bound and the probabilistic one (`prob.rs`).
    pub bound: BTreeMap<String, Vec<f64>>,
    /// Elements whose bound came from the probabilistic branch, plus that branch's per-row
    /// statements (layer norms): under its model every bound of the run holds with probability
    /// at least `1 − events·2·exp(−λ²/2)`.
    pub events: u64,
    /// Per tensor, the largest rigorous bound of its elements (where the probabilistic branch
    /// is worth having: `examples/bound_probe.rs` prints them side by side).
    pub rigorous_max: BTreeMap<String, f64>,
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

/// The quick GeLU as `gelu_sigmoid_f16` computes it: `x / (e^{x·(−1.702)} + 1)` in f32 with the
/// constants of `plan::matmul::GELU_SIGMOID_CONSTANTS`, libm's `expf` (as the simulator's
/// `f32exp`), one f16 rounding at the end.
pub fn gelu_sigmoid_device(h: f32) -> f32 {
    let [k, one] = ipu_core::plan::matmul::GELU_SIGMOID_CONSTANTS;
    round(h / (libm::expf(h * k) + one), DType::F16)
}

/// The quick GeLU in f64: `x·σ(1.702x)`.
pub fn gelu_sigmoid_f64(x: f64) -> f64 {
    x / (1.0 + (-1.702 * x).exp())
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
    // `bound` carries the rigorous bounds from op to op, `prob` the probabilistic branch; both
    // are dropped after a tensor's last reader, `combined` (their minimum) is kept.
    let mut bound: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut prob: BTreeMap<String, Prob> = BTreeMap::new();
    let mut combined: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut events = 0u64;
    let mut rigorous_max: BTreeMap<String, f64> = BTreeMap::new();
    let mut last_use: BTreeMap<String, usize> = BTreeMap::new();
    for (i, op) in g.ops.iter().enumerate() {
        for t in op.kind.operands() {
            last_use.insert(g.tensor(t).name.clone(), i);
        }
    }
    for (name, t) in inputs {
        prob.insert(name.clone(), Prob::exact(t.data.len()));
        combined.insert(name.clone(), vec![0.0; t.data.len()]);
        // FP8 sources (params) stand for code · 2^scale.
        let scale = g.find(name).map(|id| g.tensor(id).scale).unwrap_or(0);
        exact.insert(name.clone(), (0..t.data.len()).map(|i| real(t, scale, i)).collect());
        bound.insert(name.clone(), vec![0.0; t.data.len()]);
    }
    for (i, op) in g.ops.iter().enumerate() {
        let out = g.tensor(op.output);
        // An op whose result reaches no output may read an input the package does not bind
        // (`Graph::is_needed`): it has no value to read and none to give.
        let missing = op.kind.operands().iter().any(|&t| !vals.contains_key(&g.tensor(t).name));
        if missing && !g.is_needed(op.output) {
            continue;
        }
        let get = |id| {
            let t = g.tensor(id);
            vals.get(&t.name).map(|v| (v, t.scale)).ok_or(format!("op {i}: no value for `{}`", t.name))
        };
        let (value, ex, bd, pr): (HostTensor, Vec<f64>, Vec<f64>, Prob) = match &op.kind {
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
                    let bd: Vec<f64> = exact[&ta.name]
                        .iter()
                        .zip(&bound[&ta.name])
                        .map(|(e, d)| {
                            al.abs() * d + rel * al.abs() * (e.abs() + d) + underflow_error(DType::F16)
                        })
                        .collect();
                    let pr = prob::scaled(&prob[&ta.name], &ex, al);
                    (HostTensor { dtype: at.dtype, shape: at.shape.clone(), data }, ex, bd, pr)
                });
                let alpha = if on_a { &None } else { alpha };
                let at = scaled_a.as_ref().map_or(at, |s| &s.0);
                let grid = grids.get(i).map(|g| Grid { tm: g[0] as u64, tn: g[1] as u64, tk: g[2] as u64 });
                let grid = grid.unwrap_or(Grid { tm: 1, tn: 1, tk: 1 });
                let tk = grid.tk;
                let mm = MatMul::new(g, *a, *b, op.output, *transpose_a, *transpose_b, *accumulate);
                let rounds = reduction_rounds(tk, fan_in(&mm, grid));
                let args = MatMulArgs {
                    rounds,
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
                let block = if is_fp8(ta.dtype) { 32 } else { 16 };
                let sh = matmul_prob::Shape {
                    batch: c.len() / (m * n).max(1) as usize,
                    m: m as usize,
                    k: k as usize,
                    n: n as usize,
                    a_batched: ta.shape.len() > 2,
                    b_batched: tb.shape.len() > 2,
                    ta: *transpose_a,
                    tb: *transpose_b,
                    acc: *accumulate,
                    block,
                    tk: tk as usize,
                    alpha: alpha.map(|a| a as f64),
                    same: a == b,
                };
                let pa = scaled_a
                    .as_ref()
                    .map_or((&exact[&ta.name][..], &bound[&ta.name][..], &prob[&ta.name]), |s| {
                        (&s.1[..], &s.2[..], &s.3)
                    });
                let pb = (&exact[&tb.name][..], &bound[&tb.name][..], &prob[&tb.name]);
                let (ex, mut bd, mut pr) = matmul_prob::matmul(&sh, pa, pb);
                let mut c = c;
                if out.dtype != *accumulate {
                    // f16 output of an f32 accumulation: one rounding of the finished sum.
                    let (u, sub) = (unit_roundoff(out.dtype), underflow_error(out.dtype));
                    c.iter_mut().for_each(|v| *v = round(*v, out.dtype));
                    bd.iter_mut().zip(&ex).for_each(|(b, e)| *b += u * (e.abs() + *b) + sub);
                    pr = prob::round_all(&pr, &ex, out.dtype, 0);
                }
                (HostTensor { dtype: out.dtype, shape, data: c }, ex, bd, pr)
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
                let bd = ex.iter().zip(&bound[name]).map(|(e, b)| b + u * (e.abs() + b) + sub).collect();
                // Lossy: to FP8, or f32 to f16 (f16 → f32 and FP8 → f16 are exact).
                let lossy = is_fp8(out.dtype) || (out.dtype == DType::F16 && x.dtype == DType::F32);
                let pr = if lossy {
                    prob::round_all(&prob[name], &ex, out.dtype, out.scale)
                } else {
                    prob[name].clone()
                };
                (t, ex, bd, pr)
            }
            OpKind::Gelu { input, form } => {
                let (x, _) = get(*input)?;
                let name = &g.tensor(*input).name;
                let (ein, bin) = (&exact[name], &bound[name]);
                let device: fn(f32) -> f32 = match form {
                    GeluForm::Tanh => gelu_device,
                    GeluForm::Erf => gelu_erf_device,
                    GeluForm::Sigmoid => gelu_sigmoid_device,
                };
                let f64_form: fn(f64) -> f64 = match form {
                    GeluForm::Tanh => gelu_f64,
                    GeluForm::Erf => gelu_erf_f64,
                    GeluForm::Sigmoid => gelu_sigmoid_f64,
                };
                let data = x.data.iter().map(|v| device(*v)).collect();
                let ex: Vec<f64> = ein.iter().map(|v| f64_form(*v)).collect();
                let bd = ex
                    .iter()
                    .zip(ein.iter().zip(bin))
                    .map(|(y, (x, b))| {
                        // gelu is 1.13-Lipschitz (either form). The tanh formula's own f32 error is
                        // at most ~40 ulps of 1 in t (exp, divide and the constants), times 0.5|x|;
                        // the erf form's is A&S 7.1.26's 1.5e-7 in erf (0.75e-7 in Φ) plus ~40 f32
                        // ulps of 1 in Φ, times |x|; then one f16 rounding. The quick GeLU (also
                        // ≤ 1.1-Lipschitz) is prob::gelu_formula's.
                        let formula = prob::gelu_formula(*form, x.abs() + b);
                        let carried = 1.13 * b + formula + 8.0 * 2f64.powi(-24) * y.abs();
                        carried
                            + unit_roundoff(DType::F16) * (y.abs() + carried)
                            + underflow_error(DType::F16)
                    })
                    .collect();
                let pr = prob::gelu(*form, &prob[name], ein, &ex);
                (HostTensor { dtype: out.dtype, shape: x.shape.clone(), data }, ex, bd, pr)
            }
            OpKind::Map { input, func, exponent } => {
                let (x, _) = get(*input)?;
                let name = &g.tensor(*input).name;
                let (ein, bin) = (&exact[name], &bound[name]);
                let data = x.data.iter().map(|v| map::device(*func, *exponent, *v)).collect();
                let ex: Vec<f64> = ein.iter().map(|v| map::exact(*func, *exponent, *v)).collect();
                let bd = ex
                    .iter()
                    .zip(ein.iter().zip(bin))
                    .map(|(y, (x, b))| map::bound(*func, *exponent, *x, *b, *y))
                    .collect();
                let pr = prob::map(*func, *exponent, &prob[name], ein, &ex);
                (HostTensor { dtype: out.dtype, shape: x.shape.clone(), data }, ex, bd, pr)
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
                let bd = (0..n)
                    .map(|i| {
                        let (p, q, bp, bq) = (ea[ia[i]], eb[ib[i]], ba[ia[i]], bb[ib[i]]);
                        // Operand errors carried: |Δ(p ± q)| ≤ bp + bq; |Δ(pq)| ≤ |p|bq + |q|bp + bp·bq.
                        // An operand without error (a param: bound 0) adds nothing, even beside an
                        // unbounded one (0·∞ is taken as 0, not NaN).
                        let times = |a: f64, b: f64| if a == 0.0 || b == 0.0 { 0.0 } else { a * b };
                        let carried = match op {
                            BinaryOp::Add | BinaryOp::Sub => bp + bq,
                            BinaryOp::Mul => times(p.abs(), bq) + times(q.abs(), bp) + times(bp, bq),
                        };
                        carried + u * (ex[i].abs() + carried) + sub
                    })
                    .collect();
                let pr = prob::binary(*op, (&prob[na], ea), (&prob[nb], eb), &ia, &ib, &ex);
                (HostTensor { dtype: out.dtype, shape: out.shape.clone(), data }, ex, bd, pr)
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
                let (ex, bd) =
                    layernorm::exact(&exact[&n], &bound[&n], d, affine(*gamma), affine(*beta), *eps);
                let pa = |t: Option<ipu_core::graph::TensorId>| {
                    (t.map(|t| exact[&name(t)].as_slice()), t.map(|t| &prob[&name(t)]))
                };
                let pr = layernorm::prob(&exact[&n], &prob[&n], d, pa(*gamma), pa(*beta), *eps);
                events += layernorm::prob_events(ex.len(), d);
                (HostTensor { dtype: out.dtype, shape: x.shape.clone(), data }, ex, bd, pr)
            }
            OpKind::Reshape { input } => {
                let (x, _) = get(*input)?;
                let n = &g.tensor(*input).name;
                let t = HostTensor { dtype: out.dtype, shape: out.shape.clone(), data: x.data.clone() };
                (t, exact[n].clone(), bound[n].clone(), prob[n].clone())
            }
            OpKind::Slice { input, starts } => {
                let (x, _) = get(*input)?;
                let n = &g.tensor(*input).name;
                let from = slice_index(&x.shape, starts, &out.shape);
                let pick = |v: &[f64]| from.iter().map(|&i| v[i]).collect::<Vec<f64>>();
                let data = from.iter().map(|&i| x.data[i]).collect();
                let t = HostTensor { dtype: out.dtype, shape: out.shape.clone(), data };
                (t, pick(&exact[n]), pick(&bound[n]), prob[n].pick(&from))
            }
            OpKind::Transpose { input, perm } => {
                let (x, _) = get(*input)?;
                let n = &g.tensor(*input).name;
                let from = transpose_index(&x.shape, perm);
                let pick = |v: &[f64]| from.iter().map(|&i| v[i]).collect::<Vec<f64>>();
                let data = from.iter().map(|&i| x.data[i]).collect();
                let t = HostTensor { dtype: out.dtype, shape: out.shape.clone(), data };
                (t, pick(&exact[n]), pick(&bound[n]), prob[n].pick(&from))
            }
            OpKind::Reduce { input, mean } => {
                let (x, _) = get(*input)?;
                let n = &g.tensor(*input).name;
                reduce::reduce(x, &exact[n], &bound[n], &prob[n], *mean)
            }
            OpKind::Softmax { input } => {
                let (x, _) = get(*input)?;
                let data = softmax_device(x);
                let name = &g.tensor(*input).name;
                let n = *x.shape.last().unwrap() as usize;
                let (ex, bd) = softmax_exact(&exact[name], &bound[name], n, out.dtype);
                let pr = prob::softmax(&prob[name], &ex, n, out.dtype);
                (HostTensor { dtype: out.dtype, shape: x.shape.clone(), data }, ex, bd, pr)
            }
        };
        // The combined bound: the smaller (a NaN in one branch leaves the other; NaN in both,
        // an undefined bound, stays NaN).
        let comb: Vec<f64> = bd.par_iter().enumerate().map(|(e, r)| r.min(pr.mag(e))).collect();
        events += bd.iter().enumerate().filter(|(e, r)| pr.mag(*e) < **r).count() as u64;
        rigorous_max.insert(out.name.clone(), bd.iter().fold(0f64, |m, v| m.max(*v)));
        exact.insert(out.name.clone(), ex);
        bound.insert(out.name.clone(), bd);
        prob.insert(out.name.clone(), pr);
        combined.insert(out.name.clone(), comb);
        vals.insert(out.name.clone(), value);
        for t in op.kind.operands() {
            let t = &g.tensor(t).name;
            if last_use.get(t) == Some(&i) {
                bound.remove(t);
                prob.remove(t);
            }
        }
    }
    Ok(Evaluated { device: vals, exact, bound: combined, events, rigorous_max })
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

/// f64 softmax of each row and its bound: input errors of at most δ change every ratio by a factor
/// within e^±2δ; the device's f32 arithmetic (n-term sum in two lanes, exp, reciprocal, product)
/// adds γ(n + 5, 2⁻²⁴) and the output rounding one unit roundoff of the output dtype plus its
/// underflow spacing; never more than max(p, 1 − p), both being probabilities.
fn softmax_exact(e: &[f64], d: &[f64], n: usize, out: DType) -> (Vec<f64>, Vec<f64>) {
    let rel = |delta: f64| {
        (2.0 * delta).exp() * (1.0 + gamma(n as u64 + 5, 2f64.powi(-24))) * (1.0 + unit_roundoff(out)) - 1.0
    };
    e.par_chunks(n)
        .zip(d.par_chunks(n))
        .flat_map_iter(|(row, drow)| {
            let mx = row.iter().fold(f64::NEG_INFINITY, |m, v| m.max(*v));
            let s: f64 = row.iter().map(|v| (v - mx).exp()).sum();
            let r = rel(drow.iter().fold(0f64, |m, v| m.max(*v)));
            row.iter().map(move |v| {
                let p = (v - mx).exp() / s;
                // The device's probabilities are in [0, 1]: never more than max(p, 1 − p) away
                // (where e^{2δ} overflows, and p·∞ is NaN for p = 0).
                (p, (p * r).min(p.max(1.0 - p)) + underflow_error(out))
            })
        })
        .unzip()
}
