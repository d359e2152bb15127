//! Constant folding: ONNX ops evaluated at compile time on [`Const`] values (shape arithmetic,
//! weight slicing and transposes, a constant query's projection). Semantics follow the ONNX
//! operator specification (onnx.ai/onnx/operators) for the cases torch exports.

use super::consts::{elements, strides, Const, Data};
use super::proto::{data_type, AttributeProto};
use ipu_core::graph::broadcast_shape;

/// A node's attributes, looked up by name.
pub struct Attrs<'a>(pub &'a [AttributeProto]);

impl Attrs<'_> {
    fn get(&self, name: &str) -> Option<&AttributeProto> {
        self.0.iter().find(|a| a.name == name)
    }
    /// An integer attribute.
    pub fn int(&self, name: &str) -> Option<i64> {
        self.get(name).map(|a| a.i)
    }
    /// A float attribute.
    pub fn float(&self, name: &str) -> Option<f32> {
        self.get(name).map(|a| a.f)
    }
    /// A list of integers.
    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.get(name).map(|a| a.ints.clone())
    }
    /// A string attribute.
    pub fn string(&self, name: &str) -> Option<String> {
        self.get(name).map(|a| String::from_utf8_lossy(&a.s).into_owned())
    }
    /// A tensor attribute.
    pub fn tensor(&self, name: &str) -> Option<&super::proto::TensorProto> {
        self.get(name).and_then(|a| a.t.as_ref())
    }
    /// Whether the attribute is present.
    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }
}

/// Largest constant the folder makes (elements): far above any weight of the models in view
/// (So400m's largest is 5 M), and a bound on what a small hostile file can make it allocate
/// through `ConstantOfShape`, `Expand`, `Tile`, `Range` or broadcasting.
pub const FOLD_MAX: u64 = 1 << 25;

/// Elements of a shape the folder is about to fill, refused past [`FOLD_MAX`].
pub fn fold_elements(shape: &[u64]) -> Result<usize, String> {
    super::consts::elements_at_most(shape, FOLD_MAX)
        .ok_or_else(|| format!("a constant of shape {shape:?} is larger than the {FOLD_MAX} elements folded"))
}

/// An axis in `-rank..rank` made non-negative.
pub fn axis(a: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    if (-r..r).contains(&a) {
        Ok(if a < 0 { (a + r) as usize } else { a as usize })
    } else {
        Err(format!("axis {a} is out of range for rank {rank}"))
    }
}

/// For each element of `out`, the flat index of the element of `input` it broadcasts from.
pub fn broadcast_index(out: &[u64], input: &[u64]) -> Result<Vec<usize>, String> {
    let n = fold_elements(out)?;
    let (os, is) = (strides(out), strides(input));
    let lead = out.len() - input.len();
    let mut idx = Vec::with_capacity(n);
    for flat in 0..n {
        let mut at = 0;
        for (k, &d) in input.iter().enumerate() {
            let o = (flat / os[lead + k]) % out[lead + k] as usize;
            at += if d == 1 { 0 } else { o * is[k] };
        }
        idx.push(at);
    }
    Ok(idx)
}

/// Elementwise binary op with NumPy broadcasting.
pub fn binary(op: &str, a: &Const, b: &Const) -> Result<Const, String> {
    let shape = broadcast_shape(&a.shape, &b.shape)
        .ok_or_else(|| format!("shapes {:?} and {:?} do not broadcast", a.shape, b.shape))?;
    let (ia, ib) = (broadcast_index(&shape, &a.shape)?, broadcast_index(&shape, &b.shape)?);
    if let (Data::I(x), Data::I(y)) = (&a.data, &b.data) {
        let f = |p: i64, q: i64| -> Result<i64, String> {
            Ok(match op {
                "Add" => p.wrapping_add(q),
                "Sub" => p.wrapping_sub(q),
                "Mul" => p.wrapping_mul(q),
                "Div" | "Mod" | "Fmod" if q == 0 => return Err(format!("{op} by zero")),
                "Div" => p.wrapping_div(q),
                "Mod" => p.wrapping_rem(q).wrapping_add(q).wrapping_rem(q),
                "Fmod" => p.wrapping_rem(q),
                "Equal" => (p == q) as i64,
                "Less" => (p < q) as i64,
                "Greater" => (p > q) as i64,
                "Max" => p.max(q),
                "Min" => p.min(q),
                "And" => (p != 0 && q != 0) as i64,
                "Or" => (p != 0 || q != 0) as i64,
                _ => return Err(format!("{op} on integers is not folded")),
            })
        };
        let v = ia.iter().zip(&ib).map(|(i, j)| f(x[*i], y[*j])).collect::<Result<_, _>>()?;
        return Ok(Const::i(shape, v));
    }
    let (x, y) = (a.as_f32(), b.as_f32());
    let cmp = matches!(op, "Equal" | "Less" | "Greater");
    let f = |p: f32, q: f32| -> Result<f32, String> {
        Ok(match op {
            "Add" => p + q,
            "Sub" => p - q,
            "Mul" => p * q,
            "Div" => p / q,
            "Pow" => p.powf(q),
            // ONNX requires `fmod = 1` for floats: the remainder of truncated division.
            "Mod" | "Fmod" => p % q,
            "Max" => p.max(q),
            "Min" => p.min(q),
            "Equal" => (p == q) as i64 as f32,
            "Less" => (p < q) as i64 as f32,
            "Greater" => (p > q) as i64 as f32,
            _ => return Err(format!("{op} on floats is not folded")),
        })
    };
    let v: Vec<f32> = ia.iter().zip(&ib).map(|(i, j)| f(x[*i], y[*j])).collect::<Result<_, _>>()?;
    Ok(if cmp { Const::i(shape, v.iter().map(|x| *x as i64).collect()) } else { Const::f(shape, v) })
}

/// Unary float ops.
pub fn unary(op: &str, a: &Const) -> Result<Const, String> {
    if let (Data::I(v), "Neg" | "Abs" | "Not") = (&a.data, op) {
        let f = |x: i64| match op {
            "Neg" => x.wrapping_neg(),
            "Abs" => x.wrapping_abs(),
            _ => (x == 0) as i64,
        };
        return Ok(Const::i(a.shape.clone(), v.iter().map(|x| f(*x)).collect()));
    }
    let f = |x: f32| -> Result<f32, String> {
        Ok(match op {
            "Sqrt" => x.sqrt(),
            "Neg" => -x,
            "Abs" => x.abs(),
            "Exp" => x.exp(),
            "Tanh" => x.tanh(),
            "Reciprocal" => 1.0 / x,
            "Log" => x.ln(),
            "Sigmoid" => 1.0 / (1.0 + (-x).exp()),
            "Erf" => libm::erff(x),
            "Floor" => x.floor(),
            "Ceil" => x.ceil(),
            _ => return Err(format!("{op} is not folded")),
        })
    };
    let v = a.as_f32().into_iter().map(f).collect::<Result<_, _>>()?;
    Ok(Const::f(a.shape.clone(), v))
}

/// `Transpose` (`perm` empty: reverse the axes).
pub fn transpose(a: &Const, perm: &[i64]) -> Result<Const, String> {
    let r = a.shape.len();
    let perm: Vec<usize> = if perm.is_empty() {
        (0..r).rev().collect()
    } else {
        perm.iter().map(|p| axis(*p, r)).collect::<Result<_, _>>()?
    };
    let mut seen = vec![false; r];
    if perm.len() != r || perm.iter().any(|p| std::mem::replace(&mut seen[*p], true)) {
        return Err(format!("perm {perm:?} is not a permutation of {r} axes"));
    }
    let shape: Vec<u64> = perm.iter().map(|p| a.shape[*p]).collect();
    let (is, os) = (strides(&a.shape), strides(&shape));
    let n = a.len();
    let idx: Vec<usize> =
        (0..n).map(|flat| (0..r).map(|k| ((flat / os[k]) % shape[k] as usize) * is[perm[k]]).sum()).collect();
    Ok(a.pick(shape, &idx))
}

/// `Gather` along `ax` with integer indices (negative ones count from the end).
pub fn gather(a: &Const, indices: &Const, ax: i64) -> Result<Const, String> {
    let ax = axis(ax, a.shape.len())?;
    let d = a.shape[ax] as i64;
    let ids: Vec<usize> = indices
        .as_i64()?
        .iter()
        .map(|&i| {
            let j = if i < 0 { i + d } else { i };
            if (0..d).contains(&j) {
                Ok(j as usize)
            } else {
                Err(format!("index {i} is out of range for an axis of {d}"))
            }
        })
        .collect::<Result<_, _>>()?;
    let outer: usize = a.shape[..ax].iter().product::<u64>() as usize;
    let inner: usize = a.shape[ax + 1..].iter().product::<u64>() as usize;
    let mut idx = Vec::with_capacity(outer * ids.len() * inner);
    for o in 0..outer {
        for &i in &ids {
            idx.extend((0..inner).map(|k| (o * d as usize + i) * inner + k));
        }
    }
    let mut shape = a.shape[..ax].to_vec();
    shape.extend(&indices.shape);
    shape.extend(&a.shape[ax + 1..]);
    Ok(a.pick(shape, &idx))
}

/// `Slice` of one axis: `start..end` by `step` (already clamped by [`slice_range`]).
pub fn slice_axis(a: &Const, ax: usize, picks: &[usize]) -> Const {
    let d = a.shape[ax] as usize;
    let outer: usize = a.shape[..ax].iter().product::<u64>() as usize;
    let inner: usize = a.shape[ax + 1..].iter().product::<u64>() as usize;
    let mut idx = Vec::with_capacity(outer * picks.len() * inner);
    for o in 0..outer {
        for &i in picks {
            idx.extend((0..inner).map(|k| (o * d + i) * inner + k));
        }
    }
    let mut shape = a.shape.clone();
    shape[ax] = picks.len() as u64;
    a.pick(shape, &idx)
}

/// The indices `Slice` takes along an axis of size `d` (ONNX clamping rules).
pub fn slice_range(d: u64, start: i64, end: i64, step: i64) -> Result<Vec<usize>, String> {
    if step == 0 {
        return Err("slice step 0".into());
    }
    let d = d as i64;
    let norm = |x: i64| if x < 0 { x.saturating_add(d) } else { x };
    let (mut s, mut e) = (norm(start), norm(end));
    if step > 0 {
        s = s.clamp(0, d);
        e = e.clamp(0, d);
    } else {
        s = s.clamp(0, d - 1);
        e = e.clamp(-1, d - 1);
    }
    let mut out = Vec::new();
    let mut i = s;
    while (step > 0 && i < e) || (step < 0 && i > e) {
        out.push(i as usize);
        i += step;
    }
    Ok(out)
}

/// `Concat` along `ax`.
pub fn concat(parts: &[&Const], ax: i64) -> Result<Const, String> {
    let first = parts.first().ok_or("Concat of nothing")?;
    let r = first.shape.len();
    let ax = axis(ax, r)?;
    for p in parts {
        if p.shape.len() != r || (0..r).any(|k| k != ax && p.shape[k] != first.shape[k]) {
            return Err(format!("Concat of shapes {:?} and {:?} along axis {ax}", first.shape, p.shape));
        }
    }
    let outer: usize = first.shape[..ax].iter().product::<u64>() as usize;
    let ints = parts.iter().all(|p| matches!(p.data, Data::I(_)));
    let mut f = Vec::new();
    let mut i = Vec::new();
    for o in 0..outer {
        for p in parts {
            let chunk = p.shape[ax..].iter().product::<u64>() as usize;
            if ints {
                i.extend_from_slice(&p.as_i64()?[o * chunk..(o + 1) * chunk]);
            } else {
                f.extend_from_slice(&p.as_f32()[o * chunk..(o + 1) * chunk]);
            }
        }
    }
    let mut shape = first.shape.clone();
    shape[ax] = parts.iter().map(|p| p.shape[ax]).sum();
    Ok(if ints { Const::i(shape, i) } else { Const::f(shape, f) })
}

/// The output shape of `Reshape` (`0` copies the input's size unless `allowzero`, one `-1` is
/// inferred).
pub fn reshape_shape(input: &[u64], spec: &[i64], allowzero: bool) -> Result<Vec<u64>, String> {
    let total = elements(input)? as u64;
    let mut out = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (k, &s) in spec.iter().enumerate() {
        match s {
            -1 if infer.is_none() => {
                infer = Some(k);
                out.push(1);
            }
            0 if !allowzero => out.push(*input.get(k).ok_or(format!("shape {spec:?}: no axis {k} to copy"))?),
            s if s >= 0 => out.push(s as u64),
            _ => return Err(format!("shape {spec:?} is not a valid Reshape target")),
        }
    }
    if let Some(k) = infer {
        let known = out.iter().try_fold(1u64, |a, d| a.checked_mul(*d)).unwrap_or(0);
        if known == 0 || !total.is_multiple_of(known) {
            return Err(format!("cannot infer -1 in {spec:?} for {total} elements"));
        }
        out[k] = total / known;
    }
    if out.iter().try_fold(1u64, |a, d| a.checked_mul(*d)) != Some(total) {
        return Err(format!("shape {spec:?} does not hold the {total} elements of {input:?}"));
    }
    Ok(out)
}

/// `MatMul` of float constants (rank 2, or a batch of rank-2 matrices on the left).
pub fn matmul(a: &Const, b: &Const) -> Result<Const, String> {
    let (ra, rb) = (a.shape.len(), b.shape.len());
    if ra < 2 || rb != 2 || a.shape[ra - 1] != b.shape[0] {
        return Err(format!("MatMul of constants {:?} · {:?} is not folded", a.shape, b.shape));
    }
    let (k, n) = (b.shape[0] as usize, b.shape[1] as usize);
    let m = a.len() / k.max(1);
    fold_elements(&[m as u64, n as u64])?;
    let (x, y) = (a.as_f32(), b.as_f32());
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for p in 0..k {
            let v = x[i * k + p];
            for j in 0..n {
                out[i * n + j] += v * y[p * n + j];
            }
        }
    }
    let mut shape = a.shape[..ra - 1].to_vec();
    shape.push(n as u64);
    Ok(Const::f(shape, out))
}

/// `Cast` to an ONNX data type.
pub fn cast(a: &Const, to: i64) -> Result<Const, String> {
    Ok(match to as i32 {
        data_type::FLOAT | data_type::DOUBLE => Const::f(a.shape.clone(), a.as_f32()),
        // Rounded to the nearest f16 (kept as f32, as every float constant).
        data_type::FLOAT16 => Const::f(
            a.shape.clone(),
            a.as_f32().into_iter().map(|x| half::f16::from_f32(x).to_f32()).collect(),
        ),
        data_type::BOOL => Const::i(a.shape.clone(), a.as_f64().iter().map(|x| (*x != 0.0) as i64).collect()),
        data_type::INT64 | data_type::INT32 | data_type::INT8 | data_type::UINT8 => match &a.data {
            Data::I(_) => a.clone(),
            Data::F(v) => Const::i(a.shape.clone(), v.iter().map(|x| x.trunc() as i64).collect()),
        },
        other => return Err(format!("Cast to {} is not folded", data_type::name(other))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(shape: &[u64], v: &[i64]) -> Const {
        Const::i(shape.to_vec(), v.to_vec())
    }

    fn floats(shape: &[u64], v: &[f32]) -> Const {
        Const::f(shape.to_vec(), v.to_vec())
    }

    #[test]
    fn integer_ops_broadcast_as_numpy_and_follow_onnx() {
        // [2, 1] against [3]: a 2 × 3 result.
        let (a, b) = (ints(&[2, 1], &[7, -7]), ints(&[3], &[2, 3, -4]));
        let cases: [(&str, [i64; 6]); 12] = [
            ("Add", [9, 10, 3, -5, -4, -11]),
            ("Sub", [5, 4, 11, -9, -10, -3]),
            ("Mul", [14, 21, -28, -14, -21, 28]),
            // Truncated toward zero, as onnxruntime's integer Div.
            ("Div", [3, 2, -1, -3, -2, 1]),
            ("Mod", [1, 1, -1, 1, 2, -3]),
            ("Fmod", [1, 1, 3, -1, -1, -3]),
            ("Equal", [0, 0, 0, 0, 0, 0]),
            ("Less", [0, 0, 0, 1, 1, 1]),
            ("Greater", [1, 1, 1, 0, 0, 0]),
            ("Max", [7, 7, 7, 2, 3, -4]),
            ("Min", [2, 3, -4, -7, -7, -7]),
            ("And", [1, 1, 1, 1, 1, 1]),
        ];
        for (op, want) in cases {
            assert_eq!(binary(op, &a, &b).unwrap(), ints(&[2, 3], &want), "{op}");
        }
        let (p, q) = (ints(&[4], &[0, 0, 1, 1]), ints(&[4], &[0, 1, 0, 1]));
        assert_eq!(binary("Or", &p, &q).unwrap(), ints(&[4], &[0, 1, 1, 1]));
        assert_eq!(binary("And", &p, &q).unwrap(), ints(&[4], &[0, 0, 0, 1]));
        assert_eq!(binary("Equal", &p, &q).unwrap(), ints(&[4], &[1, 0, 0, 1]));
        for op in ["Div", "Mod"] {
            assert!(binary(op, &a, &ints(&[1], &[0])).is_err(), "{op} by zero");
        }
        assert!(binary("Pow", &a, &b).is_err(), "Pow of integers is not folded");
        assert!(binary("Add", &ints(&[2], &[1, 2]), &ints(&[3], &[1, 2, 3])).is_err());
    }

    #[test]
    fn float_ops_follow_onnx() {
        let (a, b) = (floats(&[3], &[1.5, -2.0, 9.0]), floats(&[3], &[2.0, 0.5, -3.0]));
        let cases: [(&str, [f32; 3]); 8] = [
            ("Add", [3.5, -1.5, 6.0]),
            ("Sub", [-0.5, -2.5, 12.0]),
            ("Mul", [3.0, -1.0, -27.0]),
            ("Div", [0.75, -4.0, -3.0]),
            ("Pow", [2.25, f32::NAN, 1.0 / 729.0]),
            ("Mod", [1.5, -0.0, 0.0]),
            ("Max", [2.0, 0.5, 9.0]),
            ("Min", [1.5, -2.0, -3.0]),
        ];
        for (op, want) in cases {
            let got = binary(op, &a, &b).unwrap();
            assert_eq!(got.shape, vec![3], "{op}");
            for (g, w) in got.as_f32().iter().zip(want) {
                assert!((g - w).abs() <= 1e-6 * w.abs() || (g.is_nan() && w.is_nan()), "{op}: {g} for {w}");
            }
        }
        let (p, q) = (floats(&[3], &[1.0, 2.0, 3.0]), floats(&[1], &[2.0]));
        assert_eq!(binary("Equal", &p, &q).unwrap(), ints(&[3], &[0, 1, 0]));
        assert_eq!(binary("Less", &p, &q).unwrap(), ints(&[3], &[1, 0, 0]));
        assert_eq!(binary("Greater", &p, &q).unwrap(), ints(&[3], &[0, 0, 1]));
        assert!(binary("And", &p, &q).is_err());
        // An integer and a float: floats.
        assert_eq!(binary("Mul", &ints(&[2], &[2, 3]), &q).unwrap(), floats(&[2], &[4.0, 6.0]));
    }

    #[test]
    fn unary_ops_follow_onnx() {
        let x = floats(&[2], &[-0.5, 2.0]);
        let cases: [(&str, [f32; 2]); 11] = [
            ("Sqrt", [f32::NAN, std::f32::consts::SQRT_2]),
            ("Neg", [0.5, -2.0]),
            ("Abs", [0.5, 2.0]),
            ("Exp", [(-0.5f32).exp(), 2f32.exp()]),
            ("Tanh", [(-0.5f32).tanh(), 2f32.tanh()]),
            ("Reciprocal", [-2.0, 0.5]),
            ("Log", [f32::NAN, std::f32::consts::LN_2]),
            ("Sigmoid", [1.0 / (1.0 + 0.5f32.exp()), 1.0 / (1.0 + (-2f32).exp())]),
            ("Erf", [libm::erff(-0.5), libm::erff(2.0)]),
            ("Floor", [-1.0, 2.0]),
            ("Ceil", [-0.0, 2.0]),
        ];
        for (op, want) in cases {
            let got = unary(op, &x).unwrap().as_f32();
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() <= 1e-6 * w.abs() || (g.is_nan() && w.is_nan()), "{op}: {g} for {w}");
            }
        }
        let i = ints(&[3], &[-3, 0, 4]);
        assert_eq!(unary("Neg", &i).unwrap(), ints(&[3], &[3, 0, -4]));
        assert_eq!(unary("Abs", &i).unwrap(), ints(&[3], &[3, 0, 4]));
        assert_eq!(unary("Not", &i).unwrap(), ints(&[3], &[0, 1, 0]));
        assert!(unary("Cos", &x).is_err());
    }

    #[test]
    fn transposes_gathers_slices_and_concats_move_the_right_elements() {
        let a = ints(&[2, 3], &[0, 1, 2, 3, 4, 5]);
        assert_eq!(transpose(&a, &[]).unwrap(), ints(&[3, 2], &[0, 3, 1, 4, 2, 5]));
        let b = ints(&[2, 3, 2], &(0..12).collect::<Vec<_>>());
        // out[i][j][k] = b[k][i][j]
        let t = transpose(&b, &[1, 2, 0]).unwrap();
        assert_eq!(t, ints(&[3, 2, 2], &[0, 6, 1, 7, 2, 8, 3, 9, 4, 10, 5, 11]));
        assert!(transpose(&a, &[0, 0]).is_err());
        assert!(transpose(&a, &[0]).is_err());
        // Gather along axis 1 with a negative index; a scalar index drops the axis.
        assert_eq!(gather(&a, &ints(&[2], &[-1, 0]), 1).unwrap(), ints(&[2, 2], &[2, 0, 5, 3]));
        assert_eq!(gather(&a, &ints(&[], &[1]), 0).unwrap(), ints(&[3], &[3, 4, 5]));
        assert!(gather(&a, &ints(&[1], &[3]), 1).is_err());
        assert!(gather(&a, &ints(&[1], &[-4]), 1).is_err());
        // Slices: ONNX clamping, negative indices and steps.
        assert_eq!(slice_range(5, 1, 3, 1).unwrap(), [1, 2]);
        assert_eq!(slice_range(5, -2, i64::MAX, 1).unwrap(), [3, 4]);
        assert_eq!(slice_range(5, -100, 2, 1).unwrap(), [0, 1]);
        assert_eq!(slice_range(5, 0, 5, 2).unwrap(), [0, 2, 4]);
        assert_eq!(slice_range(5, -1, i64::MIN, -1).unwrap(), [4, 3, 2, 1, 0]);
        assert_eq!(slice_range(5, 10, 1, -2).unwrap(), [4, 2]);
        assert_eq!(slice_range(5, 3, 3, 1).unwrap(), Vec::<usize>::new());
        assert!(slice_range(5, 0, 5, 0).is_err());
        assert_eq!(slice_axis(&a, 1, &[2, 0]), ints(&[2, 2], &[2, 0, 5, 3]));
        assert_eq!(slice_axis(&a, 0, &[1]), ints(&[1, 3], &[3, 4, 5]));
        // Concat along the last axis (negative), of integers and of floats.
        let c = ints(&[2, 1], &[9, 8]);
        assert_eq!(concat(&[&a, &c], -1).unwrap(), ints(&[2, 4], &[0, 1, 2, 9, 3, 4, 5, 8]));
        assert_eq!(concat(&[&c, &c], 0).unwrap(), ints(&[4, 1], &[9, 8, 9, 8]));
        let f = floats(&[2, 1], &[0.5, 1.5]);
        assert_eq!(concat(&[&f, &c], 1).unwrap(), floats(&[2, 2], &[0.5, 9.0, 1.5, 8.0]));
        assert!(concat(&[&a, &ints(&[3, 1], &[1, 2, 3])], 1).is_err());
        assert!(concat(&[], 0).is_err());
    }

    #[test]
    fn reshape_targets_copy_zeros_and_infer_one_axis() {
        assert_eq!(reshape_shape(&[2, 3, 4], &[0, -1], false).unwrap(), [2, 12]);
        assert_eq!(reshape_shape(&[2, 3, 4], &[-1, 0, 2], false).unwrap(), [4, 3, 2]);
        assert_eq!(reshape_shape(&[2, 3, 4], &[24], false).unwrap(), [24]);
        assert_eq!(reshape_shape(&[0, 3], &[0, 3], true).unwrap(), [0, 3]);
        assert!(reshape_shape(&[2, 3], &[0, 3], true).is_err(), "allowzero: 0 is a size");
        assert!(reshape_shape(&[2, 3], &[-1, -1], false).is_err());
        assert!(reshape_shape(&[2, 3], &[4, -1], false).is_err());
        assert!(reshape_shape(&[2, 3], &[5], false).is_err());
        assert!(reshape_shape(&[2, 3], &[0, 0, 0], false).is_err(), "no third axis to copy");
        assert!(reshape_shape(&[2, 3], &[-2, 3], false).is_err());
    }

    #[test]
    fn matmul_casts_and_broadcast_indices_are_exact() {
        // A batch of two 2 × 3 matrices times a 3 × 2 one.
        let a = floats(&[2, 2, 3], &(0..12).map(|x| x as f32).collect::<Vec<_>>());
        let b = floats(&[3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
        let want = [2.0, 3.0, 8.0, 9.0, 14.0, 15.0, 20.0, 21.0];
        assert_eq!(matmul(&a, &b).unwrap(), floats(&[2, 2, 2], &want));
        assert!(matmul(&b, &a).is_err());
        assert!(matmul(&floats(&[3], &[1.0, 2.0, 3.0]), &b).is_err());
        let x = floats(&[3], &[-1.7, 0.0, 2.9]);
        assert_eq!(cast(&x, data_type::INT64 as i64).unwrap(), ints(&[3], &[-1, 0, 2]));
        assert_eq!(cast(&x, data_type::BOOL as i64).unwrap(), ints(&[3], &[1, 0, 1]));
        assert_eq!(cast(&ints(&[1], &[3]), data_type::DOUBLE as i64).unwrap(), floats(&[1], &[3.0]));
        assert_eq!(cast(&ints(&[1], &[3]), data_type::INT32 as i64).unwrap(), ints(&[1], &[3]));
        assert!(cast(&x, 8).is_err(), "STRING");
        assert_eq!(broadcast_index(&[2, 3], &[3]).unwrap(), [0, 1, 2, 0, 1, 2]);
        assert_eq!(broadcast_index(&[2, 3], &[2, 1]).unwrap(), [0, 0, 0, 1, 1, 1]);
        assert_eq!(broadcast_index(&[2, 3], &[]).unwrap(), [0; 6]);
        assert_eq!(axis(-1, 3).unwrap(), 2);
        assert_eq!(axis(2, 3).unwrap(), 2);
        assert!(axis(3, 3).is_err() && axis(-4, 3).is_err());
        assert_eq!(fold_elements(&[4, 8]).unwrap(), 32);
        assert!(fold_elements(&[FOLD_MAX, 2]).is_err());
    }

    #[test]
    fn mod_takes_the_divisor_sign_and_fmod_the_dividend_sign() {
        let (a, b) = (ints(&[4], &[7, -7, 7, -7]), ints(&[4], &[3, 3, -3, -3]));
        assert_eq!(binary("Mod", &a, &b).unwrap(), ints(&[4], &[1, 2, -2, -1]));
        assert_eq!(binary("Fmod", &a, &b).unwrap(), ints(&[4], &[1, -1, 1, -1]));
        let f = |v: &[f32]| Const::f(vec![v.len() as u64], v.to_vec());
        assert_eq!(binary("Fmod", &f(&[7.5, -7.5]), &f(&[2.0, 2.0])).unwrap(), f(&[1.5, -1.5]));
        assert!(binary("Fmod", &a, &ints(&[1], &[0])).is_err());
    }

    #[test]
    fn a_cast_to_float16_rounds_to_f16() {
        let c = Const::f(vec![2], vec![1.0 + 1e-4, 2.000_000_2]);
        assert_eq!(cast(&c, data_type::FLOAT16 as i64).unwrap(), Const::f(vec![2], vec![1.0, 2.0]));
        assert_eq!(cast(&c, data_type::FLOAT as i64).unwrap(), c);
    }
}
