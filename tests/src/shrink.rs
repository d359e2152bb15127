//! Minimisation of a failing random graph (issue 38, deliverable 3): greedy delta debugging on a
//! [`GraphSpec`]. Each candidate is one simplification — fewer tiles, an op dropped (its readers
//! fed from one of its operands or from a new input of its shape), an output or an unread source
//! dropped, an optional field dropped, a size made smaller everywhere it appears — kept when the
//! model still parses and the caller's predicate says it still fails the same way. Candidates are
//! retried from the start after every success, until none helps or the budget is spent.

use crate::graphgen::{Attr, GraphSpec, Source};
use ipu_schema::DType;

/// Shrink `spec` while `fails` holds; at most `budget` calls of `fails`. Returns the smallest
/// graph found and the number of calls made.
pub fn minimise(
    spec: &GraphSpec,
    budget: usize,
    mut fails: impl FnMut(&GraphSpec) -> bool,
) -> (GraphSpec, usize) {
    let mut best = spec.clone();
    let mut calls = 0;
    'outer: while calls < budget {
        for cand in candidates(&best) {
            if calls >= budget {
                break 'outer;
            }
            if !parses(&cand) {
                continue;
            }
            calls += 1;
            if fails(&cand) {
                best = cand;
                continue 'outer;
            }
        }
        break;
    }
    (best, calls)
}

/// Whether the model text is valid (the parser's checks: shapes, dtypes, names, outputs).
pub fn parses(spec: &GraphSpec) -> bool {
    ipu_host::model::parse("m.toml", &spec.to_toml("")).is_ok()
}

/// Every one-step simplification of `s`, the ones that remove most first.
pub fn candidates(s: &GraphSpec) -> Vec<GraphSpec> {
    let mut out = Vec::new();
    let Ok(g) = ipu_host::model::parse("m.toml", &s.to_toml("")) else { return out };
    for t in [1, s.tiles / 2, s.tiles.saturating_sub(1)] {
        if t >= 1 && t < s.tiles {
            out.push(GraphSpec { tiles: t, ..s.clone() });
        }
    }
    // Drop op i, from the last: its readers read one of its operands of the same dtype and shape
    // instead, or a new input of its shape.
    for i in (0..s.ops.len()).rev() {
        let op = &s.ops[i];
        let Some(t) = g.find(&op.output).map(|id| g.tensor(id).clone()) else { continue };
        let read = s.reads().contains(&op.output.as_str());
        // (the replacement, whether it is a new input)
        let mut subs: Vec<(Option<String>, bool)> = Vec::new();
        if !read {
            subs.push((None, false));
        } else {
            for (_, x) in &op.operands {
                if g.find(x).map(|id| g.tensor(id)).is_some_and(|u| u.dtype == t.dtype && u.shape == t.shape)
                {
                    subs.push((Some(x.clone()), false));
                }
            }
            if matches!(t.dtype, DType::F16 | DType::F32) {
                subs.push((Some(format!("r{}", op.output)), true));
            }
        }
        for (sub, new) in subs {
            let mut c = s.clone();
            c.ops.remove(i);
            if c.outputs.contains(&op.output) {
                // Its operands that ops make are outputs in its place.
                c.outputs.retain(|o| *o != op.output);
                for (_, x) in &op.operands {
                    if s.ops.iter().any(|o| o.output == *x) && !c.outputs.contains(x) {
                        c.outputs.push(x.clone());
                    }
                }
            }
            if let Some(name) = &sub {
                if new {
                    c.sources.push(Source {
                        name: name.clone(),
                        dtype: t.dtype,
                        shape: t.shape.clone(),
                        param: None,
                    });
                }
                for o in c.ops.iter_mut() {
                    for (_, x) in o.operands.iter_mut() {
                        if *x == op.output {
                            x.clone_from(name);
                        }
                    }
                }
            }
            if !c.outputs.is_empty() {
                // The same without the sources nothing reads any more (an unread source can be
                // a failure of its own).
                let reads: Vec<String> = c.reads().into_iter().map(String::from).collect();
                let mut d = c.clone();
                d.sources.retain(|x| reads.contains(&x.name) || s.reads().iter().all(|r| *r != x.name));
                if d.sources.len() < c.sources.len() {
                    out.push(d);
                }
                out.push(c);
            }
        }
    }
    for i in 0..s.outputs.len() {
        if s.outputs.len() > 1 {
            let mut c = s.clone();
            c.outputs.remove(i);
            out.push(c);
        }
    }
    let reads = s.reads();
    for i in 0..s.sources.len() {
        if !reads.contains(&s.sources[i].name.as_str()) {
            let mut c = s.clone();
            c.sources.remove(i);
            out.push(c);
        }
    }
    // Optional fields: alpha, gamma/beta, transposes (the other operand's shape follows only
    // when it is a source: the candidate is dropped by the parse check otherwise).
    for i in 0..s.ops.len() {
        for f in ["alpha", "scale", "eps", "transpose_a", "transpose_b"] {
            if s.ops[i].attrs.iter().any(|(n, _)| n == f) {
                let mut c = s.clone();
                c.ops[i].attrs.retain(|(n, _)| n != f);
                out.push(c);
            }
        }
        for f in ["gamma", "beta"] {
            if s.ops[i].operands.iter().any(|(n, _)| n == f) {
                let mut c = s.clone();
                c.ops[i].operands.retain(|(n, _)| n != f);
                out.push(c);
            }
        }
    }
    // Sizes: each distinct size of a source made smaller everywhere it appears (sources,
    // reshape shapes, slice ends).
    let mut sizes: Vec<u64> =
        s.sources.iter().flat_map(|x| x.shape.iter().copied()).filter(|&d| d > 1).collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes.dedup();
    for v in sizes {
        let mut to = vec![1, v / 2, v - 1];
        to.dedup();
        for w in to.into_iter().filter(|&w| w >= 1 && w < v) {
            out.push(resize(s, v, w));
        }
    }
    out
}

/// `s` with every size `v` of a source shape, a reshape's shape and a slice's ends made `w`.
fn resize(s: &GraphSpec, v: u64, w: u64) -> GraphSpec {
    let mut c = s.clone();
    for src in c.sources.iter_mut() {
        for d in src.shape.iter_mut().filter(|d| **d == v) {
            *d = w;
        }
    }
    for op in c.ops.iter_mut() {
        for (f, a) in op.attrs.iter_mut() {
            if let (true, Attr::List(l)) = (f == "shape" || f == "ends", a) {
                for d in l.iter_mut().filter(|d| **d == v as i64) {
                    *d = w as i64;
                }
            }
        }
    }
    c
}

/// The first line of a saved regression model: what [`read_header`] reads back.
const HEADER: &str = "# graph_fuzz:";

/// Write `spec` as the regression model `dir/NAME.toml` (params in `dir/NAME/`), with a header
/// comment: seed, tiles, failure class, message, and how to rerun it.
pub fn save(
    spec: &GraphSpec,
    dir: &std::path::Path,
    name: &str,
    class: &str,
    message: &str,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    if spec.sources.iter().any(|s| s.param.is_some()) {
        let pdir = dir.join(name);
        std::fs::create_dir_all(&pdir)?;
        spec.write_params(&pdir)?;
    }
    let msg: String = message.lines().next().unwrap_or("").chars().take(400).collect();
    let text = format!(
        "{HEADER} seed={} tiles={} class={class}\n# message: {msg}\n# rerun: cargo run --release -p ipu-tests --bin graph_fuzz -- --check {}/{name}.toml\n\n{}",
        spec.seed,
        spec.tiles,
        dir.display(),
        spec.to_toml(&format!("{name}/"))
    );
    std::fs::write(dir.join(format!("{name}.toml")), text)
}

/// The seed, tile count and failure class a saved regression model's header records.
pub fn read_header(text: &str) -> Option<(u64, usize, String)> {
    let line = text.lines().next()?.strip_prefix(HEADER)?;
    let field = |k: &str| line.split_whitespace().find_map(|w| w.strip_prefix(k)).map(String::from);
    Some((field("seed=")?.parse().ok()?, field("tiles=")?.parse().ok()?, field("class=")?))
}
