//! Planning: from a graph to per-tile programs over named buffers, bindings and a cost.
//! The plan is symbolic (buffer names, not addresses): `ipu-linker` places the buffers and
//! `ipu-runtime-tile` turns the steps into code.

mod canon;
mod casts;
pub mod chain;
pub mod columns;
pub mod cost;
pub mod elementwise;
mod epilogue;
pub mod exchange;
pub mod init;
mod layout;
pub mod liveness;
pub mod map;
pub mod matmul;
pub mod profile;
pub mod redistribute;
mod reduce;
pub mod resident;
pub mod row_reduce;
pub mod rows;
pub mod scatter;
pub mod search;
pub mod stages;
pub mod supersteps;
pub mod tail;
pub mod tiles;
pub mod transpose;
mod validate;

use alloc::string::String;
use alloc::vec::Vec;
use ipu_schema::{DType, Direction};

use crate::graph::{BinaryOp, Graph, OpKind, TensorId};
pub use init::Init;
pub use tiles::Tiles;

/// What a buffer holds, for the memory report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum MemKind {
    /// Tensor data.
    Tensor,
    /// Kernel descriptors.
    Descriptor,
    /// Exchange receive buffers.
    Exchange,
    /// Profile cycle stamps (`build --profile`).
    Profile,
}

/// A named piece of tile memory. `Ord` so that the build can key identical tiles by their
/// buffers without formatting them.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Buffer {
    /// Symbol name (unique on the tile).
    pub name: Sym,
    /// Size in bytes.
    pub bytes: u32,
    /// Alignment.
    pub align: u32,
    /// Kind.
    pub kind: MemKind,
    /// Initial 32-bit words (`Sym` words are resolved by the linker); empty = zero-filled.
    pub init: Init,
    /// When the buffer holds a value (docs/graph-planner.md §5): the linker lets buffers whose
    /// lifetimes are disjoint share bytes.
    pub live: Live,
    /// Bytes after the buffer that kernels may read but never use (a pipelined stream's
    /// read-ahead): any memory will do, so other buffers may sit there, but it must exist — the
    /// linker keeps `end + read_past` inside tile memory.
    pub read_past: u32,
}

/// A buffer's lifetime in the tile's superstep positions, both ends included: written first at
/// `from`, read last at `to`. Positions are the stage planner's (`stages.rs`): stage `k`'s
/// redistribution is `2k`, its compute `2k + 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Live {
    /// First position.
    pub from: u32,
    /// Last position.
    pub to: u32,
}

impl Live {
    /// The whole program and every later run: params, descriptors, host-bound buffers and the
    /// buffers of single-mapping plans.
    pub const ALWAYS: Live = Live { from: 0, to: u32::MAX };

    /// Whether two lifetimes share a position (then the buffers need bytes of their own).
    pub fn overlaps(self, other: Live) -> bool {
        self.from <= other.to && other.from <= self.to
    }
}

/// A buffer or phase name. Names are short (`t3`, `g2_d17`, `D+4096`) and a 1472-tile plan holds
/// millions of them (every address word of every descriptor): an inline string up to 23 bytes
/// takes no allocation, where a `String` took one each — most of a large plan's planning time.
pub type Sym = smol_str::SmolStr;

/// A 32-bit word whose value may be an address.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Word {
    /// A constant.
    Const(u32),
    /// Address of a buffer plus an offset.
    Sym(Sym, u32),
}

/// Worker kernels (code in `ipu-runtime-tile`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kernel {
    /// AMP rows, f16 partials (descriptor: x, pin, out−40, rows+1).
    AmpF16,
    /// AMP rows, f32 partials.
    AmpF32,
    /// `dst[i] += src[i]` over f16 (descriptor: dst, src, chunks of 8 bytes).
    AddF16,
    /// Same over f32.
    AddF32,
    /// AMP rows, FP8 operands, f16 partials (same descriptor as `AmpF16`).
    AmpF8,
    /// f16 → FP8, four values per chunk (descriptor: src, dst, chunks, format | scale << 8).
    CastF16ToF8,
    /// FP8 → f16, four values per chunk (same descriptor).
    CastF8ToF16,
    /// In-place `x = f16(alpha · f32(x))` over f16 chunks (descriptor: ptr, chunks, alpha bits, 0).
    ScaleF16,
    /// Row softmax from the matmul output layout into the operand layout (docs/kernels.md).
    SoftmaxF16,
    /// `x = gelu(x)` (tanh form, f32 arithmetic) in place over blocks of f16 AMP output rows
    /// (descriptor: ptr, 4-value chunks per block, block stride, blocks, 5 constants; 64 bytes).
    GeluF16,
    /// `row += bias` over blocks of f16 AMP output rows, the block's 16 bias values held in
    /// registers (descriptor: ptr, rows, block stride, blocks, bias ptr, 0, 0, 0).
    BiasF16,
    /// f32 → f16 over chunks of four values (same descriptor as the FP8 casts; format unused).
    CastF32ToF16,
    /// f16 → f32 over chunks of four values (same descriptor).
    CastF16ToF32,
    /// f32 → f16 in place over blocks of f32 rows, the halves packed from the block's start
    /// (descriptor: ptr, pairs per block, block stride, blocks).
    CvtF32ToF16,
    /// Word copies on the tile, for redistributions whose source and destination share a tile
    /// (descriptor per worker: list, segments; each list entry: src, dst, words).
    CopyWords,
    /// Word clears of reused memory (docs/graph-planner.md §5; descriptor per worker: list,
    /// segments; each list entry: dst, words).
    ZeroWords,
    /// Output rows of a last-two-axes transpose from 2-byte column reads (descriptor: 32 bytes per
    /// worker: x column, y row, rows, R, x stride, y stride; `transpose.rs`).
    TransposeF16,
    /// Layer normalisation of f16 rows, statistics in f32 (descriptor: 64 bytes per worker,
    /// `rows.rs`; docs/kernels.md `layernorm_f16`).
    LayerNormF16,
    /// Row-shared layer normalisation, launch 1 of 3: each worker's partial sum of its columns.
    LayerNormSum,
    /// Launch 2: the mean from the partials, each worker's partial sum of squared deviations.
    LayerNormVar,
    /// Launch 3: mean and variance from the partials, each worker normalises its columns.
    LayerNormApply,
    /// `x = gelu(x)` in the erf form, in place over blocks of f16 (descriptor: ptr, 4-value chunks
    /// per block, block stride, blocks, the nine `matmul::GELU_ERF_CONSTANTS`; 64 bytes).
    GeluErfF16,
    /// `x = x·σ(1.702x)` (the quick GeLU), in place over blocks of f16 (descriptor as
    /// `GeluErfF16`, its constants the two `matmul::GELU_SIGMOID_CONSTANTS`).
    GeluSigmoidF16,
    /// One f16 per row: the row's f32 sum times a constant (1: `reduce_sum`, 1/D: `reduce_mean`),
    /// whole rows per worker (descriptor: 64 bytes per worker, `row_reduce.rs`; docs/kernels.md
    /// `reduce_rows_f16`).
    ReduceRowsF16,
    /// `out = a ∘ b` over f16 rows, a row stride of 0 broadcasting one row (descriptor: 32 bytes
    /// per worker, `elementwise.rs`; docs/kernels.md `add_rows_f16`).
    BinaryF16(BinaryOp),
    /// `out = a ∘ b` over f16 rows where `a` (`true`) or `b` (`false`) is one value per row or one
    /// value in all, splat across the row (descriptor: 64 bytes per worker, `elementwise.rs`).
    SplatF16(BinaryOp, bool),
    /// `x = f(x)` in place over blocks of f16, f32 arithmetic (descriptor: ptr, 4-value chunks
    /// per block, block stride, blocks, the function's constants; 64 bytes; `map.rs`).
    MapF16(crate::graph::MapFn),
    /// `out = dst + src` over f16 in each of several blocks: a reduce-scatter step, the code of the
    /// row binary kernels (descriptor as `BinaryF16`: dst, dst block stride, src, src block stride,
    /// out, out block stride, blocks, 8-byte chunks per block).
    AddBlocksF16,
    /// Same over f32.
    AddBlocksF32,
    /// AMP rows, f16 partials, A held row-major (`[row][K slice]`, row stride S bytes): the
    /// `AmpF16` descriptor entries, then one word shared by the six workers, S (docs/kernels.md).
    AmpF16Strided,
    /// Same with f32 partials (`AmpF32`).
    AmpF32Strided,
    /// Same with FP8 operands (`AmpF8`).
    AmpF8Strided,
}

/// How much of the AMP weight store a [`Step::LoadWeights`] fills (docs/target.md §4.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CweiLoad {
    /// `ldcwei`: all 512 bytes, the 16 engines `f16amp` and `f8amp` read.
    Full,
    /// `ldcweih`: the first 256 bytes, all that `f32amp` reads, in half the time.
    Half,
}

impl CweiLoad {
    /// The load an AMP kernel needs.
    pub fn for_kernel(amp: Kernel) -> Self {
        if matches!(amp, Kernel::AmpF32 | Kernel::AmpF32Strided) {
            CweiLoad::Half
        } else {
            CweiLoad::Full
        }
    }
    /// Supervisor cycles of the load instruction.
    pub fn cycles(self) -> u32 {
        match self {
            CweiLoad::Full => crate::target::CWEI_LOAD_CYCLES,
            CweiLoad::Half => crate::target::CWEI_HALF_LOAD_CYCLES,
        }
    }
    /// The instruction.
    pub fn mnemonic(self) -> &'static str {
        match self {
            CweiLoad::Full => "ldcwei",
            CweiLoad::Half => "ldcweih",
        }
    }
}

/// The cost model's input for one launch: the slowest worker's issues and which workers issue
/// that many. When the slowest are not all six, when the launch ends depends on which of them
/// starts last, and that depends on the cycle `runall` issues at (docs/target.md §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Issues {
    /// Issues of the slowest worker.
    pub max: u64,
    /// Bit `k` is set when worker `k` issues `max`.
    pub slowest: u8,
    /// How many fewer issues the other workers have at most (0 when all six are slowest).
    pub spare: u64,
}

impl Issues {
    /// Every worker counted as slowest: the latest end whatever cycle `runall` issues at.
    pub fn all(max: u64) -> Self {
        Issues { max, slowest: 0x3F, spare: 0 }
    }
    /// From each worker's issues (worker `k` at index `k`).
    pub fn of_workers(per_worker: impl IntoIterator<Item = u64>) -> Self {
        let per: Vec<u64> = per_worker.into_iter().collect();
        let max = per.iter().copied().max().unwrap_or(0);
        let slowest = per.iter().enumerate().filter(|(_, &i)| i == max).fold(0u8, |m, (k, _)| m | 1 << k);
        let others = per.iter().copied().filter(|&i| i < max).max();
        Issues { max, slowest, spare: others.map_or(0, |o| max - o) }
    }
}

impl From<u64> for Issues {
    fn from(max: u64) -> Self {
        Issues::all(max)
    }
}

/// One step of a tile's `run` call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Load the AMP weight store, or the part of it the kernel reads, from a buffer.
    LoadWeights(Sym, u32, CweiLoad),
    /// Start six workers on a kernel with a descriptor table and wait for them; what the
    /// slowest workers issue is the cost model's input.
    RunAll(Kernel, Desc, Issues),
    /// An internal sync (every tile has the same number).
    Sync,
    /// Timed exchange code, then an internal sync.
    Exchange(Vec<exchange::Event>),
    /// Write a supervisor CSR (FP8 formats and scale of the AMP).
    SetCsr(u32, u32),
    /// The following steps belong to this phase (an op or part of it); no code.
    Phase(Sym),
    /// Store the cycle counter as profile stamp `n` (only in profiled plans, `profile.rs`).
    Stamp(u32),
}

/// Where a launch's descriptor table is: a buffer and a byte offset in it (a tile's tables are
/// merged into one buffer, `merge_descriptors`, so a launch names its place in it by number).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Desc {
    /// The buffer.
    pub table: Sym,
    /// Byte offset of the launch's table in it.
    pub offset: u32,
}

impl From<Sym> for Desc {
    fn from(table: Sym) -> Self {
        Desc { table, offset: 0 }
    }
}

impl From<&str> for Desc {
    fn from(table: &str) -> Self {
        Desc { table: table.into(), offset: 0 }
    }
}

impl From<alloc::string::String> for Desc {
    fn from(table: alloc::string::String) -> Self {
        Desc { table: table.into(), offset: 0 }
    }
}

impl core::fmt::Display for Desc {
    /// As the assembler reads it: `table+offset` (`table` at offset 0).
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.offset {
            0 => write!(f, "{}", self.table),
            o => write!(f, "{}+{o}", self.table),
        }
    }
}

/// One tile's program.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TilePlan {
    /// Buffers.
    pub buffers: Vec<Buffer>,
    /// Steps of the `run` call.
    pub steps: Vec<Step>,
}

impl TilePlan {
    /// Run `kernel` on the six workers in op `phase`, its descriptor table `words` held in a new
    /// buffer `name`; `issues` is the slowest worker's.
    pub fn launch(
        &mut self,
        phase: impl Into<Sym>,
        kernel: Kernel,
        name: impl Into<Sym>,
        words: Vec<Word>,
        issues: u64,
    ) {
        self.steps.push(Step::Phase(phase.into()));
        self.run(kernel, name, words, issues);
    }

    /// [`TilePlan::launch`] within the phase already open (a further kernel of the same op).
    pub fn run(&mut self, kernel: Kernel, name: impl Into<Sym>, words: Vec<Word>, issues: impl Into<Issues>) {
        let name = name.into();
        self.buffers.push(Buffer {
            name: name.clone(),
            bytes: 4 * words.len() as u32,
            align: 16,
            kind: MemKind::Descriptor,
            init: words.into(),
            live: Live::ALWAYS,
            read_past: 0,
        });
        self.steps.push(Step::RunAll(kernel, name.into(), issues.into()));
    }
}

/// A binding slice before linking (buffer name instead of address).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceRef {
    /// Tile.
    pub tile: u16,
    /// Buffer.
    pub buffer: Sym,
    /// Offset in the buffer.
    pub offset: u32,
    /// Byte offset in the tensor.
    pub tensor_offset: u64,
    /// Rows.
    pub rows: u32,
    /// Bytes per row.
    pub row_bytes: u32,
    /// Tensor bytes between rows.
    pub tensor_stride: u64,
    /// Tile bytes between rows.
    pub tile_stride: u32,
}

/// How a tensor reaches tiles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindingPlan {
    /// Tensor.
    pub tensor: TensorId,
    /// Input or output.
    pub direction: Direction,
    /// The host transposes this 2-D tensor before (inputs) applying the slices.
    pub transpose: bool,
    /// Slices.
    pub slices: Vec<SliceRef>,
}

/// The whole plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// One program per tile of the target (tiles with the same program share it).
    pub tiles: Tiles,
    /// Bindings.
    pub bindings: Vec<BindingPlan>,
    /// Predicted cycles of a `run` call.
    pub cost: cost::Cost,
    /// Tiles that run kernels.
    pub tiles_used: u32,
    /// Human-readable mapping per op, for the log.
    pub mapping: Vec<String>,
    /// Per op, the grid `[tm, tn, tk]`.
    pub grids: Vec<[u32; 3]>,
    /// Ops (ascending) whose alpha the tiles apply to the f16 operand `a` — each value rounded
    /// to f16 once, in place, before the product — instead of to the product (docs/kernels.md
    /// "Alpha on the row operand"). The host reference reproduces it from the package's plan.
    pub alpha_on_a: Vec<usize>,
    /// Per exchange superstep, its scheduled horizon (cycles from its start to its last landing).
    pub horizons: Vec<u64>,
    /// The profile plan, when asked for.
    pub profile: Option<profile::Samples>,
    /// Bytes sent over the exchange per `run` call (each broadcast word counted once).
    pub exchange_bytes: u64,
    /// Rows whose padding clear was left out because the padding is zero already (docs/kernels.md).
    pub eliminated_clears: u64,
    /// Bytes the `zero_words` clears of reused memory write per run, over all tiles (`liveness.rs`).
    pub cleared_bytes: u64,
}

impl Plan {
    /// A plan of kernel launches without exchange (one superstep), its cost from the steps.
    pub fn compute_only(
        tiles: Vec<TilePlan>,
        bindings: Vec<BindingPlan>,
        tiles_used: u32,
        mapping: String,
        grids: Vec<[u32; 3]>,
    ) -> Plan {
        let tiles = Tiles::from(tiles);
        Plan {
            cost: cost::predict(&tiles, &[]),
            tiles,
            bindings,
            tiles_used,
            mapping: alloc::vec![mapping],
            grids,
            alpha_on_a: Vec::new(),
            horizons: Vec::new(),
            profile: None,
            exchange_bytes: 0,
            eliminated_clears: 0,
            cleared_bytes: 0,
        }
    }
    /// Supersteps of the `run` call: internal syncs + 1.
    pub fn phases(&self) -> u32 {
        self.tiles
            .iter()
            .next()
            .map(|t| t.steps.iter().filter(|s| matches!(s, Step::Sync | Step::Exchange(_))).count())
            .unwrap_or(0) as u32
            + 1
    }
}

/// Why a graph cannot be planned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// A feature the planner does not support, with the op index.
    Unsupported(usize, String),
    /// A tensor does not fit in tile memory.
    Memory {
        /// Tile.
        tile: u16,
        /// Buffer.
        buffer: String,
        /// Bytes over the limit.
        over: u64,
    },
    /// An op's buffers do not fit beside those already placed on a tile (graphs of stages).
    NoRoom {
        /// Tile.
        tile: u16,
        /// The op being placed (its stage's first op).
        op: usize,
        /// Bytes its buffers take on the tile.
        needed: u64,
        /// Bytes left on the tile before it.
        free: u64,
        /// What the rest of the tile holds at that point.
        held: Held,
    },
    /// The plan costs more than `PlanOptions::budget` (search candidates only).
    OverBudget {
        /// Cycles the plan takes at least.
        lower_bound: u64,
        /// Bytes its exchange moves.
        exchange_bytes: u64,
    },
}

impl core::fmt::Display for PlanError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PlanError::Unsupported(op, w) => write!(f, "op {op}: {w}"),
            PlanError::NoRoom { tile, op, needed, free, held } => {
                write!(f, "op {op}: {}", no_room(*tile, *needed, *free, held))
            }
            PlanError::Memory { tile, buffer, over } => {
                write!(f, "tile {tile}: {buffer} does not fit in tile memory ({over} bytes over)")
            }
            PlanError::OverBudget { lower_bound, .. } => {
                write!(f, "the plan takes at least {lower_bound} cycles, more than the search's budget")
            }
        }
    }
}

/// The words of a [`PlanError::NoRoom`] after the op.
pub fn no_room(tile: u16, needed: u64, free: u64, held: &Held) -> String {
    alloc::format!(
        "tile {tile}: placing it needs {needed} bytes of tile memory where {free} are free (of {}; the \
         rest holds {} bytes of resident tensors (params and host-bound buffers), {} of descriptor \
         tables, {} of exchange buffers and {} of earlier ops' results still to be read); use more \
         tiles{}",
        BUFFER_BYTES,
        held.resident,
        held.descriptors,
        held.exchange,
        held.earlier,
        if held.resident > BUFFER_BYTES / 2 { " or --weights fp8" } else { "" }
    )
}

/// Bytes a tile holds at one point of the program, by kind (the detail of [`PlanError::NoRoom`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Tensors live for the whole run: params, host-bound inputs and outputs.
    pub resident: u64,
    /// Kernel descriptor tables.
    pub descriptors: u64,
    /// Exchange receive buffers.
    pub exchange: u64,
    /// Results of earlier ops that later ops still read.
    pub earlier: u64,
}

impl Held {
    /// The bytes of `buffers` live at position `x`, by kind (each rounded up to 16 bytes, as
    /// `liveness::live_bytes` counts them).
    pub fn at(buffers: &[Buffer], x: u32) -> Held {
        let mut h = Held::default();
        for b in buffers.iter().filter(|b| b.live.from <= x && x <= b.live.to) {
            let bytes = (b.bytes as u64).div_ceil(16) * 16;
            match b.kind {
                MemKind::Descriptor => h.descriptors += bytes,
                MemKind::Exchange => h.exchange += bytes,
                MemKind::Tensor if b.live == Live::ALWAYS => h.resident += bytes,
                MemKind::Tensor | MemKind::Profile => h.earlier += bytes,
            }
        }
        h
    }
}

/// Options for planning.
#[derive(Clone, Copy, Debug)]
pub struct PlanOptions {
    /// Tiles of the target.
    pub tiles: usize,
    /// Force a grid `[tm, tn, tk]` instead of choosing one (tests, experiments).
    pub grid: Option<[u32; 3]>,
    /// Store cycle stamps for a profile (costs 2 cycles per sample point).
    pub profile: bool,
    /// Where casts of matmul side operands run relative to the exchange (row chains).
    pub side_cast: chain::SideCast,
    /// Groups of result columns a row chain's final matmul is split into (1: none; `columns.rs`).
    pub column_groups: u32,
    /// Refuse early (`PlanError::OverBudget`) a plan that provably costs more than this many
    /// cycles (the search's incumbent); `None` plans whatever it costs.
    pub budget: Option<u64>,
    /// Only the cost is wanted (a search candidate, [`figures`]): exchange schedules are not
    /// validated word by word — the plan that is built is planned again with the validation.
    pub costing: bool,
    /// Told `(stage, stages, what)` before each stage of a graph is planned, so that a long
    /// plan shows where it is (the host logs it; `core` has no clock or log of its own).
    pub progress: Option<fn(usize, usize, &str)>,
}

impl PlanOptions {
    /// Plain options for `tiles` tiles: grid chosen by the planner, no profile.
    pub fn new(tiles: usize) -> Self {
        PlanOptions {
            tiles,
            grid: None,
            profile: false,
            side_cast: chain::SideCast::Replicated,
            column_groups: 1,
            budget: None,
            costing: false,
            progress: None,
        }
    }
}

/// Name of the phase of op `i` in profiles: its kind and the tensor it defines (`matmul S`).
pub fn op_phase(graph: &Graph, i: usize) -> Sym {
    let op = &graph.ops[i];
    let kind = match op.kind {
        OpKind::MatMul { .. } => "matmul",
        OpKind::Cast { .. } => "cast",
        OpKind::Softmax { .. } => "softmax",
        OpKind::Binary { op, .. } => op.name(),
        OpKind::Gelu { .. } => "gelu",
        OpKind::Map { func, .. } => func.name(),
        OpKind::LayerNorm { .. } => "layernorm",
        OpKind::Reduce { mean: false, .. } => "reduce_sum",
        OpKind::Reduce { mean: true, .. } => "reduce_mean",
        OpKind::Reshape { .. } => "reshape",
        OpKind::Slice { .. } => "slice",
        OpKind::Transpose { .. } => "transpose",
    };
    smol_str::format_smolstr!("{kind} {}", graph.tensor(op.output).name)
}

/// Plan a graph with the one graph planner (`stages.rs`, docs/graph-planner.md): the graph is a
/// list of stages, each with a mapping — the matmul grid (any grid, K split over the exchange,
/// either operand transposed, fused epilogue), a row chain (`chain.rs`, with column groups),
/// row ops (`rows.rs`, `elementwise.rs`, `transpose.rs`) — joined by redistributions. The first
/// choice is the whole graph as one mapping when one planner takes it (a matmul with its
/// epilogue, a row chain); otherwise the partition's stages.
pub fn plan(graph: &Graph, opts: PlanOptions) -> Result<Plan, PlanError> {
    plan_with_grids(graph, opts, &[])
}

/// [`plan`] with a grid forced for the matmul stages of a graph of stages: `grids[op]` for the
/// stage whose matmul is op `op` (`None` or out of range: the grid the estimate picks). The stage
/// search (`ipu-host` `search::stage_grids`) varies them.
pub fn plan_with_grids(
    graph: &Graph,
    opts: PlanOptions,
    grids: &[Option<[u32; 3]>],
) -> Result<Plan, PlanError> {
    if let Some(c) = canon::explicit_transposes(graph) {
        // Planned with explicit transposes; the plan's per-op figures and errors name model ops.
        let forward: Vec<Option<[u32; 3]>> =
            c.orig.iter().map(|o| o.and_then(|i| grids.get(i).copied().flatten())).collect();
        let mut plan = plan_with_grids(&c.graph, opts, &forward).map_err(|e| match e {
            PlanError::Unsupported(op, w) => PlanError::Unsupported(c.model_op(op), w),
            PlanError::NoRoom { tile, op, needed, free, held } => {
                PlanError::NoRoom { tile, op: c.model_op(op), needed, free, held }
            }
            other => other,
        })?;
        plan.grids = c.new_of.iter().map(|&i| plan.grids.get(i).copied().unwrap_or([1, 1, 1])).collect();
        plan.alpha_on_a = plan.alpha_on_a.iter().filter_map(|&i| c.orig.get(i).copied().flatten()).collect();
        return Ok(plan);
    }
    // The graph-level mapping choice: the whole graph as one mapping (one matmul with its
    // epilogue, or one row chain) when a single planner takes it, else the stages the partition
    // cuts. Either way the stage planner joins, names and places them.
    let (whole, refusal) = match single(graph, PlanOptions { profile: false, ..opts }) {
        Ok(p) => (Some(p), None),
        Err(e) => (None, Some(e)),
    };
    let cut =
        if whole.is_some() { alloc::vec![(0..graph.ops.len()).collect()] } else { stages::partition(graph) };
    // A graph one planner refused that the partition does not change (one stage of the kind
    // that planner takes, no views) keeps that planner's refusal.
    let cut_changes_it = cut.len() > 1
        || (cut.len() == 1 && stages::row_op(graph, cut[0][0]))
        || (0..graph.ops.len()).any(|i| stages::view_op(graph, i));
    if let (None, false, Some(e)) = (&whole, cut_changes_it, &refusal) {
        return Err(e.clone());
    }
    // Param stages move to grids of one row group where the default grids would put more
    // weights on one tile than the budget (docs/graph-planner.md "Resident weights").
    let lean = if whole.is_none() { resident::grids(graph, opts, &cut, grids) } else { grids.to_vec() };
    let mut plan = stages::plan(graph, opts, &cut, &lean, whole).map_err(|(e, in_chain)| {
        // When a row-chain stage refuses, the whole-graph error says more (the same planner
        // refused a larger piece, with the reason in the user's terms).
        // Unless the whole-graph refusal is about an op the partition gave to another stage
        // (a layernorm, an elementwise op, a view): then the stage's own reason is the one.
        match refusal {
            Some(PlanError::Unsupported(op, _)) if in_chain && stages::planned_apart(graph, op) => e,
            Some(w) if in_chain => w,
            _ => e,
        }
    })?;
    if opts.profile {
        plan.profile = Some(profile::instrument(&mut plan.tiles));
        plan.cost = cost::predict(&plan.tiles, &plan.horizons);
    }
    // Once per distinct program: tiles that share one share the result.
    plan.tiles.for_each_distinct(|tiles, tile| {
        merge_descriptors(tile, "D");
        check_memory(graph, tiles[0] as u16, tile)
    })?;
    Ok(plan)
}

/// What a search needs of a candidate — its predicted cost and the bytes its exchange moves —
/// the same figures [`plan_with_grids`] gives (`tests/tests/search.rs` compares them). When the
/// whole graph is one mapping ([`single`]) the stage planner's naming, binding and liveness work
/// is skipped: it does not change the steps the cost is predicted from, and at 1472 tiles it was
/// most of a candidate's planning time.
pub fn figures(
    graph: &Graph,
    opts: PlanOptions,
    grids: &[Option<[u32; 3]>],
) -> Result<(cost::Cost, u64), PlanError> {
    let opts = PlanOptions { costing: true, ..opts };
    if !opts.profile {
        match single(graph, opts) {
            Ok(p) => {
                // Descriptor tables are not merged into `D` first: merging pads each table to
                // 16 bytes, as placing it alone does, so the peak is the same.
                for (t, tile) in p.tiles.distinct() {
                    check_memory(graph, t as u16, tile)?;
                }
                return Ok((p.cost, p.exchange_bytes));
            }
            Err(e @ PlanError::OverBudget { .. }) => return Err(e),
            Err(_) => {}
        }
    }
    plan_with_grids(graph, opts, grids).map(|p| (p.cost, p.exchange_bytes))
}

/// The graph as one mapping: the matmul planner (with its fused epilogue) or the row-chain
/// planner (with column groups when asked).
pub(crate) fn single(graph: &Graph, opts: PlanOptions) -> Result<Plan, PlanError> {
    let epilogue = fused_epilogue(graph);
    let simple = (graph.ops.len() == 1 || epilogue.is_some())
        && matches!(graph.ops[0].kind, OpKind::MatMul { a, b, alpha, accumulate, .. }
            if graph.tensor(a).shape.len() == 2 && graph.tensor(b).shape.len() == 2
            && graph.tensor(a).dtype == DType::F16 && graph.tensor(b).dtype == DType::F16
            && (alpha.is_none() || accumulate == DType::F16));
    Ok(if simple {
        plan_matmul(graph, opts, epilogue, Vec::new(), false)?
    } else if opts.column_groups > 1 {
        let (split, how) = columns::split(graph, opts.column_groups as u64)?;
        let mut plan = chain::plan(&split, opts)?;
        columns::remap(&mut plan, graph, &how);
        for m in plan.mapping.iter_mut() {
            m.push_str(&alloc::format!(", {} column groups", opts.column_groups));
        }
        plan
    } else {
        chain::plan(graph, opts)?
    })
}

/// Bytes the runtime and kernels may take (code, host area) — kept out of buffer space.
pub const RUNTIME_RESERVE: u64 = 24 * 1024;

/// Tile bytes the planners may give to buffers (the rest is the runtime's, [`RUNTIME_RESERVE`]).
pub const BUFFER_BYTES: u64 = crate::target::TILE_MEM_SIZE as u64 - RUNTIME_RESERVE;

/// FNV-1a of a name: a lookup compares one integer per step instead of the names' bytes (names
/// share long stage prefixes). Only found entries are compared by name, so a collision costs
/// nothing but a compare.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// Put all of a tile's descriptor tables into one buffer `table` (steps then name
/// `table+offset`), so a tile needs a handful of symbols however many kernel launches it has.
///
/// A planner may merge each tile as soon as it is made (the row chain does: at SigLIP scale the
/// per-launch tables of all tiles were 300 MB at the build's peak); the final merge into `D` then
/// takes those tables, renamed by their stage, whole, and adds their base to a step's offset.
pub(crate) fn merge_descriptors(tile: &mut TilePlan, table: &str) {
    let mut words = Init::new();
    // Old name → byte offset in `D`: looked up once per launch and per name a table uses (a tile
    // can have thousands of launches and a million words, most naming data buffers, not tables).
    let mut base: Vec<(u64, Sym, u32)> = Vec::new();
    tile.buffers.retain_mut(|b| {
        if b.kind != MemKind::Descriptor || b.init.is_empty() {
            return true;
        }
        let pad = words.len().next_multiple_of(4) - words.len();
        for _ in 0..pad {
            words.push(Word::Const(0));
        }
        let name = core::mem::take(&mut b.name);
        base.push((name_hash(&name), name, 4 * words.len() as u32));
        // The first table moves in (a tile the row chain merged already has only one).
        if words.is_empty() {
            words = core::mem::take(&mut b.init);
        } else {
            words.append(&core::mem::take(&mut b.init));
        }
        false
    });
    if words.is_empty() {
        return;
    }
    base.sort_unstable();
    let offset = |name: &str| -> Option<u32> {
        let h = name_hash(name);
        let first = base.partition_point(|e| e.0 < h);
        base[first..].iter().take_while(|e| e.0 == h).find(|e| e.1 == name).map(|e| e.2)
    };
    // A step names a place in a table: in the merged table it is that table's base further.
    for step in tile.steps.iter_mut() {
        if let Step::RunAll(_, desc, ..) = step {
            if let Some(base) = offset(desc.table.as_str()) {
                *desc = Desc { table: table.into(), offset: base + desc.offset };
            }
        }
    }
    // Descriptors that point into other merged tables (a copy list) now point into `table`.
    words.rebase(|name| offset(name.as_str()).map(|b| (Sym::from(table), b)));
    tile.buffers.push(Buffer {
        name: table.into(),
        bytes: 4 * words.len() as u32,
        align: 16,
        kind: MemKind::Descriptor,
        init: words,
        live: Live::ALWAYS,
        read_past: 0,
    });
}

/// Refuse a tile whose buffers cannot fit, naming the model tensor behind the largest buffer.
/// Bytes a tile's buffers take once placed (each rounded up to 16, as the linker aligns them).
pub(crate) fn placed_bytes<'a>(buffers: impl IntoIterator<Item = &'a Buffer>) -> u64 {
    buffers.into_iter().map(|b| (b.bytes as u64).div_ceil(16) * 16).sum()
}

fn check_memory(graph: &Graph, tile: u16, plan: &TilePlan) -> Result<(), PlanError> {
    // The peak of live bytes (buffers with disjoint lifetimes share bytes, `liveness.rs`).
    let total = liveness::peak_bytes(&plan.buffers);
    let limit = BUFFER_BYTES;
    if total <= limit {
        return Ok(());
    }
    let largest = plan.buffers.iter().max_by_key(|b| b.bytes);
    // A stage's buffers carry its tag: name the stage's op, as the stage planner's refusals do.
    if let Some((b, (op, rest))) = largest.and_then(|b| stage_op(graph, &b.name).map(|t| (b, t))) {
        let always = placed_bytes(plan.buffers.iter().filter(|b| b.live == Live::ALWAYS));
        return Err(PlanError::Unsupported(
            op,
            alloc::format!(
                "tile {tile}: the buffers live at its peak need {total} bytes, {} more than the {limit} a \
                 tile has for them; the largest is `{rest}` of this op's stage ({} bytes), and {always} bytes \
                 stay for the whole run (params, descriptors, host-bound buffers); more tiles or FP8 weights leave room",
                total - limit,
                b.bytes
            ),
        ));
    }
    let largest = largest.map(|b| b.name.as_str()).unwrap_or("?");
    let tensor = buffer_tensor(graph, largest).unwrap_or_else(|| alloc::format!("buffer `{largest}`"));
    Err(PlanError::Memory { tile, buffer: tensor, over: total - limit })
}

/// The op whose stage made a buffer, and the planner's own name of it: the stage planner tags a
/// stage's buffers `g{k}_` and the redistribution into it `x{k}_` (`stages::plan`).
pub fn stage_op<'n>(graph: &Graph, buffer: &'n str) -> Option<(usize, &'n str)> {
    let (k, rest) = buffer.strip_prefix('g').or_else(|| buffer.strip_prefix('x'))?.split_once('_')?;
    let op = *stages::partition(graph).get(k.parse::<usize>().ok()?)?.first()?;
    Some((op, rest))
}

/// The model tensor a planner buffer holds (`t<id>`/`s<id>` in chains, `A`/`B`/`C` in a matmul).
fn buffer_tensor(graph: &Graph, name: &str) -> Option<String> {
    let by_id =
        |id: &str| id.parse::<usize>().ok().and_then(|i| graph.tensors.get(i)).map(|t| t.name.clone());
    let id = match name {
        n if n.starts_with('t') || n.starts_with('s') => by_id(&n[1..]),
        "A" | "B" | "C" => graph.ops.first().and_then(|op| match op.kind {
            OpKind::MatMul { a, b, .. } => Some(match name {
                "A" => graph.tensor(a).name.clone(),
                "B" => graph.tensor(b).name.clone(),
                _ => graph.tensor(op.output).name.clone(),
            }),
            _ => None,
        }),
        _ => None,
    };
    id.map(|n| alloc::format!("tensor `{n}`"))
}

/// The epilogue the matmul planner fuses after a rank-2 matmul with an f16 result: with f16
/// partials, optionally an `add` of its result and an f16 vector of its columns (`[N]` or
/// `[1, N]`, an input or a param: the bias) or a whole `[M, N]` tensor (the residual), then
/// optionally a `gelu`; with f32 partials (rounded to f16 once, then the epilogue), a `gelu`
/// alone. The last result is the model's only output.
pub fn fused_epilogue(g: &Graph) -> Option<matmul::Epilogue> {
    let (mm, rest) = g.ops.split_first()?;
    let OpKind::MatMul { accumulate, .. } = mm.kind else { return None };
    let f32_partials = match accumulate {
        DType::F16 => false,
        DType::F32 => true,
        _ => return None,
    };
    let c = g.tensor(mm.output);
    let n = *c.shape.last()?;
    if c.dtype != DType::F16 || c.shape.len() != 2 || rest.is_empty() || rest.len() > 3 {
        return None;
    }
    let mut epi = matmul::Epilogue { bias: None, residual: None, gelu: None, result: mm.output };
    let mut last = mm.output;
    for (i, op) in rest.iter().enumerate() {
        match op.kind {
            // In order: a bias (a vector of the columns), a residual (a whole [M, N] tensor), both
            // given (inputs or params), then gelu.
            // Bias and residual blocks hold 16 f16 columns; f32 partials come in blocks of 8.
            OpKind::Binary { op: BinaryOp::Add, a, b }
                if (a == last || b == last)
                    && epi.residual.is_none()
                    && epi.gelu.is_none()
                    && !f32_partials =>
            {
                let other = if a == last { b } else { a };
                let v = g.tensor(other);
                if !g.is_source(other) || v.dtype != DType::F16 {
                    return None;
                }
                if (v.shape == [n] || v.shape == [1, n]) && epi.bias.is_none() {
                    epi.bias = Some(other);
                } else if v.shape == c.shape {
                    epi.residual = Some(other);
                } else {
                    return None;
                }
            }
            OpKind::Gelu { input, form } if input == last && i == rest.len() - 1 => epi.gelu = Some(form),
            _ => return None,
        }
        last = op.output;
    }
    epi.result = last;
    (g.outputs == [last]).then_some(epi)
}

/// The matmul planner's view of a graph whose op 0 is a matmul, with its fused epilogue.
pub fn matmul_of(graph: &Graph, epilogue: Option<matmul::Epilogue>) -> Option<matmul::MatMul> {
    let op = graph.ops.first()?;
    let OpKind::MatMul { a, b, transpose_a, transpose_b, accumulate, alpha } = op.kind else { return None };
    let mut mm = matmul::MatMul::new(graph, a, b, op.output, transpose_a, transpose_b, accumulate);
    mm.alpha = alpha;
    mm.out = graph.tensor(op.output).dtype;
    mm.epilogue = epilogue;
    Some(mm)
}

fn plan_matmul(
    graph: &Graph,
    opts: PlanOptions,
    epilogue: Option<matmul::Epilogue>,
    a_home: Vec<u16>,
    a_rows_whole: bool,
) -> Result<Plan, PlanError> {
    let op = &graph.ops[0];
    match op.kind {
        OpKind::Cast { .. }
        | OpKind::Softmax { .. }
        | OpKind::Binary { .. }
        | OpKind::Gelu { .. }
        | OpKind::Map { .. }
        | OpKind::LayerNorm { .. }
        | OpKind::Reduce { .. }
        | OpKind::Reshape { .. }
        | OpKind::Slice { .. }
        | OpKind::Transpose { .. } => {
            unreachable!("checked above")
        }
        OpKind::MatMul { a, b, accumulate, .. } => {
            let out = graph.tensor(op.output);
            let rounded_once = out.dtype == DType::F16 && accumulate == DType::F32;
            if (out.dtype != accumulate && !rounded_once) || !matches!(accumulate, DType::F16 | DType::F32) {
                return Err(PlanError::Unsupported(0, alloc::format!(
                    "output dtype {} with accumulate {} is not supported (equal f16 or f32, or f16 output with f32 accumulation)",
                    out.dtype.name(), accumulate.name()
                )));
            }
            let mut mm = matmul_of(graph, epilogue).expect("op 0 is a matmul");
            mm.a_home = a_home;
            mm.a_rows_whole = a_rows_whole;
            let grid = match opts.grid {
                Some([tm, tn, tk]) => matmul::Grid { tm: tm as u64, tn: tn as u64, tk: tk as u64 },
                None => matmul::choose_grid(&mm, opts.tiles).ok_or_else(|| {
                    let name = |t| graph.tensor(t).name.as_str();
                    matmul::no_fit(&mm, opts.tiles, [name(a), name(b), name(op.output)])
                })?,
            };
            let planned = if opts.costing {
                matmul::plan_for_cost(&mm, grid, opts.tiles)
            } else {
                matmul::plan(&mm, grid, opts.tiles)
            };
            let mut plan = planned.map_err(|e| match e {
                PlanError::Memory { tile, buffer, over } => {
                    PlanError::Memory { tile, buffer: buffer_tensor(graph, &buffer).unwrap_or(buffer), over }
                }
                other => other,
            })?;
            // The matmul planner names its phases generically; give them the op's name.
            let named = op_phase(graph, 0);
            plan.tiles
                .for_each_distinct(|_, t| {
                    for step in t.steps.iter_mut() {
                        if let Step::Phase(p) = step {
                            *p = match p.as_str() {
                                "reduce" | "scale" | "convert" => {
                                    smol_str::format_smolstr!("{p} {}", graph.tensor(op.output).name)
                                }
                                "bias" => op_phase(graph, 1),
                                "residual" => op_phase(
                                    graph,
                                    if epilogue.is_some_and(|e| e.bias.is_some()) { 2 } else { 1 },
                                ),
                                "gelu" => op_phase(graph, graph.ops.len() - 1),
                                _ => named.clone(),
                            };
                        }
                    }
                    Ok::<(), ()>(())
                })
                .expect("renaming cannot fail");
            Ok(plan)
        }
    }
}

impl core::error::Error for PlanError {}
