//! The AMP's arithmetic with AVX2 and F16C, for x86-64 hosts that have both (checked at run time).
//!
//! `ipu_core::tile::amp::Portable` is the specification; this is the same IEEE binary32
//! operations on the same operands in the same order, never fused, with the 16 (or 8) columns as
//! two (or one) 8-lane vectors, and f16 decoded and rounded (to nearest even) by `vcvtph2ps` /
//! `vcvtps2ph`, which quiet NaNs and keep their payload as `ipu_core::f16bits` does. The fused
//! `{ld2st64pi ; AMP}` and `{ld2xst64pace ; AMP}` bundles are instantiated with it inside functions
//! compiled for those features, so the whole bundle is one function (docs/architecture.md, simulator fast paths).
//! `tests/tests/sim_amp_simd.rs` checks the two bit for bit.

#![allow(unsafe_code)]

use core::arch::x86_64::*;
use ipu_core::isa::MAX_FIELDS;
use ipu_core::tile::amp::{stream_amp, AmpKernels, AmpMath};
use ipu_core::tile::exec::{Cx, Flow};
use ipu_core::tile::FaultKind;

type R = Result<Flow, FaultKind>;

/// The kernels for this host: AVX2 + F16C ones where the CPU has both, else the specification's.
/// Both streaming main halves (`ld2st64pi`, `ld2xst64pace`) get them; `f8amp` stays portable.
pub fn kernels() -> AmpKernels {
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c") {
        let [plain, pace] = AmpKernels::PORTABLE.0;
        AmpKernels([[bundle::<0, 0>, bundle::<0, 1>, plain[2]], [bundle::<1, 0>, bundle::<1, 1>, pace[2]]])
    } else {
        AmpKernels::PORTABLE
    }
}

/// `{MAIN ; KIND}` (as `ipu_core::tile::amp::stream_amp` numbers them) with AVX2 + F16C.
fn bundle<const MAIN: u8, const KIND: u8>(
    cx: &mut Cx<'_>,
    main: &[u32; MAX_FIELDS],
    aux: &[u32; MAX_FIELDS],
) -> R {
    // SAFETY: `kernels` hands this function out only on a host with AVX2 and F16C.
    unsafe { bundle_simd::<MAIN, KIND>(cx, main, aux) }
}

#[target_feature(enable = "avx2,f16c")]
fn bundle_simd<const MAIN: u8, const KIND: u8>(
    cx: &mut Cx<'_>,
    main: &[u32; MAX_FIELDS],
    aux: &[u32; MAX_FIELDS],
) -> R {
    stream_amp::<F16c, MAIN, KIND>(cx, main, aux)
}

/// Lane selectors: `PHASE4[p]` has all bits set in lanes `4p..4p + 4` of the 16 accumulators,
/// `PHASE2[p]` in lanes `2p..2p + 2` of the first 8.
static PHASE4: [[i32; 16]; 4] = {
    let mut m = [[0; 16]; 4];
    let mut p = 0;
    while p < 4 {
        let mut i = 0;
        while i < 4 {
            m[p][4 * p + i] = -1;
            i += 1;
        }
        p += 1;
    }
    m
};
static PHASE2: [[i32; 8]; 4] = {
    let mut m = [[0; 8]; 4];
    let mut p = 0;
    while p < 4 {
        m[p][2 * p] = -1;
        m[p][2 * p + 1] = -1;
        p += 1;
    }
    m
};

/// The AMP's arithmetic in AVX2 + F16C. Only ever inlined into the `target_feature` functions
/// above (every method is `inline(always)` and they are its only callers).
struct F16c;

/// `acc + (x0·w0 + x1·w1) + (x2·w2 + x3·w3)` for 8 columns, `w` rows `stride` apart.
///
/// # Safety
/// The host has AVX2; `w` points at `3·stride + 8` readable f32 values.
#[inline(always)]
unsafe fn columns8(acc: __m256, xs: [__m256; 4], w: *const f32, stride: usize) -> __m256 {
    unsafe {
        let p0 = _mm256_mul_ps(xs[0], _mm256_loadu_ps(w));
        let p1 = _mm256_mul_ps(xs[1], _mm256_loadu_ps(w.add(stride)));
        let p2 = _mm256_mul_ps(xs[2], _mm256_loadu_ps(w.add(2 * stride)));
        let p3 = _mm256_mul_ps(xs[3], _mm256_loadu_ps(w.add(3 * stride)));
        _mm256_add_ps(acc, _mm256_add_ps(_mm256_add_ps(p0, p1), _mm256_add_ps(p2, p3)))
    }
}

/// The four f16 lanes of `x` as f32, each broadcast to a vector.
///
/// # Safety
/// The host has AVX2 and F16C.
#[inline(always)]
unsafe fn broadcast_halves(x: u64) -> [__m256; 4] {
    unsafe {
        let xs = _mm_cvtph_ps(_mm_cvtsi64_si128(x as i64));
        [
            _mm256_broadcastss_ps(xs),
            _mm256_broadcastss_ps(_mm_shuffle_ps::<0x55>(xs, xs)),
            _mm256_broadcastss_ps(_mm_shuffle_ps::<0xAA>(xs, xs)),
            _mm256_broadcastss_ps(_mm_shuffle_ps::<0xFF>(xs, xs)),
        ]
    }
}

impl AmpMath for F16c {
    #[inline(always)]
    fn f16_phase(acc: &mut [f32; 16], drain: &[f32; 16], p: usize, pin: u64, x: u64, w: &[f32; 64]) -> u64 {
        let p = p & 3;
        // SAFETY: reached only from `bundle_simd` (AVX2 + F16C); every pointer below is into
        // `acc`, `drain`, `w` or the lane tables, within their lengths (p ≤ 3).
        unsafe {
            let d = _mm_loadu_ps(drain.as_ptr().add(4 * p));
            let out = _mm_cvtsi128_si64(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(d)) as u64;
            let pin4 = _mm_cvtph_ps(_mm_cvtsi64_si128(pin as i64));
            let pin8 = _mm256_set_m128(pin4, pin4);
            let lanes = PHASE4[p].as_ptr() as *const f32;
            let mut lo = _mm256_loadu_ps(acc.as_ptr());
            let mut hi = _mm256_loadu_ps(acc.as_ptr().add(8));
            lo = _mm256_blendv_ps(lo, _mm256_add_ps(lo, pin8), _mm256_loadu_ps(lanes));
            hi = _mm256_blendv_ps(hi, _mm256_add_ps(hi, pin8), _mm256_loadu_ps(lanes.add(8)));
            let xs = broadcast_halves(x);
            lo = columns8(lo, xs, w.as_ptr(), 16);
            hi = columns8(hi, xs, w.as_ptr().add(8), 16);
            _mm256_storeu_ps(acc.as_mut_ptr(), lo);
            _mm256_storeu_ps(acc.as_mut_ptr().add(8), hi);
            out
        }
    }

    #[inline(always)]
    fn f32_phase(acc: &mut [f32; 16], drain: &[f32; 16], p: usize, pin: u64, x: u64, w: &[f32; 32]) -> u64 {
        let p = p & 3;
        let out = drain[2 * p].to_bits() as u64 | (drain[2 * p + 1].to_bits() as u64) << 32;
        // SAFETY: as in `f16_phase` (reached only from `bundle_simd`).
        unsafe {
            let pin2 = _mm256_castsi256_ps(_mm256_set1_epi64x(pin as i64));
            let lanes = PHASE2[p].as_ptr() as *const f32;
            let mut lo = _mm256_loadu_ps(acc.as_ptr());
            lo = _mm256_blendv_ps(lo, _mm256_add_ps(lo, pin2), _mm256_loadu_ps(lanes));
            lo = columns8(lo, broadcast_halves(x), w.as_ptr(), 8);
            _mm256_storeu_ps(acc.as_mut_ptr(), lo);
        }
        out
    }

    #[inline(always)]
    fn prefetch(mem: &[u8], at: [u32; 3]) {
        // Once per 64-byte line of the first stream (the three move together, 8 bytes a bundle,
        // except a strided first stream, for which this is a hint at the wrong place now and then).
        if !at[0].is_multiple_of(64) {
            return;
        }
        for a in at {
            // A prefetch never faults and changes no state; the address is computed without
            // dereferencing, so one past the end of `mem` is harmless.
            let p = mem.as_ptr().wrapping_add(a as usize).wrapping_add(PREFETCH_AHEAD);
            // SAFETY: `_mm_prefetch` needs only SSE, which every x86-64 host has.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) };
        }
    }
}

/// How far ahead of a stream its cache lines are asked for: 32 bundles of one worker.
const PREFETCH_AHEAD: usize = 256;
