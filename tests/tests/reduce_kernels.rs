//! The K-split kernels on their own (docs/kernels.md "K split"): `add_blocks_f32` (the row
//! binary kernel's code over blocks of f32 partials) and the
//! pipelined `cvt_f32_f16`, each launched by a hand-written supervisor on six workers with
//! descriptors written here. Results are checked against the operations the doc names (an f32
//! sum per element; an f16 rounding, to nearest even, of each float, packed from the block's
//! start) and the cycles against the cost formulas: two launches that differ only in size differ
//! by exactly 6 × the formula's difference in issues (the slowest worker's, at one issue per six
//! cycles).

mod common;
use common::*;
use half::f16;
use ipu_core::plan::{cost, Kernel};
use ipu_host::Device;

/// Per worker w: `blocks` blocks of `chunks` f32 pairs; dst in C-like layout (stride 1024), src
/// packed (stride 8·chunks), out == src for odd workers (the running sum joining the tile's own
/// partial), == dst otherwise. Returns the cycle count.
fn add_blocks(chunks: u32, blocks: u32, check: bool) -> u64 {
    let prog = kernel_harness(Kernel::AddBlocksF32, 192);
    let mut dev = device(1, 1);
    load(&mut dev, 0, &prog);
    let mut rng = Rng(11);
    let mut expected = Vec::new();
    for w in 0..6u32 {
        let (dst, src) = (0x80000 + w * 0x8000, 0xB8000 + w * 0x4000);
        let (dstride, sstride) = (1024u32, 8 * chunks);
        let out_is_src = w % 2 == 1;
        let mut want = Vec::new();
        for b in 0..blocks {
            let n = 2 * chunks as usize;
            let x: Vec<f32> = (0..n).map(|_| rng.f16().to_f32() * 3.0).collect();
            let y: Vec<f32> = (0..n).map(|_| rng.f16().to_f32() / 7.0).collect();
            write_u32s(&mut dev, dst + b * dstride, &x.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            write_u32s(&mut dev, src + b * sstride, &y.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            let at = if out_is_src { src + b * sstride } else { dst + b * dstride };
            want.push((at, x.iter().zip(&y).map(|(a, c)| (a + c).to_bits()).collect::<Vec<u32>>()));
        }
        let (out, ostride) = if out_is_src { (src, sstride) } else { (dst, dstride) };
        write_u32s(
            &mut dev,
            prog.sym("desc") + 32 * w,
            &[dst, dstride, src, sstride, out, ostride, blocks, chunks],
        );
        expected.push(want);
    }
    let r = dev.run_to_host_sync().expect("runs");
    if check {
        for want in expected {
            for (at, words) in want {
                let got: Vec<u32> =
                    (0..words.len() as u32).map(|i| read_u32(&mut dev, 0, at + 4 * i)).collect();
                assert_eq!(got, words, "at {at:#x}");
            }
        }
    }
    r.cycle
}

#[test]
fn add_blocks_adds_every_block_and_costs_the_row_kernel_formula() {
    let (a, b) = (add_blocks(5, 3, true), add_blocks(40, 3, true));
    assert_eq!(b - a, 6 * (cost::binary_rows_issues(3, 40) - cost::binary_rows_issues(3, 5)));
    let (c, d) = (add_blocks(9, 1, true), add_blocks(9, 4, true));
    assert_eq!(d - c, 6 * (cost::binary_rows_issues(4, 9) - cost::binary_rows_issues(1, 9)));
    // One chunk per block: the prologue alone (its read-ahead goes one chunk past the block).
    add_blocks(1, 2, true);
}

/// Per worker: `blocks` blocks (stride 2048) of `quads` quads of f32, converted in place.
fn cvt(quads: u32, blocks: u32, check: bool) -> u64 {
    let prog = kernel_harness(Kernel::CvtF32ToF16, 96);
    let mut dev = device(1, 1);
    load(&mut dev, 0, &prog);
    let mut rng = Rng(5);
    let mut expected = Vec::new();
    for w in 0..6u32 {
        let base = 0x80000 + w * 0x8000;
        for b in 0..blocks {
            // Values spread over f16's range, some halfway between two halves.
            let x: Vec<f32> = (0..4 * quads)
                .map(|i| {
                    let h = rng.f16().to_f32();
                    if i % 5 == 0 {
                        h + f32::from_bits(0x3380_0000) * h.abs().max(1.0)
                    } else {
                        h * 1.0001
                    }
                })
                .collect();
            write_u32s(&mut dev, base + b * 2048, &x.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            expected
                .push((base + b * 2048, x.iter().map(|v| f16::from_f32(*v).to_bits()).collect::<Vec<u16>>()));
        }
        write_u32s(&mut dev, prog.sym("desc") + 16 * w, &[base, quads, 2048, blocks]);
    }
    run_checking_halves(&mut dev, &expected, check)
}

#[test]
fn cvt_packs_rounded_halves_and_costs_its_formula() {
    let (a, b) = (cvt(3, 2, true), cvt(50, 2, true));
    assert_eq!(b - a, 6 * (cost::cvt_issues(50, 2) - cost::cvt_issues(3, 2)));
    let (c, d) = (cvt(7, 1, true), cvt(7, 5, true));
    assert_eq!(d - c, 6 * (cost::cvt_issues(7, 5) - cost::cvt_issues(7, 1)));
    cvt(1, 1, true);
}
