//! Elementwise compositions that no fused kernel computes (docs/onnx.md "Compositions"), written
//! one step at a time: each function of the composition becomes a `map_f16` op (`tanh`, `exp`,
//! …), each arithmetic step with a constant an `add`/`sub`/`mul` with a one-value param, each step
//! between two computed values an `add`/`sub`/`mul` of tensors. An unfamiliar composition is
//! slower than a fused one (every step is a pass over the values, rounded to f16), never refused
//! while its steps are among these. Parts that are recognised (a GeLU, a scaling) are written as
//! such; parts that depend on no tensor fold to constants.

use super::{s, Lower, Run};
use crate::onnx::emit::Field;
use crate::onnx::expr::{Expr, Form};
use ipu_schema::DType;
use std::rc::Rc;

/// A step's result: a tensor of the model being written, or a constant.
enum Operand {
    T(String),
    S(f64),
}

/// Whether `e` reads the tensor.
fn reads_x(e: &Expr) -> bool {
    match e {
        Expr::X => true,
        Expr::C(_) => false,
        Expr::Un(_, a) => reads_x(a),
        Expr::Bin(_, a, b) => reads_x(a) || reads_x(b),
    }
}

impl Lower<'_, '_> {
    /// Write the composition `r.e` of `r.t` step by step; the tensor that holds its value.
    pub(super) fn write_steps(&mut self, r: &Run, at: &str) -> Result<String, String> {
        // The composition reads the tensor more than once: a scaling inside it must not fold
        // into the matmul that made the tensor (the other reads want it unscaled).
        let before = std::mem::replace(&mut self.no_fold, true);
        let out = self.step(r, &r.e, at);
        self.no_fold = before;
        match out? {
            Operand::T(t) => Ok(t),
            Operand::S(_) => Err(format!("{at}: the composition {} is a constant", r.e.text())),
        }
    }

    fn step(&mut self, r: &Run, e: &Rc<Expr>, at: &str) -> Result<Operand, String> {
        if !reads_x(e) {
            return Ok(Operand::S(e.eval(0.0)));
        }
        let sub = Run { t: r.t.clone(), shape: r.shape.clone(), e: e.clone(), prov: None };
        if e.form() != Form::Unknown {
            return self.tensor(&sub, at).map(Operand::T);
        }
        let key = (r.t.clone(), e.text());
        if let Some(t) = self.written.get(&key) {
            return Ok(Operand::T(t.clone()));
        }
        let t = match &**e {
            Expr::X | Expr::C(_) => unreachable!("X is the identity form and C reads no tensor"),
            Expr::Un(op, a) => {
                let Operand::T(a) = self.step(r, a, at)? else { unreachable!("reads the tensor") };
                match *op {
                    "Neg" => self.with_scalar("mul", &a, -1.0, false),
                    "Tanh" => self.map("tanh", &a, None),
                    "Sigmoid" => self.map("sigmoid", &a, None),
                    "Exp" => self.map("exp", &a, None),
                    "Log" => self.map("log", &a, None),
                    "Sqrt" => self.map("sqrt", &a, None),
                    "Reciprocal" => self.map("reciprocal", &a, None),
                    "Abs" => self.map("abs", &a, None),
                    "Erf" => self.map("erf", &a, None),
                    other => return Err(format!("{at}: {other} has no elementwise kernel")),
                }
            }
            Expr::Bin(op, a, b) => {
                let (a, b) = (self.step(r, a, at)?, self.step(r, b, at)?);
                self.binary_step(op, a, b, at)?
            }
        };
        self.written.insert(key, t.clone());
        Ok(Operand::T(t))
    }

    /// One arithmetic step; at least one side is a tensor.
    fn binary_step(&mut self, op: &str, a: Operand, b: Operand, at: &str) -> Result<String, String> {
        use Operand::{S, T};
        Ok(match (op, a, b) {
            ("Add" | "Sub" | "Mul", T(a), T(b)) => {
                let out = self.emit.fresh(&format!("{a}_{}", op.to_lowercase()));
                self.binary(&op.to_lowercase(), &a, &b, &out);
                out
            }
            ("Div", T(a), T(b)) => {
                let inv = self.map("reciprocal", &b, None);
                let out = self.emit.fresh(&format!("{a}_div"));
                self.binary("mul", &a, &inv, &out);
                out
            }
            ("Add" | "Mul", T(t), S(c)) | ("Add" | "Mul", S(c), T(t)) => {
                self.with_scalar(&op.to_lowercase(), &t, c, false)
            }
            ("Sub", T(t), S(c)) => self.with_scalar("sub", &t, c, false),
            ("Sub", S(c), T(t)) => self.with_scalar("sub", &t, c, true),
            ("Div", T(t), S(c)) => self.with_scalar("mul", &t, 1.0 / c, false),
            ("Div", S(c), T(t)) => {
                let inv = self.map("reciprocal", &t, None);
                if c == 1.0 {
                    inv
                } else {
                    self.with_scalar("mul", &inv, c, false)
                }
            }
            ("Pow", T(t), S(c)) => self.power(&t, c),
            ("Max", T(t), S(c)) | ("Max", S(c), T(t)) => self.map("max", &t, Some(c)),
            ("Min", T(t), S(c)) | ("Min", S(c), T(t)) => self.map("min", &t, Some(c)),
            ("LeakyRelu", T(t), S(a)) if a <= 1.0 => self.map("leaky_relu", &t, Some(a)),
            ("Pow", S(c), T(t)) if c > 0.0 => {
                // c^t = e^{t·ln c}
                let scaled = self.with_scalar("mul", &t, c.ln(), false);
                self.map("exp", &scaled, None)
            }
            (op, _, _) => {
                return Err(format!(
                    "{at}: {op} with these operands has no elementwise kernel (a power of a computed \
                     exponent or of a base ≤ 0, a Max/Min of two computed values, a LeakyRelu slope above 1)"
                ))
            }
        })
    }

    /// `t^c`: products for integer powers up to 8 (exact for any sign of t, as NumPy), √ for a
    /// half, 1/x for negative ones, else `pow` (`e^{c·ln t}`, NaN for t < 0 as NumPy's
    /// non-integer powers).
    fn power(&mut self, t: &str, c: f64) -> String {
        let k = c.abs();
        let p = if k.fract() == 0.0 && (1.0..=8.0).contains(&k) {
            self.product_power(t, k as u32)
        } else if k == 0.5 {
            self.map("sqrt", t, None)
        } else {
            return self.map("pow", t, Some(c));
        };
        if c < 0.0 {
            self.map("reciprocal", &p, None)
        } else {
            p
        }
    }

    /// `t^k` by squaring and multiplying, most significant bit first.
    fn product_power(&mut self, t: &str, k: u32) -> String {
        let mut acc = t.to_string();
        for bit in (0..31 - k.leading_zeros()).rev() {
            let sq = self.emit.fresh(&format!("{t}_pow"));
            self.binary("mul", &acc, &acc, &sq);
            acc = sq;
            if k >> bit & 1 == 1 {
                let next = self.emit.fresh(&format!("{t}_pow"));
                self.binary("mul", &acc, t, &next);
                acc = next;
            }
        }
        acc
    }

    /// `1/t` as an op of its own.
    pub(super) fn reciprocal(&mut self, t: &str) -> String {
        self.map("reciprocal", t, None)
    }

    /// `f(t)` as an op of its own (`exponent`: the function's constant, if it takes one).
    fn map(&mut self, func: &str, t: &str, exponent: Option<f64>) -> String {
        let out = self.emit.fresh(&format!("{t}_{func}"));
        let mut fields =
            vec![("input", Field::S(t.into())), ("output", Field::S(out.clone())), ("dtype", s("f16"))];
        if let Some(c) = exponent {
            // The constant's field: `exponent` of `pow`, `value` of `max`/`min`, `alpha` of
            // `leaky_relu`.
            let field = ipu_core::graph::MapFn::from_name(func).and_then(|f| f.field()).unwrap_or("exponent");
            fields.push((field, Field::F(c)));
        }
        self.emit.op(func, &fields);
        out
    }

    /// `t ∘ c`, or `c ∘ t` when `flip`, with `c` a one-value f16 param.
    fn with_scalar(&mut self, op: &str, t: &str, c: f64, flip: bool) -> String {
        let p = self.emit.param(&format!("{t}_{op}"), DType::F16, 0, vec![1], vec![c as f32]);
        let out = self.emit.fresh(&format!("{t}_{op}"));
        if flip {
            self.binary(op, &p, t, &out);
        } else {
            self.binary(op, t, &p, &out);
        }
        out
    }
}
