//! Elementwise ops on their own rows (docs/graph-planner.md "Row ops"): `add`, `sub`, `mul` with
//! NumPy broadcasting, `gelu` (either form) and the functions of `OpKind::Map` (tanh, exp, …), where no matmul before them takes them into its
//! epilogue — the residual add of a layer-normalised stream, a gate, a GeLU after a layernorm.
//! The output's rows (all leading dimensions flattened) are split over tiles as `rows.rs` splits
//! a layernorm's, each row packed to a multiple of four values (8-byte aligned, zero padding, so
//! the padding stays zero: 0 ∘ 0 = 0 and gelu(0) = 0); a tile's rows are split over its six
//! workers, or, with fewer rows than workers, each worker takes a share of every row's columns.
//!
//! Operands: one that varies only along the last axis (a bias `[D]`, `[1, 1, D]`) is held once per
//! tile and read with a row stride of 0; any other is laid out row by row like the output, its
//! rows chosen by the broadcast (`[A, 1, D]` against `[A, B, D]` reads row `a` for each of the B
//! rows); one broadcast along the last axis (`[R, 1]` against `[R, D]`, a scalar) is one f16 per
//! row (4 bytes apart) that the splat kernels spread across the row. The result is written in
//! place over an operand laid out like it where there is one.

use alloc::format;
use alloc::vec;
use alloc::vec::Vec;
use ipu_schema::Direction;

use super::layout::{split, zero};
use super::matmul::gelu_kernel;
use super::redistribute::{word_launch, COPY_MAX_WORDS};
use super::{cost, BindingPlan, Kernel, MemKind, Plan, PlanError, SliceRef, TilePlan, Word};
use crate::graph::{Graph, OpKind};
use crate::target::WORKERS;

/// Read-ahead slack after a streamed operand: the row kernels load two chunks ahead of the
/// chunk they store, one chunk past a row's end.
const READ_AHEAD: u64 = 8;

/// The longest row a row kernel takes: one `rpt` of at most 4095 bundles per row.
const MAX_CHUNKS: u64 = crate::target::RPT_MAX_COUNT as u64;

/// Whether op `op` is planned here: a binary op or a gelu (the stage planner asks after the
/// matmul epilogue declined it).
pub fn is_elementwise(g: &Graph, op: usize) -> bool {
    matches!(g.ops[op].kind, OpKind::Binary { .. } | OpKind::Gelu { .. } | OpKind::Map { .. })
}

/// The rows of a tensor of `shape`: (rows, values per row, bytes per packed row).
fn rows_of(shape: &[u64]) -> (u64, u64, u64) {
    let d = *shape.last().unwrap_or(&1);
    let rows = shape.iter().product::<u64>() / d.max(1);
    (rows, d, d.div_ceil(4) * 8)
}

/// Per worker: rows `[w0, w1)` and 4-value chunks `[c0, c1)` of a tile's `rows` rows of `chunks`
/// chunks — whole rows per worker, or with fewer rows than workers a share of every row.
fn worker_ranges(rows: u64, chunks: u64) -> Vec<(u64, u64, u64, u64)> {
    let w = WORKERS as u64;
    (0..w)
        .map(|k| {
            if rows >= w {
                let (w0, w1) = split(rows, w, k);
                (w0, w1, 0, chunks)
            } else {
                let (c0, c1) = split(chunks, w, k);
                (0, rows, c0, c1)
            }
        })
        .collect()
}

/// How a binary operand is read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Read {
    /// One row for every output row (row stride 0).
    OneRow,
    /// Row by row like the output.
    Rows,
    /// One value per output row (a column `[…, 1]`, 4 bytes per row on the tile), or with
    /// `scalar` one value for all rows: splat across the row by the splat kernels.
    Splat { scalar: bool },
}

impl Read {
    /// Bytes per row in the tile buffer (0: one row or value for all) given the output's.
    fn step(self, stride: u64) -> u64 {
        match self {
            Read::OneRow | Read::Splat { scalar: true } => 0,
            Read::Rows => stride,
            Read::Splat { scalar: false } => 4,
        }
    }
}

/// For output row `row` of `out` (leading dimensions), the row of an operand of shape `from`
/// (right-aligned leading dimensions, broadcast where they are 1).
fn operand_row(out: &[u64], from: &[u64], mut row: u64) -> u64 {
    let (lo, lf) = (out.len(), from.len());
    let mut index = 0u64;
    let mut scale = 1u64;
    for axis in (0..lo).rev() {
        let i = row % out[axis];
        row /= out[axis];
        // The operand's axis aligned with this one, if it has it.
        if let Some(fa) = (axis + lf).checked_sub(lo) {
            let dim = from[fa];
            if dim != 1 {
                index += i * scale;
            }
            scale *= dim;
        }
    }
    index
}

/// Plan op `op` (`add`, `sub` or `mul`) of `g` on up to `tiles` tiles.
pub fn binary(g: &Graph, op: usize, tiles: usize) -> Result<Plan, PlanError> {
    let OpKind::Binary { op: kind, a, b } = g.ops[op].kind else {
        return Err(PlanError::Unsupported(op, "not a binary op".into()));
    };
    let out = g.tensor(g.ops[op].output);
    let (rows_total, d, stride) = rows_of(&out.shape);
    let chunks = stride / 8;
    let lead = &out.shape[..out.shape.len().saturating_sub(1)];
    let mut reads = [Read::Rows; 2];
    for (k, &t) in [a, b].iter().enumerate() {
        let x = g.tensor(t);
        if *x.shape.last().unwrap_or(&1) != d {
            // NumPy broadcasting: the operand's last axis is 1 against the result's `d > 1`.
            reads[k] = Read::Splat { scalar: x.elements() == 1 };
        } else if x.elements() == d && rows_total > 1 {
            reads[k] = Read::OneRow;
        }
    }
    if chunks > MAX_CHUNKS {
        return Err(PlanError::Unsupported(
            op,
            format!("rows of {d} values are longer than the row kernels take ({} values)", 4 * MAX_CHUNKS),
        ));
    }
    // The operand streamed along the row (the other one when one is splat) and the kernel.
    let splat = reads.iter().position(|r| matches!(r, Read::Splat { .. }));
    let stream = match splat {
        Some(k) => 1 - k,
        None => usize::from(reads[0] != Read::Rows),
    };
    let kernel = match splat {
        Some(k) => Kernel::SplatF16(kind, k == 0),
        None => Kernel::BinaryF16(kind),
    };
    // The result is written over an operand laid out like it — unless that operand is bound by
    // the host and the result is read by it: the host fills outputs with NaN before a run (a
    // result nothing wrote must not pass) and would overwrite the operand.
    // `x ∘ x` (a square): one buffer read as both operands (a redistribution cannot deliver
    // the same bytes to one tile twice, and there is no need to).
    let same = a == b;
    let buffer = |k: usize| ["A", "B"][if same { 0 } else { k }];
    let y = g.ops[op].output;
    let own = reads[stream] != Read::Rows || separate_output(g, [a, b][stream], y);
    let out_buffer = if own { "Y" } else { buffer(stream) };
    let tm = (tiles as u64).min(rows_total).max(1);
    let row_bytes = (2 * d) as u32;
    let mut plans = vec![TilePlan::default(); tiles];
    let mut slices: [Vec<SliceRef>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for i in 0..tm {
        let (r0, r1) = split(rows_total, tm, i);
        let (tile, rows) = (i as u16, r1 - r0);
        let p = &mut plans[tile as usize];
        for (k, (&t, name)) in [a, b].iter().zip(["A", "B"]).enumerate() {
            if same && k == 1 {
                continue;
            }
            let from = &g.tensor(t).shape;
            let from_lead = &from[..from.len().saturating_sub(1)];
            let (bytes, tile_stride, tensor_row) = match reads[k] {
                Read::OneRow => (stride + READ_AHEAD, stride, row_bytes),
                Read::Rows => (rows * stride + READ_AHEAD, stride, row_bytes),
                Read::Splat { scalar: true } => (4, 4, 2),
                Read::Splat { scalar: false } => (rows * 4, 4, 2),
            };
            p.buffers.push(zero(name, bytes, MemKind::Tensor));
            if reads[k].step(stride) == 0 {
                slices[k].push(row_slice(tile, name, 0, 0, 1, tensor_row, tile_stride));
                continue;
            }
            // Runs of output rows that read consecutive operand rows.
            let mut r = r0;
            while r < r1 {
                let first = operand_row(lead, from_lead, r);
                let mut n = 1;
                while r + n < r1 && operand_row(lead, from_lead, r + n) == first + n {
                    n += 1;
                }
                let at = ((r - r0) * tile_stride) as u32;
                slices[k].push(row_slice(
                    tile,
                    name,
                    at,
                    first * tensor_row as u64,
                    n,
                    tensor_row,
                    tile_stride,
                ));
                r += n;
            }
        }
        if own {
            p.buffers.push(zero("Y", rows * stride, MemKind::Tensor));
        }
        slices[2].push(row_slice(tile, out_buffer, 0, r0 * row_bytes as u64, rows, row_bytes, stride));
        let mut words = Vec::new();
        let mut issues = 0;
        for (w0, w1, c0, c1) in worker_ranges(rows, chunks) {
            let at = |k: usize| {
                let step = reads[k].step(stride);
                let column = if matches!(reads[k], Read::Splat { .. }) { 0 } else { c0 * 8 };
                Word::Sym(buffer(k).into(), (w0 * step + column) as u32)
            };
            let out_at = Word::Sym(out_buffer.into(), (w0 * stride + c0 * 8) as u32);
            let n = if c1 > c0 { w1 - w0 } else { 0 };
            let Some(k) = splat else {
                words.extend([
                    at(0),
                    Word::Const(reads[0].step(stride) as u32),
                    at(1),
                    Word::Const(reads[1].step(stride) as u32),
                    out_at,
                    Word::Const(stride as u32),
                    Word::Const(n as u32),
                    Word::Const((c1 - c0) as u32),
                ]);
                issues = issues.max(cost::binary_rows_issues(n, c1 - c0));
                continue;
            };
            // The last chunk's lanes: all four, or with a partial last chunk of the row only
            // its values, so that the padding stays 0 ∘ 0 = 0.
            let lanes = if c1 == chunks && d % 4 != 0 { d % 4 } else { 4 };
            let mask = |lo: u64| match lanes.saturating_sub(lo) {
                0 => 0u32,
                1 => 0xFFFF,
                _ => u32::MAX,
            };
            words.extend([
                at(stream),
                Word::Const(reads[stream].step(stride) as u32),
                at(k),
                Word::Const(reads[k].step(stride) as u32),
                out_at,
                Word::Const(stride as u32),
                Word::Const(n as u32),
                Word::Const((c1 - c0) as u32),
                Word::Const(mask(0)),
                Word::Const(mask(2)),
            ]);
            words.extend((0..6).map(|_| Word::Const(0)));
            issues = issues.max(cost::splat_rows_issues(n, c1 - c0));
        }
        p.launch(super::op_phase(g, op), kernel, "dew", words, issues);
    }
    let [sa, sb, sy] = slices;
    let bind = |t, direction, slices| BindingPlan { tensor: t, direction, transpose: false, slices };
    let mut bindings = vec![bind(a, Direction::Input, sa)];
    if !same {
        bindings.push(bind(b, Direction::Input, sb));
    }
    bindings.push(bind(y, Direction::Output, sy));
    let mut grids = vec![[1, 1, 1]; g.ops.len()];
    grids[op] = [tm as u32, 1, 1];
    let mapping = format!(
        "{} rows={rows_total} D={d} tiles={tm} rows per tile ≤ {}",
        kind.name(),
        rows_total.div_ceil(tm)
    );
    Ok(Plan::compute_only(plans, bindings, tm as u32, mapping, grids))
}

/// Whether the result must not be written over `operand`: the host binds the operand and reads
/// the result (it fills outputs with NaN before a run, so that a result nothing wrote fails), or
/// other stages read the operand from the bytes this stage is given (`Graph::shared`).
fn separate_output(g: &Graph, operand: crate::graph::TensorId, result: crate::graph::TensorId) -> bool {
    (g.is_source(operand) && g.outputs.contains(&result)) || g.shared.contains(&operand)
}

/// The launch of a gelu or map kernel for a worker's chunks `[c0, c1)` of `rows` rows of `d`
/// values: the kernel, the chunks its loop takes, its constant words and its issues. `map_f16`
/// does the `d % 4` values of a row's last chunk one by one after its loop (`map.rs`), so its loop
/// stops before that chunk.
fn unary_launch(kind: &OpKind, d: u64, c0: u64, c1: u64, rows: u64) -> (Kernel, u64, Vec<Word>, u64) {
    match *kind {
        OpKind::Map { func, exponent, .. } => {
            let tail = if c1 == d.div_ceil(4) && c1 > c0 { d % 4 } else { 0 };
            let full = c1 - c0 - u64::from(tail > 0);
            let (k, words, issues) = super::map::kernel(func, exponent, full, tail, rows);
            (k, full, words, issues)
        }
        OpKind::Gelu { form, .. } => {
            let (k, words, issues) = gelu_kernel(form, c1 - c0, rows);
            (k, c1 - c0, words, issues)
        }
        _ => unreachable!("unary() plans gelu and map ops only"),
    }
}

/// Plan op `op` (a gelu or an elementwise function, `OpKind::Map`) of `g` on up to `tiles` tiles,
/// in place over its rows (after a copy when the input and the result are both the host's,
/// `separate_output`).
pub fn unary(g: &Graph, op: usize, tiles: usize) -> Result<Plan, PlanError> {
    let kind = &g.ops[op].kind;
    let (input, what) = match *kind {
        OpKind::Gelu { input, .. } => (input, "gelu"),
        OpKind::Map { input, func, .. } => (input, func.name()),
        _ => return Err(PlanError::Unsupported(op, "not a gelu or an elementwise function".into())),
    };
    let (rows_total, d, stride) = rows_of(&g.tensor(input).shape);
    let chunks = stride / 8;
    let tm = (tiles as u64).min(rows_total).max(1);
    let row_bytes = (2 * d) as u32;
    let mut plans = vec![TilePlan::default(); tiles];
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    let kernel = unary_launch(kind, d, 0, 0, 0).0;
    let out = if separate_output(g, input, g.ops[op].output) { "Y" } else { "X" };
    for i in 0..tm {
        let (r0, r1) = split(rows_total, tm, i);
        let (tile, rows) = (i as u16, r1 - r0);
        let p = &mut plans[tile as usize];
        p.buffers.push(zero("X", rows * stride, MemKind::Tensor));
        if out == "Y" {
            p.buffers.push(zero("Y", rows * stride, MemKind::Tensor));
        }
        xs.push(row_slice(tile, "X", 0, r0 * row_bytes as u64, rows, row_bytes, stride));
        ys.push(row_slice(tile, out, 0, r0 * row_bytes as u64, rows, row_bytes, stride));
        let mut words = Vec::new();
        let mut issues = 0;
        for (w0, w1, c0, c1) in worker_ranges(rows, chunks) {
            let (_, loop_chunks, constants, n) = unary_launch(kind, d, c0, c1, w1 - w0);
            words.extend([
                Word::Sym(out.into(), (w0 * stride + c0 * 8) as u32),
                Word::Const(loop_chunks as u32),
                Word::Const(stride as u32),
                Word::Const((w1 - w0) as u32),
            ]);

            words.extend(constants);
            issues = issues.max(n);
        }
        p.steps.push(super::Step::Phase(super::op_phase(g, op)));
        if out == "Y" {
            // The gelu and map kernels work in place: the input is copied to the output first.
            let words = (rows * stride / 4) as u32;
            let segs = (0..words)
                .step_by(COPY_MAX_WORDS as usize)
                .map(|w| {
                    let n = (words - w).min(COPY_MAX_WORDS);
                    (n, vec![Word::Sym("X".into(), 4 * w), Word::Sym("Y".into(), 4 * w)])
                })
                .collect();
            let (bufs, copy_issues) = word_launch(segs, cost::copy_issues, "cl", "cd");
            p.buffers.extend(bufs);
            p.steps.push(super::Step::RunAll(Kernel::CopyWords, "cd".into(), copy_issues.into()));
        }
        p.run(kernel, "dew", words, issues);
    }
    let bind = |t, direction, slices| BindingPlan { tensor: t, direction, transpose: false, slices };
    let bindings = vec![bind(input, Direction::Input, xs), bind(g.ops[op].output, Direction::Output, ys)];
    let mut grids = vec![[1, 1, 1]; g.ops.len()];
    grids[op] = [tm as u32, 1, 1];
    let mapping =
        format!("{what} rows={rows_total} D={d} tiles={tm} rows per tile ≤ {}", rows_total.div_ceil(tm));
    Ok(Plan::compute_only(plans, bindings, tm as u32, mapping, grids))
}

/// `rows` packed rows of `row_bytes` tensor bytes from `tensor_offset`, at `offset` in `buffer`.
fn row_slice(
    tile: u16,
    buffer: &str,
    offset: u32,
    tensor_offset: u64,
    rows: u64,
    row_bytes: u32,
    stride: u64,
) -> SliceRef {
    SliceRef {
        tile,
        buffer: buffer.into(),
        offset,
        tensor_offset,
        rows: rows as u32,
        row_bytes,
        tensor_stride: row_bytes as u64,
        tile_stride: stride as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_rows_follow_numpy() {
        // [2, 3, D] against [2, 1, D]: rows 0..3 read row 0, rows 3..6 read row 1.
        let rows: Vec<u64> = (0..6).map(|r| operand_row(&[2, 3], &[2, 1], r)).collect();
        assert_eq!(rows, [0, 0, 0, 1, 1, 1]);
        // Against [3, D] (right-aligned): row r reads r mod 3.
        let rows: Vec<u64> = (0..6).map(|r| operand_row(&[2, 3], &[3], r)).collect();
        assert_eq!(rows, [0, 1, 2, 0, 1, 2]);
        // Same shape: the identity.
        let rows: Vec<u64> = (0..6).map(|r| operand_row(&[2, 3], &[2, 3], r)).collect();
        assert_eq!(rows, [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn few_rows_share_columns_among_workers() {
        let r = worker_ranges(2, 12);
        assert!(r.iter().all(|&(w0, w1, _, _)| (w0, w1) == (0, 2)));
        assert_eq!(r.iter().map(|&(_, _, c0, c1)| c1 - c0).sum::<u64>(), 12);
        let r = worker_ranges(13, 5);
        assert_eq!(r.iter().map(|&(w0, w1, _, _)| w1 - w0).sum::<u64>(), 13);
    }
}
