//! Matmul planning: a grid of tiles over (M, N, K), AMP kernels per 16-deep K block, and a
//! partial-sum reduction over the exchange when K is split (docs/kernels.md).

use alloc::format;
use alloc::vec;
use alloc::vec::Vec;
use ipu_schema::{DType, Direction};

use super::cost::{self, kernel_issues};
use super::epilogue;
use super::exchange;
pub use super::layout::split;
use super::layout::{zero, ROW, SCRATCH, SLACK};
pub use super::reduce::reduction_rounds;
use super::reduce::{self, Round};
use super::{
    BindingPlan, Buffer, Kernel, MemKind, Plan, PlanError, SliceRef, Step, TilePlan, Word, RUNTIME_RESERVE,
};
use crate::graph::{matmul_dims, GeluForm, Graph, TensorId};
use crate::target::{TILE_MEM_SIZE, WORKERS};

/// The f32 constants of `gelu_f16` (descriptor words 4..8): √(2/π), 0.044715, 0.5, 1, −2 (the
/// kernel adds `(−2)/d` where the formula subtracts `2/d`: the same bits). The host reference uses
/// the same values (`reference::gelu_device`).
pub const GELU_CONSTANTS: [f32; 5] = [0.797_884_6, 0.044_715, 0.5, 1.0, -2.0];

/// The f32 constants of `gelu_erf_f16` (descriptor words 4..12): p/√2, 1, −0.5, a5, a4, a3, a2,
/// a1, 0.5, where p and a1..a5 are Abramowitz & Stegun's formula 7.1.26 for erf (Handbook of
/// Mathematical Functions, 1964: `erf z = 1 − t(a1 + t(a2 + …))e^{−z²}`, `t = 1/(1 + pz)`,
/// |error| ≤ 1.5e−7 for z ≥ 0). p/√2 folds z = |x|/√2 into t. The host reference uses the same
/// values (`reference::gelu_erf_device`).
// The published decimals, kept as printed; each rounds to the nearest f32.
#[allow(clippy::excessive_precision)]
pub const GELU_ERF_CONSTANTS: [f32; 9] = [
    0.231_641_89,
    1.0,
    -0.5,
    1.061_405_429,
    -1.453_152_027,
    1.421_413_741,
    -0.284_496_736,
    0.254_829_592,
    0.5,
];

/// The f32 constants of `gelu_sigmoid_f16` (descriptor words 4, 5): −1.702 and 1, for
/// `x/(e^{−1.702x} + 1)`. The host reference uses the same values (`reference::gelu_sigmoid_device`).
pub const GELU_SIGMOID_CONSTANTS: [f32; 2] = [-1.702, 1.0];

/// The kernel of a GeLU form, its descriptor's constant words (12, after the four block words)
/// and its worker issues for `chunks` per block over `blocks` blocks.
pub fn gelu_kernel(form: GeluForm, chunks: u64, blocks: u64) -> (Kernel, Vec<Word>, u64) {
    let (kernel, constants, issues): (_, &[f32], _) = match form {
        GeluForm::Tanh => (Kernel::GeluF16, &GELU_CONSTANTS, cost::gelu_issues(chunks, blocks)),
        GeluForm::Erf => (Kernel::GeluErfF16, &GELU_ERF_CONSTANTS, cost::gelu_erf_issues(chunks, blocks)),
        GeluForm::Sigmoid => {
            (Kernel::GeluSigmoidF16, &GELU_SIGMOID_CONSTANTS, cost::gelu_sigmoid_issues(chunks, blocks))
        }
    };
    let mut w: Vec<Word> = constants.iter().map(|c| Word::Const(c.to_bits())).collect();
    w.resize(12, Word::Const(0));
    (kernel, w, issues)
}

/// A matmul in the planner's terms.
#[derive(Clone, Debug)]
pub struct MatMul {
    /// Operand and result tensors.
    pub a: TensorId,
    /// Right operand.
    pub b: TensorId,
    /// Result.
    pub c: TensorId,
    /// Transposes.
    pub ta: bool,
    /// Transposes.
    pub tb: bool,
    /// Rows of the result.
    pub m: u64,
    /// Depth.
    pub k: u64,
    /// Columns.
    pub n: u64,
    /// Partial (and output) type.
    pub acc: DType,
    /// Scalar applied to the result on the tiles that finish the sums, after the reduction (f16 only).
    pub alpha: Option<f32>,
    /// Output type: `acc`, or f16 when `acc` is f32 (converted once where the sums are finished).
    pub out: DType,
    /// Ops fused after the product where the sums are finished (after alpha): bias, GeLU.
    pub epilogue: Option<Epilogue>,
    /// FP8 operands (`f8amp`: 32-deep K blocks of one byte per value, f16 partials): the
    /// formats of A and B (`$FP_INFMT` bits) and their combined scale (`$FP_ISCL`).
    pub fp8: Option<(u32, i32)>,
    /// For each row of A, the tile that already holds it (`u16::MAX`: none; empty: not known).
    /// Row block i's grid positions take those tiles first, so that its rows are sent from tiles
    /// of its own group, which receive nothing else meanwhile ([`tile_order`]).
    pub a_home: Vec<u16>,
    /// An earlier stage holds A as whole rows (not as a matmul's output blocks): the grid may
    /// hold it row-major ([`MatMul::a_row_major`]).
    pub a_rows_whole: bool,
}

/// What the matmul planner computes after the product, in place where the sums are finished (`reduce.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Epilogue {
    /// `C += vector` (one f16 value per column), `bias_f16`.
    pub bias: Option<TensorId>,
    /// Then `C += R` for a whole `[M, N]` tensor (a residual), `add_f16` over C's layout.
    pub residual: Option<TensorId>,
    /// Then `C = gelu(C)`, `gelu_f16` (tanh form), `gelu_erf_f16` or `gelu_sigmoid_f16`.
    pub gelu: Option<GeluForm>,
    /// The tensor the output binding reads (the last fused op's result).
    pub result: TensorId,
}

impl MatMul {
    /// Build from graph tensors (dimensions already checked by the model parser).
    pub fn new(g: &Graph, a: TensorId, b: TensorId, c: TensorId, ta: bool, tb: bool, acc: DType) -> Self {
        let (m, k, n) = matmul_dims(g.tensor(a), g.tensor(b), ta, tb).unwrap_or((0, 0, 0));
        let (at, bt) = (g.tensor(a), g.tensor(b));
        let fp8 = (at.dtype.size() == 1 && bt.dtype.size() == 1).then(|| {
            use super::chain::fmt_bit;
            (fmt_bit(at.dtype) | fmt_bit(bt.dtype) << 1, at.scale as i32 + bt.scale as i32)
        });
        MatMul {
            a,
            b,
            c,
            ta,
            tb,
            m,
            k,
            n,
            acc,
            alpha: None,
            out: acc,
            epilogue: None,
            fp8,
            a_home: Vec::new(),
            a_rows_whole: false,
        }
    }
    /// K values per AMP block: 16 f16, or 32 FP8.
    pub fn depth(&self) -> u64 {
        if self.fp8.is_some() {
            32
        } else {
            16
        }
    }
    /// Bytes per operand value: 2 (f16) or 1 (FP8).
    pub fn operand_bytes(&self) -> u64 {
        if self.fp8.is_some() {
            1
        } else {
            2
        }
    }
    /// Output columns per AMP block: 16 with f16 partials, 8 with f32.
    pub fn block_cols(&self) -> u64 {
        if self.acc == DType::F32 {
            8
        } else {
            16
        }
    }
    /// Bytes of one weight block in the CWEI.
    pub fn block_bytes(&self) -> u32 {
        (self.depth() * self.block_cols() * self.operand_bytes()) as u32
    }
    /// K blocks.
    pub fn kb(&self) -> u64 {
        self.k.div_ceil(self.depth())
    }
    /// N blocks.
    pub fn nb(&self) -> u64 {
        self.n.div_ceil(self.block_cols())
    }
    /// Whether a tile with `rows` rows, `nbt` column blocks and `kbt` K blocks holds its rows of A
    /// row-major (`[row][K slice]`, row stride `kbt · 32` bytes) and reads them with the strided
    /// AMP kernel (docs/kernels.md "Row-major A"). Only when an earlier stage holds A as whole
    /// rows (`a_rows_whole`; a matmul's output blocks already match the blocked layout): it then
    /// sends each row to a column group as one piece instead of
    /// one 8-word piece per K block — `rows · (kbt − 1)` fewer pieces per receiver, each costing
    /// the receiver about `PIECE_CYCLES` (a mux change and the gap before the next piece) — while
    /// each of the tile's `nbt · kbt` launches costs 5 issues more per worker (`BARREL_SLOTS`
    /// cycles each). So row-major where it saves more than it costs: a SigLIP-size grid by 20–60×,
    /// the example encoder block's 5-row tiles not at all. Never for a host-fed A (the host writes
    /// either layout at no cost), a single K block (the layouts coincide), or a stride past the
    /// kernel's field (`STRIDED_MAX_ROW`).
    pub(super) fn a_row_major(&self, [rows, nbt, kbt]: [u64; 3]) -> bool {
        let saved = rows.saturating_mul(kbt.saturating_sub(1)).saturating_mul(PIECE_CYCLES);
        let extra = nbt.saturating_mul(kbt).saturating_mul(5 * crate::target::BARREL_SLOTS);
        self.a_rows_whole
            && !self.ta
            && kbt >= 2
            && kbt * ROW as u64 <= STRIDED_MAX_ROW
            && saved > extra
            && rows.saturating_mul(kbt) >= ROW_MAJOR_MIN_PIECES
    }

    /// The AMP kernel a tile with `kbt` K blocks runs.
    fn amp_kernel(&self, shape: [u64; 3]) -> Kernel {
        match (self.kernel().0, self.a_row_major(shape)) {
            (Kernel::AmpF16, true) => Kernel::AmpF16Strided,
            (Kernel::AmpF32, true) => Kernel::AmpF32Strided,
            (Kernel::AmpF8, true) => Kernel::AmpF8Strided,
            (k, _) => k,
        }
    }

    /// Bytes of a tile's A buffer with `rows` rows, `nbt` column blocks and `kbt` K blocks, and
    /// the bytes after it the AMP kernel reads but never uses ([`Buffer::read_past`]): the plain
    /// kernel's read-ahead stays within `SLACK`; row-major, the strided kernel reads up to
    /// `(rows + 1)·S + 8` bytes past a block's first chunk (the flush row and the next row's first
    /// chunk, `runtime-tile/src/amp_strided.rs`), two rows past the buffer.
    fn a_bytes(&self, [rows, nbt, kbt]: [u64; 3]) -> (u64, u32) {
        let row = kbt.saturating_mul(ROW as u64);
        let bytes = rows.saturating_mul(row).saturating_add(SLACK as u64);
        (bytes, if self.a_row_major([rows, nbt, kbt]) { (2 * row) as u32 } else { 0 })
    }

    fn kernel(&self) -> (Kernel, Kernel) {
        if self.fp8.is_some() {
            (Kernel::AmpF8, Kernel::AddF16)
        } else if self.acc == DType::F32 {
            (Kernel::AmpF32, Kernel::AddF32)
        } else {
            (Kernel::AmpF16, Kernel::AddF16)
        }
    }
}

/// How the result is split over tiles: `tm` row groups × `tn` column groups × `tk` depth groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grid {
    /// Row groups.
    pub tm: u64,
    /// Column-block groups.
    pub tn: u64,
    /// K-block groups (partial sums reduced over the exchange).
    pub tk: u64,
}

fn worker_rows(rows: u64) -> Vec<(u64, u64)> {
    (0..WORKERS as u64).map(|w| split(rows, WORKERS as u64, w)).collect()
}

/// Bytes of one output block (all workers' scratch and rows).
fn c_block(rows: u64) -> u64 {
    WORKERS as u64 * SCRATCH as u64 + rows * ROW as u64
}

/// Largest row stride of a row-major A the strided AMP kernel takes: its stride field is 10 signed
/// bits of 8-byte steps added to 24 bytes (`runtime-tile/src/amp_strided.rs`), 24 + 8·511.
const STRIDED_MAX_ROW: u64 = 4112;

/// Receiver cycles one exchange piece costs beyond its words (a mux change and the one-cycle gap
/// before the next piece can land, `scatter.rs`): what [`MatMul::a_row_major`] weighs.
const PIECE_CYCLES: u64 = 2;

/// Fewest blocked-layout pieces per receiver (`rows · kbt`) at which [`MatMul::a_row_major`]
/// takes the row-major layout. Measured, not derived: below it the estimate's saving did not
/// show (the example encoder block on 64 tiles, 25 rows × 6 K blocks from its second LayerNorm:
/// the redistribution 4,130 → 4,356 cycles and the matmul 1,438 → 1,620), above it every case
/// tried gained (LayerNorm 729×1152 into 1152×4304 on 1472 tiles, 146 × 72: 211,205 → 192,407).
const ROW_MAJOR_MIN_PIECES: u64 = 1024;

/// Tile memory needed by the largest tile of a grid, with the reduction fan-in it would use.
pub fn memory_needed(mm: &MatMul, g: Grid) -> u64 {
    memory_with(mm, g, fan_in(mm, g))
}

/// Tile memory of the largest tile when a reduction root takes `f` partial sums per round.
fn memory_with(mm: &MatMul, g: Grid, f: u64) -> u64 {
    buffers_with(mm, g, f).iter().fold(5 * 16, |t, b| t.saturating_add(*b))
}

/// The buffers of the largest tile of a grid, in bytes: A, B, C, the zero pin, the reduction's
/// receive buffer, the descriptor tables and the epilogue's bias and residual.
fn buffers_with(mm: &MatMul, g: Grid, f: u64) -> Vec<u64> {
    band_buffers(mm, [mm.m.div_ceil(g.tm), mm.nb().div_ceil(g.tn), mm.kb().div_ceil(g.tk)], f == g.tk, f)
}

/// The buffers of a tile with `rows` rows, `nbt` column blocks and `kbt` K blocks (as
/// [`buffers_with`]); `scatter` when its K group reduce-scatters with fan-in `f`.
pub(super) fn band_buffers(mm: &MatMul, [rows, nbt, kbt]: [u64; 3], scatter: bool, f: u64) -> Vec<u64> {
    // Saturating: model shapes are untrusted and the answer only has to say "too large".
    let a = mm.a_bytes([rows, nbt, kbt]).0;
    let b = kbt.saturating_mul(nbt).saturating_mul(mm.block_bytes() as u64);
    let c_blk = (WORKERS as u64 * SCRATCH as u64).saturating_add(rows.saturating_mul(ROW as u64));
    let c = nbt.saturating_mul(c_blk).saturating_add(SLACK as u64);
    let z = (rows.div_ceil(WORKERS as u64) + 1).saturating_mul(ROW as u64).saturating_add(SLACK as u64);
    let r = f.saturating_sub(1).saturating_mul(c - SLACK as u64);
    // Descriptor tables: one 96-byte table per AMP launch and per add round (`reduce.rs`: per
    // partial and 4096 chunks, or per partial and block when the group reduce-scatters).
    // (A reduce-scatter's tables are 192 bytes, one per partial: counted as two.)
    let per_partial = if scatter { 2 } else { (c / 8).div_ceil(WORKERS as u64 * 4096) + 1 };
    let add_tables = f.saturating_sub(1).saturating_mul(per_partial);
    // The strided kernel's table has one word more (100 bytes, placed as 112).
    let table = if mm.a_row_major([rows, nbt, kbt]) { 112 } else { 96 };
    let d = nbt.saturating_mul(kbt).saturating_add(add_tables).saturating_add(8).saturating_mul(table);
    let bias = if mm.epilogue.is_some_and(|e| e.bias.is_some()) { nbt.saturating_mul(32) } else { 0 };
    let residual = if mm.epilogue.is_some_and(|e| e.residual.is_some()) { c } else { 0 };
    vec![a, b, c, z, r, d, bias, residual]
}

/// Whether a grid's buffers can be placed as the linker places them (`ipu-linker`): largest
/// first, each into the first free range that holds it — region 1 up to the host area, then
/// region 0 after the code (at most `RUNTIME_RESERVE` of code assumed). The total alone is not
/// enough: one buffer larger than either range cannot be placed however much is free.
fn fits(mm: &MatMul, g: Grid, f: u64) -> bool {
    fits_sizes(buffers_with(mm, g, f))
}

/// Whether buffers of these sizes can be placed (as [`fits`]).
pub(super) fn fits_sizes(mut sizes: Vec<u64>) -> bool {
    use crate::target::{EXEC_REGION_END, HOST_AREA_BASE, TILE_MEM_BASE};
    sizes.sort_unstable_by(|x, y| y.cmp(x));
    let mut free = [
        (HOST_AREA_BASE - EXEC_REGION_END) as u64,
        (EXEC_REGION_END - TILE_MEM_BASE) as u64 - RUNTIME_RESERVE,
    ];
    sizes.iter().filter(|s| **s > 0).all(|&s| {
        let s = s.saturating_add(15) / 16 * 16;
        match free.iter_mut().find(|r| **r >= s) {
            Some(r) => {
                *r -= s;
                true
            }
            None => false,
        }
    })
}

/// Partial sums a reduction root takes per round when K is split over `g.tk` tiles: all `tk − 1`
/// in one round when they fit beside the operands (the fastest), else the largest fan-in that
/// fits, in more rounds (docs/kernels.md "K split"). Shared with the host reference, which must
/// add the partial sums in the same order.
pub fn fan_in(mm: &MatMul, g: Grid) -> u64 {
    (2..=g.tk).rev().find(|&f| fits(mm, g, f)).unwrap_or(g.tk.min(2))
}

/// Analytic estimate of a grid's `run` cycles, used to screen candidates: the AMP launches, the
/// reduction (a reduce-scatter when one round takes every partial, `reduce.rs`) and the f32 → f16
/// conversion of an f16 result on the tiles that finish the sums.
pub fn estimate(mm: &MatMul, g: Grid) -> u64 {
    let rows = mm.m.div_ceil(g.tm);
    let nbt = mm.nb().div_ceil(g.tn);
    let kbt = mm.kb().div_ceil(g.tk);
    let rw = rows.div_ceil(WORKERS as u64);
    let add = mm.kernel().1;
    let mut total = launches_estimate(mm, rows, nbt, kbt);
    // Rows per worker on the tiles that finish the sums.
    let mut finish_rw = rw;
    if g.tk > 1 {
        let f = fan_in(mm, g);
        if f == g.tk {
            // Each tile receives its share of every other tile's partials and adds them per block.
            finish_rw = rw.div_ceil(g.tk);
            let words = (g.tk - 1) * nbt * WORKERS as u64 * finish_rw * ROW as u64 / 4;
            let xchg = 3 + words + (g.tk - 1) * nbt * WORKERS as u64 + 150;
            let adds = (g.tk - 1) * (2 + cost::runall_cycles(cost::binary_rows_issues(nbt, finish_rw * 4)));
            total += 2 * 90 + xchg + adds;
        } else {
            // Per reduction round the root receives f − 1 partial blocks and adds each.
            let nr = reduction_rounds(g.tk, f).len() as u64;
            let words = nbt * c_block(rows) / 4;
            let xchg = 3 + (f - 1) * (words + 1) + 150;
            let chunks = (nbt * c_block(rows) / 8).div_ceil(WORKERS as u64);
            total +=
                nr * (2 * 90 + xchg + (f - 1) * (2 + cost::runall_cycles(kernel_issues(add, chunks as u32))));
        }
    }
    total + convert_estimate(mm, finish_rw, nbt)
}

/// The estimate's AMP launches (one weight load and one launch per block pair) and the call's
/// fixed cycles, for a tile of `rows` rows, `nbt` column blocks and `kbt` K blocks.
fn launches_estimate(mm: &MatMul, rows: u64, nbt: u64, kbt: u64) -> u64 {
    let rw = rows.div_ceil(WORKERS as u64);
    let amp = mm.amp_kernel([rows, nbt, kbt]);
    let load = 1 + super::CweiLoad::for_kernel(amp).cycles() as u64;
    nbt * kbt * (load + 2 + cost::runall_cycles(kernel_issues(amp, rw as u32 + 1))) + 5 + 90
}

/// The estimate's f32 → f16 conversion of an f16 result (none otherwise), `rw` rows per worker.
fn convert_estimate(mm: &MatMul, rw: u64, nbt: u64) -> u64 {
    if mm.out != mm.acc {
        2 + cost::runall_cycles(cost::cvt_issues(2 * rw, nbt))
    } else {
        0
    }
}

/// [`estimate`] of a tile without a K split: its launches and the f32 → f16 conversion.
pub(super) fn band_estimate(mm: &MatMul, rows: u64, nbt: u64, kbt: u64) -> u64 {
    launches_estimate(mm, rows, nbt, kbt) + convert_estimate(mm, rows.div_ceil(WORKERS as u64), nbt)
}

/// [`estimate`] on a target of `tiles` tiles: with the grid's tail band when it has one.
pub fn estimate_on(mm: &MatMul, g: Grid, tiles: usize) -> u64 {
    super::tail::tail_band(mm, g, tiles).map_or_else(|| estimate(mm, g), |t| t.estimate)
}

/// Candidate grids that fit, in a fixed order.
pub fn candidates(mm: &MatMul, tiles: usize) -> Vec<Grid> {
    candidates_with(mm, tiles, false)
}

/// [`candidates`], with `tm` filling the tiles left by `tn · tk`, or (`one_row_group`) `tm = 1`:
/// every tile of the grid then holds a distinct part of B (`resident.rs`).
pub(super) fn candidates_with(mm: &MatMul, tiles: usize, one_row_group: bool) -> Vec<Grid> {
    let t = tiles as u64;
    let mut out = Vec::new();
    for tn in 1..=mm.nb().min(t) {
        for tk in 1..=mm.kb().min(t / tn) {
            let tm_max = if one_row_group { 1 } else { (t / (tn * tk)).min(mm.m).max(1) };
            let rows = mm.m.div_ceil(tm_max);
            let tm = mm.m.div_ceil(rows).max(1);
            let g = Grid {
                tm,
                tn: mm.nb().div_ceil(mm.nb().div_ceil(tn)),
                tk: mm.kb().div_ceil(mm.kb().div_ceil(tk)),
            };
            if !rows_fit_rpt(mm, rows) {
                continue;
            }
            if fits(mm, g, fan_in(mm, g)) && !out.contains(&g) {
                out.push(g);
            }
        }
    }
    out
}

/// Whether a worker's rows fit the kernels' one `rpt`: the AMP pipeline takes `rows + 1`
/// iterations, the f32 → f16 conversion two quads per row.
pub(super) fn rows_fit_rpt(mm: &MatMul, rows: u64) -> bool {
    let rw = rows.div_ceil(WORKERS as u64);
    let limit = crate::target::RPT_MAX_COUNT as u64;
    rw < limit && (mm.out == mm.acc || 2 * rw <= limit)
}

/// The grid with the lowest estimate (ties: fewer tiles, then the earlier candidate); `None` when
/// no grid fits (then [`no_fit`] says what the smallest needs).
pub fn choose_grid(mm: &MatMul, tiles: usize) -> Option<Grid> {
    candidates(mm, tiles).into_iter().min_by_key(|g| (estimate_on(mm, *g, tiles), g.tm * g.tn * g.tk))
}

/// "No mapping fits", with the smallest need over every grid of at most `tiles` tiles and the
/// bytes each operand (named `names`: A, B, C) takes on that grid's largest tile.
pub fn no_fit(mm: &MatMul, tiles: usize, names: [&str; 3]) -> PlanError {
    let t = tiles as u64;
    let mut best: Option<(u64, Grid)> = None;
    for tn in 1..=mm.nb().min(t) {
        for tk in 1..=mm.kb().min(t / tn) {
            let tm = (t / (tn * tk)).min(mm.m).max(1);
            let g = Grid { tm, tn, tk };
            let need = memory_with(mm, g, 2.min(tk)).saturating_add(RUNTIME_RESERVE);
            if best.is_none_or(|(b, _)| need < b) {
                best = Some((need, g));
            }
        }
    }
    let (need, g) = best.unwrap_or((u64::MAX, Grid { tm: 1, tn: 1, tk: 1 }));
    let rows = mm.m.div_ceil(g.tm);
    let (nbt, kbt) = (mm.nb().div_ceil(g.tn), mm.kb().div_ceil(g.tk));
    let parts = [
        kbt.saturating_mul(rows).saturating_mul(ROW as u64),
        kbt.saturating_mul(nbt).saturating_mul(mm.block_bytes() as u64),
        nbt.saturating_mul(c_block(rows)),
    ];
    PlanError::Unsupported(
        0,
        format!(
            "no tile mapping of this {}×{}·{}×{} matmul fits in tile memory: the smallest, grid tm={} tn={} \
             tk={} ({} tiles), needs {need} bytes on one tile (`{}` {} bytes, `{}` {}, `{}` {}), which has {} \
             ({} KiB, of which {} bytes are kept for the runtime); use more tiles or split the matmul into \
             smaller ones",
            mm.m,
            mm.k,
            mm.k,
            mm.n,
            g.tm,
            g.tn,
            g.tk,
            g.tm * g.tn * g.tk,
            names[0],
            parts[0],
            names[1],
            parts[1],
            names[2],
            parts[2],
            TILE_MEM_SIZE,
            TILE_MEM_SIZE / 1024,
            RUNTIME_RESERVE
        ),
    )
}

/// Grid position (`(i·tn + j)·tk + l`) → tile. Without homes, position p is tile p. With them, row
/// block i's positions take first the tiles holding its rows of A (in row order, each tile once),
/// then the lowest free tiles in position order. Why: a grid group receives every piece of its
/// row block back to back, and a tile's supervisor cannot send while it sets up receptions; rows
/// sent from tiles of another group stall that group's stream (docs/graph-planner.md, Scheduling).
pub fn tile_order(mm: &MatMul, grid: Grid, tiles: usize) -> Vec<u16> {
    let band = super::tail::tail_band(mm, grid, tiles);
    tile_order_with(mm, grid, tiles, band.map_or(0, |t| t.tn as usize))
}

/// [`tile_order`] for a plan that already has its tail band (`band` tiles, which only a grid
/// whose A comes from the host has: they follow the main groups').
fn tile_order_with(mm: &MatMul, grid: Grid, tiles: usize, band: usize) -> Vec<u16> {
    let per = (grid.tn * grid.tk) as usize;
    if mm.a_home.is_empty() {
        return (0..(grid.tm as usize * per + band) as u16).collect();
    }
    let used = grid.tm as usize * per;
    let mut order = vec![u16::MAX; used];
    let mut taken = vec![false; tiles];
    for i in 0..grid.tm {
        let (m0, m1) = split(mm.m, grid.tm, i);
        let slots = &mut order[i as usize * per..(i as usize + 1) * per];
        let mut q = 0;
        for &t in mm.a_home.get(m0 as usize..m1 as usize).unwrap_or_default() {
            if q < per && (t as usize) < tiles && !taken[t as usize] {
                taken[t as usize] = true;
                slots[q] = t;
                q += 1;
            }
        }
    }
    let mut free = (0..tiles as u16).filter(|&t| !taken[t as usize]);
    for slot in order.iter_mut().filter(|s| **s == u16::MAX) {
        *slot = free.next().expect("the grid uses at most the target's tiles");
    }
    order
}

/// Plan the matmul on `grid` over a target of `tiles` tiles.
pub fn plan(mm: &MatMul, grid: Grid, tiles: usize) -> Result<Plan, PlanError> {
    plan_checked(mm, grid, tiles, true)
}

/// [`plan`] for costing a search candidate: the reduction's exchange schedules are not
/// validated word by word (the plan that is built is planned again with the validation).
pub fn plan_for_cost(mm: &MatMul, grid: Grid, tiles: usize) -> Result<Plan, PlanError> {
    plan_checked(mm, grid, tiles, false)
}

fn plan_checked(mm: &MatMul, grid: Grid, tiles: usize, check: bool) -> Result<Plan, PlanError> {
    let tail = super::tail::tail_band(mm, grid, tiles);
    let used = (grid.tm * grid.tn * grid.tk + tail.map_or(0, |t| t.tn)) as usize;
    if used > tiles {
        return Err(PlanError::Unsupported(0, format!("grid needs {used} tiles, target has {tiles}")));
    }
    let need = memory_needed(mm, grid) + RUNTIME_RESERVE;
    if need > TILE_MEM_SIZE as u64 || !fits(mm, grid, fan_in(mm, grid)) {
        // Name the operand that takes the most room on the largest tile.
        let rows = mm.m.div_ceil(grid.tm);
        let (nbt, kbt) = (mm.nb().div_ceil(grid.tn), mm.kb().div_ceil(grid.tk));
        let a = kbt.saturating_mul(rows).saturating_mul(ROW as u64);
        let b = kbt.saturating_mul(nbt).saturating_mul(mm.block_bytes() as u64);
        let c = nbt * c_block(rows);
        let name = if a >= b && a >= c {
            "A"
        } else if b >= c {
            "B"
        } else {
            "C"
        };
        // Over the total, or (when the total fits but the pieces do not) over the larger free range.
        let region1 = (crate::target::HOST_AREA_BASE - crate::target::EXEC_REGION_END) as u64;
        let largest = a.max(b).max(c);
        let over = need.saturating_sub(TILE_MEM_SIZE as u64).max(largest.saturating_sub(region1)).max(1);
        return Err(PlanError::Memory { tile: 0, buffer: name.into(), over });
    }
    if !rows_fit_rpt(mm, mm.m.div_ceil(grid.tm)) {
        return Err(PlanError::Unsupported(
            0,
            format!(
                "{} rows per tile exceed the kernels' repeat count (grid tm={})",
                mm.m.div_ceil(grid.tm),
                grid.tm
            ),
        ));
    }
    if let Some((_, scale)) = mm.fp8 {
        if !(-32..=31).contains(&scale) {
            return Err(PlanError::Unsupported(
                0,
                format!("combined FP8 scale {scale} outside the AMP's -32..31"),
            ));
        }
    }
    let add = mm.kernel().1;
    let add_blocks = if add == Kernel::AddF32 { Kernel::AddBlocksF32 } else { Kernel::AddBlocksF16 };
    let order = tile_order_with(mm, grid, tiles, tail.map_or(0, |t| t.tn as usize));
    let groups_of_rows = super::tail::row_groups(mm, grid, tail);
    // Row group i's tiles start at position i·tn·tk (the band, tk = 1, after the main groups).
    let tile_of = |i: u64, j: u64, l: u64| order[(((i * grid.tn) + j) * grid.tk + l) as usize];
    let mut plans = vec![TilePlan::default(); tiles];
    let mut a_slices = Vec::new();
    let mut b_slices = Vec::new();
    let mut c_slices = Vec::new();
    let f = fan_in(mm, grid);
    // One round takes every partial: the group reduce-scatters (`reduce.rs`).
    let scatter = grid.tk > 1 && f == grid.tk;
    let mut groups: Vec<Vec<u16>> = Vec::new();
    // Kernels that finish the sums after the reduction: alpha, f32 → f16.
    let mut scales: Vec<(u16, Kernel, Vec<Word>, u64)> = Vec::new();
    let mut bias_slices = Vec::new();
    let mut residual_slices = Vec::new();
    let mut rounds: Vec<Round> = reduction_rounds(grid.tk, f)
        .iter()
        .map(|_| Round { transfers: Vec::new(), adds: Vec::new() })
        .collect();
    // Output bytes per element, and per output row on the tile: f16 results of an f32 AMP are
    // packed 16 bytes per row by the conversion.
    let elt = mm.out.size() as u64;
    let out_row = if mm.out != mm.acc { 16 } else { ROW };
    let bc = mm.block_cols();
    let (kd, ob) = (mm.depth(), mm.operand_bytes());
    for (i, &(m0, m1, tn)) in groups_of_rows.iter().enumerate() {
        let i = i as u64;
        let rows = m1 - m0;
        let wr = worker_rows(rows);
        let all = reduce::pieces(&wr);
        let cblk = c_block(rows);
        for j in 0..tn {
            let (nb0, nb1) = split(mm.nb(), tn, j);
            let nbt = nb1 - nb0;
            for l in 0..grid.tk {
                let (kb0, kb1) = split(mm.kb(), grid.tk, l);
                let kbt = kb1 - kb0;
                let tile = tile_of(i, j, l);
                let p = &mut plans[tile as usize];
                p.steps.push(Step::Phase("matmul".into()));
                if let Some((formats, scale)) = mm.fp8 {
                    p.steps.push(Step::SetCsr(crate::target::csr::FP_INFMT, formats));
                    p.steps.push(Step::SetCsr(crate::target::csr::FP_ISCL, (scale as u32) & 0x3F));
                }
                let amp = mm.amp_kernel([rows, nbt, kbt]);
                let strided = amp != mm.kernel().0;
                // Row stride of A on the tile when it is held row-major.
                let s = kbt * ROW as u64;
                let (a_bytes, read_past) = mm.a_bytes([rows, nbt, kbt]);
                p.buffers.push(Buffer { read_past, ..zero("A", a_bytes, MemKind::Tensor) });
                if strided {
                    a_slices.push(SliceRef {
                        tile,
                        buffer: "A".into(),
                        offset: 0,
                        tensor_offset: (m0 * mm.k + kb0 * kd) * ob,
                        rows: rows as u32,
                        row_bytes: ((mm.k - kb0 * kd).min(kbt * kd) * ob) as u32,
                        tensor_stride: mm.k * ob,
                        tile_stride: s as u32,
                    });
                }
                p.buffers.push(zero("B", kbt * nbt * mm.block_bytes() as u64, MemKind::Tensor));
                p.buffers.push(zero("C", nbt * cblk + SLACK as u64, MemKind::Tensor));
                p.buffers.push(zero(
                    "Z",
                    (wr[0].1 - wr[0].0 + 1) * ROW as u64 + SLACK as u64,
                    MemKind::Tensor,
                ));
                for kbl in 0..kbt {
                    let kb = kb0 + kbl;
                    if !strided {
                        a_slices.push(SliceRef {
                            tile,
                            buffer: "A".into(),
                            offset: (kbl * rows * ROW as u64) as u32,
                            tensor_offset: (m0 * mm.k + kb * kd) * ob,
                            rows: rows as u32,
                            row_bytes: ((mm.k - kb * kd).min(kd) * ob) as u32,
                            tensor_stride: mm.k * ob,
                            tile_stride: ROW,
                        });
                    }
                    for nbl in 0..nbt {
                        let nb = nb0 + nbl;
                        b_slices.push(SliceRef {
                            tile,
                            buffer: "B".into(),
                            offset: ((kbl * nbt + nbl) * mm.block_bytes() as u64) as u32,
                            tensor_offset: (kb * kd * mm.n + nb * bc) * ob,
                            rows: (mm.k - kb * kd).min(kd) as u32,
                            row_bytes: ((mm.n - nb * bc).min(bc) * ob) as u32,
                            tensor_stride: mm.n * ob,
                            tile_stride: (bc * ob) as u32,
                        });
                    }
                }
                for nbl in 0..nbt {
                    for kbl in 0..kbt {
                        let mut words = Vec::new();
                        let mut off = nbl * cblk;
                        for (w0, w1) in &wr {
                            let out = (off + SCRATCH as u64) as u32;
                            let x = if strided {
                                w0 * s + kbl * ROW as u64
                            } else {
                                (kbl * rows + w0) * ROW as u64
                            };
                            words.push(Word::Sym("A".into(), x as u32));
                            words.push(if kbl == 0 {
                                Word::Sym("Z".into(), 0)
                            } else {
                                Word::Sym("C".into(), out)
                            });
                            words.push(Word::Sym("C".into(), out - SCRATCH));
                            words.push(Word::Const((w1 - w0 + 1) as u32));
                            off += SCRATCH as u64 + (w1 - w0) * ROW as u64;
                        }
                        if strided {
                            // The strided kernel's row stride, shared by the six workers.
                            words.push(Word::Const(s as u32));
                        }
                        p.steps.push(Step::LoadWeights(
                            "B".into(),
                            ((kbl * nbt + nbl) * mm.block_bytes() as u64) as u32,
                            super::CweiLoad::for_kernel(amp),
                        ));
                        let issues = super::Issues::of_workers(
                            wr.iter().map(|(w0, w1)| kernel_issues(amp, (w1 - w0 + 1) as u32)),
                        );
                        p.run(amp, smol_str::format_smolstr!("d{nbl}_{kbl}"), words, issues);
                    }
                }
                // The rows this tile finishes: its share when the group reduce-scatters, all of
                // them on the group's first tile otherwise.
                let finishes = if scatter {
                    reduce::share(&all, grid.tk, l)
                } else if l == 0 {
                    all.clone()
                } else {
                    Vec::new()
                };
                for nbl in 0..nbt {
                    let nb = nb0 + nbl;
                    for p in finishes.iter().filter(|p| p.rows > 0) {
                        c_slices.push(SliceRef {
                            tile,
                            buffer: "C".into(),
                            offset: (nbl * cblk + p.at) as u32,
                            tensor_offset: ((m0 + p.row) * mm.n + nb * bc) * elt,
                            rows: p.rows as u32,
                            row_bytes: ((mm.n - nb * bc).min(bc) * elt) as u32,
                            tensor_stride: mm.n * elt,
                            tile_stride: out_row,
                        });
                    }
                }
                if !finishes.is_empty() {
                    let root = epilogue::Root { tile, pieces: &finishes, nbt, cblk, nb0, m0 };
                    let fin = epilogue::finish(mm, &root);
                    plans[tile as usize].buffers.extend(fin.buffers);
                    scales.extend(fin.launches.into_iter().map(|(k, w, n)| (tile, k, w, n)));
                    bias_slices.extend(fin.bias_slices);
                    residual_slices.extend(fin.residual_slices);
                }
            }
            if scatter {
                groups.push((0..grid.tk).map(|l| tile_of(i, j, l)).collect());
                reduce::reduce_scatter(
                    &mut plans,
                    &mut rounds[0],
                    |l| tile_of(i, j, l),
                    (grid.tk, nbt, cblk),
                    &all,
                );
            } else if grid.tk > 1 {
                let reduce = (grid.tk, f);
                reduce::reduce_group(&mut plans, &mut rounds, |l| tile_of(i, j, l), reduce, nbt * cblk, add);
            }
        }
    }
    let mut horizons = Vec::new();
    let mut exchange_bytes = 0;
    let scales = scales;
    for (r, round) in rounds.iter().enumerate() {
        // A reduce-scatter's tiles send and receive in the same exchange, in rounds (`reduce.rs`).
        // Validated word by word unless the plan is only costed (`plan_for_cost`).
        let sched = if scatter {
            Ok(reduce::scatter_schedule(&groups, &round.transfers))
        } else {
            exchange::schedule_unchecked(&round.transfers)
        }
        .and_then(|s| if check { exchange::validate(&round.transfers, &s).map(|()| s) } else { Ok(s) })
        .map_err(|e| PlanError::Unsupported(0, format!("{e}")))?;
        horizons.push(sched.horizon);
        exchange_bytes += round.transfers.iter().map(|t| 4 * t.words as u64).sum::<u64>();
        for (t, p) in plans.iter_mut().enumerate() {
            p.steps.push(Step::Phase("reduce".into()));
            p.steps.push(Step::Sync);
            p.steps.push(Step::Exchange(sched.events.get(&(t as u16)).cloned().unwrap_or_default()));
            for (tile, name, words, issues) in round.adds.iter().filter(|a| a.0 as usize == t) {
                debug_assert_eq!(*tile as usize, t);
                let kernel = if scatter { add_blocks } else { add };
                p.run(kernel, smol_str::format_smolstr!("r{r}{name}"), words.clone(), *issues);
            }
        }
    }
    // alpha scales, or the conversion rounds, the finished sums on the tiles that finish them.
    for (n, (tile, kernel, words, issues)) in scales.into_iter().enumerate() {
        let p = &mut plans[tile as usize];
        let name = format!("dfin{n}");
        let phase = match kernel {
            Kernel::ScaleF16 => "scale",
            Kernel::BiasF16 => "bias",
            Kernel::GeluF16 | Kernel::GeluErfF16 | Kernel::GeluSigmoidF16 => "gelu",
            Kernel::AddF16 => "residual",
            _ => "convert",
        };
        p.launch(phase, kernel, name, words, issues);
    }
    let plans = super::Tiles::from(plans);
    let cost = cost::predict(&plans, &horizons);
    let bind = |t: TensorId, d, tr, s| BindingPlan { tensor: t, direction: d, transpose: tr, slices: s };
    Ok(Plan {
        tiles: plans,
        bindings: vec![
            bind(mm.a, Direction::Input, mm.ta, a_slices),
            bind(mm.b, Direction::Input, mm.tb, b_slices),
            bind(mm.epilogue.map(|e| e.result).unwrap_or(mm.c), Direction::Output, false, c_slices),
        ]
        .into_iter()
        .chain(
            mm.epilogue.and_then(|e| e.bias).map(|vector| bind(vector, Direction::Input, false, bias_slices)),
        )
        .chain(
            mm.epilogue.and_then(|e| e.residual).map(|r| bind(r, Direction::Input, false, residual_slices)),
        )
        .collect(),
        cost,
        tiles_used: used as u32,
        grids: vec![[grid.tm as u32, grid.tn as u32, grid.tk as u32]],
        alpha_on_a: Vec::new(),
        horizons,
        profile: None,
        exchange_bytes,
        eliminated_clears: 0,
        cleared_bytes: 0,
        mapping: vec![format!(
            "matmul M={} K={} N={} grid tm={} tn={} tk={} tiles={used} accumulate={}{}{}",
            mm.m,
            mm.k,
            mm.n,
            grid.tm,
            grid.tn,
            grid.tk,
            mm.acc.name(),
            if grid.tk > 1 {
                format!(" reduction fan-in {f} in {} rounds", rounds.len())
            } else {
                tail.map(|t| format!(" tail band rows={} tn={}", t.rows, t.tn)).unwrap_or_default()
            },
            mm.alpha.map(|a| format!(" alpha={a}")).unwrap_or_default()
        )],
    })
}
