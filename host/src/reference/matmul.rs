//! The device-precision matmul (docs/target.md §4.4): the AMP's summation order and rounding
//! points are fixed per output element, so the work can be blocked and vectorised across output
//! columns without changing a bit. [`matmul_device`] does that — operands decoded once into
//! zero-padded f32, 4 rows × 8 columns summed in registers (`amp_order`), row blocks in
//! parallel — and [`matmul_device_scalar`] is the element-by-element specification it is
//! tested against (`tests/tests/reference_speed.rs`).

// Kernels index rows, lanes and phases by number: the numbers are the layout.
#![allow(clippy::needless_range_loop)]

use super::amp_order::{Kernel, LANES, ROWS};
use super::{fmt, is_fp8, round, HostTensor};
use half::f16;
use ipu_core::plan::matmul::split;
use ipu_core::{f16bits, fp8};
use ipu_schema::DType;
use rayon::prelude::*;

/// A matmul as the reference evaluates it.
pub struct MatMulArgs<'a> {
    /// Left operand (`[.., M, K]`, or `[.., K, M]` with `ta`); FP8 as codes.
    pub a: &'a HostTensor,
    /// Right operand (`[.., K, N]`, or `[.., N, K]` with `tb`).
    pub b: &'a HostTensor,
    /// `a` is stored transposed.
    pub ta: bool,
    /// `b` is stored transposed.
    pub tb: bool,
    /// Partial-sum type: every K block's result is rounded to it.
    pub acc: DType,
    /// K-split pieces (the grid's `tk`).
    pub tk: u64,
    /// The K-split reduction rounds (`plan::matmul::reduction_rounds`).
    pub rounds: Vec<Vec<(u64, Vec<u64>)>>,
    /// FP8: the AMP's product scale `2^iscl` (sum of the operands' scales).
    pub iscl: i32,
    /// Scalar applied last, the product rounded to f16.
    pub alpha: Option<f32>,
}

/// Batched `C = alpha · A·B` as the device computes it, one element at a time: the readable
/// specification of the summation order, kept to check [`matmul_device`] against, bit for bit.
pub fn matmul_device_scalar(p: &MatMulArgs<'_>) -> (Vec<f32>, Vec<u64>) {
    let (a, b) = (p.a, p.b);
    let ra = a.shape.len();
    let rb = b.shape.len();
    let (m, k) = if p.ta { (a.shape[ra - 1], a.shape[ra - 2]) } else { (a.shape[ra - 2], a.shape[ra - 1]) };
    let n = if p.tb { b.shape[rb - 2] } else { b.shape[rb - 1] };
    let batch: u64 = a.shape[..ra - 2].iter().product::<u64>().max(b.shape[..rb - 2].iter().product());
    let a_batched = ra > 2;
    let b_batched = rb > 2;
    let f8 = is_fp8(a.dtype);
    let (fa, fb) = (fmt(a.dtype), fmt(b.dtype));
    let val_a = |bi: u64, i: u64, kk: u64| -> f32 {
        if kk >= k {
            return 0.0;
        }
        let base = if a_batched { bi * m * k } else { 0 };
        let v =
            if p.ta { a.data[(base + kk * m + i) as usize] } else { a.data[(base + i * k + kk) as usize] };
        if f8 {
            fp8::to_f32(v as u8, fa)
        } else {
            v
        }
    };
    let val_b = |bi: u64, kk: u64, j: u64| -> f32 {
        if kk >= k {
            return 0.0;
        }
        let base = if b_batched { bi * k * n } else { 0 };
        let v =
            if p.tb { b.data[(base + j * k + kk) as usize] } else { b.data[(base + kk * n + j) as usize] };
        if f8 {
            fp8::to_f32(v as u8, fb)
        } else {
            v
        }
    };
    let be = if f8 { 32 } else { 16 };
    let kb = k.div_ceil(be);
    let cols = if p.acc == DType::F32 { 8 } else { 16 };
    let group = cols / 4;
    let rows: Vec<Vec<f32>> = (0..batch * m)
        .into_par_iter()
        .map(|row| {
            let (bi, i) = (row / m, row % m);
            (0..n)
                .map(|j| {
                    let pin_phase = (j % cols) / group;
                    let mut pieces = Vec::with_capacity(p.tk as usize);
                    for l in 0..p.tk {
                        let (kb0, kb1) = split(kb, p.tk, l);
                        let mut pin = 0f32;
                        for blk in kb0..kb1 {
                            let mut acc = 0f32;
                            for ph in 0..4 {
                                if ph == pin_phase {
                                    acc += pin;
                                }
                                if f8 {
                                    let base = blk * 32 + 8 * ph;
                                    let pr: [f32; 8] = std::array::from_fn(|q| {
                                        val_a(bi, i, base + q as u64) * val_b(bi, base + q as u64, j)
                                    });
                                    let s = ((pr[0] + pr[1]) + (pr[2] + pr[3]))
                                        + ((pr[4] + pr[5]) + (pr[6] + pr[7]));
                                    acc += fp8::scale_pow2(s, p.iscl);
                                } else {
                                    let base = blk * 16 + 4 * ph;
                                    let pr: [f32; 4] = std::array::from_fn(|q| {
                                        val_a(bi, i, base + q as u64) * val_b(bi, base + q as u64, j)
                                    });
                                    acc += (pr[0] + pr[1]) + (pr[2] + pr[3]);
                                }
                            }
                            pin = round(acc, p.acc);
                        }
                        pieces.push(pin);
                    }
                    // The K-split pieces are added in the planner's reduction tree.
                    for step in &p.rounds {
                        for (recv, senders) in step {
                            for s in senders {
                                pieces[*recv as usize] =
                                    round(pieces[*recv as usize] + pieces[*s as usize], p.acc);
                            }
                        }
                    }
                    let total = pieces[0];
                    match p.alpha {
                        Some(al) => f16::from_f32(total * al).to_f32(),
                        None => total,
                    }
                })
                .collect()
        })
        .collect();
    let mut shape: Vec<u64> = if a_batched { a.shape[..ra - 2].to_vec() } else { b.shape[..rb - 2].to_vec() };
    shape.extend([m, n]);
    (rows.concat(), shape)
}

/// f32 → nearest f16 (ties to even) → f32, as `half::f16::from_f32(x).to_f32()`, branch-free
/// (`ipu_core::f16bits`, the simulator's own conversions) so that loops over it vectorise.
#[inline]
pub fn round_f16(x: f32) -> f32 {
    f16bits::to_f32(f16bits::from_f32(x))
}

/// Batched `C = alpha · A·B` as the device computes it (bit-identical to
/// [`matmul_device_scalar`]): A decoded once into zero-padded f32 rows, B into panels of
/// [`LANES`] columns (`[panel][k][LANES]`), and each [`ROWS`] × [`LANES`] block of the output
/// summed in registers by [`Kernel`] (`amp_order`), row blocks in parallel.
pub fn matmul_device(p: &MatMulArgs<'_>) -> (Vec<f32>, Vec<u64>) {
    let (a, b) = (p.a, p.b);
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let (m, k) = if p.ta { (a.shape[ra - 1], a.shape[ra - 2]) } else { (a.shape[ra - 2], a.shape[ra - 1]) };
    let n = if p.tb { b.shape[rb - 2] } else { b.shape[rb - 1] } as usize;
    let batch = a.shape[..ra - 2].iter().product::<u64>().max(b.shape[..rb - 2].iter().product()) as usize;
    let (a_batched, b_batched) = (ra > 2, rb > 2);
    let f8 = is_fp8(a.dtype);
    let be: usize = if f8 { 32 } else { 16 };
    let kb = (k as usize).div_ceil(be);
    let kp = kb * be;
    let (m, k) = (m as usize, k as usize);
    let decode = |t: &HostTensor, v: f32| if f8 { fp8::to_f32(v as u8, fmt(t.dtype)) } else { v };
    // A as [batch][m][kp], zero-padded in K, decoded once.
    let a_batches = if a_batched { batch } else { 1 };
    let mut af = vec![0f32; a_batches * m * kp];
    for bi in 0..a_batches {
        for i in 0..m {
            for kk in 0..k {
                let v = if p.ta { a.data[bi * m * k + kk * m + i] } else { a.data[bi * m * k + i * k + kk] };
                af[(bi * m + i) * kp + kk] = decode(a, v);
            }
        }
    }
    // B as [batch][panel][kp][LANES], zero-padded in K and in the last panel's columns.
    let panels = n.div_ceil(LANES);
    let b_batches = if b_batched { batch } else { 1 };
    let mut bp = vec![0f32; b_batches * panels * kp * LANES];
    for bi in 0..b_batches {
        for kk in 0..k {
            for j in 0..n {
                let v = if p.tb { b.data[bi * k * n + j * k + kk] } else { b.data[bi * k * n + kk * n + j] };
                bp[((bi * panels + j / LANES) * kp + kk) * LANES + j % LANES] = decode(b, v);
            }
        }
    }
    // A column's pin phase repeats every `cols` columns (docs/target.md §4.4); per phase, all
    // ones in the panel's lanes whose pin phase it is.
    let cols = if p.acc == DType::F32 { 8 } else { 16 };
    let masks = |panel: usize| -> [[u32; LANES]; 4] {
        core::array::from_fn(|ph| {
            core::array::from_fn(
                |c| if ((panel * LANES + c) % cols) / (cols / 4) == ph { u32::MAX } else { 0 },
            )
        })
    };
    let scale = if f8 { (fp8::pow2(p.iscl / 2), fp8::pow2(p.iscl - p.iscl / 2)) } else { (1.0, 1.0) };
    let zero_row = vec![0f32; kp];
    let tk = p.tk as usize;
    let mut out = vec![0f32; batch * m * n];
    out.par_chunks_mut((m * n).max(1)).enumerate().for_each(|(bi, entry)| {
        let a_rows = &af[if a_batched { bi } else { 0 } * m * kp..][..m * kp];
        let b_panels = &bp[if b_batched { bi } else { 0 } * panels * kp * LANES..][..panels * kp * LANES];
        entry.par_chunks_mut(ROWS * n.max(1)).enumerate().for_each(|(chunk, dst)| {
            let i0 = chunk * ROWS;
            let rows = dst.len() / n.max(1);
            let row: [&[f32]; ROWS] = core::array::from_fn(|r| {
                if r < rows {
                    &a_rows[(i0 + r) * kp..(i0 + r + 1) * kp]
                } else {
                    &zero_row[..]
                }
            });
            for panel in 0..panels {
                let b_panel = &b_panels[panel * kp * LANES..(panel + 1) * kp * LANES];
                let mut pieces = vec![[[0f32; LANES]; ROWS]; tk];
                for (l, piece) in pieces.iter_mut().enumerate() {
                    let (kb0, kb1) = split(kb as u64, p.tk, l as u64);
                    let (k0, k1) = (kb0 as usize * be, kb1 as usize * be);
                    let kernel = Kernel {
                        a: core::array::from_fn(|r| &row[r][k0..k1]),
                        b: &b_panel[k0 * LANES..k1 * LANES],
                        blocks: (kb1 - kb0) as usize,
                        masks: masks(panel),
                        scale,
                        round16: p.acc == DType::F16,
                    };
                    *piece = if f8 { kernel.run::<8>() } else { kernel.run::<4>() };
                }
                // K-split pieces, added in the planner's reduction tree.
                for step in &p.rounds {
                    for (recv, senders) in step {
                        for s in senders {
                            for r in 0..ROWS {
                                for c in 0..LANES {
                                    let v = pieces[*recv as usize][r][c] + pieces[*s as usize][r][c];
                                    pieces[*recv as usize][r][c] = round(v, p.acc);
                                }
                            }
                        }
                    }
                }
                for r in 0..rows {
                    for c in 0..LANES.min(n - panel * LANES) {
                        let total = pieces[0][r][c];
                        dst[r * n + panel * LANES + c] = match p.alpha {
                            Some(al) => round_f16(total * al),
                            None => total,
                        };
                    }
                }
            }
        });
    });
    let mut shape: Vec<u64> = if a_batched { a.shape[..ra - 2].to_vec() } else { b.shape[..rb - 2].to_vec() };
    shape.extend([m as u64, n as u64]);
    (out, shape)
}
