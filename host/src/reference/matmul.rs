//! The device-precision matmul (docs/target.md §4.4): the AMP's summation order and rounding
//! points are fixed per output element, so the work can be blocked and vectorised across output
//! columns without changing a bit. [`matmul_device`] does that — rows in parallel blocks of four,
//! columns in chunks of 256 whose inner loops the compiler vectorises, operands decoded once into
//! zero-padded f32 — and [`matmul_device_scalar`] is the element-by-element specification it is
//! tested against (`tests/tests/reference_speed.rs`).

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

/// Rows of the output computed together (they share every load of B).
const ROWS: usize = 4;
/// Output columns per chunk (accumulators stay in L1).
const COLS: usize = 256;

/// Round a slice to the accumulation type (f16 partials round after every block of K).
fn round_all(v: &mut [f32], acc: DType) {
    if acc == DType::F16 {
        v.iter_mut().for_each(|x| *x = round_f16(*x));
    }
}

/// Batched `C = alpha · A·B` as the device computes it (bit-identical to
/// [`matmul_device_scalar`]).
pub fn matmul_device(p: &MatMulArgs<'_>) -> (Vec<f32>, Vec<u64>) {
    let (a, b) = (p.a, p.b);
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let (m, k) = if p.ta { (a.shape[ra - 1], a.shape[ra - 2]) } else { (a.shape[ra - 2], a.shape[ra - 1]) };
    let n = if p.tb { b.shape[rb - 2] } else { b.shape[rb - 1] } as usize;
    let batch: u64 = a.shape[..ra - 2].iter().product::<u64>().max(b.shape[..rb - 2].iter().product());
    let (a_batched, b_batched) = (ra > 2, rb > 2);
    let f8 = is_fp8(a.dtype);
    let be: usize = if f8 { 32 } else { 16 };
    let kb = (k as usize).div_ceil(be);
    let kp = kb * be;
    let (m, k) = (m as usize, k as usize);
    let decode = |t: &HostTensor, v: f32| if f8 { fp8::to_f32(v as u8, fmt(t.dtype)) } else { v };
    // A as [batch][m][kp] and B as [batch][kp][n], zero-padded in K, decoded once.
    let a_batches = if a_batched { batch as usize } else { 1 };
    let b_batches = if b_batched { batch as usize } else { 1 };
    let mut af = vec![0f32; a_batches * m * kp];
    for bi in 0..a_batches {
        for i in 0..m {
            for kk in 0..k {
                let v = if p.ta { a.data[bi * m * k + kk * m + i] } else { a.data[bi * m * k + i * k + kk] };
                af[(bi * m + i) * kp + kk] = decode(a, v);
            }
        }
    }
    let mut bf = vec![0f32; b_batches * kp * n];
    for bi in 0..b_batches {
        for kk in 0..k {
            for j in 0..n {
                let v = if p.tb { b.data[bi * k * n + j * k + kk] } else { b.data[bi * k * n + kk * n + j] };
                bf[(bi * kp + kk) * n + j] = decode(b, v);
            }
        }
    }
    let cols = if p.acc == DType::F32 { 8 } else { 16 };
    let pin_phase: Vec<u8> = (0..n).map(|j| ((j % cols) / (cols / 4)) as u8).collect();
    let total_rows = batch as usize * m;
    let mut out = vec![0f32; total_rows * n];
    out.par_chunks_mut(ROWS * n.max(1)).enumerate().for_each(|(chunk, dst)| {
        let row0 = chunk * ROWS;
        let rows = dst.len() / n.max(1);
        let row_a: Vec<&[f32]> = (0..rows)
            .map(|r| {
                let (bi, i) = ((row0 + r) / m, (row0 + r) % m);
                let bi = if a_batched { bi } else { 0 };
                &af[(bi * m + i) * kp..(bi * m + i + 1) * kp]
            })
            .collect();
        // Rows of one chunk may straddle two batch entries: B per row.
        let row_b: Vec<&[f32]> = (0..rows)
            .map(|r| {
                let bi = if b_batched { (row0 + r) / m } else { 0 };
                &bf[bi * kp * n..(bi + 1) * kp * n]
            })
            .collect();
        for j0 in (0..n).step_by(COLS) {
            let jn = COLS.min(n - j0);
            let pp = &pin_phase[j0..j0 + jn];
            let mut pieces = vec![0f32; p.tk as usize * rows * jn];
            for l in 0..p.tk {
                let (kb0, kb1) = split(kb as u64, p.tk, l);
                let pin_all = &mut pieces[l as usize * rows * jn..(l as usize + 1) * rows * jn];
                let mut acc = vec![0f32; rows * jn];
                for blk in kb0 as usize..kb1 as usize {
                    acc.iter_mut().for_each(|x| *x = 0.0);
                    for ph in 0..4u8 {
                        for r in 0..rows {
                            let (acc_r, pin_r) =
                                (&mut acc[r * jn..(r + 1) * jn], &pin_all[r * jn..(r + 1) * jn]);
                            for ((x, pin), q) in acc_r.iter_mut().zip(pin_r).zip(pp) {
                                *x = if *q == ph { *x + *pin } else { *x };
                            }
                            let bm = row_b[r];
                            if f8 {
                                let base = blk * 32 + 8 * ph as usize;
                                let av = &row_a[r][base..base + 8];
                                let bw: [&[f32]; 8] = core::array::from_fn(|q| {
                                    &bm[(base + q) * n + j0..(base + q) * n + j0 + jn]
                                });
                                for (j, x) in acc_r.iter_mut().enumerate().take(jn) {
                                    let pr: [f32; 8] = core::array::from_fn(|q| av[q] * bw[q][j]);
                                    let s = ((pr[0] + pr[1]) + (pr[2] + pr[3]))
                                        + ((pr[4] + pr[5]) + (pr[6] + pr[7]));
                                    *x += if p.iscl == 0 { s } else { fp8::scale_pow2(s, p.iscl) };
                                }
                            } else {
                                let base = blk * 16 + 4 * ph as usize;
                                let (a0, a1, a2, a3) = (
                                    row_a[r][base],
                                    row_a[r][base + 1],
                                    row_a[r][base + 2],
                                    row_a[r][base + 3],
                                );
                                let row = |q: usize| &bm[(base + q) * n + j0..(base + q) * n + j0 + jn];
                                // Zipped so that no index is bounds-checked: the loop vectorises.
                                for ((((x, b0), b1), b2), b3) in
                                    acc_r.iter_mut().zip(row(0)).zip(row(1)).zip(row(2)).zip(row(3))
                                {
                                    *x += (a0 * b0 + a1 * b1) + (a2 * b2 + a3 * b3);
                                }
                            }
                        }
                    }
                    // pin = round(acc): the block's result feeds the next block.
                    round_all(&mut acc, p.acc);
                    pin_all.copy_from_slice(&acc);
                }
            }
            // K-split pieces, added in the planner's reduction tree.
            for step in &p.rounds {
                for (recv, senders) in step {
                    for s in senders {
                        for e in 0..rows * jn {
                            let v =
                                pieces[*recv as usize * rows * jn + e] + pieces[*s as usize * rows * jn + e];
                            pieces[*recv as usize * rows * jn + e] = round(v, p.acc);
                        }
                    }
                }
            }
            for r in 0..rows {
                for j in 0..jn {
                    let total = pieces[r * jn + j];
                    dst[r * n + j0 + j] = match p.alpha {
                        Some(al) => round_f16(total * al),
                        None => total,
                    };
                }
            }
        }
    });
    let mut shape: Vec<u64> = if a_batched { a.shape[..ra - 2].to_vec() } else { b.shape[..rb - 2].to_vec() };
    shape.extend([m as u64, n as u64]);
    (out, shape)
}
