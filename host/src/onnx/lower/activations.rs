//! Piecewise-linear activations of one computed tensor with constant parameters — `Relu`,
//! `LeakyRelu`, `Clip`, `Max`/`Min` with constants, `HardSigmoid`, `HardSwish` — kept symbolic
//! like any scalar chain (`expr.rs`): they join the composition of their input and are written
//! with the `max`, `min` and `leaky_relu` map kernels (`compose.rs`) when a consumer needs them.

use super::*;

impl Lower<'_, '_> {
    /// Define the node's output as its activation of the computed input `r`.
    pub(super) fn activation(
        &mut self,
        node: &NodeProto,
        attrs: &Attrs,
        ins: &[Option<Val>],
        at: &str,
    ) -> Result<(), String> {
        let op = node.op_type.as_str();
        // Exactly one computed input; any other is a one-value constant (or absent).
        let mut run: Option<Run> = None;
        let mut scalars: Vec<Option<f64>> = Vec::new();
        for v in ins {
            match v {
                Some(Val::R(r)) if run.is_none() => {
                    run = Some(r.clone());
                    scalars.push(None);
                }
                Some(Val::R(_)) => {
                    return Err(format!("{at}: {op} of two tensors computed on the chip is not supported (one computed input, constants otherwise)"))
                }
                Some(Val::C(c)) => match c.scalar() {
                    Some(v) if c.len() == 1 => scalars.push(Some(v)),
                    _ => {
                        return Err(format!(
                            "{at}: {op} with a constant of shape {:?}: only one-value constants are supported",
                            c.shape
                        ))
                    }
                },
                None => scalars.push(None),
            }
        }
        let r = run.ok_or_else(|| format!("{at}: no computed input"))?;
        let x = r.e.clone();
        let c = |v: f64| Rc::new(Expr::C(v));
        let bin = |op: &'static str, a: Rc<Expr>, b: Rc<Expr>| Rc::new(Expr::Bin(op, a, b));
        let clamp01 = |e: Rc<Expr>| bin("Min", bin("Max", e, c(0.0)), c(1.0));
        let float = |name: &str, default: f32| attrs.float(name).unwrap_or(default) as f64;
        let e = match op {
            "Relu" => bin("Max", x, c(0.0)),
            "LeakyRelu" => {
                // The kernel computes max(x, α·x): the leaky ReLU for slopes up to 1.
                let alpha = float("alpha", 0.01);
                if alpha.is_nan() || alpha > 1.0 {
                    return Err(format!("{at}: a LeakyRelu slope above 1 ({alpha}) is not supported"));
                }
                bin("LeakyRelu", x, c(alpha))
            }
            "HardSigmoid" => {
                clamp01(bin("Add", bin("Mul", x, c(float("alpha", 0.2))), c(float("beta", 0.5))))
            }
            "HardSwish" => bin("Mul", x.clone(), clamp01(bin("Add", bin("Mul", x, c(1.0 / 6.0)), c(0.5)))),
            "Clip" => {
                // Opset 11 on: `min` and `max` are inputs 1 and 2; before, attributes.
                let (lo, hi) = if self.opset >= 11 {
                    (scalars.get(1).copied().flatten(), scalars.get(2).copied().flatten())
                } else {
                    (attrs.float("min").map(f64::from), attrs.float("max").map(f64::from))
                };
                let lo = lo.map_or(x.clone(), |v| bin("Max", x, c(v)));
                hi.map_or(lo.clone(), |v| bin("Min", lo, c(v)))
            }
            // Max, Min: variadic, the computed input against each constant.
            _ => {
                let f: &'static str = if op == "Max" { "Max" } else { "Min" };
                scalars.iter().flatten().fold(x, |e, v| bin(f, e, c(*v)))
            }
        };
        self.define(node, 0, Val::R(Run { t: r.t.clone(), shape: r.shape.clone(), e, prov: None }));
        Ok(())
    }
}
