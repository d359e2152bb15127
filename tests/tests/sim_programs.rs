//! Hand-written programs with exact expected memory and cycles (docs/target.md), independent of
//! the compiler. Each program's header comment derives its cycle count from the target model.

mod common;
use common::*;
use half::f16;
use ipu_host::{Device, StopState};

#[test]
fn integer_loop() {
    let (mut dev, prog, r) = run_one(include_str!("../programs/int_loop.s"));
    let r = r.expect("runs");
    assert_eq!(r.state, StopState::HostSync);
    assert_eq!(r.cycle, 116);
    assert_eq!(r.issued, 27);
    assert_eq!(read_u32(&mut dev, 0, prog.sym("result")), 33);
}

#[test]
fn code_written_at_run_time_runs_as_written() {
    let (mut dev, prog, r) = run_one(include_str!("../programs/code_rewrite.s"));
    let r = r.expect("runs");
    assert_eq!((r.cycle, r.issued), (108, 19));
    assert_eq!(read_u32(&mut dev, 0, prog.sym("result")), 16);
}

#[test]
fn vector_fp_on_one_worker() {
    let (mut dev, prog, r) = run_one(include_str!("../programs/vector_fp.s"));
    assert_eq!(r.expect("runs").cycle, 158);
    let d = prog.sym("data");
    // f16v4add: 1.5, 3.0, -1.0, 65504+65504 overflows to +inf.
    assert_eq!(read_u16s(&mut dev, 0, d + 16, 4), [0x3E00, 0x4200, 0xBC00, 0x7C00]);
    // f16v4mul: 0.5, 2.0, -6.0, inf.
    assert_eq!(read_u16s(&mut dev, 0, d + 24, 4), [0x3800, 0x4000, 0xC600, 0x7C00]);
    // Bundle: the store saw the loaded pair, the FP half squared it.
    assert_eq!(read_u32(&mut dev, 0, d + 40), 0x4040_0000);
    assert_eq!(read_u32(&mut dev, 0, d + 48), 9.0f32.to_bits());
    assert_eq!(read_u32(&mut dev, 0, d + 52), 1.0f32.to_bits());
}

#[test]
fn f16v4sub_rounds_each_lane_once_to_nearest_even() {
    let (mut dev, prog, r) = run_one(include_str!("../programs/f16v4_sub.s"));
    assert_eq!(r.expect("runs").cycle, 122);
    let d = prog.sym("data");
    // 1.5 − 0.5 = 1.0; 1 − 2^-12 lies halfway between 1 − 2^-11 (0x3BFF) and 1.0: the even one,
    // 1.0; −1 − 1 = −2; −65504 − 65504 overflows to −inf.
    assert_eq!(read_u16s(&mut dev, 0, d + 16, 4), [0x3C00, 0x3C00, 0xC000, 0xFC00]);
}

#[test]
fn f16v4max_takes_the_larger_lane_and_ignores_a_nan() {
    let (mut dev, prog, r) = run_one(include_str!("../programs/f16v4_max.s"));
    assert_eq!(r.expect("runs").cycle, 122);
    let d = prog.sym("data");
    // max(1.5, 0.5) = 1.5; max(−2, −3) = −2; max(NaN, 1) = 1; max(−inf, −65504) = −65504.
    assert_eq!(read_u16s(&mut dev, 0, d + 16, 4), [0x3E00, 0xC000, 0x3C00, 0xFBFF]);
}

#[test]
fn f32_square_root_and_reciprocal_are_correctly_rounded() {
    let (mut dev, prog, r) = run_one(include_str!("../programs/f32_sqrt.s"));
    assert_eq!(r.expect("runs").cycle, 170);
    let d = prog.sym("data");
    // NumPy float32: sqrt(2) = 0x3FB504F3, 1/sqrt(2) = 0x3F3504F3; sqrt(-1) is a NaN.
    assert_eq!(read_u32(&mut dev, 0, d + 12), 0x3FB5_04F3);
    assert_eq!(read_u32(&mut dev, 0, d + 16), 0x3F35_04F3);
    assert!(f32::from_bits(read_u32(&mut dev, 0, d + 20)).is_nan());
}

#[test]
fn f32_natural_logarithm_matches_numpy_float32() {
    let (mut dev, prog, r) = run_one(include_str!("../programs/f32_ln.s"));
    assert_eq!(r.expect("runs").cycle, 218);
    let d = prog.sym("data");
    // NumPy float32 np.log: ln 2 = 0x3F317218, ln 0.5 = 0xBF317218, ln 10 = 0x40135D8E, ln 0 = −inf.
    let got: Vec<u32> = (0..5).map(|i| read_u32(&mut dev, 0, d + 20 + 4 * i)).collect();
    assert_eq!(got[..4], [0x3F31_7218, 0xBF31_7218, 0x4013_5D8E, 0xFF80_0000]);
    // ln −1 is a NaN.
    assert!(f32::from_bits(got[4]).is_nan());
}

#[test]
fn fp8_conversion_codes() {
    let (mut dev, prog, r) = run_one(include_str!("../programs/fp8_convert.s"));
    r.expect("runs");
    let d = prog.sym("data");
    // Scale 0, F143 (bias 8): 1.0 = 0x40, -2.5 = 0xCA, 240 = 0x7F (max), 1000 overflows to NaN 0x80.
    assert_eq!(read(&mut dev, 0, d + 8, 4), [0x40, 0xCA, 0x7F, 0x80]);
    // Scale 2 stores x/4: 0.25 = 0x30, -0.625 = 0xBA, 60 = 0x6F, 250 > 248 overflows.
    assert_eq!(read(&mut dev, 0, d + 12, 4), [0x30, 0xBA, 0x6F, 0x80]);
    // Back with scale 2: 1.0, -2.5, 240.0, NaN.
    let back = read_u16s(&mut dev, 0, d + 16, 4);
    assert_eq!(&back[..3], [0x3C00, 0xC100, 0x5B80]);
    assert!(f16::from_bits(back[3]).is_nan());
}

#[test]
fn ldcweih_loads_the_first_half_of_the_weight_store_in_16_cycles() {
    let src = include_str!("../programs/ldcweih.s");
    let (mut dev, prog, r) = run_one(src);
    assert_eq!(r.expect("runs").cycle, 296);
    let d = prog.sym("data");
    // f16amp sums all 16 k: 8 × 2.0 from `wb`'s first half + 8 × 3.0 left from `wa` = 40.0.
    assert_eq!(read_u16s(&mut dev, 0, d + 8, 16), [0x5100; 16]);
    // f32amp reads only the first 256 bytes: 16 × 2.0 = 32.0.
    let f32s = read(&mut dev, 0, d + 40, 32);
    for (i, w) in f32s.chunks(4).enumerate() {
        assert_eq!(u32::from_le_bytes(w.try_into().unwrap()), 32f32.to_bits(), "f32 output {i}");
    }
    // Loading the whole store the second time instead: `run` issues 16 cycles later, at 68, and the
    // worker's first slot-0 cycle after it is 72 (not 70): 18 cycles later in all.
    let (_, _, full) = run_one(&src.replace("ldcweih $m1", "ldcwei $m1"));
    assert_eq!(full.expect("runs").cycle, 296 + 18);
}

/// The AMP program for `workers` workers (1 or 6) and `rows` rows each; returns the device, the
/// device cycles of the run and whether every output matched the hand-written reference.
fn amp_block(workers: usize, rows: usize, threads: usize) -> (u64, Vec<Vec<u16>>) {
    let mut src = include_str!("../programs/amp_block.s").to_string();
    if workers == 1 {
        src = src.replace("runall $m0, $m1", "run $m0, $m1");
    }
    let prog = program(&src);
    let mut dev = device(1, threads);
    load(&mut dev, 0, &prog);
    let mut rng = Rng(7);
    let w: Vec<f16> = (0..256).map(|_| rng.f16()).collect();
    let wbytes: Vec<u8> = w.iter().flat_map(|h| h.to_bits().to_le_bytes()).collect();
    dev.write_memory(0, prog.sym("weights"), &wbytes).unwrap();
    let mut expected = Vec::new();
    for k in 0..workers as u32 {
        let (xa, pa, oa) = (0x80000 + k * 0x4000, 0x98000 + k * 0x4000, 0xB0000 + k * 0x4000 + 40);
        let x: Vec<f16> = (0..16 * rows).map(|_| rng.f16()).collect();
        let p: Vec<f16> = (0..16 * rows).map(|_| rng.f16()).collect();
        let to_bytes = |v: &[f16]| v.iter().flat_map(|h| h.to_bits().to_le_bytes()).collect::<Vec<u8>>();
        dev.write_memory(0, xa, &to_bytes(&x)).unwrap();
        dev.write_memory(0, pa, &to_bytes(&p)).unwrap();
        let desc = [xa, pa, oa - 40, rows as u32 + 1];
        let desc: Vec<u8> = desc.iter().flat_map(|v| v.to_le_bytes()).collect();
        dev.write_memory(0, prog.sym("desc") + 16 * k, &desc).unwrap();
        // Reference, written from docs/target.md §4.4: per phase, partials first, then the
        // pairwise-summed four products, all in f32; round to f16 at the end.
        let mut out = Vec::new();
        for r in 0..rows {
            for n in 0..16 {
                let mut acc = 0f32;
                for ph in 0..4 {
                    if n / 4 == ph {
                        acc += p[16 * r + n].to_f32();
                    }
                    let pr: Vec<f32> = (0..4)
                        .map(|i| x[16 * r + 4 * ph + i].to_f32() * w[(4 * ph + i) * 16 + n].to_f32())
                        .collect();
                    acc += (pr[0] + pr[1]) + (pr[2] + pr[3]);
                }
                out.push(f16::from_f32(acc).to_bits());
            }
        }
        expected.push((oa, out));
    }
    let r = dev.run_to_host_sync().expect("runs");
    let got: Vec<Vec<u16>> = expected.iter().map(|(oa, e)| read_u16s(&mut dev, 0, *oa, e.len())).collect();
    for (k, ((_, e), g)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(e, g, "worker {k} output");
    }
    (r.cycle, got)
}

#[test]
fn amp_reaches_64_macs_per_cycle_with_six_workers() {
    // Issues per worker: 10 setup + 4(R+1) bundles + 2 = 4R + 16; six workers start at 36..41 and
    // the host sync releases at 6(4R+16) + 127 (derivation in amp_block.s and the target model).
    let (c100, _) = amp_block(6, 100, 1);
    let (c200, _) = amp_block(6, 200, 1);
    assert_eq!(c100, 6 * (4 * 100 + 16) + 127);
    assert_eq!(c200, 6 * (4 * 200 + 16) + 127);
    // Steady state: 100 more rows on each of six workers, 256 MACs per row.
    let macs_per_cycle = (6 * 100 * 256) as f64 / (c200 - c100) as f64;
    assert_eq!(macs_per_cycle, 64.0);
    // Whole run including weight load, setup and both syncs: 307200 MACs in 5023 cycles = 61.2.
    assert!((6 * 200 * 256) as f64 / c200 as f64 > 61.0);
}

#[test]
fn amp_with_one_worker_gets_a_sixth() {
    let (c100, _) = amp_block(1, 100, 1);
    let (c200, _) = amp_block(1, 200, 1);
    assert_eq!(c100, 6 * (4 * 100 + 16) + 122);
    let macs_per_cycle = (100 * 256) as f64 / (c200 - c100) as f64;
    assert!((macs_per_cycle - 64.0 / 6.0).abs() < 1e-9, "{macs_per_cycle}");
}

#[test]
fn host_page_round_trip() {
    let prog = program(include_str!("../programs/host_page.s"));
    let mut dev = device(1, 1);
    load(&mut dev, 0, &prog);
    let first = dev.run_to_host_sync().unwrap();
    assert_eq!((first.state, first.cycle), (StopState::HostSync, 90));
    let page: Vec<u8> = (0..1024u32).flat_map(|i| (i * 7).to_le_bytes()).collect();
    assert_eq!(page.len(), ipu_core::target::HOST_PAGE_BYTES);
    dev.write_memory(0, prog.sym("page"), &page).unwrap();
    let second = dev.run_to_host_sync().unwrap();
    assert_eq!((second.cycles, second.cycle), (5212, 5302));
    let back = read(&mut dev, 0, prog.sym("page"), 4096);
    for i in 0..1024usize {
        let v = u32::from_le_bytes(back[4 * i..4 * i + 4].try_into().unwrap());
        assert_eq!(v, i as u32 * 7 + 1, "word {i}");
    }
}
