//! FP8 conversions are bit-exact with ml_dtypes' float8_e4m3fnuz / float8_e5m2fnuz over every f16
//! input and every FP8 code, for scales 0 and non-zero. The reference digests in
//! `tests/data/fp8_mldtypes.txt` come from `scripts/fp8_vectors.py` (ml_dtypes itself); `.ci/run`
//! regenerates them and diffs, so they cannot drift from the library.

use half::f16;
use ipu_core::fp8::{self, Fp8Format};
use sha2::{Digest, Sha256};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn fmt(name: &str) -> Fp8Format {
    if name == "e4m3" {
        Fp8Format::E4M3
    } else {
        Fp8Format::E5M2
    }
}

#[test]
fn every_f16_and_every_code_matches_ml_dtypes() {
    let reference = include_str!("../data/fp8_mldtypes.txt");
    let mut checked = 0;
    for line in reference.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [dir, name, scale, digest] = parts[..] else { panic!("bad line {line}") };
        let scale: i32 = scale.parse().unwrap();
        let table: Vec<u8> = match dir {
            "encode" => {
                (0..=u16::MAX).map(|b| fp8::from_f16_scaled(f16::from_bits(b), fmt(name), scale)).collect()
            }
            "decode" => (0..=255u8)
                .flat_map(|c| {
                    let h = fp8::to_f16_scaled(c, fmt(name), scale);
                    let bits = if h.is_nan() { 0x7E00 } else { h.to_bits() };
                    bits.to_le_bytes()
                })
                .collect(),
            _ => panic!("bad direction {dir}"),
        };
        assert_eq!(hex(&Sha256::digest(&table)), digest, "{dir} {name} scale {scale} differs from ml_dtypes");
        checked += 1;
    }
    assert_eq!(checked, 40, "2 directions × 2 formats × 10 scales");
}

#[test]
fn hand_checked_edge_cases() {
    let e4 = Fp8Format::E4M3;
    // Subnormals: the smallest F143 subnormal is 2^-10 (code 0x01); half of it ties to even (0).
    assert_eq!(fp8::from_f32(2f32.powi(-10), e4), 0x01);
    assert_eq!(fp8::from_f32(2f32.powi(-11), e4), 0x00);
    assert_eq!(fp8::from_f32(3.0 * 2f32.powi(-11), e4), 0x02); // 1.5 quanta: tie to even 2
    assert_eq!(fp8::from_f32(-2f32.powi(-12), e4), 0x00); // rounds to zero: no negative zero
                                                          // Ties between normals: 1.0625 is halfway between 1.0 (0x40) and 1.125 (0x41): even is 0x40.
    assert_eq!(fp8::from_f32(1.0625, e4), 0x40);
    assert_eq!(fp8::from_f32(1.1875, e4), 0x42);
    // Overflow with scale: 1.0 / 2^-8 = 256 > 240 → NaN; with scale 0 it is exact.
    assert_eq!(fp8::from_f16_scaled(f16::from_f32(1.0), e4, -8), fp8::NAN);
    assert_eq!(fp8::from_f16_scaled(f16::from_f32(1.0), e4, 0), 0x40);
}
