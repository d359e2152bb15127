//! Elementwise compositions of one runtime tensor with scalar constants, kept symbolic until a
//! consumer needs the tensor, then recognised by what they compute rather than by the shape of
//! the node graph: torch writes the tanh GeLU as `Mul/Pow/Add/Tanh/Mul` in several orders, the
//! erf GeLU as `Div/Erf/Add/Mul/Mul`, attention's scale as a `Mul` (or `Div`) on Q, on K, or on
//! both. Evaluating the composition on sample points and comparing it with each known function
//! recognises all of these orders at once, and a scale in front of a matmul folds into `alpha`.

use std::rc::Rc;
use std::sync::OnceLock;

/// Every finite f16 value: the values the tensor of a composition can hold.
fn f16_domain() -> &'static [f64] {
    static DOMAIN: OnceLock<Vec<f64>> = OnceLock::new();
    DOMAIN.get_or_init(|| {
        (0..=u16::MAX).map(|b| half::f16::from_bits(b).to_f64()).filter(|x| x.is_finite()).collect()
    })
}

/// A function the device has a kernel for, its values, and the relative tolerance it is
/// recognised within.
type Candidate<'a> = (Form, &'a dyn Fn(f64) -> f64, f64);

/// An elementwise function of one tensor `x`.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// The tensor itself.
    X,
    /// A scalar constant.
    C(f64),
    /// A unary ONNX op (`Tanh`, `Erf`, `Sqrt`, `Exp`, `Log`, `Sigmoid`, `Neg`, `Abs`, `Reciprocal`).
    Un(&'static str, Rc<Expr>),
    /// A binary ONNX op (`Add`, `Sub`, `Mul`, `Div`, `Pow`, `Max`, `Min`), or `LeakyRelu` of the
    /// first operand with the second as its slope (`Relu`, `Clip`, `HardSigmoid`, `HardSwish`
    /// are written with `Max` and `Min`).
    Bin(&'static str, Rc<Expr>, Rc<Expr>),
}

/// What a composition computes, as far as the device has a kernel for it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Form {
    /// `x`.
    Identity,
    /// `a·x + b`.
    Affine(f64, f64),
    /// `0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))`.
    GeluTanh,
    /// `0.5x(1 + erf(x/√2))`.
    GeluErf,
    /// `x·σ(1.702x)`: CLIP's quick GeLU (`Mul`, `Sigmoid`, `Mul` as torch exports it).
    GeluSigmoid,
    /// Anything else.
    Unknown,
}

impl Expr {
    /// The value at `x` in f64.
    pub fn eval(&self, x: f64) -> f64 {
        self.eval_all(&[x])[0]
    }

    /// The values at each of `xs` in f64, one pass over `xs` per node.
    pub fn eval_all(&self, xs: &[f64]) -> Vec<f64> {
        match self {
            Expr::X => xs.to_vec(),
            Expr::C(c) => vec![*c; xs.len()],
            Expr::Un(op, a) => {
                let mut v = a.eval_all(xs);
                let f: fn(f64) -> f64 = match *op {
                    "Tanh" => f64::tanh,
                    "Erf" => libm::erf,
                    "Sqrt" => f64::sqrt,
                    "Exp" => f64::exp,
                    "Neg" => |a| -a,
                    "Abs" => f64::abs,
                    "Reciprocal" => |a| 1.0 / a,
                    "Log" => f64::ln,
                    "Sigmoid" => |a| 1.0 / (1.0 + (-a).exp()),
                    _ => |_| f64::NAN,
                };
                v.iter_mut().for_each(|a| *a = f(*a));
                v
            }
            Expr::Bin(op, a, b) => {
                let (mut v, w) = (a.eval_all(xs), b.eval_all(xs));
                let f: fn(f64, f64) -> f64 = match *op {
                    "Add" => |a, b| a + b,
                    "Sub" => |a, b| a - b,
                    "Mul" => |a, b| a * b,
                    "Div" => |a, b| a / b,
                    "Pow" => f64::powf,
                    "Max" => f64::max,
                    "Min" => f64::min,
                    "LeakyRelu" => |a, s| if a >= 0.0 { a } else { s * a },
                    _ => |_, _| f64::NAN,
                };
                v.iter_mut().zip(&w).for_each(|(a, b)| *a = f(*a, *b));
                v
            }
        }
    }

    /// Recognise the function by its values: first on 65 points of [-8, 8] (±0 and the GeLU
    /// knee included), then, for the function found there, at **every finite f16 value** (the
    /// tensor of a composition is f16, so this is its whole domain: a composition that agrees
    /// with a GeLU on the sample points only, such as a GeLU plus a bump between them, is not
    /// taken for one). The tolerances separate the GeLUs (they differ by up to 4.7e−4) while
    /// accepting constants rounded to f32 in the file (relative error ~6e−8): a GeLU whose
    /// √(2/π), 0.044715, 1/√2, 0.5 or 1 differs by more than about 1e−5 relative is not one.
    pub fn form(&self) -> Form {
        if *self == Expr::X {
            return Form::Identity;
        }
        // Remembered by text (constants written exactly): the lowering asks again for each view
        // and reader of a value, and the check over the f16 range takes milliseconds.
        thread_local! {
            static FORMS: std::cell::RefCell<std::collections::HashMap<String, Form>> = Default::default();
        }
        let key = self.text();
        if let Some(f) = FORMS.with(|m| m.borrow().get(&key).copied()) {
            return f;
        }
        let f = self.recognise();
        FORMS.with(|m| {
            let mut m = m.borrow_mut();
            if m.len() >= 4096 {
                m.clear();
            }
            m.insert(key, f);
        });
        f
    }

    fn recognise(&self) -> Form {
        let xs: Vec<f64> = (0..=64).map(|i| -8.0 + 0.25 * i as f64).collect();
        let ys = self.eval_all(&xs);
        if ys.iter().any(|y| !y.is_finite()) {
            return Form::Unknown;
        }
        let close = |xs: &[f64], ys: &[f64], f: &dyn Fn(f64) -> f64, tol: f64| {
            xs.iter().zip(ys).all(|(x, y)| (y - f(*x)).abs() <= tol * (1.0 + f(*x).abs()))
        };
        let (b, a) = (self.eval(0.0), (self.eval(1.0) - self.eval(-1.0)) / 2.0);
        let c = (2.0 / std::f64::consts::PI).sqrt();
        let candidates: [Candidate; 5] = [
            (Form::Identity, &|x| x, 1e-12),
            (Form::Affine(a, b), &|x| a * x + b, 1e-9),
            (Form::GeluTanh, &|x| 0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh()), 1e-6),
            (Form::GeluErf, &|x| 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)), 1e-6),
            (Form::GeluSigmoid, &|x| x / (1.0 + (-1.702 * x).exp()), 1e-6),
        ];
        let Some((form, f, tol)) = candidates.into_iter().find(|(_, f, tol)| close(&xs, &ys, *f, *tol))
        else {
            return Form::Unknown;
        };
        let domain = f16_domain();
        if close(domain, &self.eval_all(domain), f, tol) {
            form
        } else {
            Form::Unknown
        }
    }

    /// A short text of the composition, for messages.
    pub fn text(&self) -> String {
        match self {
            Expr::X => "x".into(),
            Expr::C(c) => format!("{c}"),
            Expr::Un(op, a) => format!("{op}({})", a.text()),
            Expr::Bin(op, a, b) => format!("{op}({}, {})", a.text(), b.text()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(v: f64) -> Rc<Expr> {
        Rc::new(Expr::C(v))
    }
    fn bin(op: &'static str, a: Rc<Expr>, b: Rc<Expr>) -> Rc<Expr> {
        Rc::new(Expr::Bin(op, a, b))
    }

    #[test]
    fn torch_tanh_gelu_in_f32_constants_is_recognised_and_not_taken_for_erf() {
        let x = Rc::new(Expr::X);
        let cube = bin("Pow", x.clone(), c(3.0));
        let inner = bin("Add", x.clone(), bin("Mul", c(0.044715f32 as f64), cube));
        let t = Rc::new(Expr::Un("Tanh", bin("Mul", c(0.797_884_6f32 as f64), inner)));
        let g = bin("Mul", bin("Mul", c(0.5), x.clone()), bin("Add", c(1.0), t));
        assert_eq!(g.form(), Form::GeluTanh);
        let erf = Rc::new(Expr::Un("Erf", bin("Div", x.clone(), c(std::f64::consts::SQRT_2))));
        let ge = bin("Mul", bin("Mul", x.clone(), bin("Add", erf, c(1.0))), c(0.5));
        assert_eq!(ge.form(), Form::GeluErf);
    }

    fn un(op: &'static str, a: Rc<Expr>) -> Rc<Expr> {
        Rc::new(Expr::Un(op, a))
    }

    /// `0.5x(1 + tanh(s(x + k x³)))` with its constants as given (`h`: the 0.5, `o`: the 1).
    fn gelu_tanh(s: f64, k: f64, h: f64, o: f64) -> Rc<Expr> {
        let x = Rc::new(Expr::X);
        let inner = bin("Add", x.clone(), bin("Mul", c(k), bin("Pow", x.clone(), c(3.0))));
        bin("Mul", bin("Mul", c(h), x), bin("Add", c(o), un("Tanh", bin("Mul", c(s), inner))))
    }

    /// `0.5x(1 + erf(x / r))`.
    fn gelu_erf(r: f64, h: f64, o: f64) -> Rc<Expr> {
        let x = Rc::new(Expr::X);
        bin("Mul", bin("Mul", x.clone(), bin("Add", un("Erf", bin("Div", x, c(r))), c(o))), c(h))
    }

    #[test]
    fn every_op_evaluates_as_onnx_defines_it() {
        // The values decide what a composition is recognised as (an unknown op gives NaN: the
        // composition is then written step by step).
        let x = Rc::new(Expr::X);
        type Unary = (&'static str, fn(f64) -> f64);
        type Binary = (&'static str, fn(f64, f64) -> f64);
        let unary: [Unary; 9] = [
            ("Tanh", f64::tanh),
            ("Erf", libm::erf),
            ("Sqrt", f64::sqrt),
            ("Exp", f64::exp),
            ("Neg", |v| -v),
            ("Abs", f64::abs),
            ("Reciprocal", |v| 1.0 / v),
            ("Log", f64::ln),
            ("Sigmoid", |v| 1.0 / (1.0 + (-v).exp())),
        ];
        let points = [-2.5, -0.75, 0.5, 3.0];
        for (op, f) in unary {
            let e = un(op, x.clone());
            let got = e.eval_all(&points);
            for (v, g) in points.iter().zip(got) {
                let want = f(*v);
                assert!(g == want || (g.is_nan() && want.is_nan()), "{op}({v}) = {g}, not {want}");
                assert_eq!(e.eval(*v).to_bits(), g.to_bits(), "{op}: eval and eval_all agree");
            }
        }
        let binary: [Binary; 8] = [
            ("Add", |a, b| a + b),
            ("Sub", |a, b| a - b),
            ("Mul", |a, b| a * b),
            ("Div", |a, b| a / b),
            ("Pow", f64::powf),
            ("Max", f64::max),
            ("Min", f64::min),
            ("LeakyRelu", |a, s| if a < 0.0 { a * s } else { a }),
        ];
        for (op, f) in binary {
            let e = bin(op, x.clone(), c(1.5));
            for v in points {
                assert_eq!(e.eval(v).to_bits(), f(v, 1.5).to_bits(), "{op}({v}, 1.5)");
            }
        }
        assert!(un("Cos", x.clone()).eval(1.0).is_nan() && bin("Mod", x, c(1.0)).eval(1.0).is_nan());
    }

    #[test]
    fn every_gelu_constant_is_checked() {
        let (s, k, r) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044715, std::f64::consts::SQRT_2);
        let f32 = |v: f64| v as f32 as f64;
        assert_eq!(gelu_tanh(f32(s), f32(k), 0.5, 1.0).form(), Form::GeluTanh);
        assert_eq!(gelu_erf(f32(r), 0.5, 1.0).form(), Form::GeluErf);
        // Each constant off by 1e-4 relative (a quarter of an f16 ulp) is another function.
        let off = |v: f64| v * (1.0 + 1e-4);
        for g in [
            gelu_tanh(off(s), k, 0.5, 1.0),
            gelu_tanh(s, off(k), 0.5, 1.0),
            gelu_tanh(s, k, off(0.5), 1.0),
            gelu_tanh(s, k, 0.5, off(1.0)),
            gelu_erf(off(r), 0.5, 1.0),
            gelu_erf(r, off(0.5), 1.0),
            gelu_erf(r, 0.5, off(1.0)),
        ] {
            assert_eq!(g.form(), Form::Unknown, "{}", g.text());
        }
    }

    #[test]
    fn quick_gelu_is_recognised_with_its_constant_and_silu_is_not_it() {
        // torch: `x * torch.sigmoid(1.702 * x)`, the 1.702 an f32 in the file.
        let x = Rc::new(Expr::X);
        let quick = |k: f64| bin("Mul", x.clone(), un("Sigmoid", bin("Mul", c(k), x.clone())));
        assert_eq!(quick(1.702f32 as f64).form(), Form::GeluSigmoid);
        // Written as a division, in the other operand order: the same function.
        let div = bin("Div", x.clone(), bin("Add", c(1.0), un("Exp", bin("Mul", x.clone(), c(-1.702)))));
        assert_eq!(div.form(), Form::GeluSigmoid);
        // 1.702 off by 1e-4 relative, and SiLU (k = 1), are other functions.
        assert_eq!(quick(1.702 * (1.0 + 1e-4)).form(), Form::Unknown);
        assert_eq!(quick(1.0).form(), Form::Unknown);
    }

    #[test]
    fn agreeing_on_the_sample_points_is_not_enough() {
        let x = Rc::new(Expr::X);
        let relu = |e: Rc<Expr>| bin("Mul", bin("Add", e.clone(), un("Abs", e)), c(0.5));
        // relu(1/8 − |x − 1/8|): zero at every multiple of 1/4, 1/8 at x = 1/8.
        let bump = relu(bin("Sub", c(0.125), un("Abs", bin("Sub", x.clone(), c(0.125)))));
        let s = (2.0 / std::f64::consts::PI).sqrt();
        assert_eq!(bin("Add", gelu_tanh(s, 0.044715, 0.5, 1.0), bump.clone()).form(), Form::Unknown);
        // relu(|x| − 8): zero on [−8, 8], not beyond.
        let tail = relu(bin("Sub", un("Abs", x.clone()), c(8.0)));
        assert_eq!(bin("Add", bin("Mul", x.clone(), c(0.125)), tail.clone()).form(), Form::Unknown);
        assert_eq!(bin("Add", x.clone(), tail).form(), Form::Unknown);
        assert_eq!(bin("Mul", x, c(0.125)).form(), Form::Affine(0.125, 0.0));
    }

    #[test]
    fn scales_and_shifts_are_affine_and_anything_else_is_unknown() {
        let x = Rc::new(Expr::X);
        assert_eq!(bin("Div", x.clone(), c(8.0)).form(), Form::Affine(0.125, 0.0));
        assert_eq!(bin("Sub", bin("Mul", x.clone(), c(2.0)), c(1.0)).form(), Form::Affine(2.0, -1.0));
        // Attention's 1/√d as a division: x/√12 and x·(1/√12) differ in the last bit, and by
        // 1e-12 absolute at 65504 (the tolerance is relative to the value).
        let s = 12f64.sqrt();
        assert_eq!(bin("Div", x.clone(), c(s)).form(), Form::Affine(1.0 / s, 0.0));
        assert_eq!(
            bin("Div", bin("Add", x.clone(), c(1.0)), c(3.0)).form(),
            Form::Affine(1.0 / 3.0, 1.0 / 3.0)
        );
        assert_eq!(un("Neg", x.clone()).form(), Form::Affine(-1.0, 0.0));
        assert_eq!(Rc::new(Expr::Un("Tanh", x.clone())).form(), Form::Unknown);
        assert_eq!(Expr::X.form(), Form::Identity);
    }
}
