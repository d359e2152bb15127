//! The AMP (docs/target.md §4.4) and the matmul inner loop's bundles `{ld2st64pi ; AMP}` and
//! `{ld2xst64pace ; AMP}` as one function each.
//!
//! Why the arithmetic sits behind a trait: one AMP issue is 64 (or 32) multiplies and adds in a
//! fixed order plus eight f16 decodings and four f16 roundings, and it is most of what a matmul
//! costs the simulator. A host with 8-lane vectors and hardware f16 conversion (x86-64 with AVX2
//! and F16C) does the same IEEE operations in the same order in a fraction of the instructions,
//! but selecting such code at run time needs `unsafe`, which this crate forbids. So the host
//! supplies its own [`AmpMath`] and instantiates [`stream_amp`] with it inside a function
//! compiled for those features (`host/src/sim/amp_x86.rs`), and hands the tiles the resulting
//! [`AmpKernels`]. [`Portable`] is the specification: every other host runs it, and the fast
//! forms are tested bit for bit against it.

use super::exec::{self, floats, from_floats, from_halves, halves, ld2st64pi, Cx, Flow, R};
use super::FaultKind;
use crate::fp8::{self, Fp8Format};
use crate::isa::{Instr, Op, MAX_FIELDS};
use crate::target::TILE_MEM_BASE;

/// The arithmetic of one f16- or f32-partials AMP issue in phase `p` (0..=3), after the phase-0
/// drain (docs/target.md §4.4): the partial sums `pin` enter the accumulators of the phase's
/// lanes, then every column takes its four products, and the result is the previous row's
/// drained lanes of the phase.
pub trait AmpMath {
    /// `f16amp`: `acc[4p + i] += pin[i]` (four f16 lanes), then for each of the 16 columns
    /// `acc[n] += (x0·w[n] + x1·w[16 + n]) + (x2·w[32 + n] + x3·w[48 + n])` with `x` the four f16
    /// lanes of the input; returns `drain[4p..4p + 4]` rounded to f16 lanes, to nearest even.
    fn f16_phase(acc: &mut [f32; 16], drain: &[f32; 16], p: usize, pin: u64, x: u64, w: &[f32; 64]) -> u64;
    /// `f32amp`: `acc[2p + i] += pin[i]` (two f32 lanes), then the same sums for 8 columns
    /// (`w[8k + n]`); returns `drain[2p..2p + 2]` as two f32 lanes.
    fn f32_phase(acc: &mut [f32; 16], drain: &[f32; 16], p: usize, pin: u64, x: u64, w: &[f32; 32]) -> u64;
    /// A hint that the streams at tile-memory offsets `at` (the bundle's two loads and its store)
    /// will be read and written further on: a host may ask its caches for them early. It changes
    /// nothing else; the default does nothing.
    #[inline(always)]
    fn prefetch(_mem: &[u8], _at: [u32; 3]) {}
}

/// The specification, in plain scalar code the compiler vectorises as far as the target allows.
pub struct Portable;

impl AmpMath for Portable {
    #[inline(always)]
    fn f16_phase(acc: &mut [f32; 16], drain: &[f32; 16], p: usize, pin: u64, x: u64, w: &[f32; 64]) -> u64 {
        let out = drain_and_pin_f16(acc, drain, p, pin);
        columns::<16>(acc, halves(x), w);
        out
    }

    #[inline(always)]
    fn f32_phase(acc: &mut [f32; 16], drain: &[f32; 16], p: usize, pin: u64, x: u64, w: &[f32; 32]) -> u64 {
        let out = from_floats([drain[2 * p], drain[2 * p + 1]]);
        let [a0, a1] = floats(pin);
        acc[2 * p] += a0;
        acc[2 * p + 1] += a1;
        columns::<8>(acc, halves(x), w);
        out
    }
}

/// Steps 2 and 3 of an f16-partials issue (`f16amp`, `f8amp`): returns `drain[4p..4p + 4]` rounded
/// to f16 lanes, and adds the four f16 lanes of `pin` to `acc[4p..4p + 4]`.
#[inline(always)]
fn drain_and_pin_f16(acc: &mut [f32; 16], drain: &[f32; 16], p: usize, pin: u64) -> u64 {
    let d = &drain[4 * p..4 * p + 4];
    let out = from_halves([d[0], d[1], d[2], d[3]]);
    for (i, h) in halves(pin).iter().enumerate() {
        acc[4 * p + i] += h;
    }
    out
}

/// `acc[n] += (x0·w[0][n] + x1·w[1][n]) + (x2·w[2][n] + x3·w[3][n])` for the first `COLS`
/// columns, weights `w[k][n]` at `w[k·COLS + n]`: fixed sizes so the compiler vectorises it.
#[inline(always)]
fn columns<const COLS: usize>(acc: &mut [f32; 16], xs: [f32; 4], w: &[f32]) {
    let w = &w[..4 * COLS];
    let (w0, rest) = w.split_at(COLS);
    let (w1, rest) = rest.split_at(COLS);
    let (w2, w3) = rest.split_at(COLS);
    for n in 0..COLS {
        acc[n] += (xs[0] * w0[n] + xs[1] * w1[n]) + (xs[2] * w2[n] + xs[3] * w3[n]);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum AmpKind {
    F16,
    F32,
    F8,
}

impl AmpKind {
    #[inline(always)]
    const fn of(kind: u8) -> AmpKind {
        match kind {
            0 => AmpKind::F16,
            1 => AmpKind::F32,
            _ => AmpKind::F8,
        }
    }
}

/// The AMP with its register operands already read (`pin`, `x`). Inlined everywhere, so `kind`
/// is a constant in each copy.
#[inline(always)]
fn amp_on<M: AmpMath>(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS], pin: u64, x: u64, kind: AmpKind) -> R {
    let p = a[3] as usize & 3;
    let (infmt, iscl) = (cx.shared.fp_infmt, cx.shared.fp_iscl);
    let fp = cx.fp.as_deref_mut().ok_or(FaultKind::WrongContext)?;
    if p == 0 {
        fp.drain = fp.aacc;
        fp.aacc = [0.0; 16];
    }
    let out = match kind {
        AmpKind::F16 => {
            let w = cx.shared.cwei_f32.f16[64 * p..64 * p + 64].try_into().expect("64 weights");
            M::f16_phase(&mut fp.aacc, &fp.drain, p, pin, x, w)
        }
        AmpKind::F32 => {
            let w = cx.shared.cwei_f32.f16[32 * p..32 * p + 32].try_into().expect("32 weights");
            M::f32_phase(&mut fp.aacc, &fp.drain, p, pin, x, w)
        }
        AmpKind::F8 => {
            let out = drain_and_pin_f16(&mut fp.aacc, &fp.drain, p, pin);
            let fx = Fp8Format::from_bit(infmt);
            let w = &cx.shared.cwei_f8()[((infmt >> 1) & 1) as usize];
            let scale = fp8::scale_from_bits(iscl);
            let xs: [f32; 8] = core::array::from_fn(|k| fp8::to_f32((x >> (8 * k)) as u8, fx));
            for n in 0..16 {
                let pr: [f32; 8] = core::array::from_fn(|k| xs[k] * w[(8 * p + k) * 16 + n]);
                let s = ((pr[0] + pr[1]) + (pr[2] + pr[3])) + ((pr[4] + pr[5]) + (pr[6] + pr[7]));
                fp.aacc[n] += fp8::scale_pow2(s, scale);
            }
            out
        }
    };
    let out = if kind == AmpKind::F32 { canonical_nan_f32(out) } else { canonical_nan_f16(out) };
    cx.set_pair(a[0], out);
    Ok(Flow::Next)
}

/// The four f16 lanes of `v` with every NaN made the quiet NaN `0x7E00` (docs/target.md §4.4: which
/// of two NaN operands an IEEE sum passes on is the host's choice, so the AMP's NaN results are
/// fixed instead, the same on every host and kernel). Lane by lane without branches: a lane is a
/// NaN when its magnitude is above `0x7C00`, i.e. when adding `0x03FF` sets its top bit.
#[inline(always)]
fn canonical_nan_f16(v: u64) -> u64 {
    const LANES: u64 = 0x0001_0001_0001_0001;
    let magnitude = v & (0x7FFF * LANES);
    let nan = ((magnitude + 0x03FF * LANES) >> 15) & LANES;
    let mask = nan * 0xFFFF;
    (v & !mask) | ((0x7E00 * LANES) & mask)
}

/// The two f32 lanes of `v` with every NaN made the quiet NaN `0x7FC0_0000` ([`canonical_nan_f16`]).
#[inline(always)]
fn canonical_nan_f32(v: u64) -> u64 {
    let lane = |w: u32| if w & 0x7FFF_FFFF > 0x7F80_0000 { 0x7FC0_0000 } else { w };
    lane(v as u32) as u64 | (lane((v >> 32) as u32) as u64) << 32
}

#[inline(always)]
fn amp(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS], kind: AmpKind) -> R {
    let (pin, x) = (cx.pair(a[1]), cx.pair(a[2]));
    amp_on::<Portable>(cx, a, pin, x, kind)
}

pub(crate) fn f16amp(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    amp(cx, a, AmpKind::F16)
}
pub(crate) fn f32amp(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    amp(cx, a, AmpKind::F32)
}
pub(crate) fn f8amp(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    amp(cx, a, AmpKind::F8)
}

/// A bundle's two halves executed as one function: `{main ; aux}` with the main half's and the
/// aux half's operands.
pub type FusedFn = fn(&mut Cx<'_>, &[u32; MAX_FIELDS], &[u32; MAX_FIELDS]) -> R;

/// The main halves that stream an AMP's operands: two 64-bit loads and a 64-bit store per bundle.
/// They differ only in where the three addresses live and how far each advances.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Streams {
    /// `ld2st64pi`: three pointer registers (operands 3, 4, 5), each advancing by 8.
    Ld2st64pi = 0,
    /// `ld2xst64pace`: a triple-packed register pair (operand 2), each address advancing by the
    /// increment its two bits of `strimm` (operand 4) select from the stride register (operand 3).
    Ld2xst64pace = 1,
}

impl Streams {
    #[inline(always)]
    const fn of(main: u8) -> Streams {
        match main {
            0 => Streams::Ld2st64pi,
            _ => Streams::Ld2xst64pace,
        }
    }

    /// The three addresses (two loads, the store) the main half with operands `main` accesses
    /// next.
    #[inline(always)]
    pub fn addresses(self, regs: &[u32; 16], main: &[u32; MAX_FIELDS]) -> [u32; 3] {
        let m = |r: u32| if r >= 15 { 0 } else { regs[r as usize] };
        match self {
            Streams::Ld2st64pi => [m(main[3]), m(main[4]), m(main[5])],
            Streams::Ld2xst64pace => {
                let r = main[2] & 14;
                exec::unpack_triple(m(r) as u64 | (m(r + 1) as u64) << 32)
            }
        }
    }

    /// The byte increments of the three addresses after one issue, with the registers `regs`.
    #[inline(always)]
    pub fn increments(self, regs: &[u32; 16], main: &[u32; MAX_FIELDS]) -> [u32; 3] {
        match self {
            Streams::Ld2st64pi => [8; 3],
            Streams::Ld2xst64pace => {
                let stride = if main[3] >= 15 { 0 } else { regs[main[3] as usize] };
                core::array::from_fn(|i| exec::pace_increment(main[4], stride, i))
            }
        }
    }
}

/// `{ MAIN ; AMP }` — `MAIN` 0 = `ld2st64pi`, 1 = `ld2xst64pace` ([`Streams`]); `KIND` 0 = `f16amp`,
/// 1 = `f32amp`, 2 = `f8amp` — the matmul inner loop's bundle, for a decoded pair whose AMP writes
/// a register pair the main half does not ([`fused`] checks). Both halves read the registers as
/// they were before the bundle (docs/target.md §4.1): the AMP's only register reads, `pin` and
/// `x`, are taken first; the main half then runs as it would alone, and the AMP last. The two write
/// disjoint registers, so there is nothing to set aside or merge and no clash.
///
/// Public and always inlined so that a host can instantiate it with its own [`AmpMath`] inside a
/// function compiled for wider vectors (the module comment says why).
#[inline(always)]
pub fn stream_amp<M: AmpMath, const MAIN: u8, const KIND: u8>(
    cx: &mut Cx<'_>,
    main: &[u32; MAX_FIELDS],
    aux: &[u32; MAX_FIELDS],
) -> R {
    let (pin, x) = (cx.pair(aux[1]), cx.pair(aux[2]));
    let streams = Streams::of(MAIN);
    let at = streams.addresses(&cx.regs.m, main).map(|a| a.wrapping_sub(TILE_MEM_BASE));
    M::prefetch(cx.mem, at);
    match streams {
        Streams::Ld2st64pi => ld2st64pi(cx, main)?,
        Streams::Ld2xst64pace => exec::ld2xst64pace(cx, main)?,
    };
    amp_on::<M>(cx, aux, pin, x, AmpKind::of(KIND))
}

/// The fused bundle functions a tile uses: `[main][kind]`, main as [`Streams`], kind 0 = `f16amp`,
/// 1 = `f32amp`, 2 = `f8amp`.
#[derive(Clone, Copy)]
pub struct AmpKernels(pub [[FusedFn; 3]; 2]);

impl AmpKernels {
    /// The specification's kernels ([`Portable`]): what a tile uses unless the host says otherwise.
    pub const PORTABLE: AmpKernels = AmpKernels([
        [stream_amp::<Portable, 0, 0>, stream_amp::<Portable, 0, 1>, stream_amp::<Portable, 0, 2>],
        [stream_amp::<Portable, 1, 0>, stream_amp::<Portable, 1, 1>, stream_amp::<Portable, 1, 2>],
    ]);
}

/// The fused form of the bundle `{main ; aux}` when there is one: a streaming main half
/// ([`Streams`]) with an AMP whose destination pair (its operand 0) is none of the pairs the main
/// half loads, so that neither half can see or clash with the other's writes.
pub(crate) fn fused(main: &Instr, aux: &Instr, kernels: &AmpKernels) -> Option<(FusedFn, Streams)> {
    let kind = match aux.info().mnemonic {
        "f16amp" => 0,
        "f32amp" => 1,
        "f8amp" => 2,
        _ => return None,
    };
    let pair = |r: u32| r & !1;
    let (streams, loaded) = match main.op {
        Op::Ld2St64Pi => (Streams::Ld2st64pi, [pair(main.args[0]), pair(main.args[1])]),
        // The quad's two pairs.
        Op::Ld2xst64Pace => (Streams::Ld2xst64pace, [main.args[0], main.args[0] + 2]),
        _ => return None,
    };
    let f = kernels.0[streams as usize][kind];
    (!loaded.contains(&pair(aux.args[0]))).then_some((f, streams))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lane-by-lane definition: a NaN lane becomes the quiet NaN, every other lane is kept.
    #[test]
    fn canonical_nans_follow_the_definition_on_every_lane_value() {
        for h in 0..=u16::MAX {
            let is_nan = h & 0x7C00 == 0x7C00 && h & 0x03FF != 0;
            let want = if is_nan { 0x7E00 } else { h };
            // The value in each lane, with different neighbours.
            for lane in 0..4 {
                let others = 0x7C01_3C00_FC00_7E01u64 & !(0xFFFF << (16 * lane));
                let v = others | (h as u64) << (16 * lane);
                let got = (canonical_nan_f16(v) >> (16 * lane)) as u16;
                assert_eq!(got, want, "lane {lane} of {v:#018x}");
            }
        }
        for w in
            [0x7F80_0000u32, 0xFF80_0000, 0x7F80_0001, 0xFFC0_1234, 0x7FFF_FFFF, 0x3F80_0000, 0x8000_0000]
        {
            let want = if f32::from_bits(w).is_nan() { 0x7FC0_0000 } else { w };
            let v = canonical_nan_f32((w as u64) << 32 | 0xFF80_0001);
            assert_eq!(v, (want as u64) << 32 | 0x7FC0_0000, "{w:#x}");
        }
    }
}
