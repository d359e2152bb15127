//! The row-chain planner (docs/kernels.md): graphs whose ops each consume the previous op's
//! output row by row — casts, matmuls against "side" operands (model inputs, or casts of them),
//! softmax — are mapped by (batch entry, block of rows): every tile runs the whole chain for its
//! rows, so the chain needs no exchange. Side operands are loaded per batch entry by the host.

use super::layout::split;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use ipu_schema::{DType, Direction};

pub use super::casts::SideCast;
use super::casts::{cast_desc, own_units};
use super::cost::{self, chain_issues};
use super::exchange::{self, Piece};
use super::{
    BindingPlan, Buffer, Kernel, MemKind, Plan, PlanError, PlanOptions, SliceRef, Step, Sym, TilePlan, Word,
};
use crate::graph::{matmul_shape, Graph, OpKind, TensorId};
use crate::target::{csr, WORKERS};

const SCRATCH: u64 = 40;
/// Two f16 −inf, the softmax kernel's starting lane maxima (its descriptor words 10 and 11).
pub const SOFTMAX_MAX_START: u32 = 0xFC00_FC00;
const SLACK: u64 = 96;
const ROW: u64 = 32;

/// Where a row tensor lives on a tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// `[column block][row][be elements]`: matmul operand (32-byte chunks), cast and softmax output.
    Blocks { be: u64, elt: u64 },
    /// Matmul output: `[column block][worker: 40-byte scratch, rows × 32 bytes]`; `row` is the
    /// bytes between rows once written: 32 as the AMP leaves them, 16 where f32 partial sums were
    /// packed to f16 in place (`cvt_f32_f16`: 8 values per row from each worker's first row).
    Out { cols: u64, elt: u64, row: u64 },
}

fn is_fp8(d: DType) -> bool {
    matches!(d, DType::F8E4M3 | DType::F8E5M2)
}

pub(crate) fn fmt_bit(d: DType) -> u32 {
    u32::from(d == DType::F8E5M2)
}

fn unsupported<T>(op: usize, what: String) -> Result<T, PlanError> {
    Err(PlanError::Unsupported(op, what))
}

/// The row operand of an op.
fn row_input(kind: &OpKind) -> TensorId {
    match kind {
        OpKind::MatMul { a, .. } => *a,
        OpKind::Cast { input } | OpKind::Softmax { input } => *input,
        OpKind::Binary { a, .. } => *a,
        OpKind::Gelu { input, .. }
        | OpKind::Map { input, .. }
        | OpKind::Reduce { input, .. }
        | OpKind::LayerNorm { input, .. }
        | OpKind::Reshape { input }
        | OpKind::Slice { input, .. }
        | OpKind::Transpose { input, .. } => *input,
    }
}

/// Plan a row chain.
pub fn plan(g: &Graph, opts: PlanOptions) -> Result<Plan, PlanError> {
    if let Some(i) =
        g.ops.iter().position(|o| matches!(o.kind, OpKind::LayerNorm { .. } | OpKind::Reduce { .. }))
    {
        return unsupported(
            i,
            "layernorm, reduce_sum and reduce_mean are planned on their own rows (`rows.rs`, `row_reduce.rs`), not inside a \
             row chain"
                .into(),
        );
    }
    if let Some(i) = g.ops.iter().position(|o| {
        matches!(o.kind, OpKind::Reshape { .. } | OpKind::Slice { .. } | OpKind::Transpose { .. })
    }) {
        return unsupported(
            i,
            "reshape, slice and transpose are planned between stages (views and transposes), not inside a row chain"
                .into(),
        );
    }
    if let Some(i) = g
        .ops
        .iter()
        .position(|o| matches!(o.kind, OpKind::Binary { .. } | OpKind::Gelu { .. } | OpKind::Map { .. }))
    {
        return unsupported(
            i,
            "add, sub, mul, gelu and the elementwise functions are planned on their own rows (`elementwise.rs`) or as a matmul's \
             epilogue, not inside a row chain"
                .into(),
        );
    }
    // Side casts: casts whose output is some matmul's right operand.
    let sides: Vec<TensorId> = g
        .ops
        .iter()
        .filter_map(|o| if let OpKind::MatMul { b, .. } = o.kind { Some(b) } else { None })
        .collect();
    let mut side_casts = Vec::new();
    let mut chain = Vec::new();
    for (i, op) in g.ops.iter().enumerate() {
        match op.kind {
            OpKind::Cast { input } if sides.contains(&op.output) => {
                if !is_fp8(g.tensor(op.output).dtype) || g.tensor(input).dtype != DType::F16 {
                    return unsupported(
                        i,
                        "a cast feeding a matmul's `b` must be f16 → FP8 (give an f32 `b` as an f16 input or param instead)"
                            .into(),
                    );
                }
                if !g.is_source(input) {
                    return unsupported(i, "a cast feeding a matmul's `b` must read a model input".into());
                }
                if g.outputs.contains(&op.output) {
                    // Its weight-block copies have no output binding: the partition makes such a
                    // cast a stage of its own.
                    return unsupported(
                        i,
                        "a cast feeding a matmul's `b` is not also an output in a row chain".into(),
                    );
                }
                side_casts.push(i);
            }
            _ => chain.push(i),
        }
    }
    if chain.is_empty() {
        return unsupported(0, "no op produces a row result".into());
    }
    let first = row_input(&g.ops[chain[0]].kind);
    if !g.is_source(first) {
        return unsupported(chain[0], "the first op must read a model input".into());
    }
    for w in chain.windows(2) {
        if row_input(&g.ops[w[1]].kind) != g.ops[w[0]].output {
            return unsupported(w[1], format!(
                "this version plans chains where each op consumes the previous op's output (op {} reads `{}`)",
                w[1], g.tensor(row_input(&g.ops[w[1]].kind)).name));
        }
    }
    for &i in &chain {
        if let OpKind::MatMul { transpose_a, .. } = g.ops[i].kind {
            if transpose_a {
                return unsupported(
                i,
                "transpose_a is not supported in a chain of ops (a chain spreads the rows of `a` over tiles): \
                 store `a` untransposed, or build the matmul alone (a single-matmul model accepts either transpose)"
                    .into(),
            );
            }
        }
    }
    let r0 = g.tensor(first);
    let rank = r0.shape.len();
    if rank == 0 {
        return unsupported(chain[0], format!("`{}` must have rank ≥ 1", r0.name));
    }
    // A vector is one row.
    let lead = |s: &[u64]| -> (Vec<u64>, u64) {
        match s.len() {
            0 | 1 => (Vec::new(), 1),
            r => (s[..r - 2].to_vec(), s[r - 2]),
        }
    };
    let (batch, m) = lead(&r0.shape);
    let nbatch: u64 = batch.iter().product();
    // Row tensors in order: input, then each chain op's output.
    let mut rows_t: Vec<TensorId> = vec![first];
    rows_t.extend(chain.iter().map(|&i| g.ops[i].output));
    for (&t, op) in rows_t.iter().zip(core::iter::once(&chain[0]).chain(chain.iter())) {
        let s = &g.tensor(t).shape;
        if s.len() != rank || lead(s) != (batch.clone(), m) {
            return unsupported(
                *op,
                format!("`{}` must have batch {batch:?} and {m} rows like `{}`", g.tensor(t).name, r0.name),
            );
        }
    }
    for &i in &chain {
        if let OpKind::MatMul { a, b, transpose_b, .. } = g.ops[i].kind {
            let bt = g.tensor(b);
            if matmul_shape(g.tensor(a), bt, false, transpose_b).is_none() {
                return unsupported(i, format!("`{}` does not match the rows' columns", bt.name));
            }
            if bt.shape.len() > 2 && bt.shape[..bt.shape.len() - 2] != batch[..] {
                return unsupported(
                    i,
                    format!("`{}` must have the batch dimensions {batch:?} or none", bt.name),
                );
            }
            if !g.is_source(b) && !side_casts.iter().any(|&c| g.ops[c].output == b) {
                return unsupported(
                    i,
                    format!("`{}` must be a model input or a cast of one (the operand every row tile reads whole)", bt.name),
                );
            }
        }
    }
    // Layouts, from the last op backwards: a tensor's layout is what its consumer reads.
    let cols = |t: TensorId| *g.tensor(t).shape.last().unwrap_or(&1);
    // The partial-sum type of the chain matmul that makes `t`, if one does.
    let accumulation = |t: TensorId| {
        chain.iter().find_map(|&i| match g.ops[i].kind {
            OpKind::MatMul { accumulate, .. } if g.ops[i].output == t => Some(accumulate),
            _ => None,
        })
    };
    let mut layout: BTreeMap<TensorId, Layout> = BTreeMap::new();
    for (pos, &t) in rows_t.iter().enumerate().rev() {
        let dt = g.tensor(t).dtype;
        let own = if let Some(acc) = accumulation(t) {
            // f32 partial sums come in blocks of 8 columns; rounded to f16 they are packed to
            // 16-byte rows in place.
            let cols = if acc == DType::F32 { 8 } else { 16 };
            Layout::Out { cols, elt: dt.size() as u64, row: if acc != dt { 16 } else { ROW } }
        } else if let Some(&next) = chain.get(pos) {
            match g.ops[next].kind {
                OpKind::MatMul { .. } => {
                    Layout::Blocks { be: if is_fp8(dt) { 32 } else { 16 }, elt: dt.size() as u64 }
                }
                OpKind::Cast { .. } => match layout[&g.ops[next].output] {
                    Layout::Blocks { be, .. } => Layout::Blocks { be, elt: dt.size() as u64 },
                    Layout::Out { .. } => unreachable!("casts do not produce Out"),
                },
                // A softmax of a tensor the chain did not make reads it in the layout it
                // writes: `[block][row][16 values]` (the kernel's source rows are 32 bytes apart).
                OpKind::Softmax { .. } if dt == DType::F16 => Layout::Blocks { be: 16, elt: 2 },
                OpKind::Softmax { .. } => {
                    return unsupported(
                        next,
                        format!(
                            "softmax reads f16 values; `{}` is {} (cast it to f16 first)",
                            g.tensor(t).name,
                            dt.name()
                        ),
                    )
                }
                OpKind::Binary { .. }
                | OpKind::Gelu { .. }
                | OpKind::Map { .. }
                | OpKind::Reduce { .. }
                | OpKind::LayerNorm { .. }
                | OpKind::Reshape { .. }
                | OpKind::Slice { .. }
                | OpKind::Transpose { .. } => unreachable!("refused above"),
            }
        } else {
            Layout::Blocks { be: if is_fp8(dt) { 32 } else { 16 }, elt: dt.size() as u64 }
        };
        if let (Some(&next), Layout::Out { row, .. }) = (chain.get(pos), own) {
            if !matches!(g.ops[next].kind, OpKind::Softmax { .. }) {
                return unsupported(
                    next,
                    "a matmul result may feed only a softmax or be an output in this version".into(),
                );
            }
            if row != ROW {
                return unsupported(
                    next,
                    "a softmax of an f16 result of f32 partial sums is planned as a stage of its own, not in the matmul's row chain".into(),
                );
            }
        }
        layout.insert(t, own);
    }
    // Mapping.
    let tiles = opts.tiles as u64;
    if nbatch > tiles {
        return unsupported(
            chain[0],
            format!("{nbatch} batch entries need at least as many tiles (target has {tiles})"),
        );
    }
    let per_batch = (tiles / nbatch).min(m).max(1);
    let rows_per_tile = m.div_ceil(per_batch);
    let used_per_batch = m.div_ceil(rows_per_tile);
    let used = (nbatch * used_per_batch) as usize;
    // Refuse before generating anything whose size follows from the (untrusted) shapes: the
    // largest tile's row tensors and side operands must fit.
    let limit = super::BUFFER_BYTES;
    let mut need: Vec<(u64, TensorId)> = rows_t
        .iter()
        .map(|&t| {
            (
                cols(t)
                    .div_ceil(16)
                    .saturating_mul(32)
                    .saturating_mul(rows_per_tile)
                    .saturating_add(SCRATCH * 6 + SLACK),
                t,
            )
        })
        .collect();
    for &i in &chain {
        if let OpKind::Softmax { .. } = g.ops[i].kind {
            need.push((WORKERS as u64 * softmax_e_row(cols(g.ops[i].output)), g.ops[i].output));
        }
        if let OpKind::MatMul { b, .. } = g.ops[i].kind {
            let bt = g.tensor(b);
            let per_batch: u64 =
                bt.shape[bt.shape.len().saturating_sub(2)..].iter().fold(1u64, |a, d| a.saturating_mul(*d));
            need.push((per_batch.saturating_mul(2).saturating_add(SLACK), b));
        }
    }
    let total = need.iter().fold(0u64, |a, (n, _)| a.saturating_add(*n));
    if total > limit {
        let (_, worst) = need.iter().max().copied().unwrap_or((0, first));
        return Err(PlanError::Memory {
            tile: 0,
            buffer: format!("tensor `{}`", g.tensor(worst).name),
            over: total - limit,
        });
    }
    // A search candidate that cannot beat the incumbent is refused before anything is built.
    if let Some(budget) = opts.budget {
        let (words, exchange_bytes) =
            gather_lower_bound(g, &chain, &side_casts, opts.side_cast, used_per_batch);
        if words > budget {
            return Err(PlanError::OverBudget {
                lower_bound: words,
                exchange_bytes: nbatch * exchange_bytes,
            });
        }
    }
    // Tiles whose rows are as many plan the same program (the host writes each its own rows):
    // each class is planned once (`Tiles::shared`). Class 0 is the idle tiles' empty program.
    // With distributed side casts every tile casts and sends its own share: no sharing then.
    let mut classes: Vec<TilePlan> = vec![TilePlan::default()];
    let mut class_of: Vec<usize> = vec![0; opts.tiles];
    // Rows → (class, the step index of the gather, rows of eliminated padding clears).
    let mut memo: BTreeMap<u64, (usize, Option<usize>, u64)> = BTreeMap::new();
    let shareable = opts.side_cast == SideCast::Replicated;
    // Per batch group, the pieces each tile contributes to the side-operand all-gather, and per
    // tile the step index where the exchange goes.
    let mut pieces: Vec<Vec<Piece>> = vec![Vec::new(); nbatch as usize];
    let mut gather_at: Vec<usize> = Vec::new();
    let mut eliminated_clears = 0u64;
    let mut alpha_on_a = Vec::new();
    let mut slices: BTreeMap<TensorId, Vec<SliceRef>> = BTreeMap::new();
    let name = |t: TensorId| -> Sym { smol_str::format_smolstr!("t{}", t.0) };
    for b in 0..nbatch {
        for i in 0..used_per_batch {
            let tile = (b * used_per_batch + i) as usize;
            let (m0, m1) = split(m, used_per_batch, i);
            let rows = m1 - m0;
            let wr: Vec<(u64, u64)> = (0..WORKERS as u64).map(|w| split(rows, WORKERS as u64, w)).collect();
            let hit = memo.get(&rows).copied().filter(|_| shareable);
            // A tile of a class already planned still gives its slices; its buffers go to a
            // scratch program (they are the class's).
            let mut scratch = TilePlan::default();
            let p = match hit {
                Some((class, ..)) => {
                    class_of[tile] = class;
                    &mut scratch
                }
                None => {
                    classes.push(TilePlan::default());
                    class_of[tile] = classes.len() - 1;
                    classes.last_mut().expect("just pushed")
                }
            };
            // Row tensor buffers and bindings of inputs / outputs.
            for &t in &rows_t {
                let c = cols(t);
                let (bytes, tslices) = match layout[&t] {
                    Layout::Blocks { be, elt } => {
                        let cb = c.div_ceil(be);
                        let sl = (0..cb)
                            .map(|k| SliceRef {
                                tile: tile as u16,
                                buffer: name(t).as_str().into(),
                                offset: (k * rows * be * elt) as u32,
                                tensor_offset: ((b * m + m0) * c + k * be) * elt,
                                rows: rows as u32,
                                row_bytes: ((c - k * be).min(be) * elt) as u32,
                                tensor_stride: c * elt,
                                tile_stride: (be * elt) as u32,
                            })
                            .collect::<Vec<_>>();
                        (cb * rows * be * elt, sl)
                    }
                    Layout::Out { cols: oc, elt, row } => {
                        let nb = c.div_ceil(oc);
                        let blk = WORKERS as u64 * SCRATCH + rows * ROW;
                        let mut sl = Vec::new();
                        for k in 0..nb {
                            let mut off = k * blk;
                            for (w0, w1) in &wr {
                                if w1 > w0 {
                                    sl.push(SliceRef {
                                        tile: tile as u16,
                                        buffer: name(t).as_str().into(),
                                        offset: (off + SCRATCH) as u32,
                                        tensor_offset: ((b * m + m0 + w0) * c + k * oc) * elt,
                                        rows: (w1 - w0) as u32,
                                        row_bytes: ((c - k * oc).min(oc) * elt) as u32,
                                        tensor_stride: c * elt,
                                        tile_stride: row as u32,
                                    });
                                }
                                off += SCRATCH + (w1 - w0) * ROW;
                            }
                        }
                        (nb * blk, sl)
                    }
                };
                p.buffers.push(Buffer {
                    name: name(t),
                    bytes: (bytes + SLACK) as u32,
                    align: 16,
                    kind: MemKind::Tensor,
                    init: super::Init::new(),
                    live: super::Live::ALWAYS,
                    read_past: 0,
                });
                if t == first || g.outputs.contains(&t) {
                    slices.entry(t).or_default().extend(tslices);
                }
            }
            p.buffers.push(Buffer {
                name: "Z".into(),
                bytes: ((wr[0].1 - wr[0].0 + 1) * ROW + SLACK) as u32,
                align: 16,
                kind: MemKind::Tensor,
                init: super::Init::new(),
                live: super::Live::ALWAYS,
                read_past: 0,
            });
            // Side operands: weight blocks for each matmul, per batch entry.
            let mut side_layout: BTreeMap<TensorId, (u64, u64, u64, u64, u64)> = BTreeMap::new(); // be, cols, kb, nb, elt
            for &ci in &chain {
                let Some((bt, k, n, geo)) = side_geometry(g, ci) else {
                    continue;
                };
                let (be, oc) = (geo.0, geo.1);
                let src = side_casts
                    .iter()
                    .find(|&&c| g.ops[c].output == bt)
                    .map(|&c| row_input(&g.ops[c].kind))
                    .unwrap_or(bt);
                for t in [src, bt] {
                    let elt = g.tensor(t).dtype.size() as u64;
                    if side_layout.contains_key(&t) {
                        continue;
                    }
                    side_layout.insert(t, (geo.0, geo.1, geo.2, geo.3, elt));
                    let bytes = geo.2 * geo.3 * be * oc * elt;
                    p.buffers.push(Buffer {
                        name: format!("s{}", t.0).into(),
                        bytes: bytes as u32,
                        align: 16,
                        kind: MemKind::Tensor,
                        init: super::Init::new(),
                        live: super::Live::ALWAYS,
                        read_past: 0,
                    });
                }
                let st = g.tensor(src);
                let sb = if st.shape.len() > 2 { b } else { 0 };
                let elt = st.dtype.size() as u64;
                let sl = slices.entry(src).or_default();
                // A distributed side cast loads only the blocks its share of the values touches.
                let units = own_units(opts.side_cast, geo.2 * geo.3 * be * oc / 8, used_per_batch, i);
                let per_block = be * oc / 8;
                let share = if src != bt && opts.side_cast != SideCast::Replicated {
                    units.start / per_block..units.end.div_ceil(per_block)
                } else {
                    0..geo.2 * geo.3
                };
                for kb in 0..geo.2 {
                    for nb in 0..geo.3 {
                        if !share.contains(&(kb * geo.3 + nb)) {
                            continue;
                        }
                        sl.push(SliceRef {
                            tile: tile as u16,
                            buffer: smol_str::format_smolstr!("s{}", src.0),
                            offset: ((kb * geo.3 + nb) * be * oc * elt) as u32,
                            tensor_offset: (sb * k * n + kb * be * n + nb * oc) * elt,
                            rows: (k - kb * be).min(be) as u32,
                            row_bytes: ((n - nb * oc).min(oc) * elt) as u32,
                            tensor_stride: n * elt,
                            tile_stride: (oc * elt) as u32,
                        });
                    }
                }
            }
            if let Some((_, at, eliminated)) = hit {
                gather_at.extend(at);
                eliminated_clears += eliminated;
                continue;
            }
            let (gathers_before, eliminated_before) = (gather_at.len(), eliminated_clears);
            // Side casts first: each casts its share (all blocks unless distributed before the
            // exchange); the all-gather goes before (cast after) or after (cast before) the casts.
            if opts.side_cast == SideCast::AfterExchange {
                gather_at.push(p.steps.len());
            }
            for &ci in &side_casts {
                p.steps.push(Step::Phase(super::op_phase(g, ci)));
                let out = g.ops[ci].output;
                let src = row_input(&g.ops[ci].kind);
                let (be, oc, kb, nb, _) = side_layout[&out];
                let block = be * oc;
                // Shares are counted in units of 8 values (the cast kernel's pair of chunks).
                let share = own_units(opts.side_cast, kb * nb * block / 8, used_per_batch, i);
                let cast = if opts.side_cast == SideCast::BeforeExchange {
                    share.clone()
                } else {
                    0..kb * nb * block / 8
                };
                // The exchange moves the FP8 result (cast before) or the f16 source (cast after).
                let moved = match opts.side_cast {
                    SideCast::Replicated => None,
                    SideCast::BeforeExchange => Some((out, 1)),
                    SideCast::AfterExchange => Some((src, 2)),
                };
                if let Some((buffer, elt)) = moved {
                    pieces[b as usize].push(Piece {
                        sender: tile as u16,
                        buffer: format!("s{}", buffer.0),
                        offset: (share.start * 8 * elt) as u32,
                        words: ((share.end - share.start) * 8 * elt / 4) as u32,
                    });
                }
                let pairs = cast.end - cast.start;
                if pairs.div_ceil(WORKERS as u64) > 4096 {
                    return unsupported(ci, "a side cast larger than 6 × 4096 × 8 values per tile".into());
                }
                let words = cast_desc(
                    (&format!("s{}", src.0), cast.start * 16),
                    (&format!("s{}", out.0), cast.start * 8),
                    pairs,
                    8,
                    2,
                    1,
                    g.tensor(out),
                );
                let n = cost::chain_issues(Kernel::CastF16ToF8, pairs.div_ceil(WORKERS as u64));
                p.run(Kernel::CastF16ToF8, smol_str::format_smolstr!("d{}", p.steps.len()), words, n);
            }
            if opts.side_cast == SideCast::BeforeExchange {
                gather_at.push(p.steps.len());
            }
            // The chain.
            for &ci in &chain {
                p.steps.push(Step::Phase(super::op_phase(g, ci)));
                let op = &g.ops[ci];
                let (src, dst) = (row_input(&op.kind), op.output);
                match op.kind {
                    OpKind::Cast { .. } => {
                        let (Layout::Blocks { be, .. }, Layout::Blocks { .. }) = (layout[&src], layout[&dst])
                        else {
                            unreachable!()
                        };
                        let chunks = cols(src).div_ceil(be) * rows * be / 4;
                        let (si, so) = (g.tensor(src).dtype.size() as u64, g.tensor(dst).dtype.size() as u64);
                        let k = match (g.tensor(src).dtype, g.tensor(dst).dtype) {
                            (DType::F32, DType::F16) => Kernel::CastF32ToF16,
                            (DType::F16, DType::F32) => Kernel::CastF16ToF32,
                            (_, d) if is_fp8(d) => Kernel::CastF16ToF8,
                            _ => Kernel::CastF8ToF16,
                        };
                        let fmt_of = if is_fp8(g.tensor(dst).dtype) { g.tensor(dst) } else { g.tensor(src) };
                        // Blocks hold 16 or 32 values per row: the f16 → FP8 kernel takes pairs of chunks.
                        let (units, unit) =
                            if k == Kernel::CastF16ToF8 { (chunks / 2, 8) } else { (chunks, 4) };
                        if k == Kernel::CastF16ToF8 && units.div_ceil(WORKERS as u64) > 4096 {
                            return unsupported(ci, "a cast larger than 6 × 4096 × 8 values per tile".into());
                        }
                        let words = cast_desc((&name(src), 0), (&name(dst), 0), units, unit, si, so, fmt_of);
                        let n = chain_issues(k, units.div_ceil(WORKERS as u64));
                        p.run(k, smol_str::format_smolstr!("d{}", p.steps.len()), words, n);
                    }
                    OpKind::MatMul { b: bt, accumulate, alpha, .. } => {
                        let (be, oc, kb, nb, _) = side_layout[&bt];
                        let fp8 = be == 32;
                        // With f32 partial sums there is no f16 result to scale: alpha goes on the
                        // row operand (rounded to f16 there, as `alpha_on_a` records), if it may.
                        let f32_sums = accumulate != DType::F16;
                        if alpha.is_some() && f32_sums && !alpha_rows_allowed(g, ci, fp8) {
                            return unsupported(
                                ci,
                                "alpha with f32 accumulation is applied to the f16 row operand `a`, in place: \
                                 `a` must be f16 and read by no other op nor be an output"
                                    .into(),
                            );
                        }
                        if fp8 {
                            let (at, btt) = (g.tensor(src), g.tensor(bt));
                            let iscl = at.scale as i32 + btt.scale as i32;
                            if !(-32..=31).contains(&iscl) {
                                return unsupported(
                                    ci,
                                    format!("combined FP8 scale {iscl} outside the AMP's -32..31"),
                                );
                            }
                            p.steps.push(Step::SetCsr(
                                csr::FP_INFMT,
                                fmt_bit(at.dtype) | fmt_bit(btt.dtype) << 1,
                            ));
                            p.steps.push(Step::SetCsr(csr::FP_ISCL, (iscl as u32) & 0x3F));
                        }
                        let amp = match (fp8, accumulate) {
                            (true, _) => Kernel::AmpF8,
                            (false, DType::F32) => Kernel::AmpF32,
                            _ => Kernel::AmpF16,
                        };
                        // Alpha on the row operand: `kb` blocks of `rows` rows of 32 bytes, far
                        // fewer values than the product's when the side operand is the wider one.
                        let folded = alpha
                            .filter(|_| f32_sums || alpha_on_rows(g, ci, fp8, cols(op.output), cols(src)));
                        if let Some(alpha) = folded {
                            if b == 0 && i == 0 {
                                alpha_on_a.push(ci);
                            }
                            let (words, slowest) = scale_rows_descriptor(rows, kb, alpha, &name(src));
                            p.run(
                                Kernel::ScaleF16,
                                smol_str::format_smolstr!("d{}", p.steps.len()),
                                words,
                                slowest,
                            );
                        }
                        let blk = WORKERS as u64 * SCRATCH + rows * ROW;
                        let wbytes = be * oc * if fp8 { 1 } else { 2 };
                        // Names formatted once: a whole-chip tile has hundreds of launches.
                        let (src_sym, dst_sym, zero_sym): (Sym, Sym, Sym) =
                            (name(src), name(dst), "Z".into());
                        let weights_sym: Sym = smol_str::format_smolstr!("s{}", bt.0);
                        p.steps.reserve(2 * (nb * kb) as usize);
                        p.buffers.reserve((nb * kb) as usize);
                        for nbl in 0..nb {
                            for kbl in 0..kb {
                                let mut words = Vec::with_capacity(4 * wr.len());
                                let mut off = nbl * blk;
                                for (w0, w1) in &wr {
                                    let out = (off + SCRATCH) as u32;
                                    words.push(Word::Sym(src_sym.clone(), ((kbl * rows + w0) * ROW) as u32));
                                    words.push(if kbl == 0 {
                                        Word::Sym(zero_sym.clone(), 0)
                                    } else {
                                        Word::Sym(dst_sym.clone(), out)
                                    });
                                    words.push(Word::Sym(dst_sym.clone(), out - SCRATCH as u32));
                                    words.push(Word::Const((w1 - w0 + 1) as u32));
                                    off += SCRATCH + (w1 - w0) * ROW;
                                }
                                p.steps.push(Step::LoadWeights(
                                    weights_sym.clone(),
                                    ((kbl * nb + nbl) * wbytes) as u32,
                                    super::CweiLoad::for_kernel(amp),
                                ));
                                let n = super::Issues::of_workers(
                                    wr.iter().map(|(w0, w1)| cost::kernel_issues(amp, (w1 - w0 + 1) as u32)),
                                );
                                p.run(amp, smol_str::format_smolstr!("d{}", p.steps.len()), words, n);
                            }
                        }
                        if accumulate == DType::F32 && g.tensor(dst).dtype == DType::F16 {
                            // f16 output of f32 partial sums: each worker's rows rounded once and
                            // packed to 16-byte rows in place (`Layout::Out { row: 16 }`). A worker
                            // converts 2 quads per row in each block, in one `rpt` (≤ 4095 quads).
                            if wr.iter().any(|(w0, w1)| 2 * (w1 - w0) > 4095) {
                                return unsupported(
                                    ci,
                                    "f16 output of f32 partial sums for more than 2047 rows per worker; use more tiles".into(),
                                );
                            }
                            let (mut words, mut slowest) = (Vec::with_capacity(4 * wr.len()), 0);
                            let mut off = 0;
                            for (w0, w1) in &wr {
                                let quads = 2 * (w1 - w0);
                                words.extend([
                                    Word::Sym(dst_sym.clone(), (off + SCRATCH) as u32),
                                    Word::Const(quads as u32),
                                    Word::Const(blk as u32),
                                    Word::Const(nb as u32),
                                ]);
                                slowest = slowest.max(cost::cvt_issues(quads, nb));
                                off += SCRATCH + (w1 - w0) * ROW;
                            }
                            p.run(
                                Kernel::CvtF32ToF16,
                                smol_str::format_smolstr!("d{}", p.steps.len()),
                                words,
                                slowest,
                            );
                        }
                        if let Some(alpha) = alpha.filter(|_| folded.is_none()) {
                            let ranges: Vec<(u64, u64)> =
                                super::reduce::pieces(&wr).iter().map(|p| (p.at, p.rows)).collect();
                            let (words, slowest) = scale_descriptor(&ranges, nb, blk, alpha, &name(dst));
                            p.run(
                                Kernel::ScaleF16,
                                smol_str::format_smolstr!("d{}", p.steps.len()),
                                words,
                                slowest,
                            );
                        }
                    }
                    OpKind::Binary { .. }
                    | OpKind::Gelu { .. }
                    | OpKind::Map { .. }
                    | OpKind::Reduce { .. }
                    | OpKind::LayerNorm { .. }
                    | OpKind::Reshape { .. }
                    | OpKind::Slice { .. }
                    | OpKind::Transpose { .. } => {
                        unreachable!("refused above")
                    }
                    OpKind::Softmax { .. } => {
                        let Layout::Blocks { be, elt } = layout[&dst] else {
                            unreachable!("softmax writes blocks")
                        };
                        let n = cols(src);
                        // Where worker `w`'s first source row is, and the jump from a row's
                        // block to the same row of the next block, less the 32 bytes read: AMP
                        // output blocks (each worker's rows after its scratch) or `[block][row]`
                        // blocks of an input the chain did not make.
                        let (first_row, src_jump): (Vec<u64>, u64) = match layout[&src] {
                            Layout::Out { row: ROW, .. } => {
                                let blk = WORKERS as u64 * SCRATCH + rows * ROW;
                                let starts = wr
                                    .iter()
                                    .scan(0, |off, (w0, w1)| {
                                        let at = *off + SCRATCH;
                                        *off += SCRATCH + (w1 - w0) * ROW;
                                        Some(at)
                                    })
                                    .collect();
                                (starts, blk - ROW)
                            }
                            Layout::Blocks { be: 16, elt: 2 } => {
                                (wr.iter().map(|(w0, _)| w0 * ROW).collect(), (rows - 1) * ROW)
                            }
                            _ => unreachable!("refused when the layouts were chosen"),
                        };
                        let pad = n.div_ceil(be) * be - n;
                        if pad > 0 {
                            eliminated_clears += rows;
                        }
                        // Each worker's `e` row: the f32 exps of its current row, written by
                        // the second pass and scaled by the third.
                        let erow = softmax_e_row(n);
                        let ebuf: Sym = smol_str::format_smolstr!("e{}", dst.0);
                        p.buffers.push(Buffer {
                            name: ebuf.clone(),
                            bytes: (WORKERS as u64 * erow) as u32,
                            align: 16,
                            kind: MemKind::Tensor,
                            init: super::Init::new(),
                            live: super::Live::ALWAYS,
                            read_past: 0,
                        });
                        let mut words = Vec::new();
                        for (w, (w0, w1)) in wr.iter().enumerate() {
                            words.extend([
                                Word::Sym(name(src), first_row[w] as u32),
                                Word::Const(src_jump as u32),
                                Word::Sym(name(dst), (w0 * be * elt) as u32),
                                Word::Const(((rows - 1) * be * elt) as u32),
                                Word::Const((w1 - w0) as u32),
                                // Groups of four values, the tail, groups per destination
                                // block. Padding columns are left alone: the loader zero-fills
                                // every buffer and no kernel writes them.
                                Word::Const((n / 4) as u32),
                                Word::Const((n % 4) as u32),
                                Word::Const((be / 4) as u32),
                                Word::Sym(ebuf.clone(), (w as u64 * erow) as u32),
                                Word::Const(0),
                            ]);
                            // Four f16 −inf at byte 40 (8-aligned): where each row's lane maxima
                            // start.
                            words.extend([SOFTMAX_MAX_START; 2].map(Word::Const));
                            words.extend((0..4).map(|_| Word::Const(0)));
                        }
                        let max_rows = wr[0].1 - wr[0].0;
                        p.run(
                            Kernel::SoftmaxF16,
                            smol_str::format_smolstr!("d{}", p.steps.len()),
                            words,
                            cost::softmax_issues(max_rows, n, be),
                        );
                    }
                }
            }
            // Every tile's plan is live until the last is made: its launch tables merged now, and
            // no growth slack kept (at SigLIP scale the slack was a third of the steps' 150 MB).
            super::merge_descriptors(p, "T");
            p.steps.shrink_to_fit();
            p.buffers.shrink_to_fit();
            let at = gather_at.get(gathers_before).copied();
            memo.insert(rows, (class_of[tile], at, eliminated_clears - eliminated_before));
        }
    }
    let mut plans = super::Tiles::shared(classes, &class_of);
    // The all-gather of distributed side casts: one exchange superstep on every tile.
    let mut horizons = Vec::new();
    let groups: Vec<(Vec<u16>, Vec<Piece>)> = pieces
        .into_iter()
        .enumerate()
        .map(|(b, p)| {
            (((b as u64 * used_per_batch)..((b as u64 + 1) * used_per_batch)).map(|t| t as u16).collect(), p)
        })
        .collect();
    let mut exchange_bytes = 0u64;
    if groups.iter().any(|(t, p)| t.len() > 1 && !p.is_empty()) {
        let sched = if opts.costing {
            exchange::all_gather_unchecked(&groups)
        } else {
            exchange::all_gather(&groups)
                .map_err(|e| PlanError::Unsupported(side_casts[0], format!("{e}")))?
                .0
        };
        exchange_bytes = groups.iter().flat_map(|(_, p)| p).map(|p| 4 * p.words as u64).sum();
        horizons.push(sched.horizon);
        let names: Vec<String> = side_casts.iter().map(|&c| g.tensor(g.ops[c].output).name.clone()).collect();
        let phase = format!("gather {}", names.join(" "));
        for (t, p) in plans.iter_mut().enumerate() {
            let at = gather_at.get(t).copied().unwrap_or(p.steps.len()).min(p.steps.len());
            let events = sched.events.get(&(t as u16)).cloned().unwrap_or_default();
            p.steps.splice(at..at, [Step::Phase(phase.clone().into()), Step::Sync, Step::Exchange(events)]);
        }
    }
    let cost = cost::predict(&plans, &horizons);
    let mut bindings = Vec::new();
    for (t, sl) in slices {
        let direction = if g.is_source(t) { Direction::Input } else { Direction::Output };
        let transpose = g.ops.iter().any(|o| {
            matches!(o.kind, OpKind::MatMul { b, transpose_b: true, .. } if b == t
            || side_casts.iter().any(|&c| g.ops[c].output == b && row_input(&g.ops[c].kind) == t))
        });
        bindings.push(BindingPlan { tensor: t, direction, transpose, slices: sl });
    }
    Ok(Plan {
        tiles: plans,
        bindings,
        cost,
        tiles_used: used as u32,
        grids: vec![[used_per_batch as u32, 1, 1]; g.ops.len()],
        alpha_on_a,
        horizons,
        profile: None,
        exchange_bytes,
        eliminated_clears,
        cleared_bytes: 0,
        mapping: vec![format!(
            "row chain of {} ops: batch {batch:?} × {m} rows over {used} tiles ({rows_per_tile} rows per tile), side casts {} (exchange bytes {exchange_bytes})",
            chain.len(),
            opts.side_cast.name()
        )],
    })
}

/// Weight blocks of a side operand: `(be, oc, kb, nb, elt)` (elt filled in per tensor).
type BlockGeometry = (u64, u64, u64, u64, u64);

/// The right operand of chain matmul `ci` and its AMP weight-block geometry: `(b, k, n, (be, oc,
/// kb, nb, 0))` — block rows (32 for FP8 `a`, else 16), block columns (8 for f32 accumulation,
/// else 16) and the block counts. `None` for other ops.
fn side_geometry(g: &Graph, ci: usize) -> Option<(TensorId, u64, u64, BlockGeometry)> {
    let OpKind::MatMul { a, b, transpose_b, accumulate, .. } = g.ops[ci].kind else {
        return None;
    };
    let (_, _, k, n) = matmul_shape(g.tensor(a), g.tensor(b), false, transpose_b).unwrap_or_default();
    let be = if is_fp8(g.tensor(a).dtype) { 32 } else { 16 };
    let oc = if accumulate == DType::F32 { 8 } else { 16 };
    Some((b, k, n, (be, oc, k.div_ceil(be), n.div_ceil(oc), 0)))
}

/// A lower bound on the cycles of a plan with distributed side casts, and the bytes one batch
/// group's all-gather moves. Each of the `per_group` tiles of a batch group holds its share
/// (`casts::own_units`, units of 8 values) and receives every other tile's; a tile takes in one
/// word per cycle (docs/target.md §5), so the exchange superstep — and the plan — lasts at least
/// as many cycles as the busiest tile receives words. `(0, 0)` when nothing is exchanged.
fn gather_lower_bound(
    g: &Graph,
    chain: &[usize],
    side_casts: &[usize],
    mode: SideCast,
    per_group: u64,
) -> (u64, u64) {
    let elt = match mode {
        SideCast::Replicated => return (0, 0),
        SideCast::BeforeExchange => 1,
        SideCast::AfterExchange => 2,
    };
    if per_group < 2 {
        return (0, 0);
    }
    let units: Vec<u64> = side_casts
        .iter()
        .filter_map(|&c| {
            let out = g.ops[c].output;
            let (_, _, _, (be, oc, kb, nb, _)) =
                chain.iter().find_map(|&i| side_geometry(g, i).filter(|(b, ..)| *b == out))?;
            Some(kb * nb * be * oc / 8)
        })
        .collect();
    let words = |u: u64| u * 8 * elt / 4;
    let busiest = (0..per_group)
        .map(|i| {
            units
                .iter()
                .map(|&u| {
                    let own = own_units(mode, u, per_group, i);
                    words(u) - words(own.end - own.start)
                })
                .sum()
        })
        .max()
        .unwrap_or(0);
    (busiest, units.iter().map(|&u| 4 * words(u)).sum())
}

/// Bytes of a softmax worker's `e` row for rows of `n` values: `n` f32, 8-aligned (the kernel
/// stores whole groups 64 bits at a time).
fn softmax_e_row(n: u64) -> u64 {
    (4 * n).div_ceil(8) * 8
}

/// Whether chain matmul `op` applies its alpha to its row operand `a` (in place, rounded to f16)
/// rather than to its result: when `a` is f16 (an FP8 `a` is the cast's result, which the scale
/// kernel does not take), nothing else reads `a` or returns it (it is scaled in place: the host
/// or the redistribution writes it anew before every run), and the result has more columns than
/// `a`, so that fewer values are scaled (docs/kernels.md "Alpha on the row operand").
fn alpha_on_rows(g: &Graph, op: usize, fp8: bool, out_cols: u64, a_cols: u64) -> bool {
    alpha_rows_allowed(g, op, fp8) && out_cols > a_cols
}

/// Whether alpha may be applied to chain matmul `op`'s row operand in place (see
/// [`alpha_on_rows`]); with f32 accumulation it must be, there being no f16 result to scale.
fn alpha_rows_allowed(g: &Graph, op: usize, fp8: bool) -> bool {
    let a = row_input(&g.ops[op].kind);
    let readers = g.ops.iter().filter(|o| o.kind.operands().contains(&a)).count();
    !fp8 && g.tensor(a).dtype == DType::F16
        && readers == 1
        && !g.outputs.contains(&a)
        && !g.shared.contains(&a)
}

/// The `ScaleF16` descriptor over a row operand in `[block][row][32 bytes]` layout (`kb` blocks of
/// `rows` rows): the cheaper of one range of all rows per block (each worker a share of the
/// blocks) and an even share of the row-blocks per worker. Returns the words and the slowest
/// worker's issues.
fn scale_rows_descriptor(rows: u64, kb: u64, alpha: f32, buffer: &str) -> (Vec<Word>, u64) {
    let blk = rows * ROW;
    let whole = scale_descriptor(&[(0, rows)], kb, blk, alpha, buffer);
    let per_row: Vec<(u64, u64)> = (0..rows).map(|r| (r * ROW, 1)).collect();
    match balanced_segments(&per_row, kb).map(|segs| segment_words(&segs, blk, alpha, buffer)) {
        Some(by_row) if by_row.1 < whole.1 => by_row,
        _ => whole,
    }
}

/// The `ScaleF16` descriptor over a matmul output in AMP output layout (`nb` blocks of `blk`
/// bytes; in each, per worker, its rows `(byte offset, count)` after its scratch: at most one
/// range per worker). Only the result rows are scaled, not the AMP scratch between them: each
/// worker takes one worker's row range in a share of the column blocks, or an even share of the
/// row-blocks when that is faster. Returns the words and the slowest worker's issues.
pub(super) fn scale_descriptor(
    ranges: &[(u64, u64)],
    nb: u64,
    blk: u64,
    alpha: f32,
    buffer: &str,
) -> (Vec<Word>, u64) {
    let ranges: Vec<(u64, u64)> = ranges.iter().copied().filter(|r| r.1 > 0).collect();
    // Each worker's segments `(byte offset, rows, first block, end block)`: the balanced split
    // when it needs at most two segments per worker and is faster, else one range per worker.
    let by_range = one_range_each(&ranges, nb);
    let slowest = |segs: &[Vec<Segment>]| segs.iter().map(|s| segment_issues(s)).max();
    let segs = match balanced_segments(&ranges, nb) {
        Some(b) if !b.is_empty() && slowest(&b) < slowest(&by_range) => b,
        _ => by_range,
    };
    segment_words(&segs, blk, alpha, buffer)
}

/// Worker issues of `scale_f16` over its (at most two) segments.
fn segment_issues(s: &[Segment]) -> u64 {
    let seg = |i: usize| s.get(i).map_or((0, 0), |&(_, r, b0, b1)| (r * ROW / 8, b1 - b0));
    cost::scale_issues([seg(0), seg(1)])
}

/// The descriptor words of each worker's segments (blocks `blk` bytes apart), and the slowest
/// worker's issues.
fn segment_words(segs: &[Vec<Segment>], blk: u64, alpha: f32, buffer: &str) -> (Vec<Word>, u64) {
    let (mut words, mut worst) = (Vec::new(), 0);
    for s in segs {
        let word = |i: usize| s.get(i).map_or((0, 0, 0, 0), |&x| x);
        let (at, rows, b0, b1) = word(0);
        let (at2, rows2, c0, c1) = word(1);
        words.extend([
            Word::Sym(buffer.into(), (b0 * blk + at) as u32),
            Word::Const((rows * ROW / 8) as u32),
            Word::Const(alpha.to_bits()),
            Word::Const(blk as u32),
            Word::Const((b1 - b0) as u32),
            Word::Sym(buffer.into(), (c0 * blk + at2) as u32),
            Word::Const((rows2 * ROW / 8) as u32),
            Word::Const((c1 - c0) as u32),
        ]);
        worst = worst.max(segment_issues(s));
    }
    (words, worst)
}

/// A worker's segment of the alpha kernel: byte offset of its first row in a block, rows, first
/// block, end block.
type Segment = (u64, u64, u64, u64);

/// One segment per worker: worker `w` takes range `w mod active` over a share of the blocks (a
/// range gets several workers when there are fewer ranges than workers). Covers every range only
/// when there are at most [`WORKERS`] of them, as its callers' (one per worker) are.
fn one_range_each(ranges: &[(u64, u64)], nb: u64) -> Vec<Vec<Segment>> {
    debug_assert!(ranges.len() <= WORKERS, "one range per worker");
    let active = ranges.len().max(1) as u64;
    let shares = (WORKERS as u64 / active).max(1);
    (0..WORKERS as u64)
        .map(|w| match ranges.get((w % active) as usize) {
            Some(&(at, r)) if w / active < shares => {
                let (b0, b1) = split(nb, shares, w / active);
                alloc::vec![(at, r, b0, b1)]
            }
            _ => Vec::new(),
        })
        .collect()
}

/// Row-blocks dealt in order (range by range, block by block), each worker taking its even share
/// of what is left as at most two segments; `None` when that does not cover every range (a worker
/// would need a third segment).
fn balanced_segments(ranges: &[(u64, u64)], nb: u64) -> Option<Vec<Vec<Segment>>> {
    let mut left: u64 = ranges.iter().map(|r| r.1 * nb).sum();
    let (mut r, mut b) = (0usize, 0u64);
    let mut out = Vec::with_capacity(WORKERS);
    for w in 0..WORKERS as u64 {
        let mut quota = left.div_ceil(WORKERS as u64 - w);
        let mut segs = Vec::new();
        while quota > 0 && r < ranges.len() && segs.len() < 2 {
            let (at, rows) = ranges[r];
            let take = quota.div_ceil(rows).min(nb - b);
            segs.push((at, rows, b, b + take));
            quota = quota.saturating_sub(take * rows);
            left -= take * rows;
            b += take;
            if b == nb {
                (r, b) = (r + 1, 0);
            }
        }
        out.push(segs);
    }
    (r == ranges.len()).then_some(out)
}
