//! Elementwise compositions of one runtime tensor with scalar constants, kept symbolic until a
//! consumer needs the tensor, then recognised by what they compute rather than by the shape of
//! the node graph: torch writes the tanh GeLU as `Mul/Pow/Add/Tanh/Mul` in several orders, the
//! erf GeLU as `Div/Erf/Add/Mul/Mul`, attention's scale as a `Mul` (or `Div`) on Q, on K, or on
//! both. Evaluating the composition on sample points and comparing it with each known function
//! recognises all of these orders at once, and a scale in front of a matmul folds into `alpha`.

use std::rc::Rc;

/// An elementwise function of one tensor `x`.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// The tensor itself.
    X,
    /// A scalar constant.
    C(f64),
    /// A unary ONNX op (`Tanh`, `Erf`, `Sqrt`, `Exp`, `Log`, `Sigmoid`, `Neg`, `Abs`, `Reciprocal`).
    Un(&'static str, Rc<Expr>),
    /// A binary ONNX op (`Add`, `Sub`, `Mul`, `Div`, `Pow`).
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
    /// Anything else.
    Unknown,
}

impl Expr {
    /// The value at `x` in f64.
    pub fn eval(&self, x: f64) -> f64 {
        match self {
            Expr::X => x,
            Expr::C(c) => *c,
            Expr::Un(op, a) => {
                let a = a.eval(x);
                match *op {
                    "Tanh" => a.tanh(),
                    "Erf" => libm::erf(a),
                    "Sqrt" => a.sqrt(),
                    "Exp" => a.exp(),
                    "Neg" => -a,
                    "Abs" => a.abs(),
                    "Reciprocal" => 1.0 / a,
                    "Log" => a.ln(),
                    "Sigmoid" => 1.0 / (1.0 + (-a).exp()),
                    _ => f64::NAN,
                }
            }
            Expr::Bin(op, a, b) => {
                let (a, b) = (a.eval(x), b.eval(x));
                match *op {
                    "Add" => a + b,
                    "Sub" => a - b,
                    "Mul" => a * b,
                    "Div" => a / b,
                    "Pow" => a.powf(b),
                    _ => f64::NAN,
                }
            }
        }
    }

    /// Recognise the function by its values on [-8, 8] (65 points, ±0 and the GeLU knee
    /// included). The tolerances separate the two GeLUs (they differ by up to 4.7e−4) while
    /// accepting constants rounded to f32 in the file (relative error ~6e−8).
    pub fn form(&self) -> Form {
        if *self == Expr::X {
            return Form::Identity;
        }
        let xs: Vec<f64> = (0..=64).map(|i| -8.0 + 0.25 * i as f64).collect();
        let ys: Vec<f64> = xs.iter().map(|x| self.eval(*x)).collect();
        if ys.iter().any(|y| !y.is_finite()) {
            return Form::Unknown;
        }
        let close = |f: &dyn Fn(f64) -> f64, tol: f64| {
            xs.iter().zip(&ys).all(|(x, y)| (y - f(*x)).abs() <= tol * (1.0 + f(*x).abs()))
        };
        let (b, a) = (self.eval(0.0), (self.eval(1.0) - self.eval(-1.0)) / 2.0);
        if close(&|x| x, 1e-12) {
            return Form::Identity;
        }
        if close(&|x| a * x + b, 1e-9) {
            return Form::Affine(a, b);
        }
        let c = (2.0 / std::f64::consts::PI).sqrt();
        if close(&|x| 0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh()), 1e-6) {
            return Form::GeluTanh;
        }
        if close(&|x| 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)), 1e-6) {
            return Form::GeluErf;
        }
        Form::Unknown
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

    #[test]
    fn scales_and_shifts_are_affine_and_anything_else_is_unknown() {
        let x = Rc::new(Expr::X);
        assert_eq!(bin("Div", x.clone(), c(8.0)).form(), Form::Affine(0.125, 0.0));
        assert_eq!(bin("Sub", bin("Mul", x.clone(), c(2.0)), c(1.0)).form(), Form::Affine(2.0, -1.0));
        assert_eq!(Rc::new(Expr::Un("Tanh", x.clone())).form(), Form::Unknown);
        assert_eq!(Expr::X.form(), Form::Identity);
    }
}
