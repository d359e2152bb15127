//! The matmul epilogue (docs/kernels.md, docs/model-format.md "What the planner supports"): what
//! each tile that finishes sums (docs/kernels.md "K split") runs on them, in place, after the reduction — alpha
//! (`scale_f16`), a bias (`bias_f16`), a residual (`add_f16` against a buffer laid out like C),
//! GeLU (`gelu_f16`), and the f32 → f16 conversion of an f32-accumulated result (`cvt_f32_f16`).
//! The first fused elementwise ops of the whole-graph planner (docs/graph-planner.md).

use alloc::vec::Vec;

use super::cost;
use super::layout::{zero, ROW, SLACK};
use super::matmul::MatMul;
use super::reduce::{descriptor_issues, Piece};
use super::{Buffer, Kernel, MemKind, SliceRef, Word};

/// A tile that finishes sums (a K group's first tile, or every tile of a reduce-scattering group): its tile, the rows each worker finishes, its column blocks and block size, the
/// first column block and first row it holds.
pub(super) struct Root<'a> {
    /// Tile.
    pub tile: u16,
    /// Per worker, the rows it finishes (all its AMP rows, or its share when the K group
    /// reduce-scatters).
    pub pieces: &'a [Piece],
    /// Column blocks on the tile.
    pub nbt: u64,
    /// Bytes of one output block (all workers' scratch and rows).
    pub cblk: u64,
    /// First column block.
    pub nb0: u64,
    /// First row of the result.
    pub m0: u64,
}

/// What the epilogue adds to a root: buffers, kernel launches in order (kernel, descriptor words,
/// slowest worker's issues) and the binding slices of the bias and residual.
pub(super) struct Finish {
    pub buffers: Vec<Buffer>,
    pub launches: Vec<(Kernel, Vec<Word>, u64)>,
    pub bias_slices: Vec<SliceRef>,
    pub residual_slices: Vec<SliceRef>,
}

/// The epilogue of one root, in the order the reference applies it: alpha, bias, residual on f16
/// partials; the f32 → f16 rounding of f32 partials; then GeLU on the f16 values.
pub(super) fn finish(mm: &MatMul, r: &Root<'_>) -> Finish {
    let mut f = Finish {
        buffers: Vec::new(),
        launches: Vec::new(),
        bias_slices: Vec::new(),
        residual_slices: Vec::new(),
    };
    let rows: Vec<(u64, u64)> = r.pieces.iter().map(|p| (p.at, p.rows)).collect();
    let epi = mm.epilogue;
    if let Some(alpha) = mm.alpha {
        let (words, issues) = super::chain::scale_descriptor(&rows, r.nbt, r.cblk, alpha, "C");
        f.launches.push((Kernel::ScaleF16, words, issues));
    }
    if epi.is_some_and(|e| e.bias.is_some()) {
        bias(mm, r, &rows, &mut f);
    }
    if epi.is_some_and(|e| e.residual.is_some()) {
        residual(mm, r, &mut f);
    }
    let rounded_once = mm.out != mm.acc;
    if rounded_once {
        // 8 floats = 2 quads per row, packed from each piece's start as 8 halves per row.
        let launch = per_worker(r, &rows, 2, |quads| (Vec::new(), cost::cvt_issues(quads, r.nbt)));
        f.launches.push((Kernel::CvtF32ToF16, launch.0, launch.1));
    }
    if let Some(form) = epi.and_then(|e| e.gelu) {
        // On f16 values: 16 per row (4 chunks) in an f16 block; 8 (2 chunks) once f32 partials
        // are packed.
        let chunks_per_row = if rounded_once { 2 } else { 4 };
        let kernel = super::matmul::gelu_kernel(form, 0, 0).0;
        let launch = per_worker(r, &rows, chunks_per_row, |chunks| {
            let (_, w, issues) = super::matmul::gelu_kernel(form, chunks, r.nbt);
            (w, issues)
        });
        f.launches.push((kernel, launch.0, launch.1));
    }
    f
}

/// A descriptor of four words per worker — its first row, `units_per_row` × its rows, the block
/// stride, the blocks — followed by the kernel's own words; and the slowest worker's issues.
fn per_worker(
    r: &Root<'_>,
    rows: &[(u64, u64)],
    units_per_row: u64,
    tail: impl Fn(u64) -> (Vec<Word>, u64),
) -> (Vec<Word>, u64) {
    let (mut words, mut slowest) = (Vec::new(), 0);
    for &(at, n) in rows {
        let units = units_per_row * n;
        let (extra, issues) = tail(units);
        words.extend([
            Word::Sym("C".into(), at as u32),
            Word::Const(units as u32),
            Word::Const(r.cblk as u32),
            Word::Const(r.nbt as u32),
        ]);
        words.extend(extra);
        slowest = slowest.max(issues);
    }
    (words, slowest)
}

/// The bias: 16 values per column block (32 bytes) on the root, added by `bias_f16`.
fn bias(mm: &MatMul, r: &Root<'_>, rows: &[(u64, u64)], f: &mut Finish) {
    let bc = mm.block_cols();
    f.buffers.push(zero("Bias", r.nbt * 32, MemKind::Tensor));
    for nbl in 0..r.nbt {
        let nb = r.nb0 + nbl;
        f.bias_slices.push(SliceRef {
            tile: r.tile,
            buffer: "Bias".into(),
            offset: (nbl * 32) as u32,
            tensor_offset: nb * bc * 2,
            rows: 1,
            row_bytes: ((mm.n - nb * bc).min(bc) * 2) as u32,
            tensor_stride: 0,
            tile_stride: 32,
        });
    }
    let (mut words, mut slowest) = (Vec::new(), 0);
    for &(at, n) in rows {
        words.extend([
            Word::Sym("C".into(), at as u32),
            Word::Const(n as u32),
            Word::Const(r.cblk as u32),
            Word::Const(r.nbt as u32),
            Word::Sym("Bias".into(), 0),
            Word::Const(0),
            Word::Const(0),
            Word::Const(0),
        ]);
        slowest = slowest.max(cost::bias_issues(n, r.nbt));
    }
    f.launches.push((Kernel::BiasF16, words, slowest));
}

/// The residual: bound into a buffer laid out like C (same blocks, same rows), then added to each
/// worker's piece with the reduction's add kernel, one launch per block (and per 4096 chunks of
/// the longest piece, the kernel's `rpt` limit).
fn residual(mm: &MatMul, r: &Root<'_>, f: &mut Finish) {
    let bc = mm.block_cols();
    f.buffers.push(zero("Res", r.nbt * r.cblk + SLACK as u64, MemKind::Tensor));
    for nbl in 0..r.nbt {
        let nb = r.nb0 + nbl;
        for p in r.pieces.iter().filter(|p| p.rows > 0) {
            f.residual_slices.push(SliceRef {
                tile: r.tile,
                buffer: "Res".into(),
                offset: (nbl * r.cblk + p.at) as u32,
                tensor_offset: ((r.m0 + p.row) * mm.n + nb * bc) * 2,
                rows: p.rows as u32,
                row_bytes: ((mm.n - nb * bc).min(bc) * 2) as u32,
                tensor_stride: mm.n * 2,
                tile_stride: ROW,
            });
        }
    }
    let chunks = |p: &Piece| p.rows * ROW as u64 / 8;
    let tables = r.pieces.iter().map(chunks).max().unwrap_or(0).div_ceil(4096);
    for nbl in 0..r.nbt {
        for t in 0..tables {
            let mut words = Vec::new();
            for p in r.pieces {
                let (c0, c1) = super::layout::split(chunks(p), tables, t);
                let at = (nbl * r.cblk + p.at + 8 * c0) as u32;
                words.extend([
                    Word::Sym("C".into(), at),
                    Word::Sym("Res".into(), at),
                    Word::Sym("C".into(), at),
                    Word::Const((c1 - c0) as u32),
                ]);
            }
            let issues = descriptor_issues(Kernel::AddF16, &words);
            f.launches.push((Kernel::AddF16, words, issues));
        }
    }
}
