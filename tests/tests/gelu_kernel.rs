//! `k_gelu_f16` (the tanh GeLU of the matmul epilogue, docs/kernels.md) and `k_gelu_sigmoid_f16`
//! (the quick GeLU `x·σ(1.702x)`) on their own: a hand-written supervisor launches one on six
//! workers, each with its own blocks. Values must be the reference's (`reference::gelu_device`,
//! `reference::gelu_sigmoid_device`) of each input bit for bit (any NaN for a NaN) inside the
//! blocks' chunks and untouched past them; cycles must differ between two sizes by exactly
//! 6 × the issue count's difference (`cost::gelu_issues`, `cost::gelu_sigmoid_issues`).

mod common;
use common::*;
use half::f16;
use ipu_core::graph::GeluForm;
use ipu_core::plan::matmul::gelu_kernel;
use ipu_core::plan::{cost, Kernel, Word};
use ipu_host::Device;

/// The device formula of a form, as the reference computes it.
fn reference(form: GeluForm) -> fn(f32) -> f32 {
    match form {
        GeluForm::Tanh => ipu_host::reference::gelu_device,
        GeluForm::Erf => ipu_host::reference::gelu_erf_device,
        GeluForm::Sigmoid => ipu_host::reference::gelu_sigmoid_device,
    }
}

/// Runs `form`'s kernel with `chunks` 4-value chunks in each of `blocks` blocks per worker, the
/// values from `pick`, and checks every value; returns the cycle of the host sync.
fn gelu(form: GeluForm, chunks: u32, blocks: u32, pick: &mut dyn FnMut() -> f16) -> u64 {
    let (kernel, constants, _) = gelu_kernel(form, chunks as u64, blocks as u64);
    let constants: Vec<u32> = constants
        .iter()
        .map(|w| match w {
            Word::Const(c) => *c,
            other => panic!("a constant word expected: {other:?}"),
        })
        .collect();
    let prog = kernel_harness(kernel, 6 * 64);
    let mut dev = device(1, 1);
    load(&mut dev, 0, &prog);
    // Each block: its chunks, then one chunk the kernel must not touch.
    let stride = 8 * (chunks + 1);
    let per_worker = (stride * blocks).next_multiple_of(256);
    let mut expected = Vec::new();
    for w in 0..6u32 {
        let base = 0x80000 + w * per_worker;
        for b in 0..blocks {
            let x: Vec<f16> = (0..4 * (chunks + 1)).map(|_| pick()).collect();
            let bytes: Vec<u8> = x.iter().flat_map(|h| h.to_bits().to_le_bytes()).collect();
            let at = base + stride * b;
            dev.write_memory(0, at, &bytes).unwrap();
            let y: Vec<f16> = x
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    let inside = i < 4 * chunks as usize;
                    if inside {
                        f16::from_f32(reference(form)(h.to_f32()))
                    } else {
                        *h
                    }
                })
                .collect();
            expected.push((at, x, y));
        }
        let mut desc = vec![base, chunks, stride, blocks];
        desc.extend(&constants);
        write_u32s(&mut dev, prog.sym("desc") + 64 * w, &desc);
    }
    let cycles = dev.run_to_host_sync().expect("runs").cycles;
    for (at, x, want) in &expected {
        let got = read_u16s(&mut dev, 0, *at, want.len());
        for ((x, want), got) in x.iter().zip(want).zip(got) {
            let got = f16::from_bits(got);
            let same = got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan());
            assert!(
                same,
                "gelu({x}) at block {at:#x}: device {got} ({:#06x}), reference {want}",
                got.to_bits()
            );
        }
    }
    cycles
}

#[test]
fn gelu_matches_the_reference_and_costs_its_formula() {
    for (form, issues) in [
        (GeluForm::Tanh, cost::gelu_issues as fn(u64, u64) -> u64),
        (GeluForm::Sigmoid, cost::gelu_sigmoid_issues),
    ] {
        assert_eq!(
            gelu_kernel(form, 0, 0).0,
            if form == GeluForm::Tanh { Kernel::GeluF16 } else { Kernel::GeluSigmoidF16 }
        );
        let mut rng = Rng(11);
        // Values in [−8, 8): the formula's whole useful range, and both tails.
        let mut pick = move || f16::from_f32(rng.f16().to_f32() * 8.0);
        for ((ca, ba), (cb, bb)) in [((1, 1), (3, 2)), ((2, 3), (5, 4)), ((0, 2), (4, 1)), ((3, 0), (3, 5))] {
            let (ta, tb) = (gelu(form, ca, ba, &mut pick), gelu(form, cb, bb, &mut pick));
            let issues = |c: u32, b: u32| issues(c as u64, b as u64);
            assert_eq!(
                tb - ta,
                6 * (issues(cb, bb) - issues(ca, ba)),
                "{form:?} ({ca}, {ba}) → ({cb}, {bb})"
            );
        }
    }
}

#[test]
#[allow(clippy::excessive_precision, reason = "the exact f16 values, all their digits, as NumPy prints them")]
fn quick_gelu_reference_is_hand_computed_values() {
    // x·σ(1.702x) rounded to f16, from NumPy (`x / (1 + np.exp(-1.702 * x))` in f64, then
    // `np.float16`): the device formula rounds to the same f16 at these points.
    let f = ipu_host::reference::gelu_sigmoid_device;
    for (x, want) in [
        (0.0f32, 0.0f32),
        (1.0, 0.845703125),
        (-1.0, -0.1541748046875),
        (2.0, 1.935546875),
        (-3.0, -0.01806640625),
        (8.0, 8.0),
        // −16·e^{−27.2} ≈ −2.4e−11: below f16's smallest subnormal, −0.
        (-16.0, -0.0),
    ] {
        assert_eq!(f(x).to_bits(), want.to_bits(), "quick_gelu({x}) = {}, not {want}", f(x));
    }
    // Far out: e^{1.702·65504} is ∞ in f32, x/∞ = −0; a NaN stays NaN.
    assert_eq!(f(-65504.0).to_bits(), (-0.0f32).to_bits());
    assert!(f(f32::NAN).is_nan());
}

#[test]
fn gelu_is_the_reference_on_every_f16() {
    for form in [GeluForm::Tanh, GeluForm::Sigmoid] {
        every_f16(form);
    }
}

fn every_f16(form: GeluForm) {
    // Every f16 (NaNs, infinities, subnormals and zeros of both signs included) inside a block:
    // 6 workers × 43 blocks × 64 chunks × 4 = 66,048 values inside, taken from a counter; the
    // chunk past each block holds 1.0.
    let (chunks, blocks) = (64u32, 43u32);
    assert!(6 * blocks * chunks * 4 >= 1 << 16);
    let (mut at, mut v) = (0u32, 0u16);
    let mut pick = move || {
        let inside = at % (4 * (chunks + 1)) < 4 * chunks;
        at += 1;
        if inside {
            v = v.wrapping_add(1);
            f16::from_bits(v.wrapping_sub(1))
        } else {
            f16::ONE
        }
    };
    gelu(form, chunks, blocks, &mut pick);
}
