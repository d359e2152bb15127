//! IPU FP8 formats F143 and F152 (`float8_e4m3fnuz`, `float8_e5m2fnuz`; FS §6) and their
//! conversions. Both formats have no infinities and no negative zero; the single NaN is `0x80`.
//! A tensor-wide power-of-two scale `s` means the stored code represents `value × 2^-s`, i.e. a cast
//! stores `round(x / 2^s)` and a load yields `code · 2^s`. Rounding is to nearest, ties to even;
//! a magnitude that rounds past the largest finite code becomes NaN (the hardware's "NaNOO" mode).

use half::f16;

/// The single NaN code of both formats.
pub const NAN: u8 = 0x80;

/// Which FP8 format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fp8Format {
    /// 1 sign, 4 exponent, 3 mantissa bits, bias 8; max 240.
    E4M3,
    /// 1 sign, 5 exponent, 2 mantissa bits, bias 16; max 57344.
    E5M2,
}

impl Fp8Format {
    /// Mantissa bits.
    pub const fn mantissa_bits(self) -> u32 {
        match self {
            Fp8Format::E4M3 => 3,
            Fp8Format::E5M2 => 2,
        }
    }
    /// Exponent bias.
    pub const fn bias(self) -> i32 {
        match self {
            Fp8Format::E4M3 => 8,
            Fp8Format::E5M2 => 16,
        }
    }
    /// Format from the hardware's format bit (0 = F143, 1 = F152).
    pub const fn from_bit(bit: u32) -> Self {
        if bit & 1 == 0 {
            Fp8Format::E4M3
        } else {
            Fp8Format::E5M2
        }
    }
    /// Largest finite value.
    pub fn max_value(self) -> f32 {
        to_f32(0x7F, self)
    }
}

/// `2^e` as f32 for `e` in the normal range.
pub fn pow2(e: i32) -> f32 {
    debug_assert!((-126..=127).contains(&e));
    f32::from_bits(((e + 127) as u32) << 23)
}

/// Multiply by `2^e` exactly for the ranges used here (|e| ≤ 63, values from f16/f8), splitting
/// the factor so that each step stays a normal f32.
pub fn scale_pow2(x: f32, e: i32) -> f32 {
    let half_e = e / 2;
    x * pow2(half_e) * pow2(e - half_e)
}

/// Round an f32 to the FP8 format (ties to even, NaN on overflow, no negative zero).
pub fn from_f32(x: f32, fmt: Fp8Format) -> u8 {
    if !x.is_finite() {
        return NAN;
    }
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let biased = ((bits >> 23) & 0xFF) as i32;
    let frac = bits & 0x7F_FFFF;
    if biased == 0 && frac == 0 {
        return 0;
    }
    // x = sig · 2^(exp2) exactly.
    let (sig, exp2) = if biased == 0 { (frac, -149) } else { (frac | 0x80_0000, biased - 150) };
    let m = fmt.mantissa_bits() as i32;
    let emin = 1 - fmt.bias();
    // floor(log2 |x|)
    let e = 31 - sig.leading_zeros() as i32 + exp2;
    let quantum = if e < emin { emin - m } else { e - m };
    let shift = quantum - exp2;
    let n = if shift <= 0 {
        sig << (-shift) as u32
    } else if shift >= 32 {
        0
    } else {
        let kept = sig >> shift;
        let rest = sig & ((1u32 << shift) - 1);
        let halfway = 1u32 << (shift - 1);
        if rest > halfway || (rest == halfway && kept & 1 == 1) {
            kept + 1
        } else {
            kept
        }
    };
    let code = if e < emin { n } else { (((e + fmt.bias()) as u32) << m) + (n - (1 << m)) };
    if code > 0x7F {
        return NAN;
    }
    if code == 0 {
        return 0;
    }
    sign | code as u8
}

/// Exact value of an FP8 code as f32 (NaN for `0x80`).
pub fn to_f32(code: u8, fmt: Fp8Format) -> f32 {
    if code == NAN {
        return f32::NAN;
    }
    let m = fmt.mantissa_bits();
    let mag = (code & 0x7F) as u32;
    let exp = (mag >> m) as i32;
    let mant = mag & ((1 << m) - 1);
    let v = if exp == 0 {
        mant as f32 * pow2(1 - fmt.bias() - m as i32)
    } else {
        ((1 << m) + mant) as f32 * pow2(exp - fmt.bias() - m as i32)
    };
    if code & 0x80 != 0 {
        -v
    } else {
        v
    }
}

/// Cast an f16 with scale `scale`: stores `round(x / 2^scale)`.
pub fn from_f16_scaled(x: f16, fmt: Fp8Format, scale: i32) -> u8 {
    from_f32(scale_pow2(x.to_f32(), -scale), fmt)
}

/// Cast an f32 with scale `scale`: stores `round(x / 2^scale)`.
pub fn from_f32_scaled(x: f32, fmt: Fp8Format, scale: i32) -> u8 {
    from_f32(scale_pow2(x, -scale), fmt)
}

/// Load an FP8 code with scale `scale` into f16: `round_f16(code · 2^scale)`.
pub fn to_f16_scaled(code: u8, fmt: Fp8Format, scale: i32) -> f16 {
    f16::from_f32(scale_pow2(to_f32(code, fmt), scale))
}

/// Sign-extend a 6-bit scale field (FS §6: bits 5:0, −32..31).
pub const fn scale_from_bits(bits: u32) -> i32 {
    ((bits << 26) as i32) >> 26
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_codes_from_the_fact_sheet() {
        // FS §6: 8.0 = 0x58, 7.0 = 0x56 in PopLibs' F143 table.
        assert_eq!(from_f32(8.0, Fp8Format::E4M3), 0x58);
        assert_eq!(from_f32(7.0, Fp8Format::E4M3), 0x56);
        assert_eq!(Fp8Format::E4M3.max_value(), 240.0);
        assert_eq!(Fp8Format::E5M2.max_value(), 57344.0);
    }

    #[test]
    fn overflow_zero_and_nan() {
        assert_eq!(from_f32(247.9, Fp8Format::E4M3), 0x7F);
        assert_eq!(from_f32(248.0, Fp8Format::E4M3), NAN); // tie rounds to even = 256: overflow
        assert_eq!(from_f32(-0.0, Fp8Format::E4M3), 0);
        assert_eq!(from_f32(-1e-9, Fp8Format::E4M3), 0);
        assert_eq!(from_f32(f32::INFINITY, Fp8Format::E5M2), NAN);
        assert!(to_f32(NAN, Fp8Format::E5M2).is_nan());
    }

    #[test]
    fn every_code_round_trips() {
        for fmt in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for c in 0..=255u8 {
                if c == NAN {
                    continue;
                }
                assert_eq!(from_f32(to_f32(c, fmt), fmt), c, "{fmt:?} {c:#x}");
            }
        }
    }

    #[test]
    fn scale_bits_sign_extend() {
        assert_eq!(scale_from_bits(0x3F), -1);
        assert_eq!(scale_from_bits(0x20), -32);
        assert_eq!(scale_from_bits(31), 31);
    }
}
