//! Lowering ONNX nodes, in file order, onto the graph IR (docs/onnx.md "Lowering").

use super::consts::{Const, External};
use super::emit::{Emit, Field};
use super::expr::{Expr, Form};
use super::fold::{self, Attrs};
use super::patterns::Pattern;
use super::proto::{data_type, GraphProto, NodeProto};
use super::{ImportOptions, Weights};
use crate::reference::HostTensor;
use ipu_core::fp8::Fp8Format;
use ipu_schema::DType;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

/// The ops the importer takes, for refusals.
pub const SUPPORTED: &str = "MatMul, Gemm, Conv (patch embedding: stride = kernel, no padding), Add, Sub, Mul, Div, \
Pow, Sqrt, Erf, Tanh, Exp, Neg, Abs, Reciprocal (as scalings, the tanh/erf GeLU and a decomposed LayerNorm), Gelu, \
LayerNormalization, Softmax (last axis), Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Identity, Dropout, Cast; \
on constants and shapes also Shape, Gather, Slice, Split, Concat, ConstantOfShape, Constant, Expand, Tile, Range, \
Mod, Equal, Where, ReduceMean";

/// A runtime value: `e(t)` elementwise, where `t` is a tensor of the model being written.
#[derive(Clone, Debug)]
struct Run {
    t: String,
    shape: Vec<u64>,
    e: Rc<Expr>,
    /// Set when the value is (a view of) a projection by a constant weight.
    prov: Option<Rc<Prov>>,
}

/// A projection `alpha·x·w + bias` of a runtime `x` by a constant `w` (`[K, N]`), and for each
/// element of the value that carries it, its flat index in the projection's output. When torch
/// selects part of a projection (the packed K/V of `nn.MultiheadAttention`: reshape, transpose,
/// squeeze, then `Gather`), the selected columns are projected on their own with the matching
/// columns of `w`; the full projection is then dead and pruned.
#[derive(Debug)]
struct Prov {
    x: Run,
    w: Rc<Const>,
    bias: Option<Rc<Const>>,
    alpha: f64,
    idx: Rc<Const>,
}

fn iota(shape: &[u64]) -> Const {
    let n: u64 = shape.iter().product();
    Const::i(shape.to_vec(), (0..n as i64).collect())
}

fn is_iota(c: &Const) -> bool {
    matches!(&c.data, super::consts::Data::I(v) if v.iter().enumerate().all(|(k, x)| *x == k as i64))
}

#[derive(Clone, Debug)]
enum Val {
    C(Rc<Const>),
    R(Run),
}

/// The lowering state.
pub struct Lower<'a, 'b> {
    file: &'a str,
    opset: i64,
    opts: &'a ImportOptions,
    vals: BTreeMap<String, Val>,
    emit: Emit,
    ext: &'a mut External<'b>,
    /// Params made from constants, by the constant's address; the `Rc` is kept so that no later
    /// constant can be allocated at the same address while the map lives.
    params_of: BTreeMap<(usize, bool), (Rc<Const>, String)>,
    scales: Vec<(String, i8)>,
    /// Matmuls emitted, by output tensor: op index, alpha, and whether the ONNX value has one
    /// reader (then a scaling applied after it folds into its `alpha`).
    matmuls: BTreeMap<String, (usize, f64, bool)>,
    /// Scalings folded into a matmul's alpha after it was written, by tensor.
    folded: BTreeMap<String, f64>,
    /// Readers of each ONNX value.
    uses: BTreeMap<String, usize>,
}

/// The projection `a·b` when `b` is a constant matrix and `a` computed (identity form).
fn projection(a: &Val, b: &Val, alpha: f64, bias: Option<Rc<Const>>) -> Option<Prov> {
    match (a, b) {
        (Val::R(x), Val::C(w)) if *x.e == Expr::X && strip(&w.shape).len() == 2 => {
            let w = Rc::new(w.reshaped(strip(&w.shape)));
            Some(Prov { x: x.clone(), w, bias, alpha, idx: Rc::new(iota(&[0])) })
        }
        _ => None,
    }
}

fn f16_param_values(c: &Const) -> Vec<f32> {
    c.as_f32()
}

impl<'a, 'b> Lower<'a, 'b> {
    /// Start with the initializers as constants.
    pub fn new(
        file: &'a str,
        opset: i64,
        opts: &'a ImportOptions,
        init: BTreeMap<String, Const>,
        ext: &'a mut External<'b>,
    ) -> Self {
        let vals = init.into_iter().map(|(k, v)| (k, Val::C(Rc::new(v)))).collect();
        Lower {
            file,
            opset,
            opts,
            vals,
            emit: Emit::new(),
            ext,
            params_of: BTreeMap::new(),
            scales: Vec::new(),
            matmuls: BTreeMap::new(),
            folded: BTreeMap::new(),
            uses: BTreeMap::new(),
        }
    }

    /// Declare the graph inputs (those that are not initializers).
    pub fn inputs(&mut self, g: &GraphProto) -> Result<(), String> {
        self.uses = super::patterns::consumers(g).into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        for o in &g.output {
            self.emit.reserve(&o.name);
        }
        let mut given: BTreeSet<&String> = self.opts.input_shapes.keys().collect();
        for i in &g.input {
            if self.vals.contains_key(&i.name) {
                continue;
            }
            given.remove(&i.name);
            self.emit.reserve(&i.name);
            let at = format!("{}: input `{}`", self.file, i.name);
            let tt = i
                .r#type
                .as_ref()
                .and_then(|t| t.tensor_type.as_ref())
                .ok_or(format!("{at}: not a tensor"))?;
            let dims = tt.shape.as_ref().map(|s| s.dim.as_slice()).unwrap_or(&[]);
            let shape: Vec<u64> = match self.opts.input_shapes.get(&i.name) {
                Some(s) => {
                    if s.len() != dims.len() || dims.iter().zip(s).any(|(d, v)| d.dim_value.is_some_and(|x| x as u64 != *v)) {
                        return Err(format!("{at}: --input-shape {s:?} does not match the file's {:?}", dim_text(dims)));
                    }
                    s.clone()
                }
                None => dims
                    .iter()
                    .map(|d| d.dim_value.filter(|v| *v > 0).map(|v| v as u64))
                    .collect::<Option<_>>()
                    .ok_or_else(|| {
                        format!(
                            "{at}: shape {:?} is not fixed; give it with --input-shape {}=1,3,224,224 (the sizes you run)",
                            dim_text(dims),
                            i.name
                        )
                    })?,
            };
            let t = match tt.elem_type {
                data_type::FLOAT => {
                    self.emit.input(&i.name, DType::F32, &shape);
                    let t = self.emit.fresh(&format!("{}_f16", i.name));
                    self.emit.op(
                        "cast",
                        &[
                            ("input", Field::S(i.name.clone())),
                            ("output", Field::S(t.clone())),
                            ("dtype", s("f16")),
                        ],
                    );
                    t
                }
                data_type::FLOAT16 => {
                    self.emit.input(&i.name, DType::F16, &shape);
                    i.name.clone()
                }
                other => {
                    return Err(format!(
                        "{at}: element type {} (inputs are FLOAT or FLOAT16)",
                        data_type::name(other)
                    ))
                }
            };
            let held = strip(&shape);
            let t = if held != shape {
                self.write_view(&t, "reshape", &held, &format!("{}_held", i.name))
            } else {
                t
            };
            self.vals.insert(i.name.clone(), Val::R(Run { t, shape, e: Rc::new(Expr::X), prov: None }));
        }
        if let Some(n) = given.first() {
            return Err(format!(
                "{}: --input-shape names `{n}`, which is not an input of the model",
                self.file
            ));
        }
        Ok(())
    }

    fn get(&self, name: &str, at: &str) -> Result<Val, String> {
        self.vals
            .get(name)
            .cloned()
            .ok_or_else(|| format!("{at}: input `{name}` is not defined before it is used"))
    }

    /// The tensor of a runtime value, writing the ops its composition needs.
    fn tensor(&mut self, r: &Run, at: &str) -> Result<String, String> {
        if r.t.is_empty() {
            return Err(format!(
                "{at}: reads an intermediate of a recognised pattern (only its shape can be read)"
            ));
        }
        match r.e.form() {
            Form::Identity => Ok(r.t.clone()),
            Form::GeluTanh | Form::GeluErf => {
                let approx = if r.e.form() == Form::GeluTanh { "tanh" } else { "none" };
                let out = self.emit.fresh(&format!("{}_gelu", r.t));
                self.emit.op(
                    "gelu",
                    &[
                        ("input", Field::S(r.t.clone())),
                        ("output", Field::S(out.clone())),
                        ("dtype", s("f16")),
                        ("approximate", s(approx)),
                    ],
                );
                Ok(out)
            }
            Form::Affine(a, b) if b == 0.0 && self.fold_into_matmul(&r.t, a) => Ok(r.t.clone()),
            Form::Affine(a, b) => {
                let mut t = r.t.clone();
                for (op, v, skip) in [("mul", a, 1.0), ("add", b, 0.0)] {
                    if v == skip {
                        continue;
                    }
                    let p = self.emit.param(&format!("{t}_{op}"), DType::F16, 0, vec![1], vec![v as f32]);
                    let out = self.emit.fresh(&format!("{t}_{op}"));
                    self.binary(op, &t, &p, &out);
                    t = out;
                }
                Ok(t)
            }
            Form::Unknown => Err(format!(
                "{at}: the elementwise composition {} of `{}` is not one the device has a kernel for \
                 (recognised: scalings, shifts, the tanh and erf GeLU)",
                r.e.text(),
                r.t
            )),
        }
    }

    /// Scale the matmul that wrote `t` by `a` if nothing else reads its result unscaled (softmax
    /// must read a matmul's output, so `softmax(q·kᵀ × c)` needs the `c` in `alpha`).
    fn fold_into_matmul(&mut self, t: &str, a: f64) -> bool {
        let Some(&(op, alpha, single)) = self.matmuls.get(t) else { return false };
        match self.folded.get(t) {
            Some(prev) => *prev == a,
            None if single => {
                self.emit.set_number(op, "alpha", alpha * a);
                self.folded.insert(t.to_string(), a);
                true
            }
            None => false,
        }
    }

    /// A runtime operand of a matmul: the tensor and the scalar factor that goes into `alpha`.
    fn scaled(&mut self, r: &Run, at: &str) -> Result<(String, f64), String> {
        match r.e.form() {
            Form::Affine(a, b) if b == 0.0 => Ok((r.t.clone(), a)),
            _ => Ok((self.tensor(r, at)?, 1.0)),
        }
    }

    fn binary(&mut self, op: &str, a: &str, b: &str, out: &str) {
        self.emit.op(
            op,
            &[
                ("a", Field::S(a.into())),
                ("b", Field::S(b.into())),
                ("output", Field::S(out.into())),
                ("dtype", s("f16")),
            ],
        );
    }

    /// A constant as an f16 param (each constant once).
    fn param(&mut self, c: &Rc<Const>, base: &str, shape: Vec<u64>) -> String {
        let key = (Rc::as_ptr(c) as usize, false);
        if let Some((_, n)) = self.params_of.get(&key) {
            return n.clone();
        }
        let n = self.emit.param(base, DType::F16, 0, shape, f16_param_values(c));
        self.params_of.insert(key, (c.clone(), n.clone()));
        n
    }

    fn define(&mut self, node: &NodeProto, k: usize, v: Val) {
        if let Some(name) = node.output.get(k) {
            self.vals.insert(name.clone(), v);
        }
    }

    fn run(&mut self, node: &NodeProto, t: String, shape: Vec<u64>) {
        self.define(node, 0, Val::R(Run { t, shape, e: Rc::new(Expr::X), prov: None }));
    }

    fn out_name(&mut self, node: &NodeProto) -> String {
        let base = node.output.first().map(String::as_str).unwrap_or("t");
        self.emit.fresh(base)
    }

    /// A node inside a pattern lowered at a later node (a patch `Conv` and its flatten): its
    /// output is given a shape only, for `Shape` nodes that read it; any other use is refused.
    pub fn placeholder(&mut self, node: &NodeProto) {
        let shape_of = |v: Option<&Val>| match v {
            Some(Val::R(r)) => Some(r.shape.clone()),
            Some(Val::C(c)) => Some(c.shape.clone()),
            None => None,
        };
        let x = shape_of(node.input.first().and_then(|n| self.vals.get(n)));
        let shape = match (node.op_type.as_str(), x) {
            ("Conv", Some(x)) => match shape_of(node.input.get(1).and_then(|n| self.vals.get(n))) {
                Some(w) if x.len() == 4 && w.len() == 4 && w[2] > 0 && w[3] > 0 => {
                    Some(vec![x[0], w[0], x[2] / w[2], x[3] / w[3]])
                }
                _ => None,
            },
            (_, Some(x)) if x.len() == 4 => Some(vec![x[0], x[1], x[2] * x[3]]),
            _ => None,
        };
        if let Some(shape) = shape {
            self.define(node, 0, Val::R(Run { t: String::new(), shape, e: Rc::new(Expr::X), prov: None }));
        }
    }

    /// Lower one node.
    pub fn node(
        &mut self,
        g: &GraphProto,
        node: &NodeProto,
        pattern: Option<&Pattern>,
    ) -> Result<(), String> {
        let at = format!("{}: node `{}` ({}, opset {})", self.file, node.name, node.op_type, self.opset);
        if !(node.domain.is_empty() || node.domain == "ai.onnx") {
            return Err(format!(
                "{at}: domain `{}` is not supported; supported ops: {SUPPORTED}",
                node.domain
            ));
        }
        match pattern {
            Some(Pattern::LayerNorm { x, eps, means }) => {
                return self.decomposed_layernorm(g, node, x, eps, means, &at)
            }
            Some(Pattern::PatchEmbed { conv, flatten }) => {
                return self.patch_embed(&g.node[*conv], &g.node[*flatten], node, &at)
            }
            _ => {}
        }
        let attrs = Attrs(&node.attribute);
        if node.op_type == "Constant" {
            let c = constant(&attrs, self.ext).map_err(|e| format!("{at}: {e}"))?;
            self.define(node, 0, Val::C(Rc::new(c)));
            return Ok(());
        }
        let ins: Vec<Option<Val>> = node
            .input
            .iter()
            .map(|n| if n.is_empty() { Ok(None) } else { self.get(n, &at).map(Some) })
            .collect::<Result<_, _>>()?;
        let consts: Vec<Option<Rc<Const>>> =
            ins.iter().map(|v| if let Some(Val::C(c)) = v { Some(c.clone()) } else { None }).collect();
        let all_const = ins.iter().all(|v| !matches!(v, Some(Val::R(_))));
        if node.op_type == "Shape" {
            let shape = match &ins.first() {
                Some(Some(Val::R(r))) => r.shape.clone(),
                Some(Some(Val::C(c))) => c.shape.clone(),
                _ => return Err(format!("{at}: no input")),
            };
            let r = shape.len() as i64;
            let clamp = |v: i64| if v < 0 { (v + r).max(0) } else { v.min(r) } as usize;
            let (a, b) = (clamp(attrs.int("start").unwrap_or(0)), clamp(attrs.int("end").unwrap_or(r)));
            let dims: Vec<i64> = shape[a..b.max(a)].iter().map(|d| *d as i64).collect();
            self.define(node, 0, Val::C(Rc::new(Const::i(vec![dims.len() as u64], dims))));
            return Ok(());
        }
        if all_const {
            let outs = self.fold(node, &attrs, &consts).map_err(|e| format!("{at}: {e}"))?;
            for (k, c) in outs.into_iter().enumerate() {
                self.define(node, k, Val::C(Rc::new(c)));
            }
            return Ok(());
        }
        self.runtime(node, &attrs, &ins, &consts, &at)
    }

    fn const_ints(c: &Option<Rc<Const>>, what: &str) -> Result<Vec<i64>, String> {
        c.as_ref().ok_or_else(|| format!("{what} must be a constant"))?.as_i64()
    }

    /// Evaluate a node whose inputs are all constants.
    fn fold(
        &mut self,
        node: &NodeProto,
        attrs: &Attrs,
        c: &[Option<Rc<Const>>],
    ) -> Result<Vec<Const>, String> {
        let op = node.op_type.as_str();
        let x = || c.first().cloned().flatten().ok_or_else(|| "missing input".to_string());
        let y = || c.get(1).cloned().flatten().ok_or_else(|| "missing second input".to_string());
        Ok(vec![match op {
            "Identity" | "Dropout" => (*x()?).clone(),
            "Cast" => fold::cast(&*x()?, attrs.int("to").unwrap_or(1))?,
            "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "Equal" | "Less" | "Greater" | "Max" | "Min"
            | "And" | "Or" => fold::binary(op, &*x()?, &*y()?)?,
            "Sqrt" | "Neg" | "Abs" | "Exp" | "Tanh" | "Reciprocal" | "Erf" | "Floor" | "Ceil" | "Not" => {
                fold::unary(op, &*x()?)?
            }
            "Transpose" => fold::transpose(&*x()?, &attrs.ints("perm").unwrap_or_default())?,
            "Gather" => fold::gather(&*x()?, &*y()?, attrs.int("axis").unwrap_or(0))?,
            "Concat" => {
                let parts: Vec<&Const> = c.iter().flatten().map(|r| r.as_ref()).collect();
                fold::concat(&parts, attrs.int("axis").unwrap_or(0))?
            }
            "Reshape" => {
                let a = x()?;
                let shape =
                    fold::reshape_shape(&a.shape, &*y()?.as_i64()?, attrs.int("allowzero") == Some(1))?;
                a.reshaped(shape)
            }
            "Unsqueeze" | "Squeeze" | "Flatten" => {
                let a = x()?;
                let shape = self.view_shape(op, attrs, &a.shape, c.get(1).cloned().flatten())?;
                a.reshaped(shape)
            }
            "ConstantOfShape" => {
                let shape: Vec<u64> = x()?.as_i64()?.iter().map(|d| (*d).max(0) as u64).collect();
                let n = super::consts::elements(&shape)?;
                let v = match attrs.tensor("value") {
                    Some(t) => super::consts::decode(t, self.ext)?,
                    None => Const::f(vec![1], vec![0.0]),
                };
                match v.data {
                    super::consts::Data::F(f) => Const::f(shape, vec![*f.first().unwrap_or(&0.0); n]),
                    super::consts::Data::I(i) => Const::i(shape, vec![*i.first().unwrap_or(&0); n]),
                }
            }
            "Expand" => {
                let a = x()?;
                let want: Vec<u64> = y()?.as_i64()?.iter().map(|d| (*d).max(0) as u64).collect();
                let shape = ipu_core::graph::broadcast_shape(&a.shape, &want)
                    .ok_or_else(|| format!("Expand of {:?} to {want:?}", a.shape))?;
                a.pick(shape.clone(), &fold::broadcast_index(&shape, &a.shape)?)
            }
            "Tile" => {
                let a = x()?;
                let reps = y()?.as_i64()?;
                if reps.len() != a.shape.len() || reps.iter().any(|r| *r < 1) {
                    return Err(format!("Tile repeats {reps:?} for shape {:?}", a.shape));
                }
                let mut cur = (*a).clone();
                for (ax, r) in reps.iter().enumerate() {
                    let d = cur.shape[ax] as usize;
                    let picks: Vec<usize> = (0..*r as usize * d).map(|i| i % d).collect();
                    cur = fold::slice_axis(&cur, ax, &picks);
                }
                cur
            }
            "Slice" => {
                let mut a = (*x()?).clone();
                let starts = Self::const_ints(&c.get(1).cloned().flatten(), "starts")?;
                let ends = Self::const_ints(&c.get(2).cloned().flatten(), "ends")?;
                let axes = match c.get(3).cloned().flatten() {
                    Some(v) => v.as_i64()?,
                    None => (0..starts.len() as i64).collect(),
                };
                let steps = match c.get(4).cloned().flatten() {
                    Some(v) => v.as_i64()?,
                    None => vec![1; starts.len()],
                };
                if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
                    return Err("Slice: starts, ends, axes and steps differ in length".into());
                }
                for k in 0..starts.len() {
                    let ax = fold::axis(axes[k], a.shape.len())?;
                    let picks = fold::slice_range(a.shape[ax], starts[k], ends[k], steps[k])?;
                    a = fold::slice_axis(&a, ax, &picks);
                }
                a
            }
            "Split" => return self.split(node, attrs, c),
            "Range" => {
                let (s, l, d) = (
                    x()?.as_f64(),
                    y()?.as_f64(),
                    c.get(2).cloned().flatten().ok_or("Range: no delta")?.as_f64(),
                );
                let (s, l, d) = (s[0], l[0], d[0]);
                let n = if d == 0.0 { 0.0 } else { ((l - s) / d).ceil().max(0.0) };
                if n > 1e8 {
                    return Err("Range of more than 1e8 values".into());
                }
                let v: Vec<f64> = (0..n as usize).map(|i| s + i as f64 * d).collect();
                match x()?.data {
                    super::consts::Data::I(_) => {
                        Const::i(vec![v.len() as u64], v.iter().map(|x| *x as i64).collect())
                    }
                    super::consts::Data::F(_) => {
                        Const::f(vec![v.len() as u64], v.iter().map(|x| *x as f32).collect())
                    }
                }
            }
            "Where" => {
                let (cond, a, b) = (x()?, y()?, c.get(2).cloned().flatten().ok_or("Where: 3 inputs")?);
                let s1 = ipu_core::graph::broadcast_shape(&cond.shape, &a.shape).ok_or("Where: shapes")?;
                let shape = ipu_core::graph::broadcast_shape(&s1, &b.shape).ok_or("Where: shapes")?;
                let (ic, ia, ib) = (
                    fold::broadcast_index(&shape, &cond.shape)?,
                    fold::broadcast_index(&shape, &a.shape)?,
                    fold::broadcast_index(&shape, &b.shape)?,
                );
                let cv = cond.as_f64();
                match (&a.data, &b.data) {
                    (super::consts::Data::I(p), super::consts::Data::I(q)) => Const::i(
                        shape,
                        (0..ic.len()).map(|k| if cv[ic[k]] != 0.0 { p[ia[k]] } else { q[ib[k]] }).collect(),
                    ),
                    _ => {
                        let (p, q) = (a.as_f32(), b.as_f32());
                        Const::f(
                            shape,
                            (0..ic.len())
                                .map(|k| if cv[ic[k]] != 0.0 { p[ia[k]] } else { q[ib[k]] })
                                .collect(),
                        )
                    }
                }
            }
            "MatMul" => fold::matmul(&*x()?, &*y()?)?,
            "Gemm" => {
                let (mut a, mut b) = ((*x()?).clone(), (*y()?).clone());
                if attrs.int("transA") == Some(1) {
                    a = fold::transpose(&a, &[])?;
                }
                if attrs.int("transB") == Some(1) {
                    b = fold::transpose(&b, &[])?;
                }
                let mut p = fold::matmul(&a, &b)?;
                let alpha = attrs.float("alpha").unwrap_or(1.0);
                p = fold::binary("Mul", &p, &Const::f(vec![], vec![alpha]))?;
                if let Some(cc) = c.get(2).cloned().flatten() {
                    let beta = attrs.float("beta").unwrap_or(1.0);
                    p = fold::binary("Add", &p, &fold::binary("Mul", &cc, &Const::f(vec![], vec![beta]))?)?;
                }
                p
            }
            _ => return Err(format!("this op is not supported; supported ops: {SUPPORTED}")),
        }])
    }

    fn split(
        &mut self,
        node: &NodeProto,
        attrs: &Attrs,
        c: &[Option<Rc<Const>>],
    ) -> Result<Vec<Const>, String> {
        let a = c.first().cloned().flatten().ok_or("missing input")?;
        let ax = fold::axis(attrs.int("axis").unwrap_or(0), a.shape.len())?;
        let d = a.shape[ax];
        let parts = node.output.len() as u64;
        let sizes: Vec<u64> = match (c.get(1).cloned().flatten(), attrs.ints("split")) {
            (Some(s), _) => s.as_i64()?.iter().map(|v| (*v).max(0) as u64).collect(),
            (None, Some(s)) if !s.is_empty() => s.iter().map(|v| (*v).max(0) as u64).collect(),
            _ => {
                let n = attrs.int("num_outputs").map(|n| n as u64).unwrap_or(parts).max(1);
                let each = d.div_ceil(n);
                (0..n).map(|k| each.min(d.saturating_sub(k * each))).collect()
            }
        };
        if sizes.iter().sum::<u64>() != d || sizes.len() as u64 != parts {
            return Err(format!("Split of an axis of {d} into {sizes:?} for {parts} outputs"));
        }
        let mut start = 0usize;
        Ok(sizes
            .iter()
            .map(|n| {
                let picks: Vec<usize> = (start..start + *n as usize).collect();
                start += *n as usize;
                fold::slice_axis(&a, ax, &picks)
            })
            .collect())
    }

    /// Output shape of `Squeeze`, `Unsqueeze` and `Flatten`.
    fn view_shape(
        &self,
        op: &str,
        attrs: &Attrs,
        shape: &[u64],
        axes_in: Option<Rc<Const>>,
    ) -> Result<Vec<u64>, String> {
        let axes = match (axes_in, attrs.ints("axes")) {
            (Some(a), _) => Some(a.as_i64()?),
            (None, a) => a,
        };
        match op {
            "Flatten" => {
                let ax = attrs.int("axis").unwrap_or(1);
                let ax = if ax < 0 { ax + shape.len() as i64 } else { ax } as usize;
                if ax > shape.len() {
                    return Err(format!("Flatten axis {ax} of rank {}", shape.len()));
                }
                Ok(vec![shape[..ax].iter().product(), shape[ax..].iter().product()])
            }
            "Squeeze" => {
                let axes: Vec<usize> = match axes {
                    Some(a) => a.iter().map(|x| fold::axis(*x, shape.len())).collect::<Result<_, _>>()?,
                    None => (0..shape.len()).filter(|k| shape[*k] == 1).collect(),
                };
                if axes.iter().any(|k| shape[*k] != 1) {
                    return Err(format!("Squeeze of axes {axes:?} of {shape:?}: not of size 1"));
                }
                Ok(shape.iter().enumerate().filter(|(k, _)| !axes.contains(k)).map(|(_, d)| *d).collect())
            }
            _ => {
                let axes = axes.ok_or("Unsqueeze without axes")?;
                let r = shape.len() + axes.len();
                let mut ax: Vec<usize> = axes.iter().map(|x| fold::axis(*x, r)).collect::<Result<_, _>>()?;
                ax.sort_unstable();
                let mut out = Vec::with_capacity(r);
                let mut it = shape.iter();
                for k in 0..r {
                    out.push(if ax.contains(&k) { 1 } else { *it.next().ok_or("Unsqueeze axes repeat")? });
                }
                Ok(out)
            }
        }
    }

    /// A node with at least one runtime input.
    fn runtime(
        &mut self,
        node: &NodeProto,
        attrs: &Attrs,
        ins: &[Option<Val>],
        consts: &[Option<Rc<Const>>],
        at: &str,
    ) -> Result<(), String> {
        let op = node.op_type.as_str();
        let r0 = match ins.first() {
            Some(Some(Val::R(r))) => Some(r.clone()),
            _ => None,
        };
        let need_r0 =
            || r0.clone().ok_or_else(|| format!("{at}: the first input must be computed on the chip"));
        match op {
            "Identity" | "Dropout" => self.define(node, 0, Val::R(need_r0()?)),
            "Cast" => {
                let to = attrs.int("to").unwrap_or(0) as i32;
                if !matches!(to, data_type::FLOAT | data_type::FLOAT16 | data_type::DOUBLE) {
                    return Err(format!("{at}: a cast of a computed tensor to {} is not supported", data_type::name(to)));
                }
                self.define(node, 0, Val::R(need_r0()?));
            }
            "MatMul" => {
                let (a, b) = (ins[0].clone().unwrap(), ins.get(1).cloned().flatten().ok_or(format!("{at}: one input"))?);
                let out = self.out_name(node);
                let single = self.uses.get(&node.output[0]) == Some(&1);
                let prov = projection(&a, &b, 1.0, None);
                let (t, shape) = self.matmul(a, b, 1.0, &out, single, at)?;
                let prov = prov.map(|p| Rc::new(Prov { idx: Rc::new(iota(&shape)), ..p }));
                self.define(node, 0, Val::R(Run { t, shape, e: Rc::new(Expr::X), prov }));
            }
            "Gemm" => {
                let (a, b) = (ins[0].clone().unwrap(), ins.get(1).cloned().flatten().ok_or(format!("{at}: one input"))?);
                let a = match (a, attrs.int("transA")) {
                    (Val::R(_), Some(1)) => return Err(format!("{at}: transA on a computed tensor is not supported")),
                    (v, _) => v,
                };
                let b = match (b, attrs.int("transB")) {
                    (Val::C(c), Some(1)) => Val::C(Rc::new(fold::transpose(&c, &[])?)),
                    (Val::R(_), Some(1)) => return Err(format!("{at}: transB on a computed tensor is not supported")),
                    (v, _) => v,
                };
                let alpha = attrs.float("alpha").unwrap_or(1.0) as f64;
                let mm = self.emit.fresh(&format!("{}_mm", node.output[0]));
                let (mut t, shape) = self.matmul(a, b, alpha, &mm, false, at)?;
                if let Some(c) = consts.get(2).cloned().flatten() {
                    let beta = attrs.float("beta").unwrap_or(1.0);
                    let c = Rc::new(fold::binary("Mul", &c, &Const::f(vec![], vec![beta]))?);
                    let p = self.param(&c, &format!("{}_bias", node.output[0]), strip(&c.shape));
                    let out = self.out_name(node);
                    self.binary("add", &t, &p, &out);
                    t = out;
                } else if matches!(ins.get(2), Some(Some(Val::R(_)))) {
                    return Err(format!("{at}: a computed C operand is not supported"));
                }
                self.run(node, t, shape);
            }
            "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Tanh" | "Erf" | "Sqrt" | "Exp" | "Neg" | "Abs" | "Reciprocal" => {
                self.elementwise(node, ins, at)?
            }
            "Gelu" => {
                let r = need_r0()?;
                let t = self.tensor(&r, at)?;
                let form = match attrs.string("approximate").as_deref() {
                    None | Some("none") => "none",
                    Some("tanh") => "tanh",
                    Some(o) => return Err(format!("{at}: approximate = `{o}`")),
                };
                let out = self.out_name(node);
                self.emit.op(
                    "gelu",
                    &[("input", Field::S(t)), ("output", Field::S(out.clone())), ("dtype", s("f16")), ("approximate", s(form))],
                );
                self.run(node, out, r.shape);
            }
            "LayerNormalization" => {
                let r = need_r0()?;
                let rank = r.shape.len();
                if fold::axis(attrs.int("axis").unwrap_or(-1), rank)? != rank - 1 {
                    return Err(format!("{at}: normalising over axes other than the last is not supported"));
                }
                let t = self.tensor(&r, at)?;
                let d = *r.shape.last().unwrap_or(&1);
                let mut fields = vec![("input", Field::S(t))];
                for (k, field) in [(1, "gamma"), (2, "beta")] {
                    match ins.get(k) {
                        Some(Some(Val::C(c))) => {
                            if c.len() as u64 != d {
                                return Err(format!("{at}: {field} has {} values for rows of {d}", c.len()));
                            }
                            let p = self.param(c, &format!("{}_{field}", node.name_or(k)), vec![d]);
                            fields.push((field, Field::S(p)));
                        }
                        Some(Some(Val::R(_))) => return Err(format!("{at}: a computed {field} is not supported")),
                        _ => {}
                    }
                }
                let out = self.out_name(node);
                fields.push(("eps", Field::F(attrs.float("epsilon").unwrap_or(1e-5) as f64)));
                fields.push(("output", Field::S(out.clone())));
                fields.push(("dtype", s("f16")));
                self.emit.op("layernorm", &fields);
                self.run(node, out, r.shape);
            }
            "Softmax" => {
                let r = need_r0()?;
                let default = if self.opset >= 13 { -1 } else { 1 };
                if fold::axis(attrs.int("axis").unwrap_or(default), r.shape.len())? != r.shape.len() - 1 {
                    return Err(format!("{at}: softmax over an axis other than the last is not supported"));
                }
                let t = self.tensor(&r, at)?;
                let out = self.out_name(node);
                self.emit.op("softmax", &[("input", Field::S(t)), ("output", Field::S(out.clone())), ("dtype", s("f16"))]);
                self.run(node, out, r.shape);
            }
            "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => {
                let r = need_r0()?;
                let shape = if op == "Reshape" {
                    let spec = Self::const_ints(&consts.get(1).cloned().flatten(), "the target shape").map_err(|e| format!("{at}: {e}"))?;
                    fold::reshape_shape(&r.shape, &spec, attrs.int("allowzero") == Some(1)).map_err(|e| format!("{at}: {e}"))?
                } else {
                    self.view_shape(op, attrs, &r.shape, consts.get(1).cloned().flatten()).map_err(|e| format!("{at}: {e}"))?
                };
                self.view(node, r, "reshape", shape, None, at)?;
            }
            "Transpose" => {
                let r = need_r0()?;
                let rank = r.shape.len();
                let perm: Vec<usize> = match attrs.ints("perm") {
                    Some(p) if !p.is_empty() => p.iter().map(|a| fold::axis(*a, rank)).collect::<Result<_, _>>()?,
                    _ => (0..rank).rev().collect(),
                };
                let shape = perm.iter().map(|p| r.shape.get(*p).copied().unwrap_or(0)).collect();
                self.view(node, r, "transpose", shape, Some(perm), at)?;
            }
            "Gather" | "Slice" | "Expand" => {
                let r = need_r0()?;
                let same = self.selects_everything(op, attrs, &r.shape, consts).map_err(|e| format!("{at}: {e}"))?;
                match (same, &r.prov) {
                    (Some(shape), _) => self.view(node, r, "reshape", shape, None, at)?,
                    (None, Some(p)) if *r.e == Expr::X && op != "Expand" => {
                        let mut cs = consts.to_vec();
                        cs[0] = Some(p.idx.clone());
                        let idx = self.fold(node, attrs, &cs).map_err(|e| format!("{at}: {e}"))?.remove(0);
                        let v = self.select(node, 0, p.clone(), idx, at)?;
                        self.define(node, 0, v);
                    }
                    (None, _) => {
                        return Err(format!(
                            "{at}: selecting part of a computed tensor is supported for an axis of size 1, a whole \
                             axis, or columns of a projection by constant weights"
                        ))
                    }
                }
            }
            "Split" => {
                let r = need_r0()?;
                let p = r.prov.clone().filter(|_| *r.e == Expr::X).ok_or_else(|| {
                    format!("{at}: Split of a computed tensor is supported for a projection by constant weights")
                })?;
                let mut cs = consts.to_vec();
                cs[0] = Some(p.idx.clone());
                let parts = self.fold(node, attrs, &cs).map_err(|e| format!("{at}: {e}"))?;
                for (k, idx) in parts.into_iter().enumerate() {
                    let v = self.select(node, k, p.clone(), idx, at)?;
                    self.define(node, k, v);
                }
            }
            "Conv" => {
                return Err(format!(
                    "{at}: Conv is supported as a patch embedding: stride equal to the kernel, no padding, followed by \
                     Flatten/Reshape to [N, C, patches] and Transpose(0, 2, 1)"
                ))
            }
            _ => return Err(format!("{at}: not supported on a computed tensor; supported ops: {SUPPORTED}")),
        }
        Ok(())
    }

    /// The part `idx` (flat indices into the projection's output, in the shape of the result)
    /// of a projection: when it is whole rows of a subset of the columns, that subset projected
    /// on its own and viewed in the result's shape.
    fn select(
        &mut self,
        node: &NodeProto,
        k: usize,
        p: Rc<Prov>,
        idx: Const,
        at: &str,
    ) -> Result<Val, String> {
        let n = p.w.shape[1] as usize;
        let rows = p.x.shape.iter().product::<u64>() as usize / (p.w.shape[0] as usize).max(1);
        let picked = idx.as_i64()?;
        let width = if rows == 0 { 0 } else { picked.len() / rows };
        let cols: Vec<usize> = picked.iter().take(width).map(|i| *i as usize % n.max(1)).collect();
        let whole_rows = width > 0
            && width * rows == picked.len()
            && picked.iter().enumerate().all(|(j, i)| *i as usize == (j / width) * n + cols[j % width]);
        if !whole_rows {
            return Err(format!("{at}: this selection of a projection's output is not a set of its columns"));
        }
        let w = Rc::new(fold::slice_axis(&p.w, 1, &cols));
        let bias = p.bias.as_ref().map(|b| Rc::new(fold::slice_axis(&b.reshaped(vec![n as u64]), 0, &cols)));
        let base = node.output.get(k).cloned().unwrap_or_default();
        let out = self.emit.fresh(&format!("{base}_proj"));
        let (mut t, shape) = self.matmul(Val::R(p.x.clone()), Val::C(w.clone()), p.alpha, &out, false, at)?;
        if let Some(b) = &bias {
            let name = self.param(b, &format!("{base}_bias"), vec![cols.len() as u64]);
            let o = self.emit.fresh(&format!("{base}_biased"));
            self.binary("add", &t, &name, &o);
            t = o;
        }
        let t = self.emit_view(&t, &shape, &idx.shape, None, &base)?;
        let prov = Prov {
            x: p.x.clone(),
            w,
            bias,
            alpha: p.alpha,
            idx: Rc::new(iota(&shape).reshaped(idx.shape.clone())),
        };
        Ok(Val::R(Run { t, shape: idx.shape.clone(), e: Rc::new(Expr::X), prov: Some(Rc::new(prov)) }))
    }

    /// `Gather`/`Slice`/`Expand` that keep every element: the output shape, else `None`.
    fn selects_everything(
        &self,
        op: &str,
        attrs: &Attrs,
        shape: &[u64],
        c: &[Option<Rc<Const>>],
    ) -> Result<Option<Vec<u64>>, String> {
        let arg = |k: usize| c.get(k).cloned().flatten();
        match op {
            "Gather" => {
                let idx = arg(1).ok_or("indices must be constant")?;
                let ax = fold::axis(attrs.int("axis").unwrap_or(0), shape.len())?;
                let i = idx.as_i64()?;
                if shape[ax] != 1 || i.len() != 1 || !(i[0] == 0 || i[0] == -1) {
                    return Ok(None);
                }
                let mut out = shape[..ax].to_vec();
                out.extend(&idx.shape);
                out.extend(&shape[ax + 1..]);
                Ok(Some(out))
            }
            "Slice" => {
                let starts = Self::const_ints(&arg(1), "starts")?;
                let ends = Self::const_ints(&arg(2), "ends")?;
                let axes = match arg(3) {
                    Some(a) => a.as_i64()?,
                    None => (0..starts.len() as i64).collect(),
                };
                let steps = match arg(4) {
                    Some(a) => a.as_i64()?,
                    None => vec![1; starts.len()],
                };
                for k in 0..starts.len().min(ends.len()).min(axes.len()).min(steps.len()) {
                    let ax = fold::axis(axes[k], shape.len())?;
                    let picks = fold::slice_range(shape[ax], starts[k], ends[k], steps[k])?;
                    if picks != (0..shape[ax] as usize).collect::<Vec<_>>() {
                        return Ok(None);
                    }
                }
                Ok(Some(shape.to_vec()))
            }
            _ => {
                let want: Vec<u64> = arg(1)
                    .ok_or("shape must be constant")?
                    .as_i64()?
                    .iter()
                    .map(|d| (*d).max(0) as u64)
                    .collect();
                Ok(ipu_core::graph::broadcast_shape(shape, &want).filter(|s| s == shape))
            }
        }
    }

    /// A reshape or transpose of a runtime value. A pure scaling travels through the view (so a
    /// scale on K before its transpose still folds into the matmul's `alpha`).
    fn view(
        &mut self,
        node: &NodeProto,
        r: Run,
        kind: &str,
        shape: Vec<u64>,
        perm: Option<Vec<usize>>,
        at: &str,
    ) -> Result<(), String> {
        let (t, e) = match r.e.form() {
            Form::Affine(_, 0.0) | Form::Identity => (r.t.clone(), r.e.clone()),
            _ => (self.tensor(&r, at)?, Rc::new(Expr::X)),
        };
        let base = node.output.first().cloned().unwrap_or_default();
        let t =
            self.emit_view(&t, &r.shape, &shape, perm.as_deref(), &base).map_err(|e| format!("{at}: {e}"))?;
        let _ = kind;
        let prov = match (&r.prov, *e == Expr::X) {
            (Some(p), true) => Some(Rc::new(Prov {
                x: p.x.clone(),
                w: p.w.clone(),
                bias: p.bias.clone(),
                alpha: p.alpha,
                idx: match &perm {
                    Some(perm) => {
                        Rc::new(fold::transpose(&p.idx, &perm.iter().map(|x| *x as i64).collect::<Vec<_>>())?)
                    }
                    None => Rc::new(p.idx.reshaped(shape.clone())),
                },
            })),
            _ => None,
        };
        self.define(node, 0, Val::R(Run { t, shape, e, prov }));
        Ok(())
    }

    /// Write the views that turn tensor `t` (ONNX shape `from`, held as `strip(from)`) into ONNX
    /// shape `to` (held as `strip(to)`): a reshape, or a transpose by `perm` (ONNX axes). The
    /// device's transposes keep the last axis (a view) or swap the last two; a permutation that
    /// brings the last axis to the second-to-last place is written as one of each.
    fn emit_view(
        &mut self,
        t: &str,
        from: &[u64],
        to: &[u64],
        perm: Option<&[usize]>,
        base: &str,
    ) -> Result<String, String> {
        let (held_in, held_out) = (strip(from), strip(to));
        let Some(perm) = perm else {
            return Ok(if held_in == held_out {
                t.to_string()
            } else {
                self.write_view(t, "reshape", &held_out, base)
            });
        };
        let (lead_in, lead_out) = (from.len() - held_in.len(), to.len() - held_out.len());
        // The permutation of the held axes; when a leading unit axis moves, work at full rank.
        let ours: Option<Vec<usize>> = (lead_in == lead_out)
            .then(|| perm[lead_out..].iter().map(|p| p.checked_sub(lead_in)).collect::<Option<Vec<_>>>())
            .flatten()
            .filter(|p| {
                let mut q = p.clone();
                q.sort_unstable();
                q.iter().enumerate().all(|(k, v)| k == *v)
            });
        let (t, perm, out_full) = match ours {
            Some(p) => (t.to_string(), p, false),
            None => {
                let full = if held_in.len() == from.len() {
                    t.to_string()
                } else {
                    self.write_view(t, "reshape", from, base)
                };
                (full, perm.to_vec(), held_out.len() != to.len())
            }
        };
        let r = perm.len();
        if perm.iter().enumerate().all(|(k, v)| k == *v) {
            return Ok(t);
        }
        let mut t = t;
        let mut perm = perm;
        if r >= 2 && perm[r - 1] != r - 1 && perm[r - 2] == r - 1 {
            let mut first = perm.clone();
            first.swap(r - 2, r - 1);
            if !first.iter().enumerate().all(|(k, v)| k == *v) {
                let ints: Vec<i64> = first.iter().map(|x| *x as i64).collect();
                t = self.write_view_ints(&t, "transpose", "perm", ints, &format!("{base}_lead"));
            }
            perm = (0..r).collect();
            perm.swap(r - 2, r - 1);
        }
        let ints: Vec<i64> = perm.iter().map(|x| *x as i64).collect();
        let out = self.write_view_ints(&t, "transpose", "perm", ints, base);
        Ok(if out_full { self.write_view(&out, "reshape", &held_out, base) } else { out })
    }

    fn write_view(&mut self, t: &str, kind: &str, shape: &[u64], base: &str) -> String {
        self.write_view_ints(t, kind, "shape", shape.iter().map(|x| *x as i64).collect(), base)
    }

    fn write_view_ints(&mut self, t: &str, kind: &str, field: &str, ints: Vec<i64>, base: &str) -> String {
        let out = self.emit.fresh(base);
        let f: &'static str = if field == "perm" { "perm" } else { "shape" };
        self.emit.op(
            kind,
            &[
                ("input", Field::S(t.into())),
                (f, Field::Ints(ints)),
                ("output", Field::S(out.clone())),
                ("dtype", s("f16")),
            ],
        );
        out
    }

    fn elementwise(&mut self, node: &NodeProto, ins: &[Option<Val>], at: &str) -> Result<(), String> {
        let op = node.op_type.as_str();
        let op: &'static str =
            ["Add", "Sub", "Mul", "Div", "Pow", "Tanh", "Erf", "Sqrt", "Exp", "Neg", "Abs", "Reciprocal"]
                .into_iter()
                .find(|o| *o == op)
                .unwrap_or("Add");
        let runs: Vec<&Run> =
            ins.iter().filter_map(|v| if let Some(Val::R(r)) = v { Some(r) } else { None }).collect();
        let base = runs[0];
        let symbolic = runs.iter().all(|r| r.t == base.t && r.shape == base.shape)
            && ins.iter().all(|v| match v {
                Some(Val::C(c)) => c.len() == 1 && c.shape.len() <= base.shape.len(),
                _ => true,
            });
        if symbolic {
            let term = |v: &Option<Val>| match v {
                Some(Val::R(r)) => r.e.clone(),
                Some(Val::C(c)) => Rc::new(Expr::C(c.scalar().unwrap_or(0.0))),
                None => Rc::new(Expr::C(0.0)),
            };
            let e = if ins.len() == 1 {
                Expr::Un(op, term(&ins[0]))
            } else {
                Expr::Bin(op, term(&ins[0]), term(&ins[1]))
            };
            self.define(
                node,
                0,
                Val::R(Run { t: base.t.clone(), shape: base.shape.clone(), e: Rc::new(e), prov: None }),
            );
            return Ok(());
        }
        if !matches!(op, "Add" | "Sub" | "Mul" | "Div") || ins.len() != 2 {
            return Err(format!(
                "{at}: {op} of tensors computed on the chip is supported only as part of a recognised composition"
            ));
        }
        let mut names = Vec::new();
        let mut shapes = Vec::new();
        for (k, v) in ins.iter().enumerate() {
            match v {
                Some(Val::R(r)) => {
                    if op == "Div" && k == 1 {
                        return Err(format!(
                            "{at}: division by a tensor computed on the chip is not supported"
                        ));
                    }
                    names.push(self.tensor(r, at)?);
                    shapes.push(r.shape.clone());
                }
                Some(Val::C(c)) => {
                    let c = if op == "Div" { Rc::new(fold::unary("Reciprocal", c)?) } else { c.clone() };
                    let shape = if c.shape.is_empty() { vec![1] } else { c.shape.clone() };
                    names.push(self.param(&c, &format!("{}_c{k}", node.output[0]), strip(&shape)));
                    shapes.push(shape);
                }
                None => return Err(format!("{at}: missing input")),
            }
        }
        let shape = ipu_core::graph::broadcast_shape(&shapes[0], &shapes[1])
            .ok_or_else(|| format!("{at}: shapes {:?} and {:?} do not broadcast", shapes[0], shapes[1]))?;
        let out = self.out_name(node);
        let ours = match op {
            "Add" => "add",
            "Sub" => "sub",
            _ => "mul",
        };
        self.binary(ours, &names[0], &names[1], &out);
        // A bias added to a projection's output (either operand order) stays part of it.
        let prov = match (op, &ins[0], &ins[1]) {
            ("Add", Some(Val::R(r)), Some(Val::C(c))) | ("Add", Some(Val::C(c)), Some(Val::R(r))) => {
                r.prov.as_ref().and_then(|p| {
                    let n = p.w.shape[1];
                    let per_column = c.len() as u64 == n
                        && c.shape.last() == Some(&n)
                        && shape == r.shape
                        && is_iota(&p.idx);
                    (per_column && p.bias.is_none() && *r.e == Expr::X).then(|| {
                        Rc::new(Prov {
                            x: p.x.clone(),
                            w: p.w.clone(),
                            bias: Some(c.clone()),
                            alpha: p.alpha,
                            idx: p.idx.clone(),
                        })
                    })
                })
            }
            _ => None,
        };
        self.define(node, 0, Val::R(Run { t: out, shape, e: Rc::new(Expr::X), prov }));
        Ok(())
    }

    /// `a · b` (either may be a constant, which becomes a param), scaled by `alpha` and by the
    /// operands' pending scalings. Returns the output tensor and shape.
    fn matmul(
        &mut self,
        a: Val,
        b: Val,
        alpha: f64,
        out: &str,
        single: bool,
        at: &str,
    ) -> Result<(String, Vec<u64>), String> {
        let mut alpha = alpha;
        let fp8 = self.opts.weights == Weights::Fp8 && matches!((&a, &b), (Val::R(_), Val::C(_)));
        let mut side = |v: Val, which: usize, this: &mut Self| -> Result<(String, Vec<u64>), String> {
            match v {
                Val::R(r) => {
                    let (t, f) = this.scaled(&r, at)?;
                    alpha *= f;
                    Ok((t, r.shape))
                }
                Val::C(c) => {
                    let mut shape = c.shape.clone();
                    while shape.len() > 2 && shape[0] == 1 {
                        shape.remove(0);
                    }
                    if shape.len() < 2 {
                        return Err(format!(
                            "{at}: a constant operand of rank {} is not supported",
                            c.shape.len()
                        ));
                    }
                    let base = format!("{out}_w{which}");
                    if fp8 && which == 1 {
                        Ok((this.fp8_weight(&c, &base, shape.clone()), shape))
                    } else {
                        Ok((this.param(&c, &base, shape.clone()), shape))
                    }
                }
            }
        };
        let (mut ta, sa) = side(a, 0, self)?;
        let (tb, sb) = side(b, 1, self)?;
        let dt = |d: DType, s: &[u64]| ipu_core::graph::Tensor {
            name: String::new(),
            dtype: d,
            shape: s.to_vec(),
            scale: 0,
        };
        let (batch, m, _k, n) =
            ipu_core::graph::matmul_shape(&dt(DType::F16, &sa), &dt(DType::F16, &sb), false, false)
                .ok_or_else(|| format!("{at}: shapes {sa:?} · {sb:?} do not multiply"))?;
        if fp8 {
            // Twice the calibrated range: the FP8 model's activations differ from the f16 run's,
            // and a value past the format's largest one becomes NaN. FP8 is floating point, so
            // the headroom costs precision only at the bottom of the range.
            let range =
                self.opts.activation_ranges.get(out).map(|r| 2.0 * r).unwrap_or(DEFAULT_ACTIVATION_RANGE);
            let scale = fp8_scale(range);
            let cast = self.emit.fresh(&format!("{ta}_f8"));
            self.emit.op(
                "cast",
                &[
                    ("input", Field::S(ta.clone())),
                    ("output", Field::S(cast.clone())),
                    ("dtype", s("f8e4m3")),
                    ("scale", Field::I(scale as i64)),
                ],
            );
            self.scales.push((cast.clone(), scale));
            ta = cast;
        }
        let mut fields = vec![("a", Field::S(ta)), ("b", Field::S(tb))];
        if alpha != 1.0 {
            fields.push(("alpha", Field::F(alpha)));
        }
        fields.extend([("output", Field::S(out.into())), ("dtype", s("f16")), ("accumulate", s("f16"))]);
        let idx = self.emit.op("matmul", &fields);
        self.matmuls.insert(out.to_string(), (idx, alpha, single));
        let mut shape = batch;
        shape.extend([m, n]);
        Ok((out.to_string(), shape))
    }

    /// A matmul weight as FP8 E4M3 with a power-of-two scale from its largest magnitude.
    fn fp8_weight(&mut self, c: &Rc<Const>, base: &str, shape: Vec<u64>) -> String {
        let key = (Rc::as_ptr(c) as usize, true);
        if let Some((_, n)) = self.params_of.get(&key) {
            return n.clone();
        }
        let v = c.as_f32();
        let range = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        let scale = fp8_scale(range);
        let n = self.emit.param(base, DType::F8E4M3, scale, shape, v);
        self.scales.push((n.clone(), scale));
        self.params_of.insert(key, (c.clone(), n.clone()));
        n
    }

    fn decomposed_layernorm(
        &mut self,
        g: &GraphProto,
        node: &NodeProto,
        x: &str,
        eps: &str,
        means: &[usize; 2],
        at: &str,
    ) -> Result<(), String> {
        let Val::R(r) = self.get(x, at)? else {
            return Err(format!("{at}: LayerNorm of a constant"));
        };
        let rank = r.shape.len();
        for m in means {
            let mn = &g.node[*m];
            let axes = match mn.input.get(1).filter(|n| !n.is_empty()) {
                Some(n) => match self.get(n, at)? {
                    Val::C(c) => c.as_i64()?,
                    Val::R(_) => return Err(format!("{at}: ReduceMean axes must be constant")),
                },
                None => Attrs(&mn.attribute).ints("axes").unwrap_or_default(),
            };
            if axes.len() != 1
                || fold::axis(axes[0], rank)? != rank - 1
                || Attrs(&mn.attribute).int("keepdims") == Some(0)
            {
                return Err(format!("{at}: a LayerNorm written out over axes {axes:?} of rank {rank}: only the last axis is supported"));
            }
        }
        let eps = match self.get(eps, at)? {
            Val::C(c) => c.scalar().ok_or(format!("{at}: eps is not a scalar"))?,
            Val::R(_) => return Err(format!("{at}: eps is computed on the chip")),
        };
        let t = self.tensor(&r, at)?;
        let out = self.out_name(node);
        self.emit.op(
            "layernorm",
            &[
                ("input", Field::S(t)),
                ("eps", Field::F(eps)),
                ("output", Field::S(out.clone())),
                ("dtype", s("f16")),
            ],
        );
        self.run(node, out, r.shape);
        Ok(())
    }

    fn patch_embed(
        &mut self,
        conv: &NodeProto,
        flatten: &NodeProto,
        node: &NodeProto,
        at: &str,
    ) -> Result<(), String> {
        let catt = Attrs(&conv.attribute);
        let Val::R(x) = self.get(&conv.input[0], at)? else {
            return Err(format!("{at}: Conv of a constant"));
        };
        let Val::C(w) = self.get(&conv.input[1], at)? else {
            return Err(format!("{at}: Conv weights must be constant"));
        };
        let bias = match conv.input.get(2).filter(|n| !n.is_empty()) {
            Some(n) => match self.get(n, at)? {
                Val::C(c) => Some(c),
                Val::R(_) => return Err(format!("{at}: Conv bias must be constant")),
            },
            None => None,
        };
        let (xs, ws) = (&x.shape, &w.shape);
        if xs.len() != 4 || ws.len() != 4 || ws[1] != xs[1] || ws[2] != ws[3] {
            return Err(format!("{at}: Conv of {xs:?} with weights {ws:?}: a 2-D convolution with square kernels is supported"));
        }
        let k = ws[2];
        let ones = |n: &str, want: i64| catt.ints(n).is_none_or(|v| v.iter().all(|x| *x == want));
        let stride_ok = catt.ints("strides").is_some_and(|s| s.iter().all(|x| *x as u64 == k));
        if !stride_ok
            || !ones("pads", 0)
            || !ones("dilations", 1)
            || catt.int("group").unwrap_or(1) != 1
            || xs[2] % k != 0
            || xs[3] % k != 0
        {
            return Err(format!(
                "{at}: Conv is supported as a patch embedding: strides equal to the kernel ({k}), no padding, no dilation, \
                 one group, and an image whose sides are multiples of the kernel"
            ));
        }
        let (n, c, hp, wp, d) = (xs[0], xs[1], xs[2] / k, xs[3] / k, ws[0]);
        let fl_shape: Vec<u64> = if flatten.op_type == "Flatten" {
            let ax = Attrs(&flatten.attribute).int("axis").unwrap_or(1);
            if ax != 2 {
                return Err(format!("{at}: Flatten axis {ax} after the patch Conv (expected 2)"));
            }
            vec![n, d, hp * wp]
        } else {
            let spec = match self.get(&flatten.input[1], at)? {
                Val::C(c) => c.as_i64()?,
                Val::R(_) => return Err(format!("{at}: the Reshape target must be constant")),
            };
            fold::reshape_shape(&[n, d, hp, wp], &spec, false)?
        };
        let perm = Attrs(&node.attribute).ints("perm").unwrap_or_default();
        if fl_shape != [n, d, hp * wp] || perm != [0, 2, 1] {
            return Err(format!("{at}: the patch Conv's output is reshaped to {fl_shape:?} and transposed by {perm:?}; expected [N, C, patches] and [0, 2, 1]"));
        }
        let t = self.tensor(&x, at)?;
        let base = conv.output[0].clone();
        let six = [n, c, hp, k, wp, k];
        let r6 = self.emit_view(&t, xs, &six, None, &format!("{base}_reshape"))?;
        let moved = [n, hp, wp, c, k, k];
        let t6 =
            self.emit_view(&r6, &six, &moved, Some(&[0, 2, 4, 1, 3, 5]), &format!("{base}_transpose"))?;
        let patches =
            self.emit_view(&t6, &moved, &[n, hp * wp, c * k * k], None, &format!("{base}_reshape"))?;
        let wm = fold::transpose(&w.reshaped(vec![d, c * k * k]), &[])?;
        let pr = Run { t: patches, shape: vec![n, hp * wp, c * k * k], e: Rc::new(Expr::X), prov: None };
        let out = self.emit.fresh(&format!("{}_mm", node.output[0]));
        let (mut y, shape) = self.matmul(Val::R(pr), Val::C(Rc::new(wm)), 1.0, &out, false, at)?;
        if let Some(b) = bias {
            let p = self.param(&b, &format!("{}_bias", conv.output[0]), vec![d]);
            let o = self.out_name(node);
            self.binary("add", &y, &p, &o);
            y = o;
        }
        self.run(node, y, shape);
        Ok(())
    }

    /// The graph outputs: each computed value cast to the output's element type under the ONNX
    /// name. Returns the model text, the param values and the FP8 scales chosen.
    pub fn finish(
        mut self,
        g: &GraphProto,
        name: &str,
    ) -> Result<(String, BTreeMap<String, HostTensor>, Vec<(String, i8)>), String> {
        let mut outs = Vec::new();
        for o in &g.output {
            let at = format!("{}: output `{}`", self.file, o.name);
            let r = match self.vals.get(&o.name).cloned() {
                Some(Val::R(r)) => r,
                Some(Val::C(_)) => return Err(format!("{at}: a constant, not computed on the chip")),
                None => return Err(format!("{at}: no node computes it")),
            };
            let t = self.tensor(&r, &at)?;
            let elem = o
                .r#type
                .as_ref()
                .and_then(|t| t.tensor_type.as_ref())
                .map(|t| t.elem_type)
                .unwrap_or(data_type::FLOAT);
            if elem == data_type::FLOAT16 {
                let shape: Vec<i64> = r.shape.iter().map(|d| *d as i64).collect();
                self.emit.op(
                    "reshape",
                    &[
                        ("input", Field::S(t)),
                        ("shape", Field::Ints(shape)),
                        ("output", Field::S(o.name.clone())),
                        ("dtype", s("f16")),
                    ],
                );
            } else if strip(&r.shape) == r.shape {
                self.emit.op(
                    "cast",
                    &[("input", Field::S(t)), ("output", Field::S(o.name.clone())), ("dtype", s("f32"))],
                );
            } else {
                // Cast where the tensor is held, then view it in the ONNX shape under the ONNX name.
                let wide = self.emit.fresh(&format!("{}_f32", o.name));
                self.emit.op(
                    "cast",
                    &[("input", Field::S(t)), ("output", Field::S(wide.clone())), ("dtype", s("f32"))],
                );
                let shape: Vec<i64> = r.shape.iter().map(|d| *d as i64).collect();
                self.emit.op(
                    "reshape",
                    &[
                        ("input", Field::S(wide)),
                        ("shape", Field::Ints(shape)),
                        ("output", Field::S(o.name.clone())),
                        ("dtype", s("f32")),
                    ],
                );
            }
            outs.push(o.name.clone());
        }
        let header = format!("# Imported from {} by ipu-codegen {}.\n", self.file, env!("CARGO_PKG_VERSION"));
        self.emit.prune(&outs);
        let toml = self.emit.finish(name, &outs, &header);
        let live: BTreeSet<&String> = self.emit.params.iter().map(|p| &p.0).collect();
        self.scales.retain(|(n, _)| {
            live.contains(n) || toml.contains(&format!("output = {}", super::emit::quote(n)))
        });
        let params = self.emit.params.drain(..).map(|(n, _, _, t)| (n, t)).collect();
        Ok((toml, params, self.scales))
    }
}

/// Activation range assumed for an FP8 matmul input without calibration.
pub const DEFAULT_ACTIVATION_RANGE: f32 = 8.0;

/// The smallest power-of-two scale that maps `range` inside E4M3's largest finite value
/// (`Fp8Format::E4M3.max_value()`, docs/target.md), so no value saturates.
pub fn fp8_scale(range: f32) -> i8 {
    let max = Fp8Format::E4M3.max_value();
    if !(range.is_finite() && range > 0.0) {
        return 0;
    }
    ((range / max).log2().ceil() as i32).clamp(-32, 31) as i8
}

/// The shape a runtime tensor is held in: its ONNX shape without leading unit axes (a batch of
/// one), keeping at least two axes. The matmul planners take rank-2 operands; broadcasting is
/// unchanged by leading unit axes.
fn strip(shape: &[u64]) -> Vec<u64> {
    let lead = shape.iter().take(shape.len().saturating_sub(2)).take_while(|d| **d == 1).count();
    shape[lead..].to_vec()
}

fn s(v: &str) -> Field {
    Field::S(v.into())
}

fn dim_text(dims: &[super::proto::Dimension]) -> Vec<String> {
    dims.iter()
        .map(|d| match (&d.dim_value, &d.dim_param) {
            (Some(v), _) => v.to_string(),
            (None, Some(p)) => p.clone(),
            _ => "?".into(),
        })
        .collect()
}

/// The value of a `Constant` node.
fn constant(a: &Attrs, ext: &mut External) -> Result<Const, String> {
    if let Some(t) = a.tensor("value") {
        return super::consts::decode(t, ext);
    }
    if let Some(f) = a.0.iter().find(|x| x.name == "value_float") {
        return Ok(Const::f(vec![], vec![f.f]));
    }
    if let Some(i) = a.0.iter().find(|x| x.name == "value_int") {
        return Ok(Const::i(vec![], vec![i.i]));
    }
    if let Some(v) = a.0.iter().find(|x| x.name == "value_floats") {
        return Ok(Const::f(vec![v.floats.len() as u64], v.floats.clone()));
    }
    if let Some(v) = a.ints("value_ints") {
        return Ok(Const::i(vec![v.len() as u64], v));
    }
    Err("a Constant without a value of a supported kind".into())
}

trait NameOr {
    fn name_or(&self, k: usize) -> String;
}

impl NameOr for NodeProto {
    /// The node's name, or its k-th input's name if it has none.
    fn name_or(&self, k: usize) -> String {
        if self.name.is_empty() {
            self.input.get(k).cloned().unwrap_or_default()
        } else {
            self.name.clone()
        }
    }
}
