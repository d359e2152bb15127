//! f16 ⇄ f32 conversions on bits, inlined and branch-light, with exactly `half`'s results (every
//! f16 and a sweep of f32 rounding cases are checked against `half` in the tests below).
//!
//! Why not `half::f16` directly: without F16C enabled at compile time `half` dispatches at run
//! time to an out-of-line function per value, and the simulator converts a dozen values per AMP
//! bundle. These forms inline into the caller's loop.

/// 2^112 as f32: scales an f16's exponent and mantissa bits, placed in an f32, to their value.
const TWO_POW_112: u32 = 0x7780_0000;
/// 0.5: adding it to a value below 2^-14 rounds that value to the f16 subnormal grid (2^-24).
const SUBNORMAL_MAGIC: u32 = 0x3F00_0000;

/// The f32 value of the f16 with bits `h` (NaNs quieted with their payload kept, as `half` does).
#[inline(always)]
pub fn to_f32(h: u16) -> f32 {
    f32::from_bits(to_f32_bits(h))
}

/// [`to_f32`] of four f16 lanes (`v`'s 16-bit fields, lowest first), looked up in a table of all
/// 65,536 f16 values (256 KiB, built at compile time by [`to_f32`] itself): the simulator
/// decodes eight f16 lanes per AMP bundle, and a load is cheaper than the bit manipulation.
#[inline(always)]
pub fn to_f32x4(v: u64) -> [f32; 4] {
    core::array::from_fn(|i| f32::from_bits(TO_F32[((v >> (16 * i)) & 0xFFFF) as usize]))
}

/// `to_f32(h).to_bits()` for every `h`.
static TO_F32: [u32; 1 << 16] = {
    let mut t = [0u32; 1 << 16];
    let mut h = 0;
    while h < t.len() {
        t[h] = to_f32_bits(h as u16);
        h += 1;
    }
    t
};

/// [`to_f32`]'s bits; a `const fn`, so that the table is built by the same code.
#[inline(always)]
const fn to_f32_bits(h: u16) -> u32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7FFF;
    // Exact for normals and subnormals alike: the product is a power-of-two rescaling.
    let finite = (f32::from_bits(em << 13) * f32::from_bits(TWO_POW_112)).to_bits();
    let man = em & 0x3FF;
    let special = 0x7F80_0000 | man << 13 | if man != 0 { 0x0040_0000 } else { 0 };
    sign | if em >= 0x7C00 { special } else { finite }
}

/// The f16 bits nearest to `x`, ties to even (overflow to infinity, NaNs quieted with the top
/// payload bits kept, as `half` does).
#[inline(always)]
pub fn from_f32(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = (bits >> 16) & 0x8000;
    let a = bits & 0x7FFF_FFFF;
    // All three cases are computed and one selected, so that four lanes vectorise.
    let inf_or_nan = if a > 0x7F80_0000 { 0x7E00 | (a & 0x007F_FFFF) >> 13 } else { 0x7C00 };
    // |x| < 2^-14: the f32 adder rounds to the subnormal grid.
    let subnormal =
        (f32::from_bits(a) + f32::from_bits(SUBNORMAL_MAGIC)).to_bits().wrapping_sub(SUBNORMAL_MAGIC);
    // Normal: rebias, add half an ulp minus one plus the kept lowest bit, drop 13 bits (a carry
    // into the exponent is the correct result, up to infinity).
    let normal = a.wrapping_add(0xC800_0FFF).wrapping_add((a >> 13) & 1) >> 13;
    let o = if a >= 0x4780_0000 {
        inf_or_nan
    } else if a < 0x3880_0000 {
        subnormal
    } else {
        normal
    };
    (o | sign) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn every_f16_converts_as_half_does() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32().to_bits();
            assert_eq!(to_f32(h).to_bits(), want, "{h:#06x}");
            // Each lane of the four-lane form, with different values in the other lanes.
            for lane in 0..4 {
                let v = (0x3C00_7C01_8001_0400u64 & !(0xFFFF << (16 * lane))) | (h as u64) << (16 * lane);
                assert_eq!(to_f32x4(v)[lane].to_bits(), want, "{h:#06x} lane {lane}");
            }
        }
    }

    #[test]
    fn rounding_matches_half_at_every_f16_and_midpoint() {
        let check = |x: f32| {
            let want = f16::from_f32(x).to_bits();
            assert_eq!(from_f32(x), want, "{:#010x}", x.to_bits());
        };
        for h in 0..=u16::MAX {
            let v = f16::from_bits(h).to_f32();
            for d in [-2i32, -1, 0, 1, 2] {
                check(f32::from_bits(v.to_bits().wrapping_add(d as u32)));
            }
            // Midpoints to the next f16 and one f32 ulp either side.
            let next = f16::from_bits(h.wrapping_add(1)).to_f32();
            if v.is_finite() && next.is_finite() {
                let mid = ((v as f64 + next as f64) / 2.0) as f32;
                for d in [-1i32, 0, 1] {
                    check(f32::from_bits(mid.to_bits().wrapping_add(d as u32)));
                }
            }
        }
        // A deterministic sweep over all exponents and signs.
        let mut s = 0x9E37_79B9u32;
        for _ in 0..2_000_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            check(f32::from_bits(s));
        }
    }
}
