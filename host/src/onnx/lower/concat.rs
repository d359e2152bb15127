//! `Concat` with at least one computed input (the class token joined to the patch tokens of ViT,
//! CLIP and DINOv2). The graph IR has no concatenation, so it is written with ops it has: each
//! computed part is placed by a matmul with a constant 0/1 placement matrix, the constant parts
//! are one param with zeros where the computed parts go, and the placed parts are added. Each
//! output element is one part's element times 1 plus zeros, so the result is exact in f16 (the
//! placement matmuls accumulate in f16; a product 0·∞ would be NaN, as no finite model has).
//!
//! With the ONNX output `[outer…, N, inner…]` concatenated along the axis of size N:
//! - `outer` = 1 (a batch of one, the token axis): parts viewed as `[n_k, inner]`, placed by
//!   `S_k·X_k` with `S_k` of `[N, n_k]` (one 1 per row);
//! - otherwise: parts viewed as `[outer, n_k·inner]`, placed by `X_k·T_k` with `T_k` of
//!   `[n_k·inner, N·inner]`.
//!
//! Either matrix is refused when larger than [`MAX_PLACEMENT`] values.

use super::*;

/// The largest placement matrix written (values): 2 MB in f16.
pub const MAX_PLACEMENT: u64 = 1 << 20;

impl Lower<'_, '_> {
    /// Lower a `Concat` of which some input is computed.
    pub(super) fn concat(
        &mut self,
        node: &NodeProto,
        attrs: &Attrs,
        ins: &[Option<Val>],
        at: &str,
    ) -> Result<(), String> {
        let parts: Vec<Val> = ins.iter().flatten().cloned().collect();
        let shape_of = |v: &Val| match v {
            Val::R(r) => r.shape.clone(),
            Val::C(c) => c.shape.clone(),
        };
        let first = parts.first().map(shape_of).ok_or(format!("{at}: no inputs"))?;
        let rank = first.len();
        let ax = fold::axis(attrs.int("axis").ok_or(format!("{at}: no axis"))?, rank)
            .map_err(|e| format!("{at}: {e}"))?;
        // Empty parts add nothing (torch writes none, but the format allows them).
        let parts: Vec<Val> = parts.into_iter().filter(|p| shape_of(p).get(ax) != Some(&0)).collect();
        for p in &parts {
            let s = shape_of(p);
            if s.len() != rank || (0..rank).any(|k| k != ax && s[k] != first[k]) {
                return Err(format!("{at}: Concat of shapes {first:?} and {s:?} along axis {ax}"));
            }
        }
        let sizes: Vec<u64> = parts.iter().map(|p| shape_of(p)[ax]).collect();
        let n: u64 = sizes.iter().sum();
        let outer: u64 = first[..ax].iter().product();
        let inner: u64 = first[ax + 1..].iter().product();
        let mut out_shape = first.clone();
        out_shape[ax] = n;
        let rows = outer == 1;
        // The 2-D form of the output, and of part k.
        let flat = if rows { vec![n, inner] } else { vec![outer, n * inner] };
        let part_flat = |nk: u64| if rows { vec![nk, inner] } else { vec![outer, nk * inner] };
        let base = node.output.first().cloned().unwrap_or_default();
        let mut acc: Option<String> = None;
        let mut consts: Vec<Const> = Vec::new();
        let mut off = 0;
        for (p, &nk) in parts.iter().zip(&sizes) {
            match p {
                Val::C(c) => consts.push((**c).clone()),
                Val::R(r) => {
                    consts.push(Const::f(
                        r.shape.clone(),
                        vec![0.0; fold::fold_elements(&r.shape).map_err(|e| format!("{at}: {e}"))?],
                    ));
                    let t = self.tensor(r, at)?;
                    let x = self
                        .emit_view(&t, &r.shape, &part_flat(nk), None, &format!("{base}_part"))
                        .map_err(|e| format!("{at}: {e}"))?;
                    let placed = self.emit.fresh(&format!("{base}_placed"));
                    let (k, m) = if rows { (n, nk) } else { (nk * inner, n * inner) };
                    if k.saturating_mul(m) > MAX_PLACEMENT {
                        return Err(format!(
                            "{at}: Concat along axis {ax} of {:?} ({outer} rows before the axis): its placement \
                             matrix would be {k} × {m} values (at most {MAX_PLACEMENT}); supported: the token axis \
                             of up to ~1000 tokens, or a small concatenation along another axis",
                            r.shape
                        ));
                    }
                    let (a, b) = if rows {
                        let mut s = vec![0f32; (n * nk) as usize];
                        for i in 0..nk {
                            s[((off + i) * nk + i) as usize] = 1.0;
                        }
                        let s = self.emit.param(&format!("{base}_place"), DType::F16, 0, vec![n, nk], s);
                        (s, x)
                    } else {
                        let mut s = vec![0f32; (k * m) as usize];
                        for j in 0..k {
                            s[(j * m + off * inner + j) as usize] = 1.0;
                        }
                        let s = self.emit.param(&format!("{base}_place"), DType::F16, 0, vec![k, m], s);
                        (x, s)
                    };
                    self.emit.op(
                        "matmul",
                        &[
                            ("a", Field::S(a)),
                            ("b", Field::S(b)),
                            ("output", Field::S(placed.clone())),
                            ("dtype", s("f16")),
                            ("accumulate", s("f16")),
                        ],
                    );
                    acc = Some(match acc {
                        None => placed,
                        Some(prev) => {
                            let sum = self.emit.fresh(&format!("{base}_joined"));
                            self.binary("add", &prev, &placed, &sum);
                            sum
                        }
                    });
                }
            }
            off += nk;
        }
        let mut t = acc.ok_or(format!("{at}: no computed input"))?;
        if parts.iter().any(|p| matches!(p, Val::C(_))) {
            let refs: Vec<&Const> = consts.iter().collect();
            let joined = fold::concat(&refs, ax as i64).map_err(|e| format!("{at}: {e}"))?;
            let p = self.emit.param(&format!("{base}_const"), DType::F16, 0, flat.clone(), joined.as_f32());
            let sum = self.emit.fresh(&format!("{base}_joined"));
            self.binary("add", &t, &p, &sum);
            t = sum;
        }
        let t = self.emit_view(&t, &flat, &out_shape, None, &base).map_err(|e| format!("{at}: {e}"))?;
        self.run(node, t, out_shape);
        Ok(())
    }
}
