//! `k_softmax_f16` on its own (docs/kernels.md, the softmax paragraph): launched by a hand-written
//! supervisor on six workers, one row each, with descriptors (and `e` rows) written here. Each row's values are
//! checked against the operations the doc names — the max; `e = exp(x + (−max))` summed in two f32
//! lanes (values 0 and 2 of each group of four in lane 0, 1 and 3 in lane 1, the tail in lane 0);
//! `f16(e · (1/sum))` — computed here in f32 with `libm::expf`, and the cycles against
//! `cost::softmax_issues`: launches that differ only in the row length differ by exactly 6 × the
//! formula's difference (the slowest worker's issues, one per six cycles).

mod common;
use common::*;
use half::f16;
use ipu_core::plan::chain::SOFTMAX_MAX_START as MAX_START;
use ipu_core::plan::{cost, Kernel};
use ipu_host::Device;

/// Source blocks of 16 values (32 bytes) every 64 bytes; destination blocks of `be` values every
/// `2·be + 32` bytes. One row per worker.
fn softmax(n: u32, be: u32, check: bool) -> u64 {
    let prog = kernel_harness(Kernel::SoftmaxF16, 384);
    let mut dev = device(1, 1);
    load(&mut dev, 0, &prog);
    let mut rng = Rng(3 + n as u64);
    let mut expected = Vec::new();
    for w in 0..6u32 {
        let (x_at, y_at) = (0x80000 + w * 0x1000, 0x90000 + w * 0x1000);
        let dstride = 2 * be + 32;
        let x: Vec<f32> =
            (0..n).map(|_| rng.f16().to_f32() * 8.0).map(|v| f16::from_f32(v).to_f32()).collect();
        for (b, chunk) in x.chunks(16).enumerate() {
            let bytes: Vec<u8> =
                chunk.iter().flat_map(|v| f16::from_f32(*v).to_bits().to_le_bytes()).collect();
            dev.write_memory(0, x_at + 64 * b as u32, &bytes).unwrap();
        }
        // The doc's operations, in f32.
        let mx = x.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
        let neg = 0.0 - mx;
        let mut lanes = [0f32; 2];
        for (i, v) in x.iter().enumerate() {
            let lane = if (i as u32) < n / 4 * 4 { i % 2 } else { 0 };
            lanes[lane] += libm::expf(v + neg);
        }
        let r = 1.0 / (lanes[0] + lanes[1]);
        let y: Vec<u16> = x.iter().map(|v| f16::from_f32(libm::expf(v + neg) * r).to_bits()).collect();
        expected.push((y_at, dstride, y));
        // The worker's `e` row (f32 scratch) follows the descriptor's first eight words.
        let e_at = 0xA0000 + w * 0x1000;
        let desc = [
            x_at,
            64 - 32,
            y_at,
            dstride - 2 * be,
            1,
            n / 4,
            n % 4,
            be / 4,
            e_at,
            0,
            MAX_START,
            MAX_START,
            0,
            0,
            0,
            0,
        ];
        let bytes: Vec<u8> = desc.iter().flat_map(|v| v.to_le_bytes()).collect();
        dev.write_memory(0, prog.sym("desc") + 64 * w, &bytes).unwrap();
    }
    let r = dev.run_to_host_sync().expect("runs");
    if check {
        for (y_at, dstride, y) in expected {
            let got: Vec<u16> = (0..n as usize)
                .map(|i| {
                    let (b, k) = (i as u32 / be, i as u32 % be);
                    read_u16s(&mut dev, 0, y_at + dstride * b + 2 * k, 1)[0]
                })
                .collect();
            assert_eq!(got, y, "row of {n} into blocks of {be}");
        }
    }
    r.cycle
}

#[test]
fn softmax_rows_follow_the_doc_and_cost_their_formula() {
    // Whole source blocks only, leftover groups, a tail, both destination block sizes.
    for be in [16u32, 32] {
        for (a, b) in [(64u32, 128u32), (69, 133), (72, 729), (3, 11)] {
            let (ca, cb) = (softmax(a, be, true), softmax(b, be, true));
            let want =
                cost::softmax_issues(1, b as u64, be as u64) - cost::softmax_issues(1, a as u64, be as u64);
            assert_eq!(cb - ca, 6 * want, "{a} → {b} values, blocks of {be}");
        }
    }
}
