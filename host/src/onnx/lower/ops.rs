//! Matmuls (params, FP8 weights, scales into alpha) and the patterns lowered as one op.

use super::*;

impl Lower<'_, '_> {
    /// `a · b` (either may be a constant, which becomes a param), scaled by `alpha` and by the
    /// operands' pending scalings. Returns the output tensor and shape.
    pub(super) fn matmul(
        &mut self,
        a: Val,
        b: Val,
        alpha: f64,
        out: &str,
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
            // One cast per tensor and scale: Q, K and V projections of one input share it.
            ta = match self.fp8_casts.get(&(ta.clone(), scale)) {
                Some(cast) => cast.clone(),
                None => {
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
                    self.fp8_casts.insert((ta, scale), cast.clone());
                    cast
                }
            };
        }
        let mut fields = vec![("a", Field::S(ta)), ("b", Field::S(tb))];
        if alpha != 1.0 {
            fields.push(("alpha", Field::F(alpha)));
        }
        fields.extend([("output", Field::S(out.into())), ("dtype", s("f16")), ("accumulate", s("f16"))]);
        let idx = self.emit.op("matmul", &fields);
        self.matmuls.insert(out.to_string(), idx);
        let mut shape = batch;
        shape.extend([m, n]);
        Ok((out.to_string(), shape))
    }

    /// A matmul weight as FP8 E4M3 with a power-of-two scale from its largest magnitude.
    pub(super) fn fp8_weight(&mut self, c: &Rc<Const>, base: &str, shape: Vec<u64>) -> String {
        let key = (Rc::as_ptr(c) as usize, true);
        if let Some((_, n)) = self.params_of.get(&key) {
            return n.clone();
        }
        let v = c.as_f32();
        let range = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        let scale = fp8_scale(range);
        let n = self.emit.param(base, DType::F8E4M3, scale, shape, v);
        self.scales.push((n.clone(), scale));
        self.params_of.insert(key, (Rc::downgrade(c), n.clone()));
        n
    }

    pub(super) fn decomposed_layernorm(
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
            if axes.len() != 1 || fold::axis(axes[0], rank)? != rank - 1 {
                return Err(format!("{at}: a LayerNorm written out over axes {axes:?} of rank {rank}: only the last axis is supported"));
            }
            if Attrs(&mn.attribute).int("keepdims") == Some(0) {
                return Err(format!(
                    "{at}: a LayerNorm written out with keepdims = 0 in `{}`: its mean broadcasts along the last axis, \
                     not a LayerNorm (the last axis, kept, is supported)",
                    mn.name
                ));
            }
        }
        let eps = match self.get(eps, at)? {
            // More axes than x would broadcast the result to another rank.
            Val::C(c) if c.shape.len() <= rank => c.scalar().ok_or(format!("{at}: eps is not a scalar"))?,
            Val::C(_) => return Err(format!("{at}: eps has more axes than the normalised tensor")),
            Val::R(_) => return Err(format!("{at}: eps is computed on the chip")),
        };
        let t = self.tensor(&r, at)?;
        let out = self.out_name(node);
        let idx = self.emit.op(
            "layernorm",
            &[
                ("input", Field::S(t)),
                ("eps", Field::F(eps)),
                ("output", Field::S(out.clone())),
                ("dtype", s("f16")),
            ],
        );
        self.affine_open.insert(out.clone(), (idx, false, false));
        self.run(node, out, r.shape);
        Ok(())
    }

    /// `Mul` by a per-column constant (gamma), then `Add` of one (beta), after a written-out
    /// LayerNorm whose result nothing else reads (no other ONNX reader, no op, no other value
    /// holding the tensor): folded into the `layernorm` op's `gamma` and
    /// `beta` (two row stages fewer per LayerNorm). Returns whether the node was taken.
    pub(super) fn fuse_affine(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> bool {
        let (r, c, input) = match ins {
            [Some(Val::R(r)), Some(Val::C(c))] => (r, c, &node.input[0]),
            [Some(Val::C(c)), Some(Val::R(r))] => (r, c, &node.input[1]),
            _ => return false,
        };
        let Some(&(op, has_gamma, has_beta)) = self.affine_open.get(&r.t) else { return false };
        let d = *r.shape.last().unwrap_or(&0);
        let per_column = c.len() as u64 == d && c.shape.last() == Some(&d) && c.shape.len() <= r.shape.len();
        let gamma = node.op_type == "Mul";
        let free = if gamma { !has_gamma && !has_beta } else { !has_beta };
        // Nothing else may see the LayerNorm's output change: this node is the only reader of
        // its input, no op written so far reads the tensor, and no other live value holds it
        // (an `Identity` or a view that keeps the tensor would).
        let others_hold =
            self.vals.iter().any(|(name, v)| name != input && matches!(v, Val::R(o) if o.t == r.t));
        if *r.e != Expr::X
            || !per_column
            || !free
            || self.uses_total.get(input) != Some(&1)
            || others_hold
            || self.emit.reads(&r.t)
        {
            return false;
        }
        let field = if gamma { "gamma" } else { "beta" };
        let values = Rc::new(c.reshaped(vec![d]));
        let p = self.param(&values, &format!("{}_{field}", r.t), vec![d]);
        self.emit.set_field(op, field, Field::S(p));
        self.affine_open.insert(r.t.clone(), (op, has_gamma || gamma, has_beta || !gamma));
        self.define(
            node,
            0,
            Val::R(Run { t: r.t.clone(), shape: r.shape.clone(), e: Rc::new(Expr::X), prov: None }),
        );
        true
    }

    /// The image `[N, C, H, W]` cut to `[N, C, h, w]`, the pixels a stride-k convolution reads
    /// (`h`, `w`: whole patches; torch's 384-pixel SigLIP image with 14-pixel patches drops 6):
    /// a slice, read where the image's bytes are.
    fn crop_to_patches(
        &mut self,
        x: &Run,
        h: u64,
        w: u64,
        base: &str,
        at: &str,
    ) -> Result<(String, Vec<u64>), String> {
        let ends = [x.shape[0], x.shape[1], h, w];
        self.slice_box(x, &[0, 0, 0, 0], &ends, &format!("{base}_crop"), at)
    }

    pub(super) fn patch_embed(
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
        if xs.len() != 4 || ws.len() != 4 || ws[1] != xs[1] || ws[2] != ws[3] || ws[2] == 0 {
            return Err(format!("{at}: Conv of {xs:?} with weights {ws:?}: a 2-D convolution with square kernels is supported"));
        }
        let k = ws[2];
        let ones = |n: &str, want: i64| catt.ints(n).is_none_or(|v| v.iter().all(|x| *x == want));
        let pair = |v: Vec<i64>, want: u64| v.len() == 2 && v.iter().all(|x| *x as u64 == want);
        let stride_ok = catt.ints("strides").is_some_and(|s| pair(s, k));
        let kernel_ok = catt.ints("kernel_shape").is_none_or(|s| pair(s, k));
        // `auto_pad`: VALID pads nothing; SAME_* pads a side that is not a multiple of the
        // stride (here the kernel) up to one, where this embedding would instead drop the
        // border: taken only when it pads nothing.
        let pad_ok = match catt.string("auto_pad").as_deref() {
            None | Some("NOTSET") => ones("pads", 0),
            Some("VALID") => true,
            Some("SAME_UPPER" | "SAME_LOWER") => xs[2] % k == 0 && xs[3] % k == 0,
            Some(_) => false,
        };
        if !stride_ok
            || !kernel_ok
            || !pad_ok
            || !ones("dilations", 1)
            || catt.int("group").unwrap_or(1) != 1
            || xs[2] < k
            || xs[3] < k
        {
            return Err(format!(
                "{at}: Conv is supported as a patch embedding: strides equal to the kernel ({k}), no padding, no dilation, \
                 one group, and an image at least one kernel wide"
            ));
        }
        let (n, c, hp, wp, d) = (xs[0], xs[1], xs[2] / k, xs[3] / k, ws[0]);
        let fl_shape: Vec<u64> = if flatten.op_type == "Flatten" {
            let ax = Attrs(&flatten.attribute).int("axis").unwrap_or(1);
            if fold::axis(ax, 4) != Ok(2) {
                return Err(format!("{at}: Flatten axis {ax} after the patch Conv (expected 2)"));
            }
            vec![n, d, hp * wp]
        } else {
            let spec = match self.get(&flatten.input[1], at)? {
                Val::C(c) => c.as_i64()?,
                Val::R(_) => return Err(format!("{at}: the Reshape target must be constant")),
            };
            fold::reshape_shape(
                &[n, d, hp, wp],
                &spec,
                Attrs(&flatten.attribute).int("allowzero") == Some(1),
            )?
        };
        let perm = Attrs(&node.attribute).ints("perm").unwrap_or_default();
        if fl_shape != [n, d, hp * wp] || perm != [0, 2, 1] {
            return Err(format!("{at}: the patch Conv's output is reshaped to {fl_shape:?} and transposed by {perm:?}; expected [N, C, patches] and [0, 2, 1]"));
        }
        let base = conv.output[0].clone();
        let (t, cropped) = self.crop_to_patches(&x, hp * k, wp * k, &base, at)?;
        let six = [n, c, hp, k, wp, k];
        let r6 = self.emit_view(&t, &cropped, &six, None, &format!("{base}_reshape"))?;
        let moved = [n, hp, wp, c, k, k];
        let t6 =
            self.emit_view(&r6, &six, &moved, Some(&[0, 2, 4, 1, 3, 5]), &format!("{base}_transpose"))?;
        let patches =
            self.emit_view(&t6, &moved, &[n, hp * wp, c * k * k], None, &format!("{base}_reshape"))?;
        let wm = fold::transpose(&w.reshaped(vec![d, c * k * k]), &[])?;
        let pr = Run { t: patches, shape: vec![n, hp * wp, c * k * k], e: Rc::new(Expr::X), prov: None };
        let out = self.emit.fresh(&format!("{}_mm", node.output[0]));
        let (mut y, shape) = self.matmul(Val::R(pr), Val::C(Rc::new(wm)), 1.0, &out, at)?;
        if let Some(b) = bias {
            let p = self.param(&b, &format!("{}_bias", conv.output[0]), vec![d]);
            let o = self.out_name(node);
            self.binary("add", &y, &p, &o);
            y = o;
        }
        self.run(node, y, shape);
        Ok(())
    }
}
