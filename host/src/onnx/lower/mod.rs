//! Lowering ONNX nodes, in file order, onto the graph IR (docs/onnx.md "Steps"): the state, the
//! node dispatch and the outputs here; folding, computed ops, views and matmuls in submodules.

mod activations;
mod compose;
mod concat;
mod fold_node;
mod guards;
mod inputs;
mod lookup;
mod masks;
mod ops;
mod outputs;
mod reduce;
mod runtime;
mod select;
mod views;

use crate::onnx::consts::{Const, External};
use crate::onnx::emit::{Emit, Field};
use crate::onnx::expr::{Expr, Form};
use crate::onnx::fold::{self, Attrs};
use crate::onnx::patterns::Pattern;
use crate::onnx::proto::{data_type, GraphProto, NodeProto, TensorProto};
use crate::onnx::{ImportOptions, Weights};
use crate::reference::HostTensor;
use ipu_core::fp8::Fp8Format;
use ipu_schema::DType;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

/// The ops the importer takes, for refusals.
pub const SUPPORTED: &str = "MatMul, Gemm, Conv (patch embedding: stride = kernel, no padding), Add, Sub, Mul, Div, \
Pow, Sqrt, Erf, Tanh, Sigmoid, Exp, Log, Neg, Abs, Reciprocal, Relu, LeakyRelu, Clip, Max and Min (with constants), \
HardSigmoid, HardSwish (fused where recognised: scalings, the tanh/erf/quick GeLU, \
a decomposed LayerNorm; else one elementwise op per step), Gelu, \
LayerNormalization, Softmax, ReduceMean and ReduceSum (last axis), Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Identity, Dropout, Cast, \
Concat (placement matmuls), Add of zeros and Where(IsNaN(x), c, x) (as x: SDPA's guards), \
Where with a constant condition (x·c + y·(1 − c)), \
an attention mask (an integer input, Cast to BOOL, GatherND as a reshape, And, Where with constants); \
Gather of a constant table by INT64/INT32 token ids (an embedding lookup: one-hot rows written by the host, one matmul); \
on constants and shapes also Shape, Gather, GatherElements, GatherND, Slice, Split, Concat, ConstantOfShape, Constant, Expand, Tile, Range, \
Mod, Equal, Where, ReduceMean";

/// The imported model: its text, its param values (f32), the FP8 scales chosen.
pub type Finished = (String, BTreeMap<String, HostTensor>, Vec<(String, i8)>);

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

/// `0, 1, …` in `shape` (callers check the size with [`fold::fold_elements`]).
fn iota(shape: &[u64]) -> Const {
    let n = fold::fold_elements(shape).unwrap_or(0);
    Const::i(shape.to_vec(), (0..n as i64).collect())
}

fn is_iota(c: &Const) -> bool {
    matches!(&c.data, crate::onnx::consts::Data::I(v) if v.iter().enumerate().all(|(k, x)| *x == k as i64))
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
    params_of: BTreeMap<(usize, bool), (std::rc::Weak<Const>, String)>,
    scales: Vec<(String, i8)>,
    /// Matmuls emitted, by output tensor: the op's index (a scaling read after the matmul was
    /// written may fold into its `alpha`, [`Lower::fold_into_matmul`]).
    matmuls: BTreeMap<String, usize>,
    /// Readers of each ONNX value.
    uses: BTreeMap<String, usize>,
    /// Written-out LayerNorms, by output tensor: op index, and whether a gamma and a beta were
    /// fused into it (each at most once, gamma before beta).
    affine_open: BTreeMap<String, (usize, bool, bool)>,
    /// Readers of each ONNX value in the whole graph (`uses` counts down).
    uses_total: BTreeMap<String, usize>,
    /// Compositions written, by tensor and composition text.
    written: BTreeMap<(String, String), String>,
    /// FP8 casts written, by source tensor and scale.
    fp8_casts: BTreeMap<(String, i8), String>,
    /// Initializers not decoded yet.
    pending: BTreeMap<String, &'a TensorProto>,
    /// A composition is being written step by step (`compose.rs`): no scaling folds into a
    /// matmul's alpha.
    no_fold: bool,
    /// Integer inputs held as one-hot rows (`lookup.rs`).
    ids: BTreeSet<String>,
    /// `IsNaN` outputs, by the value each tests (`guards.rs`).
    nan_tests: BTreeMap<String, String>,
    /// Values that hold integers, and booleans (0 or 1), by ONNX name (`masks.rs`).
    ints: BTreeSet<String>,
    bools: BTreeSet<String>,
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
        init: BTreeMap<String, &'a TensorProto>,
        ext: &'a mut External<'b>,
    ) -> Self {
        Lower {
            pending: init,
            vals: BTreeMap::new(),
            file,
            opset,
            opts,
            emit: Emit::new(),
            ext,
            params_of: BTreeMap::new(),
            scales: Vec::new(),
            matmuls: BTreeMap::new(),
            uses: BTreeMap::new(),
            no_fold: false,
            fp8_casts: BTreeMap::new(),
            written: BTreeMap::new(),
            affine_open: BTreeMap::new(),
            uses_total: BTreeMap::new(),
            ids: BTreeSet::new(),
            nan_tests: BTreeMap::new(),
            ints: BTreeSet::new(),
            bools: BTreeSet::new(),
        }
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
        // A composition read by several nodes is written once.
        let key = (r.t.clone(), r.e.text());
        if let Some(t) = self.written.get(&key) {
            return Ok(t.clone());
        }
        let t = self.write_composition(r, at)?;
        // The tensor itself (the identity, or a scaling folded into the matmul that wrote it)
        // is not remembered: after a fold, the same composition of it means another value.
        if t != r.t {
            self.written.insert(key, t.clone());
        }
        Ok(t)
    }

    fn write_composition(&mut self, r: &Run, at: &str) -> Result<String, String> {
        match r.e.form() {
            Form::Identity => Ok(r.t.clone()),
            form @ (Form::GeluTanh | Form::GeluErf | Form::GeluSigmoid) => {
                let approx = match form {
                    Form::GeluTanh => "tanh",
                    Form::GeluErf => "none",
                    _ => "sigmoid",
                };
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
            Form::Affine(a, b) if b == 0.0 && !self.no_fold && self.fold_into_matmul(&r.t, a) => {
                Ok(r.t.clone())
            }
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
            Form::Unknown => self.write_steps(r, at),
        }
    }

    /// Scale the matmul that wrote `t` by `a` (softmax must read a matmul's output, so
    /// `softmax(q·kᵀ × c)` needs the `c` in `alpha`), when that changes no other reader of `t`:
    /// no op written so far reads `t`, and every value held as `t` is `a·t`. Those values are
    /// then `t` itself, so later readers (a second scaling, a composition) see the scaled
    /// tensor. The check is on values, not on the node graph: a view that keeps the tensor
    /// (`Identity`, a reshape of leading unit axes) and a second reader of the scaling hold `t`
    /// as well.
    fn fold_into_matmul(&mut self, t: &str, a: f64) -> bool {
        let Some(&op) = self.matmuls.get(t) else { return false };
        let holders: Vec<String> = self
            .vals
            .iter()
            .filter(|(_, v)| matches!(v, Val::R(r) if r.t == t))
            .map(|(name, _)| name.clone())
            .collect();
        let all_scaled = holders
            .iter()
            .all(|name| matches!(&self.vals[name], Val::R(r) if r.e.form() == Form::Affine(a, 0.0)));
        if !all_scaled || self.emit.reads(t) {
            return false;
        }
        let alpha = self.emit.number(op, "alpha").unwrap_or(1.0);
        self.emit.set_number(op, "alpha", alpha * a);
        for name in holders {
            if let Some(Val::R(r)) = self.vals.get_mut(&name) {
                r.e = Rc::new(Expr::X);
            }
        }
        true
    }

    /// A runtime operand of a matmul: the tensor and the scalar factor that goes into `alpha`.
    fn scaled(&mut self, r: &Run, at: &str) -> Result<(String, f64), String> {
        match r.e.form() {
            Form::Affine(a, 0.0) => Ok((r.t.clone(), a)),
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
        self.params_of.insert(key, (Rc::downgrade(c), n.clone()));
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
            ("Conv", Some(x)) => match node.input.get(1).and_then(|n| {
                // The weight's shape, whether or not it is decoded yet.
                shape_of(self.vals.get(n)).or_else(|| {
                    self.pending.get(n).map(|t| t.dims.iter().map(|d| (*d).max(0) as u64).collect())
                })
            }) {
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
        // The initializers this node (or the pattern it stands for) reads.
        let mut reads: Vec<&String> = node.input.iter().collect();
        match pattern {
            Some(Pattern::LayerNorm { eps, means, .. }) => {
                reads.push(eps);
                reads.extend(means.iter().flat_map(|m| g.node[*m].input.iter()));
            }
            Some(Pattern::PatchEmbed { conv, flatten }) => {
                reads.extend(g.node[*conv].input.iter().chain(&g.node[*flatten].input));
            }
            _ => {}
        }
        for name in reads {
            if let Some(t) = self.pending.remove(name) {
                let c = crate::onnx::consts::decode(t, self.ext)
                    .map_err(|e| format!("{}: initializer `{name}`: {e}", self.file))?;
                self.vals.insert(name.clone(), Val::C(Rc::new(c)));
            }
        }
        self.lower_node(g, node, pattern)?;
        // A value nothing reads any more is dropped (graph outputs count as readers): weights,
        // and projections that keep their weight for column selection, are not held beside the
        // params made of them for the rest of the import.
        for name in node.input.iter().filter(|n| !n.is_empty()) {
            if let Some(u) = self.uses.get_mut(name) {
                *u = u.saturating_sub(1);
                if *u == 0 {
                    self.vals.remove(name);
                }
            }
        }
        Ok(())
    }

    fn lower_node(
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
        // Dropout is the identity in inference only: `training_mode` (input 2) must be false.
        if node.op_type == "Dropout" {
            let training = match ins.get(2) {
                None | Some(None) => false,
                Some(Some(Val::C(c))) => c.as_f64().iter().any(|v| *v != 0.0),
                Some(Some(Val::R(_))) => true,
            };
            if training {
                return Err(format!("{at}: Dropout in training mode (random) is not supported"));
            }
        }
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
        // Every error names the node (some helpers' messages do not: an axis out of range).
        if let Err(e) = self.runtime(node, &attrs, &ins, &consts, &at) {
            return Err(if e.starts_with(self.file) { e } else { format!("{at}: {e}") });
        }
        self.carry_kinds(node);
        // Shapes come from the file: a computed tensor too large to count is refused here, before
        // any later step multiplies its sizes (the model parser then bounds it by the chip).
        for o in &node.output {
            if let Some(Val::R(r)) = self.vals.get(o) {
                crate::onnx::consts::elements(&r.shape).map_err(|e| format!("{at}: output `{o}`: {e}"))?;
            }
        }
        Ok(())
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

/// The value of a `Constant` node.
pub(crate) fn constant(a: &Attrs, ext: &mut External) -> Result<Const, String> {
    if let Some(t) = a.tensor("value") {
        return crate::onnx::consts::decode(t, ext);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_scales_fit_the_range_and_need_a_finite_positive_one() {
        let max = Fp8Format::E4M3.max_value();
        assert_eq!(fp8_scale(max), 0);
        assert_eq!(fp8_scale(max * 1.01), 1);
        assert_eq!(fp8_scale(max / 2.0), -1);
        assert_eq!(fp8_scale(1.0), (1.0 / max).log2().ceil() as i8);
        assert_eq!(fp8_scale(1e30), 31, "clamped");
        assert_eq!(fp8_scale(1e-30), -32, "clamped");
        // No range measured (an activation that was 0 in the calibration run, or not finite):
        // the format's own range, not 2^-32 of it.
        for r in [0.0, -1.0, f32::INFINITY, f32::NAN] {
            assert_eq!(fp8_scale(r), 0, "{r}");
        }
    }
}
