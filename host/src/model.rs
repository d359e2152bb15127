//! Model files (TOML, docs/model-format.md) → graph IR, with errors that name file, line, op,
//! field and tensor.

use ipu_core::graph::{matmul_shape, BinaryOp, GeluForm, Graph, MapFn, Op, OpKind, Tensor, TensorId};
use ipu_schema::DType;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use toml::Spanned;

/// A problem in a model file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelError {
    /// File name as given.
    pub file: String,
    /// 1-based line (0 if unknown).
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

impl std::error::Error for ModelError {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: Spanned<String>,
    outputs: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    inputs: BTreeMap<String, Spanned<RawInput>>,
    #[serde(default)]
    params: BTreeMap<String, Spanned<RawParam>>,
    #[serde(default)]
    ops: Vec<Spanned<RawOp>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawParam {
    dtype: Spanned<String>,
    shape: Spanned<Vec<i64>>,
    scale: Option<Spanned<i64>>,
    file: Option<Spanned<String>>,
    safetensors: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
}

/// Where a param's values come from (docs/model-format.md "Params").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamSource {
    /// A `.npy` file, relative to the model file.
    Npy(String),
    /// A tensor of a `.safetensors` file (relative to the model file), by key.
    Safetensors(String, String),
}

/// A param as the model file declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    /// Tensor name.
    pub name: String,
    /// Where the values are.
    pub source: ParamSource,
    /// 1-based line of its table, for messages.
    pub line: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInput {
    dtype: Spanned<String>,
    shape: Spanned<Vec<i64>>,
    /// Given as integer ids of this shape, written as one-hot rows (`crate::ids`).
    one_hot: Option<Spanned<Vec<i64>>>,
    /// Given as integers, written as their f32 values (`crate::ids`).
    integer: Option<Spanned<bool>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOp {
    op: Spanned<String>,
    a: Option<Spanned<String>>,
    b: Option<Spanned<String>>,
    input: Option<Spanned<String>>,
    output: Option<Spanned<String>>,
    dtype: Option<Spanned<String>>,
    accumulate: Option<Spanned<String>>,
    transpose_a: Option<Spanned<bool>>,
    transpose_b: Option<Spanned<bool>>,
    alpha: Option<Spanned<f64>>,
    approximate: Option<Spanned<String>>,
    scale: Option<Spanned<i64>>,
    gamma: Option<Spanned<String>>,
    beta: Option<Spanned<String>>,
    eps: Option<Spanned<f64>>,
    exponent: Option<Spanned<f64>>,
    value: Option<Spanned<f64>>,
    shape: Option<Spanned<Vec<i64>>>,
    perm: Option<Spanned<Vec<i64>>>,
    starts: Option<Spanned<Vec<i64>>>,
    ends: Option<Spanned<Vec<i64>>>,
}

struct Ctx<'a> {
    file: &'a str,
    src: &'a str,
}

impl Ctx<'_> {
    fn line(&self, offset: usize) -> usize {
        self.src[..offset.min(self.src.len())].matches('\n').count() + 1
    }
    fn err<T>(&self, span: std::ops::Range<usize>, message: impl Into<String>) -> Result<T, ModelError> {
        Err(ModelError { file: self.file.into(), line: self.line(span.start), message: message.into() })
    }
}

/// Parse a dtype name.
pub fn parse_dtype(s: &str) -> Option<DType> {
    Some(match s {
        "f32" => DType::F32,
        "f16" => DType::F16,
        "f8e4m3" => DType::F8E4M3,
        "f8e5m2" => DType::F8E5M2,
        _ => return None,
    })
}

/// The 1-based line of each op's `[[ops]]` entry (empty if the file does not parse), so that
/// later stages can point at the op they refuse.
pub fn op_lines(src: &str) -> Vec<usize> {
    let cx = Ctx { file: "", src };
    match toml::from_str::<RawModel>(src) {
        Ok(raw) => raw.ops.iter().map(|o| cx.line(o.span().start)).collect(),
        Err(_) => Vec::new(),
    }
}

/// The params of a model and where their values are (the file must parse: call after [`parse`]).
pub fn param_specs(src: &str) -> Vec<ParamSpec> {
    let cx = Ctx { file: "", src };
    let Ok(raw) = toml::from_str::<RawModel>(src) else { return Vec::new() };
    raw.params
        .iter()
        .map(|(name, p)| {
            let r = p.get_ref();
            let source = match (&r.file, &r.safetensors, &r.key) {
                (Some(f), _, _) => ParamSource::Npy(f.get_ref().clone()),
                (None, Some(f), Some(k)) => {
                    ParamSource::Safetensors(f.get_ref().clone(), k.get_ref().clone())
                }
                _ => ParamSource::Npy(String::new()),
            };
            ParamSpec { name: name.clone(), source, line: cx.line(p.span().start) }
        })
        .collect()
}

/// Parse and check a model. `file` is used in messages.
pub fn parse(file: &str, src: &str) -> Result<Graph, ModelError> {
    let cx = Ctx { file, src };
    let raw: RawModel = toml::from_str(src).map_err(|e| ModelError {
        file: file.into(),
        line: e.span().map(|s| cx.line(s.start)).unwrap_or(0),
        message: e.message().trim().to_string(),
    })?;
    let mut g = Graph {
        name: raw.name.get_ref().clone(),
        tensors: vec![],
        inputs: vec![],
        params: vec![],
        outputs: vec![],
        ops: vec![],
        shared: vec![],
    };
    for (name, input) in &raw.inputs {
        let inp = input.get_ref();
        let dtype = match parse_dtype(inp.dtype.get_ref()) {
            Some(d @ (DType::F16 | DType::F32)) => d,
            Some(_) => {
                return cx.err(
                    inp.dtype.span(),
                    format!("input `{name}`: FP8 inputs are not supported (cast f16 inputs instead)"),
                )
            }
            None => {
                return cx.err(
                    inp.dtype.span(),
                    format!("input `{name}`: unknown dtype `{}` (expected f32 or f16)", inp.dtype.get_ref()),
                )
            }
        };
        let shape = inp.shape.get_ref();
        if shape.is_empty() || shape.iter().any(|d| *d <= 0) {
            return cx.err(
                inp.shape.span(),
                format!("input `{name}`: shape must be a non-empty list of positive integers"),
            );
        }
        if let Some(int) = inp.integer.as_ref().filter(|i| *i.get_ref()) {
            if dtype != DType::F32 || inp.one_hot.is_some() {
                return cx.err(
                    int.span(),
                    format!("input `{name}`: integer = true needs dtype f32 and no one_hot"),
                );
            }
        }
        if let Some(ids) = &inp.one_hot {
            // The rows of ids: f16, the ids' shape and the vocabulary size.
            let i = ids.get_ref();
            if dtype != DType::F16
                || i.iter().any(|d| *d <= 0)
                || shape.len() != i.len() + 1
                || shape[..i.len()] != i[..]
            {
                return cx.err(
                    ids.span(),
                    format!(
                        "input `{name}`: one_hot {i:?} must be the positive ids' shape, and the input f16 of that \
                         shape and the vocabulary size"
                    ),
                );
            }
        }
        g.tensors.push(Tensor {
            name: name.clone(),
            dtype,
            shape: shape.iter().map(|d| *d as u64).collect(),
            scale: 0,
        });
        g.inputs.push(TensorId(g.tensors.len() as u32 - 1));
    }
    for (name, param) in &raw.params {
        if g.find(name).is_some() {
            return cx.err(param.span(), format!("param `{name}`: an input has the same name"));
        }
        let p = param.get_ref();
        let Some(dtype) = parse_dtype(p.dtype.get_ref()) else {
            return cx.err(
                p.dtype.span(),
                format!(
                    "param `{name}`: unknown dtype `{}` (expected f32, f16, f8e4m3 or f8e5m2)",
                    p.dtype.get_ref()
                ),
            );
        };
        let shape = p.shape.get_ref();
        if shape.is_empty() || shape.iter().any(|d| *d <= 0) {
            return cx.err(
                p.shape.span(),
                format!("param `{name}`: shape must be a non-empty list of positive integers"),
            );
        }
        let scale = match &p.scale {
            None => 0,
            Some(s) if matches!(dtype, DType::F8E4M3 | DType::F8E5M2) && (-32..32).contains(s.get_ref()) => {
                *s.get_ref() as i8
            }
            Some(s) => {
                return cx.err(
                    s.span(),
                    format!("param `{name}`: `scale` is a power of two in -32..=31 for FP8 params only"),
                )
            }
        };
        match (&p.file, &p.safetensors, &p.key) {
            (Some(_), None, None) | (None, Some(_), Some(_)) => {}
            _ => {
                return cx.err(
                    param.span(),
                    format!("param `{name}`: give either `file = \"w.npy\"` or `safetensors = \"m.safetensors\"` with `key`"),
                )
            }
        }
        g.tensors.push(Tensor {
            name: name.clone(),
            dtype,
            shape: shape.iter().map(|d| *d as u64).collect(),
            scale,
        });
        g.params.push(TensorId(g.tensors.len() as u32 - 1));
    }
    for (i, sop) in raw.ops.iter().enumerate() {
        let op = sop.get_ref();
        let kind = op.op.get_ref().as_str();
        let here = |field: &str| format!("op {i} ({kind}): field `{field}`");
        let tensor = |f: &Option<Spanned<String>>, field: &str, g: &Graph| -> Result<TensorId, ModelError> {
            let Some(s) = f else {
                return cx.err(sop.span(), format!("op {i} ({kind}): missing field `{field}`"));
            };
            g.find(s.get_ref())
                .ok_or(())
                .or_else(|_| cx.err(s.span(), format!("{}: unknown tensor `{}`", here(field), s.get_ref())))
        };
        let dtype = |f: &Option<Spanned<String>>, field: &str| -> Result<DType, ModelError> {
            let Some(s) = f else {
                return cx.err(sop.span(), format!("op {i} ({kind}): missing field `{field}`"));
            };
            parse_dtype(s.get_ref())
                .ok_or(())
                .or_else(|_| cx.err(s.span(), format!("{}: unknown dtype `{}`", here(field), s.get_ref())))
        };
        // Fields an op does not take are errors, naming the field.
        let present = [
            ("a", op.a.is_some()),
            ("b", op.b.is_some()),
            ("input", op.input.is_some()),
            ("accumulate", op.accumulate.is_some()),
            ("transpose_a", op.transpose_a.is_some()),
            ("transpose_b", op.transpose_b.is_some()),
            ("alpha", op.alpha.is_some()),
            ("scale", op.scale.is_some()),
            ("gamma", op.gamma.is_some()),
            ("beta", op.beta.is_some()),
            ("eps", op.eps.is_some()),
            ("approximate", op.approximate.is_some()),
            ("exponent", op.exponent.is_some()),
            ("value", op.value.is_some()),
            ("shape", op.shape.is_some()),
            ("perm", op.perm.is_some()),
            ("starts", op.starts.is_some()),
            ("ends", op.ends.is_some()),
        ];
        let only = |allowed: &[&str]| -> Result<(), ModelError> {
            match present.iter().find(|(name, set)| *set && !allowed.contains(name)) {
                Some((field, _)) => {
                    cx.err(sop.span(), format!("op {i} ({kind}): field `{field}` does not apply to this op"))
                }
                None => Ok(()),
            }
        };
        let Some(out) = &op.output else {
            return cx.err(sop.span(), format!("op {i} ({kind}): missing field `output`"));
        };
        if g.find(out.get_ref()).is_some() {
            return cx.err(
                out.span(),
                format!("{}: tensor `{}` is already defined", here("output"), out.get_ref()),
            );
        }
        // An op of one f16 input with an f16 result (`what` says what the arithmetic is): its input.
        let f16_input = |g: &Graph, what: &str| -> Result<TensorId, ModelError> {
            let input = tensor(&op.input, "input", g)?;
            let (from, to) = (g.tensor(input).dtype, dtype(&op.dtype, "dtype")?);
            if from != DType::F16 || to != DType::F16 {
                return cx.err(
                    op.dtype.as_ref().map(|s| s.span()).unwrap_or(sop.span()),
                    format!(
                        "{}: unsupported dtype combination: {kind} {} → {} (supported: f16 → f16, {what})",
                        here("dtype"),
                        from.name(),
                        to.name()
                    ),
                );
            }
            Ok(input)
        };
        // A view's input (reshape, transpose, slice), whose dtype the result keeps.
        let view_input = |g: &Graph| -> Result<(TensorId, Tensor), ModelError> {
            let input = tensor(&op.input, "input", g)?;
            let (to, x) = (dtype(&op.dtype, "dtype")?, g.tensor(input).clone());
            if to != x.dtype {
                return cx.err(
                    op.dtype.as_ref().map(|s| s.span()).unwrap_or(sop.span()),
                    format!(
                        "{}: a {kind} keeps the dtype: `{}` is {}",
                        here("dtype"),
                        x.name,
                        x.dtype.name()
                    ),
                );
            }
            Ok((input, x))
        };
        // The op's result, shaped like `input`, in f16.
        let push_f16 = |g: &mut Graph, input: TensorId, kind: OpKind| {
            let shape = g.tensor(input).shape.clone();
            g.tensors.push(Tensor { name: out.get_ref().clone(), dtype: DType::F16, shape, scale: 0 });
            let output = TensorId(g.tensors.len() as u32 - 1);
            g.ops.push(Op { kind, output });
        };
        match kind {
            "matmul" => {
                only(&[
                    "op",
                    "a",
                    "b",
                    "output",
                    "dtype",
                    "accumulate",
                    "transpose_a",
                    "transpose_b",
                    "alpha",
                ])?;
                let a = tensor(&op.a, "a", &g)?;
                let b = tensor(&op.b, "b", &g)?;
                let out_dtype = dtype(&op.dtype, "dtype")?;
                let acc = dtype(&op.accumulate, "accumulate")?;
                let ta = op.transpose_a.as_ref().map(|s| *s.get_ref()).unwrap_or(false);
                let tb = op.transpose_b.as_ref().map(|s| *s.get_ref()).unwrap_or(false);
                let (at, bt) = (g.tensor(a), g.tensor(b));
                let fp8 = |d: DType| matches!(d, DType::F8E4M3 | DType::F8E5M2);
                let both_f16 = at.dtype == DType::F16 && bt.dtype == DType::F16;
                let both_f8 = fp8(at.dtype) && fp8(bt.dtype);
                let b_span = op.b.as_ref().map(|s| s.span()).unwrap_or(sop.span());
                if !both_f16 && !both_f8 {
                    return cx.err(b_span, format!(
                        "op {i} (matmul): unsupported dtype combination: a is {}, b is {} (the AMP takes two f16 or two FP8 operands)",
                        at.dtype.name(), bt.dtype.name()));
                }
                let acc_span = op.accumulate.as_ref().map(|s| s.span()).unwrap_or(sop.span());
                if !matches!(acc, DType::F16 | DType::F32) {
                    return cx
                        .err(acc_span, format!("{}: accumulate must be f16 or f32", here("accumulate")));
                }
                if both_f8 && acc != DType::F16 {
                    return cx.err(acc_span, format!(
                        "{}: unsupported dtype combination: FP8 operands accumulate in f16 on the AMP (f8v8hihov4amp); accumulate = \"f32\" is not available",
                        here("accumulate")));
                }
                // f16 output with f32 accumulation: the AMP sums in f32, the result is rounded
                // to f16 once.
                let rounded_once = out_dtype == DType::F16 && acc == DType::F32 && both_f16;
                if out_dtype != acc && !rounded_once {
                    return cx.err(op.dtype.as_ref().map(|s| s.span()).unwrap_or(sop.span()), format!(
                        "{}: unsupported dtype combination: output {} with accumulate {} (supported: output equal to accumulate, or f16 output with f32 accumulation)",
                        here("dtype"), out_dtype.name(), acc.name()));
                }
                let Some((mut shape, m, _k, n)) = matmul_shape(at, bt, ta, tb) else {
                    return cx.err(b_span, format!(
                        "op {i} (matmul): shape mismatch: a {:?}{} · b {:?}{} (need rank ≥ 2, equal K and broadcastable batch dimensions)",
                        at.shape, if ta { "ᵀ" } else { "" }, bt.shape, if tb { "ᵀ" } else { "" }));
                };
                let alpha = op.alpha.as_ref().map(|a| *a.get_ref() as f32);
                if let (Some(a), Some(s)) = (alpha, &op.alpha) {
                    if !a.is_finite() {
                        return cx.err(s.span(), format!("{}: alpha must be finite", here("alpha")));
                    }
                }
                shape.extend([m, n]);
                g.tensors.push(Tensor { name: out.get_ref().clone(), dtype: out_dtype, shape, scale: 0 });
                let output = TensorId(g.tensors.len() as u32 - 1);
                g.ops.push(Op {
                    kind: OpKind::MatMul { a, b, transpose_a: ta, transpose_b: tb, accumulate: acc, alpha },
                    output,
                });
            }
            "cast" => {
                only(&["op", "input", "output", "dtype", "scale"])?;
                let input = tensor(&op.input, "input", &g)?;
                let to = dtype(&op.dtype, "dtype")?;
                let from = g.tensor(input).dtype;
                let scale = op.scale.as_ref().map(|s| *s.get_ref()).unwrap_or(0);
                let scale_span = op.scale.as_ref().map(|s| s.span()).unwrap_or(sop.span());
                if !(-32..=31).contains(&scale) {
                    return cx.err(scale_span, format!("{}: scale {scale} not in -32..31", here("scale")));
                }
                let fp8 = |d: DType| matches!(d, DType::F8E4M3 | DType::F8E5M2);
                if scale != 0 && !fp8(to) {
                    return cx
                        .err(scale_span, format!("{}: a scale applies only to casts to FP8", here("scale")));
                }
                let supported = (from == DType::F16 && fp8(to))
                    || (fp8(from) && to == DType::F16)
                    || (from == DType::F32 && to == DType::F16)
                    || (from == DType::F16 && to == DType::F32);
                if !supported {
                    return cx.err(
                        op.dtype.as_ref().map(|s| s.span()).unwrap_or(sop.span()),
                        format!(
                        "{}: unsupported dtype combination: cast {} → {} (supported: f16 ↔ f8e4m3/f8e5m2, f32 ↔ f16)",
                        here("dtype"), from.name(), to.name()),
                    );
                }
                let shape = g.tensor(input).shape.clone();
                g.tensors.push(Tensor { name: out.get_ref().clone(), dtype: to, shape, scale: scale as i8 });
                let output = TensorId(g.tensors.len() as u32 - 1);
                g.ops.push(Op { kind: OpKind::Cast { input }, output });
            }
            "gelu" => {
                only(&["op", "input", "output", "dtype", "approximate"])?;
                let form = match op.approximate.as_ref().map(|s| s.get_ref().as_str()) {
                    Some("tanh") => GeluForm::Tanh,
                    Some("none") => GeluForm::Erf,
                    Some("sigmoid") => GeluForm::Sigmoid,
                    Some(other) => {
                        let span = op.approximate.as_ref().map(|s| s.span()).unwrap_or(sop.span());
                        return cx.err(span, format!(
                            "{}: `{other}`: the forms are \"tanh\" (gelu_pytorch_tanh), \"none\" (the erf form) and \"sigmoid\" (quick_gelu, x·σ(1.702x))",
                            here("approximate")));
                    }
                    None => {
                        return cx.err(
                            sop.span(),
                            format!(
                            "op {i} (gelu): missing field `approximate` (\"tanh\", \"none\" or \"sigmoid\")"
                        ),
                        )
                    }
                };
                let input = f16_input(&g, "f32 arithmetic")?;
                push_f16(&mut g, input, OpKind::Gelu { input, form });
            }
            "layernorm" => {
                only(&["op", "input", "output", "dtype", "gamma", "beta", "eps"])?;
                let input = tensor(&op.input, "input", &g)?;
                let to = dtype(&op.dtype, "dtype")?;
                let x = g.tensor(input);
                if x.dtype != DType::F16 || to != DType::F16 {
                    return cx.err(op.dtype.as_ref().map(|s| s.span()).unwrap_or(sop.span()), format!(
                        "{}: unsupported dtype combination: layernorm {} → {} (supported: f16 → f16, statistics in f32)",
                        here("dtype"), x.dtype.name(), to.name()));
                }
                let d = *x.shape.last().unwrap_or(&0);
                let affine =
                    |f: &Option<Spanned<String>>, field: &str| -> Result<Option<TensorId>, ModelError> {
                        let Some(s) = f else { return Ok(None) };
                        let t = tensor(f, field, &g)?;
                        let v = g.tensor(t);
                        if v.dtype != DType::F16 || v.elements() != d || v.shape.last() != Some(&d) {
                            return cx.err(
                                s.span(),
                                format!(
                            "{}: `{}` must be f16 of shape [{d}] (the last axis of `{}`), not {} {:?}",
                            here(field), v.name, x.name, v.dtype.name(), v.shape),
                            );
                        }
                        Ok(Some(t))
                    };
                let (gamma, beta) = (affine(&op.gamma, "gamma")?, affine(&op.beta, "beta")?);
                let eps = op.eps.as_ref().map(|e| *e.get_ref()).unwrap_or(1e-5);
                if !(eps.is_finite() && eps >= 0.0) {
                    let span = op.eps.as_ref().map(|s| s.span()).unwrap_or(sop.span());
                    return cx.err(span, format!("{}: eps must be finite and ≥ 0", here("eps")));
                }
                let shape = x.shape.clone();
                g.tensors.push(Tensor { name: out.get_ref().clone(), dtype: to, shape, scale: 0 });
                let output = TensorId(g.tensors.len() as u32 - 1);
                g.ops.push(Op { kind: OpKind::LayerNorm { input, gamma, beta, eps: eps as f32 }, output });
            }
            "reshape" | "transpose" => {
                let field = if kind == "reshape" { "shape" } else { "perm" };
                only(&["op", "input", "output", "dtype", field])?;
                let (input, x) = view_input(&g)?;
                let to = x.dtype;
                let spanned = if kind == "reshape" { &op.shape } else { &op.perm };
                let Some(list) = spanned else {
                    return cx.err(sop.span(), format!("op {i} ({kind}): missing field `{field}`"));
                };
                let v = list.get_ref();
                let (shape, kind_op) =
                    if kind == "reshape" {
                        let shape: Vec<u64> = v.iter().map(|d| (*d).max(0) as u64).collect();
                        let product = shape.iter().try_fold(1u64, |a, d| a.checked_mul(*d));
                        if v.iter().any(|d| *d <= 0) || product != Some(x.elements()) {
                            return cx.err(
                                list.span(),
                                format!(
                            "{}: {v:?} is not a shape of positive sizes with {} elements like `{}` {:?}",
                            here(field), x.elements(), x.name, x.shape),
                            );
                        }
                        (shape, OpKind::Reshape { input })
                    } else {
                        let r = x.shape.len();
                        let mut seen = vec![false; r];
                        let ok = v.len() == r
                            && v.iter().all(|&a| {
                                (0..r as i64).contains(&a) && !std::mem::replace(&mut seen[a as usize], true)
                            });
                        if !ok {
                            return cx.err(
                                list.span(),
                                format!(
                                    "{}: {v:?} is not a permutation of the {r} axes of `{}`",
                                    here(field),
                                    x.name
                                ),
                            );
                        }
                        let perm: Vec<usize> = v.iter().map(|&a| a as usize).collect();
                        (perm.iter().map(|&a| x.shape[a]).collect(), OpKind::Transpose { input, perm })
                    };
                g.tensors.push(Tensor { name: out.get_ref().clone(), dtype: to, shape, scale: x.scale });
                let output = TensorId(g.tensors.len() as u32 - 1);
                g.ops.push(Op { kind: kind_op, output });
            }
            "slice" => {
                only(&["op", "input", "output", "dtype", "starts", "ends"])?;
                let (input, x) = view_input(&g)?;
                let to = x.dtype;
                let (Some(starts), Some(ends)) = (&op.starts, &op.ends) else {
                    let name = if op.starts.is_none() { "starts" } else { "ends" };
                    return cx.err(sop.span(), format!("op {i} (slice): missing field `{name}`"));
                };
                let (sv, ev) = (starts.get_ref(), ends.get_ref());
                let r = x.shape.len();
                let ok = sv.len() == r
                    && ev.len() == r
                    && (0..r).all(|k| 0 <= sv[k] && sv[k] < ev[k] && ev[k] as u64 <= x.shape[k]);
                if !ok {
                    return cx.err(
                        starts.span().start..ends.span().end.max(starts.span().end),
                        format!(
                            "op {i} (slice): starts {sv:?} and ends {ev:?} must give, on each of the {r} axes of \
                             `{}` {:?}, 0 ≤ start < end ≤ size",
                            x.name, x.shape
                        ),
                    );
                }
                let shape = (0..r).map(|k| (ev[k] - sv[k]) as u64).collect();
                let starts = sv.iter().map(|&v| v as u64).collect();
                g.tensors.push(Tensor { name: out.get_ref().clone(), dtype: to, shape, scale: x.scale });
                let output = TensorId(g.tensors.len() as u32 - 1);
                g.ops.push(Op { kind: OpKind::Slice { input, starts }, output });
            }
            "add" | "sub" | "mul" => {
                only(&["op", "a", "b", "output", "dtype"])?;
                let which = match kind {
                    "add" => BinaryOp::Add,
                    "sub" => BinaryOp::Sub,
                    _ => BinaryOp::Mul,
                };
                let (a, b) = (tensor(&op.a, "a", &g)?, tensor(&op.b, "b", &g)?);
                let to = dtype(&op.dtype, "dtype")?;
                let (at, bt) = (g.tensor(a), g.tensor(b));
                if at.dtype != DType::F16 || bt.dtype != DType::F16 || to != DType::F16 {
                    return cx.err(
                        op.dtype.as_ref().map(|s| s.span()).unwrap_or(sop.span()),
                        format!(
                        "{}: unsupported dtype combination: {kind} {} and {} → {} (supported: f16 and f16 → f16)",
                        here("dtype"), at.dtype.name(), bt.dtype.name(), to.name()),
                    );
                }
                let Some(shape) = ipu_core::graph::broadcast_shape(&at.shape, &bt.shape) else {
                    return cx.err(
                        op.b.as_ref().map(|s| s.span()).unwrap_or(sop.span()),
                        format!(
                            "op {i} ({kind}): shapes {:?} and {:?} do not broadcast (NumPy rules)",
                            at.shape, bt.shape
                        ),
                    );
                };
                g.tensors.push(Tensor { name: out.get_ref().clone(), dtype: to, shape, scale: 0 });
                let output = TensorId(g.tensors.len() as u32 - 1);
                g.ops.push(Op { kind: OpKind::Binary { op: which, a, b }, output });
            }
            "softmax" => {
                only(&["op", "input", "output", "dtype"])?;
                let input = f16_input(&g, "statistics in f32")?;
                push_f16(&mut g, input, OpKind::Softmax { input });
            }
            "reduce_sum" | "reduce_mean" => {
                // Over the last axis, keeping it with size 1 (ONNX `keepdims = 1`).
                only(&["op", "input", "output", "dtype"])?;
                let input = f16_input(&g, "the sum in f32")?;
                push_f16(&mut g, input, OpKind::Reduce { input, mean: kind == "reduce_mean" });
                if let Some(d) = g.tensors.last_mut().and_then(|t| t.shape.last_mut()) {
                    *d = 1;
                }
            }
            name => {
                let Some(func) = MapFn::from_name(name) else {
                    return cx.err(
                    op.op.span(),
                    format!(
                    "op {i}: unknown op `{name}` (supported: matmul, cast, softmax, reduce_sum, reduce_mean, add, sub, mul, gelu, layernorm, \
                     reshape, transpose, slice, tanh, sigmoid, exp, log, sqrt, reciprocal, abs, erf, pow, max, min, leaky_relu)"
                ),
                );
                };
                let exponent = match func.field() {
                    Some(field) => {
                        only(&["op", "input", "output", "dtype", field])?;
                        let given = match field {
                            "exponent" => &op.exponent,
                            "alpha" => &op.alpha,
                            _ => &op.value,
                        };
                        let ok = |v: f64| v.is_finite() && (func != MapFn::LeakyRelu || v <= 1.0);
                        match given {
                            Some(e) if ok(*e.get_ref()) => *e.get_ref() as f32,
                            Some(e) => {
                                let what = if func == MapFn::LeakyRelu {
                                    "a finite number ≤ 1"
                                } else {
                                    "a finite number"
                                };
                                return cx.err(e.span(), format!("{}: must be {what}", here(field)));
                            }
                            None => {
                                return cx.err(
                                    sop.span(),
                                    format!("op {i} ({}): missing field `{field}`", func.name()),
                                )
                            }
                        }
                    }
                    None => {
                        only(&["op", "input", "output", "dtype"])?;
                        1.0
                    }
                };
                let input = f16_input(&g, "f32 arithmetic")?;
                push_f16(&mut g, input, OpKind::Map { input, func, exponent });
            }
        }
    }
    // Shapes are untrusted: a tensor larger than the whole chip's tile memory cannot be planned,
    // and refusing it here keeps every later size computation in range.
    let chip = (ipu_core::target::NUM_TILES * ipu_core::target::TILE_MEM_SIZE) as u64;
    for t in &g.tensors {
        let bytes = t.shape.iter().try_fold(t.dtype.size() as u64, |a, d| a.checked_mul(*d));
        if bytes.is_none_or(|b| b > chip) {
            let line = src
                .find(&format!("[inputs.{}]", t.name))
                .or_else(|| src.find(&format!("[params.{}]", t.name)))
                .or_else(|| src.find(&format!("\"{}\"", t.name)))
                .unwrap_or(0);
            return cx.err(
                line..line,
                format!(
                    "tensor `{}` of shape {:?} is larger than the chip's {chip} bytes of tile memory",
                    t.name, t.shape
                ),
            );
        }
    }
    for o in raw.outputs.get_ref() {
        match g.find(o.get_ref()) {
            Some(t) if !g.is_source(t) => g.outputs.push(t),
            Some(_) => {
                return cx.err(
                    o.span(),
                    format!("output `{}` is a model input or param, not produced by an op", o.get_ref()),
                )
            }
            None => return cx.err(o.span(), format!("output `{}` is not produced by any op", o.get_ref())),
        }
    }
    if g.outputs.is_empty() {
        return cx.err(raw.outputs.span(), "`outputs` must name at least one tensor");
    }
    Ok(g)
}
