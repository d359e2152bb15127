//! `k_scale_f16` (alpha) on its own (docs/kernels.md): a hand-written supervisor launches it on six
//! workers, each with two segments of blocks written here. Values must be `f16(alpha · f32(x))`
//! (one f32 product rounded once to f16, nearest even) inside the segments and untouched outside;
//! cycles must differ between two sizes by exactly 6 × `cost::scale_issues`' difference.

mod common;
use common::*;
use half::f16;
use ipu_core::plan::{cost, Kernel};
use ipu_host::Device;

/// Worker w: segment 1 at `0x80000 + w·0x2000`, segment 2 at `+0x1000`; blocks every 256 bytes.
fn scale(seg: [(u32, u32); 2], check: bool) -> u64 {
    let prog = kernel_harness(Kernel::ScaleF16, 192);
    let mut dev = device(1, 1);
    load(&mut dev, 0, &prog);
    let alpha = 0.117_851_13f32;
    let mut rng = Rng(9);
    let mut expected = Vec::new();
    for w in 0..6u32 {
        let base = 0x80000 + w * 0x2000;
        for (k, &(chunks, blocks)) in seg.iter().enumerate() {
            let at = base + 0x1000 * k as u32;
            // Each block: the segment's chunks, then one chunk the kernel must not touch.
            for b in 0..blocks {
                let x: Vec<f16> = (0..4 * (chunks + 1)).map(|_| rng.f16()).collect();
                let bytes: Vec<u8> = x.iter().flat_map(|h| h.to_bits().to_le_bytes()).collect();
                let a = at + 256 * b;
                dev.write_memory(0, a, &bytes).unwrap();
                let y: Vec<u16> = x
                    .iter()
                    .enumerate()
                    .map(|(i, h)| {
                        if i < 4 * chunks as usize {
                            f16::from_f32(alpha * h.to_f32()).to_bits()
                        } else {
                            h.to_bits()
                        }
                    })
                    .collect();
                expected.push((a, y));
            }
        }
        let desc = [base, seg[0].0, alpha.to_bits(), 256, seg[0].1, base + 0x1000, seg[1].0, seg[1].1];
        write_u32s(&mut dev, prog.sym("desc") + 32 * w, &desc);
    }
    run_checking_halves(&mut dev, &expected, check)
}

#[test]
fn alpha_scales_two_segments_and_costs_its_formula() {
    let issues = |s: [(u32, u32); 2]| cost::scale_issues(s.map(|(c, b)| (c as u64, b as u64)));
    for (a, b) in [
        ([(4, 3), (0, 0)], [(4, 3), (8, 5)]),
        ([(2, 1), (3, 2)], [(9, 4), (3, 2)]),
        ([(0, 3), (2, 0)], [(5, 3), (2, 6)]),
    ] {
        let (ca, cb) = (scale(a, true), scale(b, true));
        assert_eq!(cb - ca, 6 * (issues(b) - issues(a)), "{a:?} → {b:?}");
    }
}
