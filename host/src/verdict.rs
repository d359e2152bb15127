//! The verdict: does one output the device wrote agree with the host reference?
//! (docs/reliability.md "The verdict").
//!
//! Two checks, both on every element:
//! - **device precision**: the device's value must equal the device-precision reference bit for
//!   bit (FP8 codes equal; f16/f32 values equal, any NaN equal to any NaN);
//! - **f64**: |device − f64 value| must be within the bound the reference derived for that element
//!   from the ops' rounding points. A non-finite device value where the f64 value is finite is an
//!   infinite error; equal infinities are equal; NaN against a NaN f64 value agrees.
//!
//! Nothing here can pass on nothing: zero elements, or lengths that differ, are errors.

use ipu_schema::DType;

/// One element that failed a check.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// Flat element index (row-major in the output's shape).
    pub index: u64,
    /// Which check it failed: `"device precision"` or `"f64"`.
    pub check: &'static str,
    /// The device's value (real number; FP8 decoded with the tensor's scale).
    pub device: f64,
    /// The value it was compared with.
    pub reference: f64,
    /// The allowed error (0 for the device-precision check).
    pub bound: f64,
}

/// The result of checking one output of one inference.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputCheck {
    /// Tensor name.
    pub name: String,
    /// Elements compared (always > 0: [`check`] refuses empty outputs).
    pub elements: u64,
    /// Elements that differ from the device-precision reference.
    pub mismatches: u64,
    /// Elements whose error against f64 is over their bound.
    pub over_bound: u64,
    /// Device NaN or infinity elements.
    pub non_finite: u64,
    /// Largest |device − device-precision reference| (infinite for a NaN on one side only).
    pub max_abs_error: f64,
    /// Largest |device − f64| (infinite where the device is not finite and f64 is).
    pub max_abs_error_f64: f64,
    /// Largest per-element bound on the f64 error.
    pub max_bound_f64: f64,
    /// Largest error / bound ratio over the elements (≤ 1 passes).
    pub worst_ratio_f64: f64,
    /// The first element that failed either check.
    pub first_mismatch: Option<Mismatch>,
}

impl OutputCheck {
    /// Both checks passed on every element.
    pub fn passed(&self) -> bool {
        self.mismatches == 0 && self.over_bound == 0
    }
}

/// The values of one output: raw device values (f32 values of the dtype, FP8 as codes 0..=255).
#[derive(Clone, Copy, Debug)]
pub struct Values<'a> {
    /// Element type.
    pub dtype: DType,
    /// FP8 scale (a code `c` stands for `c · 2^scale`).
    pub scale: i8,
    /// Values as the host holds them.
    pub data: &'a [f32],
}

/// Real value of one element.
pub fn real(v: &Values<'_>, i: usize) -> f64 {
    let x = v.data[i];
    match v.dtype {
        DType::F8E4M3 => {
            ipu_core::fp8::to_f32(x as u8, ipu_core::fp8::Fp8Format::E4M3) as f64 * 2f64.powi(v.scale as i32)
        }
        DType::F8E5M2 => {
            ipu_core::fp8::to_f32(x as u8, ipu_core::fp8::Fp8Format::E5M2) as f64 * 2f64.powi(v.scale as i32)
        }
        _ => x as f64,
    }
}

/// Bit equality in device precision (any NaN equals any NaN). FP8 codes are held as the f32
/// integers 0..=255, for which bit equality is code equality.
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// |device − reference| for reporting: equal values (equal infinities included) are 0, a NaN or
/// an infinity against anything else is infinite.
pub fn abs_error(device: f64, reference: f64) -> f64 {
    if device == reference || (device.is_nan() && reference.is_nan()) {
        0.0
    } else {
        let e = (device - reference).abs();
        if e.is_nan() {
            f64::INFINITY
        } else {
            e
        }
    }
}

/// Check one output. `device` and `reference` hold values of the same dtype; `exact` and
/// `bound` are the f64 values and their per-element bounds.
pub fn check(
    name: &str,
    device: Values<'_>,
    reference: Values<'_>,
    exact: &[f64],
    bound: &[f64],
) -> Result<OutputCheck, String> {
    let n = device.data.len();
    if n == 0 {
        return Err(format!("output `{name}`: no elements to compare"));
    }
    if reference.data.len() != n || exact.len() != n || bound.len() != n {
        return Err(format!(
            "output `{name}`: the device wrote {n} elements but the reference has {} (f64: {}, bounds: {})",
            reference.data.len(),
            exact.len(),
            bound.len()
        ));
    }
    if device.dtype != reference.dtype {
        return Err(format!(
            "output `{name}`: device dtype {} but reference dtype {}",
            device.dtype.name(),
            reference.dtype.name()
        ));
    }
    let mut c = OutputCheck {
        name: name.to_string(),
        elements: n as u64,
        mismatches: 0,
        over_bound: 0,
        non_finite: 0,
        max_abs_error: 0.0,
        max_abs_error_f64: 0.0,
        max_bound_f64: 0.0,
        worst_ratio_f64: 0.0,
        first_mismatch: None,
    };
    for i in 0..n {
        let (d, r) = (real(&device, i), real(&reference, i));
        if !d.is_finite() {
            c.non_finite += 1;
        }
        c.max_abs_error = c.max_abs_error.max(abs_error(d, r));
        if !same(device.data[i], reference.data[i]) {
            c.mismatches += 1;
            if c.first_mismatch.is_none() {
                let check = "device precision";
                c.first_mismatch =
                    Some(Mismatch { index: i as u64, check, device: d, reference: r, bound: 0.0 });
            }
        }
        let (e, b) = (exact[i], bound[i]);
        let err = abs_error(d, e);
        c.max_abs_error_f64 = c.max_abs_error_f64.max(err);
        c.max_bound_f64 = c.max_bound_f64.max(b);
        let ratio = if err == 0.0 { 0.0 } else { err / b };
        c.worst_ratio_f64 = c.worst_ratio_f64.max(ratio);
        // A device NaN or infinity where the f64 value is finite is an infinite error that no bound
        // covers, and a bound that is NaN covers no error; an element equal to its f64 value (NaN
        // to NaN included) has none to cover (docs/reliability.md "The verdict").
        let unbounded = (!d.is_finite() && e.is_finite()) || (b.is_nan() && err != 0.0);
        if err > b || err.is_nan() || unbounded {
            c.over_bound += 1;
            if c.first_mismatch.is_none() {
                c.first_mismatch =
                    Some(Mismatch { index: i as u64, check: "f64", device: d, reference: e, bound: b });
            }
        }
    }
    Ok(c)
}

/// Row-major multi-index of a flat index, for messages: `[2, 0, 17]`.
pub fn multi_index(shape: &[u64], mut flat: u64) -> Vec<u64> {
    let mut idx = vec![0; shape.len()];
    for (slot, dim) in idx.iter_mut().zip(shape).rev() {
        let d = (*dim).max(1);
        *slot = flat % d;
        flat /= d;
    }
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Values<'_> {
        Values { dtype: DType::F32, scale: 0, data: v }
    }

    fn run(dev: &[f32], refv: &[f32], exact: &[f64], bound: &[f64]) -> OutputCheck {
        check("C", f32s(dev), f32s(refv), exact, bound).unwrap()
    }

    #[test]
    fn equal_values_within_bound_pass() {
        let c = run(&[1.0, -2.5], &[1.0, -2.5], &[1.0001, -2.5], &[1e-3, 0.0]);
        assert!(c.passed());
        assert_eq!((c.elements, c.mismatches, c.over_bound, c.non_finite), (2, 0, 0, 0));
        assert!((c.max_abs_error_f64 - 1e-4).abs() < 1e-9);
        assert_eq!(c.max_bound_f64, 1e-3);
        assert!(c.worst_ratio_f64 > 0.09 && c.worst_ratio_f64 < 0.11);
    }

    #[test]
    fn one_ulp_off_fails_device_precision() {
        let next = f32::from_bits(1.0f32.to_bits() + 1);
        let c = run(&[1.0, next], &[1.0, 1.0], &[1.0, 1.0], &[1.0, 1.0]);
        assert!(!c.passed());
        assert_eq!((c.mismatches, c.over_bound), (1, 0));
        let m = c.first_mismatch.unwrap();
        assert_eq!((m.index, m.check), (1, "device precision"));
        assert_eq!((m.device, m.reference), (next as f64, 1.0));
        assert!(c.max_abs_error > 0.0);
    }

    #[test]
    fn signed_zero_is_a_different_bit_pattern() {
        let c = run(&[-0.0], &[0.0], &[0.0], &[0.0]);
        assert_eq!(c.mismatches, 1);
        assert_eq!(c.over_bound, 0, "but no error against f64");
    }

    /// An infinite or NaN bound does not excuse a device NaN or infinity where the f64 value is
    /// finite (fuzz finding F11), and a NaN bound covers no error (F10).
    #[test]
    fn non_finite_device_values_fail_against_finite_f64_whatever_the_bound() {
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        let c = run(&[inf, nan], &[inf, nan], &[1e30, 2.0], &[f64::INFINITY, f64::INFINITY]);
        assert!(!c.passed());
        assert_eq!((c.mismatches, c.over_bound, c.non_finite), (0, 2, 2));
        let c = run(&[1.0], &[1.0], &[1.5], &[f64::NAN]);
        assert_eq!(c.over_bound, 1, "a NaN bound covers no error");
        // An element equal to its f64 value has no error to cover, whatever its bound.
        let c = run(&[1.0, nan], &[1.0, nan], &[1.0, f64::NAN], &[f64::NAN, f64::NAN]);
        assert!(c.passed(), "{c:?}");
        // A NaN where the f64 value is NaN too (a function outside its domain) is no error.
        let c = run(&[nan], &[nan], &[f64::NAN], &[0.0]);
        assert!(c.passed(), "{c:?}");
    }

    #[test]
    fn all_nan_output_fails_even_when_the_reference_is_nan_too() {
        let nan = f32::NAN;
        // The device-precision reference may overflow to NaN as the device does; f64 is finite.
        let c = run(&[nan, nan], &[nan, nan], &[0.5, 0.25], &[1e-3, 1e-3]);
        assert!(!c.passed());
        assert_eq!((c.mismatches, c.over_bound, c.non_finite), (0, 2, 2));
        assert_eq!(c.max_abs_error, 0.0);
        assert_eq!(c.max_abs_error_f64, f64::INFINITY);
        let m = c.first_mismatch.unwrap();
        assert_eq!((m.index, m.check, m.reference, m.bound), (0, "f64", 0.5, 1e-3));
        assert!(m.device.is_nan());
    }

    #[test]
    fn device_nan_against_finite_reference_is_an_infinite_error() {
        let c = run(&[f32::NAN], &[1.0], &[1.0], &[10.0]);
        assert_eq!((c.mismatches, c.over_bound), (1, 1));
        assert_eq!(c.max_abs_error, f64::INFINITY);
        assert_eq!(c.max_abs_error_f64, f64::INFINITY);
    }

    #[test]
    fn equal_infinities_are_equal() {
        let inf = f32::INFINITY;
        let c = run(&[inf, -inf], &[inf, -inf], &[f64::INFINITY, f64::NEG_INFINITY], &[0.0, 0.0]);
        assert!(c.passed(), "{c:?}");
        assert_eq!((c.non_finite, c.max_abs_error, c.max_abs_error_f64), (2, 0.0, 0.0));
        // Opposite infinities are not.
        let c = run(&[inf], &[-inf], &[f64::NEG_INFINITY], &[0.0]);
        assert_eq!((c.mismatches, c.over_bound), (1, 1));
    }

    #[test]
    fn overflow_to_infinity_fails_the_f64_check() {
        // 60000 · 2 in f16: the device and its reference give inf, the real product is 120000.
        let inf = f32::INFINITY;
        let c = run(&[inf], &[inf], &[120000.0], &[60.0]);
        assert!(!c.passed());
        assert_eq!((c.mismatches, c.over_bound, c.non_finite), (0, 1, 1));
        let m = c.first_mismatch.unwrap();
        assert_eq!((m.check, m.device, m.reference), ("f64", f64::INFINITY, 120000.0));
    }

    #[test]
    fn error_exactly_at_the_bound_passes_and_just_over_fails() {
        let c = run(&[1.5], &[1.5], &[1.25], &[0.25]);
        assert!(c.passed());
        assert_eq!(c.worst_ratio_f64, 1.0);
        let c = run(&[1.5], &[1.5], &[1.25], &[0.2499]);
        assert_eq!(c.over_bound, 1);
    }

    #[test]
    fn fp8_codes_compare_as_codes_and_decode_with_the_scale() {
        let e = |data| Values { dtype: DType::F8E4M3, scale: -3, data };
        // Code 0x40 is 1.0 in F143 (bias 8): times 2^-3 = 0.125.
        let c = check("P", e(&[64.0]), e(&[64.0]), &[0.125], &[0.0]).unwrap();
        assert!(c.passed(), "{c:?}");
        let c = check("P", e(&[65.0]), e(&[64.0]), &[0.125], &[0.0]).unwrap();
        assert_eq!((c.mismatches, c.over_bound), (1, 1));
        assert_eq!(c.first_mismatch.unwrap().reference, 0.125);
    }

    #[test]
    fn e5m2_codes_decode_with_their_format_and_scale() {
        let e = |data| Values { dtype: DType::F8E5M2, scale: 2, data };
        // F152 (bias 16, 2 mantissa bits): code 0x40 is 1.0, 0x41 is 1.25; times 2^2.
        assert_eq!(real(&e(&[64.0]), 0), 4.0);
        assert_eq!(real(&e(&[65.0]), 0), 5.0);
        let c = check("P", e(&[65.0]), e(&[65.0]), &[5.0], &[0.0]).unwrap();
        assert!(c.passed(), "{c:?}");
        let e4 = Values { dtype: DType::F8E4M3, scale: 0, data: &[68.0] };
        assert_eq!(real(&e4, 0), 1.5, "F143 (bias 8): 0x44 is 1.5");
    }

    #[test]
    fn empty_and_mismatched_lengths_are_refused() {
        assert!(check("C", f32s(&[]), f32s(&[]), &[], &[]).unwrap_err().contains("no elements"));
        let e = check("C", f32s(&[1.0]), f32s(&[1.0, 2.0]), &[1.0], &[0.0]).unwrap_err();
        assert!(e.contains("1 elements but the reference has 2"), "{e}");
        assert!(check("C", f32s(&[1.0]), f32s(&[1.0]), &[1.0, 2.0], &[0.0]).is_err());
        assert!(check("C", f32s(&[1.0]), f32s(&[1.0]), &[1.0], &[0.0, 1.0]).is_err());
        let h = Values { dtype: DType::F16, scale: 0, data: &[1.0] };
        assert!(check("C", h, f32s(&[1.0]), &[1.0], &[0.0]).unwrap_err().contains("dtype"));
    }

    #[test]
    fn counts_and_maxima_cover_every_element() {
        let dev = [1.0, 2.0, f32::INFINITY, 4.0];
        let refv = [1.0, 2.5, f32::INFINITY, 4.0];
        let c = run(&dev, &refv, &[1.0, 2.0, 3.0, 4.5], &[0.0, 0.0, 1.0, 1.0]);
        assert_eq!((c.mismatches, c.over_bound, c.non_finite), (1, 1, 1));
        assert_eq!(c.max_abs_error, 0.5);
        assert_eq!(c.max_abs_error_f64, f64::INFINITY);
        assert_eq!(c.max_bound_f64, 1.0);
        assert_eq!(c.first_mismatch.unwrap().index, 1);
    }

    #[test]
    fn multi_index_is_row_major() {
        assert_eq!(multi_index(&[2, 3, 4], 0), vec![0, 0, 0]);
        assert_eq!(multi_index(&[2, 3, 4], 23), vec![1, 2, 3]);
        assert_eq!(multi_index(&[2, 3, 4], 13), vec![1, 0, 1]);
        assert_eq!(multi_index(&[5], 4), vec![4]);
    }

    #[test]
    fn abs_error_cases() {
        assert_eq!(abs_error(1.0, 1.0), 0.0);
        assert_eq!(abs_error(f64::NAN, f64::NAN), 0.0);
        assert_eq!(abs_error(f64::NAN, 1.0), f64::INFINITY);
        assert_eq!(abs_error(f64::INFINITY, f64::INFINITY), 0.0);
        assert_eq!(abs_error(f64::INFINITY, 1.0), f64::INFINITY);
        assert_eq!(abs_error(3.0, 1.0), 2.0);
    }
}
