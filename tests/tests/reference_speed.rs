//! The fast device-precision matmul (`reference::matmul_device`: blocked, vectorised, parallel)
//! is bit-identical to the element-by-element specification (`matmul_device_scalar`) on every
//! kind of matmul the planners emit; its f16 rounding matches `half` on every class of value.

use half::f16;
use ipu_host::reference::{matmul_device, matmul_device_scalar, round_f16, HostTensor, MatMulArgs};
use ipu_schema::DType;

mod common;
use common::Rng;

fn tensor(dtype: DType, shape: &[u64], rng: &mut Rng, range: f32) -> HostTensor {
    let n: u64 = shape.iter().product();
    let data = (0..n)
        .map(|_| match dtype {
            DType::F8E4M3 | DType::F8E5M2 => {
                // Any code but the NaN (0x80).
                let c = (rng.next() % 255) as u8;
                (if c >= 0x80 { c + 1 } else { c }) as f32
            }
            _ => f16::from_f32(rng.f16().to_f32() * range).to_f32(),
        })
        .collect();
    HostTensor { dtype, shape: shape.to_vec(), data }
}

#[test]
fn round_f16_matches_half_on_every_class_of_value() {
    let check = |x: f32| {
        let (got, want) = (round_f16(x), f16::from_f32(x).to_f32());
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{x:e}: {got:e} vs {want:e}"
        );
    };
    for x in
        [0.0, -0.0, 1.0, 65504.0, 65519.99, 65520.0, 65536.0, 1e9, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]
    {
        check(x);
        check(-x);
    }
    // Every f16 value and the midpoints and their neighbours around it.
    for h in 0..=u16::MAX {
        let v = f16::from_bits(h).to_f32();
        let next = f16::from_bits(h.wrapping_add(1)).to_f32();
        if v.is_finite() && next.is_finite() {
            let mid = ((v as f64 + next as f64) / 2.0) as f32;
            for x in
                [v, mid, f32::from_bits(mid.to_bits() + 1), f32::from_bits(mid.to_bits().wrapping_sub(1))]
            {
                check(x);
            }
        }
    }
    let mut rng = Rng(0x5eed);
    for _ in 0..2_000_000 {
        check(f32::from_bits(rng.next() as u32));
    }
}

#[test]
fn fast_matmul_is_bit_identical_to_the_specification() {
    let mut rng = Rng(42);
    let rounds = |tk: u64, f: u64| ipu_core::plan::matmul::reduction_rounds(tk, f);
    // (a shape, b shape, ta, tb, dtype, acc, tk, fan-in, iscl, alpha)
    type Case = (Vec<u64>, Vec<u64>, bool, bool, DType, DType, u64, u64, i32, Option<f32>);
    let cases: Vec<Case> = vec![
        (vec![45, 37], vec![37, 29], false, false, DType::F16, DType::F16, 1, 2, 0, None),
        (vec![37, 45], vec![29, 37], true, true, DType::F16, DType::F32, 1, 2, 0, None),
        (vec![9, 300], vec![300, 520], false, false, DType::F16, DType::F16, 3, 3, 0, Some(0.125)),
        (vec![7, 100], vec![100, 40], false, false, DType::F16, DType::F16, 7, 2, 0, None),
        (vec![6, 80], vec![80, 17], false, false, DType::F16, DType::F32, 5, 2, 0, None),
        (vec![3, 5, 72], vec![3, 19, 72], false, true, DType::F8E4M3, DType::F16, 1, 2, -3, Some(0.125)),
        (vec![2, 9, 64], vec![64, 33], false, false, DType::F8E5M2, DType::F16, 1, 2, 2, None),
        (vec![17, 40], vec![2, 40, 24], false, false, DType::F16, DType::F16, 1, 2, 0, None),
    ];
    let mut non_finite = 0;
    for (sa, sb, ta, tb, dt, acc, tk, f, iscl, alpha) in cases {
        let range = if dt == DType::F16 { 200.0 } else { 1.0 };
        let (a, b) = (tensor(dt, &sa, &mut rng, range), tensor(dt, &sb, &mut rng, range));
        let b = if dt == DType::F8E5M2 { HostTensor { dtype: DType::F8E5M2, ..b } } else { b };
        let args = MatMulArgs { a: &a, b: &b, ta, tb, acc, tk, rounds: rounds(tk, f), iscl, alpha };
        let (fast, s1) = matmul_device(&args);
        let (spec, s2) = matmul_device_scalar(&args);
        assert_eq!(s1, s2);
        let differ = fast
            .iter()
            .zip(&spec)
            .position(|(x, y)| x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan()));
        assert_eq!(differ, None, "{sa:?}·{sb:?} {dt:?} acc {acc:?} tk {tk}: element {differ:?}");
        non_finite += fast.iter().filter(|v| !v.is_finite()).count();
    }
    // Inputs up to ±200 overflow some f16 sums: infinities and NaNs were compared too.
    assert!(non_finite > 0);
}
