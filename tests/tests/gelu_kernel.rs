//! `k_gelu_f16` (the tanh GeLU of the matmul epilogue, docs/kernels.md) on its own: a hand-written
//! supervisor launches it on six workers, each with its own blocks. Values must be
//! `reference::gelu_device` of each input bit for bit (any NaN for a NaN) inside the blocks'
//! chunks and untouched past them; cycles must differ between two sizes by exactly
//! 6 × `cost::gelu_issues`' difference.

mod common;
use common::*;
use half::f16;
use ipu_core::plan::matmul::GELU_CONSTANTS;
use ipu_core::plan::{cost, Kernel};
use ipu_host::Device;

/// Runs the kernel with `chunks` 4-value chunks in each of `blocks` blocks per worker, the values
/// from `pick`, and checks every value; returns the cycle of the host sync.
fn gelu(chunks: u32, blocks: u32, pick: &mut dyn FnMut() -> f16) -> u64 {
    let prog = kernel_harness(Kernel::GeluF16, 6 * 64);
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
                        f16::from_f32(ipu_host::reference::gelu_device(h.to_f32()))
                    } else {
                        *h
                    }
                })
                .collect();
            expected.push((at, x, y));
        }
        let mut desc = vec![base, chunks, stride, blocks];
        desc.extend(GELU_CONSTANTS.map(f32::to_bits));
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
    let mut rng = Rng(11);
    // Values in [−8, 8): the formula's whole useful range, and both tails.
    let mut pick = move || f16::from_f32(rng.f16().to_f32() * 8.0);
    for ((ca, ba), (cb, bb)) in [((1, 1), (3, 2)), ((2, 3), (5, 4)), ((0, 2), (4, 1)), ((3, 0), (3, 5))] {
        let (ta, tb) = (gelu(ca, ba, &mut pick), gelu(cb, bb, &mut pick));
        let issues = |c: u32, b: u32| cost::gelu_issues(c as u64, b as u64);
        assert_eq!(tb - ta, 6 * (issues(cb, bb) - issues(ca, ba)), "({ca}, {ba}) → ({cb}, {bb})");
    }
}

#[test]
fn gelu_is_the_reference_on_every_f16() {
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
    gelu(chunks, blocks, &mut pick);
}
