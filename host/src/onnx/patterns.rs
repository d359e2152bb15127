//! Node patterns that stand for one op of ours, found before lowering, and the nodes the graph
//! outputs need (everything else, such as the head-averaged attention weights torch's
//! `nn.MultiheadAttention` also computes, is dropped).

use super::consts::Const;
use super::fold::Attrs;
use super::proto::{data_type, GraphProto, NodeProto};
use std::collections::BTreeMap;

/// What a node stands for.
#[derive(Clone, Debug, PartialEq)]
pub enum Pattern {
    /// The `Div` ending `(x − mean(x)) / sqrt(mean((x − mean(x))²) + eps)`: a LayerNorm of `x`
    /// without affine; `means` are the two `ReduceMean` nodes (their axes are checked when
    /// lowered), `eps` the name of the constant added to the variance (checked to be a scalar
    /// constant when lowered). The square is `Mul(d, d)` or `Pow(d, 2)` with the exponent a
    /// constant stated in the file (see [`stated`]) equal to 2: any other power is not
    /// a LayerNorm.
    LayerNorm {
        /// The normalised tensor.
        x: String,
        /// The constant added to the variance.
        eps: String,
        /// The two `ReduceMean` nodes.
        means: [usize; 2],
    },
    /// The `Transpose([0, 2, 1])` after `Conv` → `Reshape`/`Flatten`: a patch embedding whose
    /// result is `[N, patches, D]`.
    PatchEmbed {
        /// The `Conv` node.
        conv: usize,
        /// The `Reshape` or `Flatten` node between.
        flatten: usize,
    },
    /// A node folded into a pattern at a later node.
    Inside,
}

fn producers(g: &GraphProto) -> BTreeMap<&str, usize> {
    let mut p = BTreeMap::new();
    for (i, n) in g.node.iter().enumerate() {
        for o in &n.output {
            p.insert(o.as_str(), i);
        }
    }
    p
}

/// How many node inputs and graph outputs read each value.
pub fn consumers(g: &GraphProto) -> BTreeMap<&str, usize> {
    let mut c = BTreeMap::new();
    for n in &g.node {
        for i in &n.input {
            *c.entry(i.as_str()).or_insert(0) += 1;
        }
    }
    for o in &g.output {
        *c.entry(o.name.as_str()).or_insert(0) += 1;
    }
    c
}

/// How deep [`stated`] follows `Identity` and `Cast` nodes (a hostile file may loop).
const STATED_DEPTH: usize = 8;

/// The value of `name` when the file states it before lowering: an initializer held in the file
/// itself (not external data) of at most 16 elements, the value of a `Constant` node, or either
/// through `Identity` or a `Cast` to a float type (`prod`: the node writing each value). A value
/// other nodes compute (folded when lowered) is not resolved here, and a pattern that needs it
/// is then not recognised.
fn stated(g: &GraphProto, prod: &BTreeMap<&str, usize>, name: &str, depth: usize) -> Option<Const> {
    let dir = std::path::Path::new(".");
    let mut ext = super::consts::External { dir, maps: BTreeMap::new() };
    if let Some(i) = prod.get(name) {
        let n = &g.node[*i];
        let a = Attrs(&n.attribute);
        return match n.op_type.as_str() {
            "Constant" => super::lower::constant(&a, &mut ext).ok().filter(|c| c.len() <= 16),
            "Identity" if depth > 0 => stated(g, prod, n.input.first()?, depth - 1),
            "Cast"
                if depth > 0
                    && matches!(
                        a.int("to").map(|t| t as i32),
                        Some(data_type::FLOAT | data_type::DOUBLE)
                    ) =>
            {
                super::fold::cast(&stated(g, prod, n.input.first()?, depth - 1)?, data_type::FLOAT as i64)
                    .ok()
            }
            _ => None,
        };
    }
    let t = g.initializer.iter().find(|t| t.name == name)?;
    let small = t.dims.iter().try_fold(1i64, |n, d| (*d >= 0).then(|| n.saturating_mul(*d)))? <= 16;
    (small && t.data_location != 1).then(|| super::consts::decode(t, &mut ext).ok()).flatten()
}

/// Whether `name` is a constant stated in the file (see [`stated`]) of one element, at
/// most one axis, equal to `want`.
fn stated_scalar_is(g: &GraphProto, prod: &BTreeMap<&str, usize>, name: &str, want: f64) -> bool {
    stated(g, prod, name, STATED_DEPTH).is_some_and(|c| c.shape.len() <= 1 && c.scalar() == Some(want))
}

/// Patterns by node index.
pub fn find(g: &GraphProto) -> BTreeMap<usize, Pattern> {
    let prod = producers(g);
    let uses = consumers(g);
    let node = |name: &str| prod.get(name).map(|i| (*i, &g.node[*i]));
    let is = |n: &NodeProto, op: &str, inputs: usize| n.op_type == op && n.input.len() >= inputs;
    let mut found = BTreeMap::new();
    for (i, n) in g.node.iter().enumerate() {
        if is(n, "Div", 2) {
            let ln = (|| {
                let (_, s) = node(&n.input[1]).filter(|(_, s)| is(s, "Sqrt", 1))?;
                let (_, e) = node(&s.input[0]).filter(|(_, e)| is(e, "Add", 2))?;
                let (vi, eps) = [(0, 1), (1, 0)].iter().find_map(|&(a, b)| {
                    node(&e.input[a]).filter(|(_, v)| is(v, "ReduceMean", 1)).map(|(vi, _)| (vi, &e.input[b]))
                })?;
                let p = &g.node[vi];
                let (_, sq) = node(&p.input[0])?;
                let d = &n.input[0];
                let squares =
                    (is(sq, "Pow", 2) && sq.input[0] == *d && stated_scalar_is(g, &prod, &sq.input[1], 2.0))
                        || (is(sq, "Mul", 2) && sq.input[0] == *d && sq.input[1] == *d);
                let (_, sub) = node(d).filter(|(_, s)| is(s, "Sub", 2))?;
                let (mi, _) = node(&sub.input[1])
                    .filter(|(_, m)| is(m, "ReduceMean", 1) && m.input[0] == sub.input[0])?;
                squares.then(|| Pattern::LayerNorm {
                    x: sub.input[0].clone(),
                    eps: eps.clone(),
                    means: [mi, vi],
                })
            })();
            if let Some(p) = ln {
                found.insert(i, p);
            }
        }
        if is(n, "Transpose", 1) {
            let pe = (|| {
                let (fi, f) =
                    node(&n.input[0]).filter(|(_, f)| is(f, "Reshape", 2) || is(f, "Flatten", 1))?;
                let (ci, c) = node(&f.input[0]).filter(|(_, c)| is(c, "Conv", 2))?;
                // Readers other than `Shape` (the legacy exporter reads the Conv's shape to
                // compute the flatten target).
                let single = |name: &str| {
                    let shapes = g
                        .node
                        .iter()
                        .filter(|m| m.op_type == "Shape" && m.input.first().map(String::as_str) == Some(name))
                        .count();
                    uses.get(name).map(|u| u - shapes) == Some(1)
                };
                (single(&c.output[0]) && single(&f.output[0])).then_some((ci, fi))
            })();
            if let Some((conv, flatten)) = pe {
                found.insert(conv, Pattern::Inside);
                found.insert(flatten, Pattern::Inside);
                found.insert(i, Pattern::PatchEmbed { conv, flatten });
            }
        }
    }
    found
}

/// Which nodes the graph outputs need, given the patterns (a pattern's node needs only the
/// pattern's own inputs).
pub fn needed(g: &GraphProto, found: &BTreeMap<usize, Pattern>) -> Vec<bool> {
    let mut want: std::collections::BTreeSet<&str> = g.output.iter().map(|o| o.name.as_str()).collect();
    let mut need = vec![false; g.node.len()];
    for i in (0..g.node.len()).rev() {
        let n = &g.node[i];
        if !n.output.iter().any(|o| want.contains(o.as_str())) {
            continue;
        }
        need[i] = true;
        match found.get(&i) {
            Some(Pattern::LayerNorm { x, eps, means }) => {
                want.insert(x);
                want.insert(eps);
                // The axes of the two means, when given as inputs (opset 18), are read when the
                // pattern is lowered.
                want.extend(means.iter().filter_map(|m| g.node[*m].input.get(1)).map(String::as_str));
            }
            Some(Pattern::PatchEmbed { conv, flatten }) => {
                want.extend(g.node[*conv].input.iter().map(String::as_str));
                want.extend(g.node[*flatten].input.iter().skip(1).map(String::as_str));
            }
            _ => want.extend(n.input.iter().map(String::as_str)),
        }
    }
    need
}
