//! Drawing a random graph: the op generators, each reading tensors made earlier or new sources
//! (docs: the parent module).

use super::{dtype_name, is_fp8, Attr, GraphSpec, OpSpec, Param, Rng, Source};
use ipu_schema::DType;

/// A tensor the generator may read, with a rough bound on its values' magnitude (to pick FP8
/// scales that overflow only when meant to).
#[derive(Clone, Debug)]
struct Avail {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    mag: f64,
    from_matmul: bool,
}

/// The generator's state for one graph.
struct Gen {
    rng: Rng,
    spec: GraphSpec,
    avail: Vec<Avail>,
    next: usize,
}

/// Sizes drawn for axes: small, odd, not multiples of 4/8/16, with 1 among them.
const DIMS: [u64; 24] =
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 15, 16, 17, 19, 20, 23, 24, 31, 32, 33, 40, 48];

/// Draw a graph for `seed`.
pub fn generate(seed: u64) -> GraphSpec {
    let mut g = Gen {
        rng: Rng::new(seed, 0x6772_6170_6867_656e),
        spec: GraphSpec { seed, tiles: 1, sources: Vec::new(), ops: Vec::new(), outputs: Vec::new() },
        avail: Vec::new(),
        next: 0,
    };
    g.spec.tiles = match g.rng.weighted(&[35, 30, 20, 10, 5]) {
        0 => 1 + g.rng.below(4),
        1 => 5 + g.rng.below(12),
        2 => 17 + g.rng.below(112),
        3 => 129 + g.rng.below(1343),
        _ => 1472,
    };
    let steps = 1 + g.rng.below(6);
    for _ in 0..steps {
        g.step();
    }
    if g.spec.ops.is_empty() {
        g.unary_map();
    }
    if g.rng.pct(10) {
        let shape = g.shape();
        let t = g.source(DType::F16, shape, false);
        g.avail.retain(|a| a.name != t);
    }
    if g.rng.pct(6) {
        let shape = g.shape();
        let t = g.source(DType::F16, shape, true);
        g.avail.retain(|a| a.name != t);
    }
    g.read_views();
    g.choose_outputs();
    g.spec
}

impl Gen {
    fn fresh(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{}", self.next - 1)
    }

    fn is_source(&self, name: &str) -> bool {
        self.spec.sources.iter().any(|s| s.name == name)
    }

    fn dim(&mut self) -> u64 {
        self.rng.pick(&DIMS)
    }

    /// A shape of rank 1–4, mostly 2, elements kept small.
    fn shape(&mut self) -> Vec<u64> {
        let rank = [1, 2, 2, 2, 2, 3, 3, 4][self.rng.below(8)];
        let mut s: Vec<u64> = (0..rank).map(|_| self.dim()).collect();
        if rank > 2 {
            for d in s.iter_mut().take(rank - 2) {
                *d = 1 + (*d % 4);
            }
        }
        s
    }

    /// Declare a source; returns its name. Params are f16, or FP8 when `dtype` says so.
    fn source(&mut self, dtype: DType, shape: Vec<u64>, param: bool) -> String {
        let name = self.fresh(if param { "w" } else { "x" });
        let p = param.then(|| Param {
            scale: is_fp8(dtype).then(|| self.rng.pick(&[-4i8, -3, -2, -1, 0])),
            codes: is_fp8(dtype) && self.rng.pct(50),
        });
        let mag = if let Some(Param { scale: Some(s), codes: true }) = &p {
            let max = if dtype == DType::F8E4M3 { 240.0 } else { 57344.0 };
            max * 2f64.powi(*s as i32)
        } else {
            1.0
        };
        self.spec.sources.push(Source { name: name.clone(), dtype, shape: shape.clone(), param: p });
        self.avail.push(Avail { name: name.clone(), dtype, shape, mag, from_matmul: false });
        name
    }

    /// An input or (with 40%) a param.
    fn new_operand(&mut self, shape: Vec<u64>) -> String {
        let param = self.rng.pct(40);
        self.source(DType::F16, shape, param)
    }

    /// An f16 tensor of rank ≥ `min_rank` to read: mostly the latest result, else any, else new.
    fn pick_f16(&mut self, min_rank: usize) -> Avail {
        let ok: Vec<Avail> = self
            .avail
            .iter()
            .filter(|a| a.dtype == DType::F16 && a.shape.len() >= min_rank)
            .cloned()
            .collect();
        if ok.is_empty() || self.rng.pct(8) {
            let mut shape = self.shape();
            while shape.len() < min_rank {
                shape.insert(0, 1 + self.rng.below(3) as u64);
            }
            let n = self.new_operand(shape);
            return self.avail.iter().find(|a| a.name == n).cloned().expect("declared");
        }
        if self.rng.pct(60) {
            return ok[ok.len() - 1].clone();
        }
        self.rng.pick(&ok)
    }

    /// The input of a view: mostly an op's result (a view of a model input that no earlier op
    /// reads is refused, documented), else as [`Self::pick_f16`].
    fn pick_view_input(&mut self, min_rank: usize) -> Avail {
        let made: Vec<Avail> = self
            .avail
            .iter()
            .filter(|a| a.dtype == DType::F16 && a.shape.len() >= min_rank && !self.is_source(&a.name))
            .cloned()
            .collect();
        if made.is_empty() || self.rng.pct(10) {
            return self.pick_f16(min_rank);
        }
        if self.rng.pct(60) {
            return made[made.len() - 1].clone();
        }
        self.rng.pick(&made)
    }

    /// A slice or a last-axis-keeping transpose that nothing reads cannot be an output (refused,
    /// documented): most get a reader, an elementwise function.
    fn read_views(&mut self) {
        let reads: Vec<String> = self.spec.reads().into_iter().map(String::from).collect();
        let leaves: Vec<Avail> = self
            .spec
            .ops
            .iter()
            .filter(|o| {
                let keeps_last = matches!(o.attrs.first(), Some((_, Attr::List(p))) if p.last() == Some(&(p.len() as i64 - 1)));
                (o.op == "slice" || (o.op == "transpose" && keeps_last)) && !reads.contains(&o.output)
            })
            .filter_map(|o| self.avail.iter().find(|a| a.name == o.output).cloned())
            .collect();
        for v in leaves {
            if v.dtype == DType::F16 && self.rng.pct(85) {
                let f = self.rng.pick(&["abs", "tanh", "sigmoid"]);
                self.push(f, &[("input", &v.name)], Vec::new(), (DType::F16, v.shape.clone(), v.mag));
            }
        }
    }

    fn push(
        &mut self,
        op: &str,
        operands: &[(&str, &str)],
        attrs: Vec<(&str, Attr)>,
        out: (DType, Vec<u64>, f64),
    ) -> String {
        let output = self.fresh("t");
        self.spec.ops.push(OpSpec {
            op: op.into(),
            operands: operands.iter().map(|(f, t)| (f.to_string(), t.to_string())).collect(),
            attrs: attrs.into_iter().map(|(f, a)| (f.to_string(), a)).collect(),
            output: output.clone(),
            dtype: out.0,
        });
        let from_matmul = op == "matmul";
        self.avail.push(Avail { name: output.clone(), dtype: out.0, shape: out.1, mag: out.2, from_matmul });
        output
    }

    fn step(&mut self) {
        match self.rng.weighted(&[24, 15, 8, 8, 7, 10, 8, 6, 7, 6, 6]) {
            0 => self.matmul(),
            1 => self.binary(),
            2 => self.softmax(),
            3 => self.layernorm(),
            4 => self.gelu(),
            5 => self.unary_map(),
            6 => self.cast_round_trip(),
            7 => self.reshape(),
            8 => self.transpose(),
            9 => self.slice(),
            _ => self.reduce(),
        }
    }

    /// An FP8 cast of `t` with a scale that fits its magnitude, tight enough to overflow 1 time in 8.
    fn cast_fp8(&mut self, t: &Avail) -> Avail {
        let to = if self.rng.pct(60) { DType::F8E4M3 } else { DType::F8E5M2 };
        let max = if to == DType::F8E4M3 { 240.0 } else { 57344.0 };
        let fit = (t.mag / max).log2().ceil() as i64;
        let slack = if self.rng.pct(12) { -2 - self.rng.below(2) as i64 } else { self.rng.below(4) as i64 };
        let scale = (fit + slack).clamp(-32, 31);
        let out = (to, t.shape.clone(), t.mag);
        let name = self.push("cast", &[("input", &t.name)], vec![("scale", Attr::Int(scale))], out);
        self.avail.last().cloned().filter(|a| a.name == name).expect("pushed")
    }

    fn matmul(&mut self) {
        let mut a = self.pick_f16(2);
        // Params as the left operand: the tensor picked is read as `b`, a new source is `a`.
        if self.rng.pct(12) && a.shape.len() == 2 {
            let new_a = vec![self.dim(), a.shape[0]];
            let name = self.new_operand(new_a);
            let (b, mode) = (a, self.rng.weighted(&[45, 20, 15, 20]));
            a = self.avail.iter().find(|x| x.name == name).cloned().expect("declared");
            let k = k_of_b(&b);
            return self.finish_matmul(a, b, false, false, mode, k);
        }
        let ra = a.shape.len();
        // A transposed read of a tensor made on the chip is refused (documented): mostly sources.
        let ta = self.rng.pct(if self.is_source(&a.name) { 15 } else { 3 });
        let k = if ta { a.shape[ra - 2] } else { a.shape[ra - 1] };
        let batch: Vec<u64> = a.shape[..ra - 2].to_vec();
        let tb = self.rng.pct(25);
        let n = self.dim();
        let bb = match self.rng.below(10) {
            0..=5 => Vec::new(),
            6..=8 => batch.clone(),
            _ => vec![1; batch.len()],
        };
        let mut b_shape = bb;
        b_shape.extend(if tb { [n, k] } else { [k, n] });
        let mode = self.rng.weighted(&[45, 20, 15, 20]);
        let fp8 = mode == 3;
        let b =
            match self.avail.iter().find(|x| x.dtype == DType::F16 && x.shape == b_shape && x.name != a.name)
            {
                Some(x) if self.rng.pct(50) => x.clone(),
                _ if fp8 && self.rng.pct(50) => {
                    let dt = if self.rng.pct(50) { DType::F8E4M3 } else { DType::F8E5M2 };
                    let name = self.source(dt, b_shape, true);
                    self.avail.iter().find(|x| x.name == name).cloned().expect("declared")
                }
                _ => {
                    let name = self.new_operand(b_shape);
                    self.avail.iter().find(|x| x.name == name).cloned().expect("declared")
                }
            };
        self.finish_matmul(a, b, ta, tb, mode, k);
    }

    /// The matmul of `a` and `b` (FP8 casts first for `mode` 3), and a cast of an f32 result.
    fn finish_matmul(&mut self, mut a: Avail, mut b: Avail, ta: bool, tb: bool, mode: usize, k: u64) {
        let fp8 = mode == 3;
        if fp8 {
            a = self.cast_fp8(&a);
            if b.dtype == DType::F16 {
                b = self.cast_fp8(&b);
            }
        }
        let (out, acc) = match mode {
            1 => (DType::F16, DType::F32),
            2 => (DType::F32, DType::F32),
            _ => (DType::F16, DType::F16),
        };
        let mut attrs = vec![("accumulate", Attr::Str(dtype_name(acc).into()))];
        if ta {
            attrs.push(("transpose_a", Attr::Bool(true)));
        }
        if tb {
            attrs.push(("transpose_b", Attr::Bool(true)));
        }
        let mut alpha = 1.0;
        if self.rng.pct(25) {
            alpha = self.rng.pick(&[0.5, 0.125, std::f64::consts::FRAC_1_SQRT_2, 2.0, -1.0, 0.3]);
            attrs.push(("alpha", Attr::Float(alpha)));
        }
        let shape =
            ipu_core::graph::matmul_shape(&tensor(&a), &tensor(&b), ta, tb).map(|(mut s, m, _, n)| {
                s.extend([m, n]);
                s
            });
        let Some(shape) = shape else { return };
        let mag = a.mag * b.mag * (k as f64).sqrt() * 2.0 * f64::abs(alpha);
        let t = self.push("matmul", &[("a", &a.name), ("b", &b.name)], attrs, (out, shape.clone(), mag));
        if out == DType::F32 && self.rng.pct(70) {
            self.push("cast", &[("input", &t)], Vec::new(), (DType::F16, shape, mag));
        }
    }

    fn binary(&mut self) {
        let a = self.pick_f16(1);
        let s = a.shape.clone();
        let r = s.len();
        let mut choices: Vec<Vec<u64>> = vec![s.clone(), vec![s[r - 1]], vec![1]];
        if r >= 2 {
            choices.push([vec![1], s[1..].to_vec()].concat());
            choices.push([s[..r - 1].to_vec(), vec![1]].concat());
            choices.push(vec![1, s[r - 1]]);
        }
        if r >= 3 {
            let mut m = s.clone();
            m[r - 2] = 1;
            choices.push(m);
        }
        let b_shape = self.rng.pick(&choices);
        let b =
            match self.avail.iter().find(|x| x.dtype == DType::F16 && x.shape == b_shape && x.name != a.name)
            {
                Some(x) if self.rng.pct(60) => x.clone(),
                _ => {
                    let n = self.new_operand(b_shape);
                    self.avail.iter().find(|x| x.name == n).cloned().expect("declared")
                }
            };
        let op = self.rng.pick(&["add", "sub", "mul"]);
        let (x, y) = if self.rng.pct(25) { (&b, &a) } else { (&a, &b) };
        let Some(shape) = ipu_core::graph::broadcast_shape(&x.shape, &y.shape) else { return };
        let mag = if op == "mul" { a.mag * b.mag } else { a.mag + b.mag };
        let (xn, yn) = (x.name.clone(), y.name.clone());
        self.push(op, &[("a", &xn), ("b", &yn)], Vec::new(), (DType::F16, shape, mag));
    }

    fn softmax(&mut self) {
        let mm: Vec<Avail> =
            self.avail.iter().filter(|a| a.from_matmul && a.dtype == DType::F16).cloned().collect();
        let x = if !mm.is_empty() && self.rng.pct(60) {
            self.rng.pick(&mm)
        } else {
            let r = if self.rng.pct(90) { 2 } else { 1 };
            self.pick_f16(r)
        };
        self.push("softmax", &[("input", &x.name)], Vec::new(), (DType::F16, x.shape, 1.0));
    }

    fn layernorm(&mut self) {
        let x = self.pick_f16(1);
        let d = *x.shape.last().expect("rank ≥ 1");
        let mut operands = vec![("input", x.name.clone())];
        for field in ["gamma", "beta"] {
            if self.rng.pct(50) {
                let n = self.new_operand(vec![d]);
                operands.push((field, n));
            }
        }
        let eps = self.rng.pick(&[1e-5, 1e-6, 1e-3, 0.0]);
        let ops: Vec<(&str, &str)> = operands.iter().map(|(f, t)| (*f, t.as_str())).collect();
        let mag = 2.0 * (d as f64).sqrt() + 2.0;
        self.push("layernorm", &ops, vec![("eps", Attr::Float(eps))], (DType::F16, x.shape, mag));
    }

    fn gelu(&mut self) {
        let x = self.pick_f16(1);
        let form = self.rng.pick(&["tanh", "none", "sigmoid"]);
        self.push(
            "gelu",
            &[("input", &x.name)],
            vec![("approximate", Attr::Str(form.into()))],
            (DType::F16, x.shape, x.mag),
        );
    }

    fn unary_map(&mut self) {
        let x = self.pick_f16(1);
        let f = self.rng.pick(&[
            "tanh",
            "sigmoid",
            "exp",
            "log",
            "sqrt",
            "reciprocal",
            "abs",
            "erf",
            "pow",
            "max",
            "min",
            "leaky_relu",
        ]);
        let mut attrs = Vec::new();
        let mag = match f {
            "exp" => x.mag.min(11.0).exp(),
            "log" => 17.0 + x.mag.ln().max(0.0),
            "sqrt" => x.mag.sqrt(),
            "reciprocal" => 1e4,
            "abs" => x.mag,
            "pow" => {
                let c: f64 = self.rng.pick(&[2.0, 3.0, 0.5, -1.0, 1.5]);
                attrs.push(("exponent", Attr::Float(c)));
                if c < 0.0 {
                    1e4
                } else {
                    x.mag.max(1.0).powf(c)
                }
            }
            // ReLU (0), ReLU6's bounds, others; a NaN input gives the value.
            "max" | "min" => {
                let c: f64 = self.rng.pick(&[0.0, 6.0, -0.5, 1.0, -2.0, 0.25]);
                attrs.push(("value", Attr::Float(c)));
                x.mag.max(c.abs())
            }
            "leaky_relu" => {
                let a: f64 = self.rng.pick(&[0.01, 0.2, 0.5, 1.0, 0.0, -0.25]);
                attrs.push(("alpha", Attr::Float(a)));
                x.mag
            }
            _ => 1.0,
        };
        self.push(f, &[("input", &x.name)], attrs, (DType::F16, x.shape, mag));
    }

    /// `reduce_sum` or `reduce_mean` over the last axis: the result's last axis is 1.
    fn reduce(&mut self) {
        let x = self.pick_f16(1);
        let d = *x.shape.last().expect("rank ≥ 1");
        let (op, mag) =
            if self.rng.pct(50) { ("reduce_sum", x.mag * d as f64) } else { ("reduce_mean", x.mag) };
        let mut shape = x.shape.clone();
        *shape.last_mut().expect("rank ≥ 1") = 1;
        self.push(op, &[("input", &x.name)], Vec::new(), (DType::F16, shape, mag));
    }

    /// f16 → FP8 → f16, or f16 → f32 → f16; an f32 input cast to f16; sometimes the middle
    /// tensor is left as the end of the chain (an FP8 or f32 output).
    fn cast_round_trip(&mut self) {
        if self.rng.pct(20) {
            let shape = self.shape();
            let name = self.source(DType::F32, shape.clone(), false);
            self.push("cast", &[("input", &name)], Vec::new(), (DType::F16, shape, 1.0));
            return;
        }
        let x = self.pick_f16(1);
        let mid = if self.rng.pct(65) {
            self.cast_fp8(&x)
        } else {
            let n =
                self.push("cast", &[("input", &x.name)], Vec::new(), (DType::F32, x.shape.clone(), x.mag));
            self.avail.iter().find(|a| a.name == n).cloned().expect("pushed")
        };
        if self.rng.pct(80) {
            self.push("cast", &[("input", &mid.name)], Vec::new(), (DType::F16, mid.shape, mid.mag));
        }
    }

    fn reshape(&mut self) {
        let x = if self.avail.is_empty() || self.rng.pct(85) {
            self.pick_view_input(1)
        } else {
            self.rng.pick(&self.avail.clone())
        };
        let s = &x.shape;
        let e: u64 = s.iter().product();
        let r = s.len();
        let mut choices: Vec<Vec<u64>> = vec![vec![e], [vec![1], s.clone()].concat()];
        if r >= 2 {
            choices.push(vec![e / s[r - 1], s[r - 1]]);
        }
        let divisors: Vec<u64> = (2..=e.min(64)).filter(|d| e.is_multiple_of(*d) && *d < e).collect();
        if !divisors.is_empty() {
            let d = self.rng.pick(&divisors);
            choices.push(vec![e / d, d]);
            choices.push(vec![d, e / d]);
        }
        let shape = self.rng.pick(&choices);
        let list = shape.iter().map(|&d| d as i64).collect();
        self.push(
            "reshape",
            &[("input", &x.name)],
            vec![("shape", Attr::List(list))],
            (x.dtype, shape, x.mag),
        );
    }

    fn transpose(&mut self) {
        let x = self.pick_view_input(2);
        let r = x.shape.len();
        let mut perm: Vec<usize> = (0..r).collect();
        match self.rng.weighted(&[70, 25, 5]) {
            0 => perm.swap(r - 1, r - 2),
            1 if r >= 3 => perm.swap(0, r - 2),
            _ => perm.rotate_left(1),
        }
        let shape: Vec<u64> = perm.iter().map(|&p| x.shape[p]).collect();
        let list = perm.iter().map(|&p| p as i64).collect();
        self.push(
            "transpose",
            &[("input", &x.name)],
            vec![("perm", Attr::List(list))],
            (x.dtype, shape, x.mag),
        );
    }

    fn slice(&mut self) {
        let x = self.pick_view_input(1);
        let r = x.shape.len();
        let (mut starts, mut ends) = (vec![0i64; r], x.shape.iter().map(|&d| d as i64).collect::<Vec<_>>());
        for k in 0..r {
            let d = x.shape[k] as i64;
            if d > 1 && (k == r - 1 || self.rng.pct(40)) && self.rng.pct(75) {
                let mut s = self.rng.below(d as usize) as i64;
                if k == r - 1 && self.rng.pct(85) {
                    s &= !1;
                }
                starts[k] = s;
                ends[k] = s + 1 + self.rng.below((d - s) as usize) as i64;
            }
        }
        let shape: Vec<u64> = (0..r).map(|k| (ends[k] - starts[k]) as u64).collect();
        let attrs = vec![("starts", Attr::List(starts)), ("ends", Attr::List(ends))];
        self.push("slice", &[("input", &x.name)], attrs, (x.dtype, shape, x.mag));
    }

    /// Every result nothing reads is an output (9 in 10: the rest stay dead code), and some
    /// intermediate results are outputs too.
    fn choose_outputs(&mut self) {
        let reads: Vec<String> = self.spec.reads().into_iter().map(String::from).collect();
        let mut outs = Vec::new();
        let n = self.spec.ops.len();
        for (i, op) in self.spec.ops.iter().enumerate() {
            let leaf = !reads.contains(&op.output);
            let pick = if leaf { i + 1 == n || self.rng.pct(90) } else { self.rng.pct(12) };
            if pick {
                outs.push(op.output.clone());
            }
        }
        self.spec.outputs = outs;
    }
}

/// K of a matmul that reads `b` untransposed as its right operand.
fn k_of_b(b: &Avail) -> u64 {
    b.shape[b.shape.len() - 2]
}

/// The core graph's view of a generator tensor, for its shape rules.
fn tensor(a: &Avail) -> ipu_core::graph::Tensor {
    ipu_core::graph::Tensor { name: a.name.clone(), dtype: a.dtype, shape: a.shape.clone(), scale: 0 }
}
