//! Node patterns that stand for one op of ours, found before lowering, and the nodes the graph
//! outputs need (everything else, such as the head-averaged attention weights torch's
//! `nn.MultiheadAttention` also computes, is dropped).

use super::proto::{GraphProto, NodeProto};
use std::collections::BTreeMap;

/// What a node stands for.
#[derive(Clone, Debug, PartialEq)]
pub enum Pattern {
    /// The `Div` ending `(x − mean(x)) / sqrt(mean((x − mean(x))²) + eps)`: a LayerNorm of `x`
    /// without affine; `means` are the two `ReduceMean` nodes (their axes are checked when
    /// lowered), `eps` the name of the constant added to the variance.
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
                let squares = (is(sq, "Pow", 2) && sq.input[0] == *d)
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
            Some(Pattern::LayerNorm { x, eps, .. }) => {
                want.insert(x);
                want.insert(eps);
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
