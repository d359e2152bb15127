//! Section bodies (`docs/format.md`), encoded with postcard.

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

/// Segment flag: instruction memory (must lie in region 0).
pub const SEG_EXEC: u32 = 1;
/// Segment flag: data.
pub const SEG_DATA: u32 = 2;
/// Segment flag: zero-filled data; `bytes` is empty and `len` gives the size.
pub const SEG_ZERO: u32 = 4;

/// Bytes placed at a tile address.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Segment {
    /// Tile byte address.
    pub addr: u32,
    /// `SEG_EXEC`, `SEG_DATA` or `SEG_DATA | SEG_ZERO`.
    pub flags: u32,
    /// Size in bytes (equals `bytes.len()` unless zero-filled).
    pub len: u32,
    /// Contents (empty for zero-filled segments).
    pub bytes: Vec<u8>,
}

/// One tile's image. Tiles with identical programs share their segments (`Arc`): a package of
/// 1472 tiles often holds a handful of distinct images (all idle tiles, the tiles of one row
/// class), and the file stores each once ([`SharedImage`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileImage {
    /// Logical tile.
    pub tile: u16,
    /// Supervisor entry address.
    pub entry: u32,
    /// Segments, sorted by address.
    pub segments: Arc<Vec<Segment>>,
}

/// One distinct image as the `TILE_IMAGES` section stores it (docs/format.md, version 5): the
/// tiles that load it (ascending), its entry and its segments. Images are ordered by their first
/// tile and every tile of the target appears in exactly one, so the encoding is canonical.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedImage {
    /// Logical tiles that load this image, ascending.
    pub tiles: Vec<u16>,
    /// Supervisor entry address.
    pub entry: u32,
    /// Segments, sorted by address.
    pub segments: Vec<Segment>,
}

/// The `TILE_IMAGES` body of per-tile images (in tile order): identical images (same entry and
/// segments) stored once, in order of their first tile.
pub fn share_images(tiles: &[TileImage]) -> Vec<SharedImage> {
    let mut by_image: BTreeMap<(u32, &[Segment]), usize> = BTreeMap::new();
    let mut out: Vec<SharedImage> = Vec::new();
    for t in tiles {
        let k = *by_image.entry((t.entry, t.segments.as_slice())).or_insert_with(|| {
            out.push(SharedImage { tiles: Vec::new(), entry: t.entry, segments: (*t.segments).clone() });
            out.len() - 1
        });
        out[k].tiles.push(t.tile);
    }
    out
}

/// Per-tile images from a `TILE_IMAGES` body: each shared image's segments once, referenced by
/// every tile that loads it, in tile order. `None` when the body is not canonical (a tile listed
/// twice or out of order, an image with no tile, images out of order) — the reader then refuses.
pub fn unshare_images(images: Vec<SharedImage>) -> Option<Vec<TileImage>> {
    let mut tiles: Vec<TileImage> = Vec::new();
    let mut last_first: Option<u16> = None;
    for im in images {
        let first = *im.tiles.first()?;
        if last_first.is_some_and(|l| l >= first) || im.tiles.windows(2).any(|w| w[0] >= w[1]) {
            return None;
        }
        last_first = Some(first);
        let segments = Arc::new(im.segments);
        tiles.extend(im.tiles.iter().map(|&tile| TileImage {
            tile,
            entry: im.entry,
            segments: segments.clone(),
        }));
    }
    tiles.sort_by_key(|t| t.tile);
    tiles.windows(2).all(|w| w[0].tile != w[1].tile).then_some(tiles)
}

/// Element types on disk and on device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DType {
    /// IEEE single.
    F32,
    /// IEEE half.
    F16,
    /// FP8 F143 (`float8_e4m3fnuz`).
    F8E4M3,
    /// FP8 F152 (`float8_e5m2fnuz`).
    F8E5M2,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
            DType::F8E4M3 | DType::F8E5M2 => 1,
        }
    }
    /// Name in model files.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
        }
    }
}

/// Whether the host writes or reads a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Direction {
    /// Host → device before each inference.
    Input,
    /// Device → host after each inference.
    Output,
    /// Resident: the values are in the tile images (a param); the host never writes them, and
    /// reads them from the package for the reference.
    Param,
}

/// A strided block copy between a tensor (row-major bytes) and one tile:
/// `rows` rows of `row_bytes`, tensor rows `tensor_stride` apart, tile rows `tile_stride` apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slice {
    /// Tile.
    pub tile: u16,
    /// Tile address of the first row.
    pub addr: u32,
    /// Byte offset of the first row in the tensor.
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

/// How a tensor maps onto tiles.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// Tensor name from the model.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u64>,
    /// Input or output.
    pub direction: Direction,
    /// The slices address the transposed (2-D) tensor: the host transposes before writing.
    pub transpose: bool,
    /// Power-of-two scale of FP8 tensors (0 otherwise).
    pub scale: i8,
    /// Copies (inputs may be replicated to several tiles).
    pub slices: Vec<Slice>,
}

impl Binding {
    /// Tensor size in bytes.
    pub fn bytes(&self) -> u64 {
        self.shape.iter().product::<u64>() * self.dtype.size() as u64
    }
}

/// A host-exchange call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    /// Name (`run`).
    pub name: String,
    /// Command word written to every tile's mailbox.
    pub command: u32,
    /// Phases (BSP supersteps) the call executes.
    pub phases: u32,
}

/// The host-exchange protocol of the runtime.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostExchange {
    /// Page size in bytes.
    pub page_bytes: u32,
    /// Tile address of the command mailbox (same on every tile).
    pub mailbox: u32,
    /// Calls.
    pub calls: Vec<Call>,
}

/// A named address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Symbol {
    /// Name.
    pub name: String,
    /// Tile, or `u16::MAX` for all tiles.
    pub tile: u16,
    /// Address.
    pub addr: u32,
}

/// Where the package came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildInfo {
    /// `ipu-codegen` version.
    pub compiler: String,
    /// Model name.
    pub model: String,
    /// SHA-256 of the model file.
    pub model_digest: [u8; 32],
    /// Target name.
    pub target: String,
    /// Tiles that run kernels.
    pub tiles_used: u32,
    /// The model file itself, so that `run` can evaluate the host reference.
    pub model_source: String,
}

/// Bytes of tile memory by kind on one tile.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TileMemory {
    /// Code (all of it: the sum of the four kinds below).
    pub code: u32,
    /// Of the code: the runtime (host command loop, call and return).
    pub code_runtime: u32,
    /// Of the code: the worker kernels' text.
    pub code_kernels: u32,
    /// Of the code: supervisor code of kernel launches, weight loads, CSR writes, syncs and
    /// profile stamps.
    pub code_launches: u32,
    /// Of the code: supervisor code of exchange supersteps.
    pub code_exchange: u32,
    /// Tensor data (inputs, outputs, intermediates).
    pub tensors: u32,
    /// Kernel descriptors and other runtime data.
    pub descriptors: u32,
    /// Exchange receive buffers.
    pub exchange: u32,
    /// Host mailbox and host data.
    pub host: u32,
    /// Profile sample buffer (0 without a profile plan).
    pub profile: u32,
}

/// The plan's figures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanSummary {
    /// Cost-model prediction of one `run` call, cycles.
    pub predicted_cycles: u64,
    /// Of which exchange.
    pub predicted_exchange_cycles: u64,
    /// Prediction for the baseline mapping.
    pub baseline_cycles: u64,
    /// Search attempts made.
    pub search_attempts: u32,
    /// Memory by kind, per tile (index = tile).
    pub memory: Vec<TileMemory>,
    /// Per op, the tile grid `[tm, tn, tk]` (the host reference reproduces the K split).
    pub grids: Vec<[u32; 3]>,
    /// Ops (indices, ascending) whose alpha the tiles apply to the f16 operand `a`, each value
    /// rounded to f16, before the product, instead of to the product: the host reference
    /// reproduces the choice (docs/kernels.md "Alpha on the row operand").
    pub alpha_on_a: Vec<u32>,
    /// Where the runtime writes cycle counters (`build --profile`), if it does.
    pub profile: Option<ProfilePlan>,
}

/// What a profile interval was spent on (docs/profile.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum SampleKind {
    /// Worker kernels and supervisor set-up (weight loads, CSR writes).
    Compute,
    /// Waiting in an internal sync for the other tiles.
    Sync,
    /// An exchange superstep, up to its closing sync.
    Exchange,
    /// From the host-sync release to the start of the first phase.
    Host,
}

impl SampleKind {
    /// All kinds, in report order.
    pub const ALL: [SampleKind; 4] =
        [SampleKind::Compute, SampleKind::Sync, SampleKind::Exchange, SampleKind::Host];
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            SampleKind::Compute => "compute",
            SampleKind::Sync => "sync",
            SampleKind::Exchange => "exchange",
            SampleKind::Host => "host",
        }
    }
}

/// `kernel` of a sample that ran no kernel.
pub const NO_KERNEL: u16 = u16::MAX;

/// One profiled interval of a tile: from the previous cycle stamp to this one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplePoint {
    /// Index into `ProfilePlan::phases`.
    pub phase: u16,
    /// What the interval was spent on.
    pub kind: SampleKind,
    /// Index into `ProfilePlan::kernels`, or `NO_KERNEL`.
    pub kernel: u16,
}

/// One tile's samples: the runtime stores `samples.len() + 1` cycle stamps (`$COUNT_L`, u32 each)
/// from `buffer` on; sample `i` spans stamps `i` and `i + 1`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TileSamples {
    /// Address of the stamp buffer.
    pub buffer: u32,
    /// The intervals.
    pub samples: Vec<SamplePoint>,
}

/// The package's profile plan: sample points per tile and phase, and their names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfilePlan {
    /// Phase names (op and part of it, e.g. `matmul S`).
    pub phases: Vec<String>,
    /// Kernel names.
    pub kernels: Vec<String>,
    /// One per tile, in tile order.
    pub tiles: Vec<TileSamples>,
}

/// Encode a section body.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Sized first, then written once: growing a whole chip's tile images (90 MB for SigLIP
    // attention) by doubling copied them twice over and faulted in the pages of every copy.
    let size = postcard::experimental::serialized_size(value)
        .expect("postcard encoding of owned values cannot fail");
    let out = postcard::to_extend(value, Vec::with_capacity(size))
        .expect("postcard encoding of owned values cannot fail");
    debug_assert_eq!(out.len(), size);
    out
}

/// Decode a section body completely (trailing bytes are an error).
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, postcard::Error> {
    let (v, rest) = postcard::take_from_bytes(bytes)?;
    if !rest.is_empty() {
        return Err(postcard::Error::DeserializeBadEncoding);
    }
    Ok(v)
}
