//! `ipu-linker`: places a tile's code in the executable region and its buffers in data memory,
//! resolves their symbols, assembles, and produces the tile image (docs/architecture.md "Symbolic plans, a real linker").
//!
//! Placement: code from `TILE_MEM_BASE` up (region 0, the only executable region); buffers
//! largest-alignment-then-largest-first, first fit, into region 1 (0x80000..0xE8000) and then the
//! rest of region 0 after the code; a buffer only avoids the bytes of placed buffers whose
//! lifetimes overlap its own (`Buffer::live`, docs/graph-planner.md). When some buffer finds no
//! free range in that order, two more orders are tried (by first use; by bytes × lifetime), then
//! the three again over one range from the code's end to the host area (a buffer may straddle
//! 0x80000: only code is bound to region 0). Deterministic: ties break by name.
#![no_std]
#![forbid(unsafe_code)]
extern crate alloc;

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use core::fmt::Write;

use ipu_core::plan::{Buffer, Live, MemKind, Word};
use ipu_core::target::{
    EXEC_REGION_END, HOST_AREA_BASE, HOST_AREA_BYTES, TILE_MEM_BASE, TILE_MEM_END, TILE_MEM_SIZE,
};
use ipu_runtime_tile::asm::{assemble, AsmError};
use ipu_schema::{Segment, TileImage, TileMemory, SEG_DATA, SEG_EXEC, SEG_ZERO};

/// Why a tile cannot be linked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkError {
    /// The generated code does not assemble (a compiler bug; the line is in the message).
    Asm(u16, String),
    /// A buffer does not fit: tile, buffer, bytes over.
    NoSpace {
        /// Tile.
        tile: u16,
        /// Buffer.
        buffer: String,
        /// Bytes that could not be placed.
        over: u64,
        /// Bytes of the tile's code (region 0 below the buffers there).
        code: u32,
        /// The most bytes the tile's buffers take at once (each rounded up to 16).
        peak: u64,
        /// Bytes between the code's end and the host area: what the buffers may use.
        room: u32,
    },
    /// Code larger than the executable region.
    CodeTooLarge(u16, u32),
}

impl core::fmt::Display for LinkError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LinkError::Asm(t, e) => write!(f, "tile {t}: generated code does not assemble: {e}"),
            LinkError::NoSpace { tile, buffer, over, code, peak, room } => {
                write!(
                    f,
                    "tile {tile}: buffer `{buffer}` does not fit in tile memory ({over} bytes over; the tile's code \
                     takes {code} bytes, leaving {room} for buffers, which take {peak} at their peak)"
                )
            }
            LinkError::CodeTooLarge(t, n) => {
                write!(f, "tile {t}: {n} bytes of code exceed the executable region 0x4c000..0x80000")
            }
        }
    }
}

/// A linked tile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Linked {
    /// The image.
    pub image: TileImage,
    /// Buffer and code symbols.
    pub symbols: BTreeMap<String, u32>,
    /// Memory by kind.
    pub memory: TileMemory,
    /// End of code.
    pub code_end: u32,
}

fn asm_err(tile: u16, e: AsmError, text: &str) -> LinkError {
    let line = text.lines().nth(e.line.saturating_sub(1)).unwrap_or("").trim();
    LinkError::Asm(tile, format!("{e} (`{line}`)"))
}

/// Link one tile.
pub fn link(tile: u16, code: &str, buffers: &[Buffer]) -> Result<Linked, LinkError> {
    let mut scratch = vec![0u8; TILE_MEM_SIZE];
    // Pass 1: code size, with every buffer symbol at a dummy address.
    let mut probe = String::new();
    for b in buffers {
        let _ = writeln!(probe, ".equ {}, {:#x}", b.name, 0x80000);
    }
    probe.push_str(code);
    let p = assemble(&probe, TILE_MEM_BASE, &mut scratch).map_err(|e| asm_err(tile, e, &probe))?;
    let code_bytes = p.segments.iter().map(|s| s.len as u32).sum::<u32>();
    let kind_bytes = p.kind_bytes;
    let code_end = TILE_MEM_BASE + code_bytes;
    if code_end > EXEC_REGION_END {
        return Err(LinkError::CodeTooLarge(tile, code_bytes));
    }
    // Place buffers: largest first; if a buffer finds no free range that way, other orders
    // (`ORDERS`), each deterministic. The first order's placement is what every package that fits
    // with it gets, so adding orders changes no image that linked before.
    // Last, the same orders over the two regions as one range: a buffer may then start after the
    // code in region 0 and end in region 1 (data may sit anywhere in tile memory; only code is
    // bound to region 0, docs/target.md §2), which uses the bytes the split leaves at both sides
    // of 0x80000. Tried last so that every image that linked before is unchanged.
    let mut first_err = None;
    let mut addr_of = None;
    let tries = ORDERS.iter().map(|&o| (o, false)).chain(ORDERS.iter().map(|&o| (o, true)));
    for (order, joined) in tries {
        match place(tile, buffers, code_end, order, joined) {
            Ok(a) => {
                addr_of = Some(a);
                break;
            }
            // The error told is the first over the joined range: its bytes over are what no
            // placement found.
            Err(e) if joined => {
                first_err.get_or_insert(e);
            }
            Err(_) => {}
        }
    }
    let Some(addr_of) = addr_of else {
        let mut e = first_err.expect("at least one order was tried");
        if let LinkError::NoSpace { peak, room, .. } = &mut e {
            *peak = ipu_core::plan::liveness::peak_bytes(buffers);
            *room = HOST_AREA_BASE - code_end;
        }
        return Err(e);
    };
    // Pass 2: real addresses, initialised buffers as data segments.
    let mut text = String::new();
    for (n, a) in &addr_of {
        let _ = writeln!(text, ".equ {n}, {a:#x}");
    }
    text.push_str(code);
    // Initialised buffers in address order; adjacent ones share one segment (the assembler has a
    // fixed segment capacity, and fewer segments make smaller images).
    let mut init: Vec<&Buffer> = buffers.iter().filter(|b| !b.init.is_empty()).collect();
    init.sort_by_key(|b| addr_of[b.name.as_str()]);
    let mut cur_end = None;
    for b in init {
        let a = addr_of[b.name.as_str()];
        // Only exactly adjacent buffers share a segment: a gap may hold another (zero) buffer.
        match cur_end {
            Some(e) if a == e => {}
            _ => {
                let _ = writeln!(text, ".org {}", b.name);
            }
        }
        cur_end = Some(a + 4 * b.init.len() as u32);
        for w in b.init.iter() {
            match w {
                Word::Const(v) => {
                    let _ = writeln!(text, "    .word {v}");
                }
                Word::Sym(s, o) => {
                    let _ = writeln!(text, "    .word {s}+{o}");
                }
            }
        }
    }
    let prog = assemble(&text, TILE_MEM_BASE, &mut scratch).map_err(|e| asm_err(tile, e, &text))?;
    let mut segments: Vec<Segment> = prog
        .segments
        .iter()
        .map(|s| Segment {
            addr: s.addr,
            flags: if s.addr < code_end { SEG_EXEC } else { SEG_DATA },
            len: s.len as u32,
            bytes: scratch[s.offset..s.offset + s.len].to_vec(),
        })
        .collect();
    let [code_runtime, code_kernels, code_launches, code_exchange] = kind_bytes;
    let mut memory = TileMemory {
        code: code_bytes,
        code_runtime,
        code_kernels,
        code_launches,
        code_exchange,
        host: HOST_AREA_BYTES,
        ..TileMemory::default()
    };
    // Zero-filled bytes as disjoint segments (buffers with disjoint lifetimes may share bytes).
    let mut zero: Vec<(u32, u32)> =
        buffers.iter().filter(|b| b.init.is_empty()).map(|b| (addr_of[b.name.as_str()], b.bytes)).collect();
    zero.sort_unstable();
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for (a, n) in zero {
        match runs.last_mut() {
            Some(r) if a < r.0 + r.1 => r.1 = r.1.max(a + n - r.0),
            _ => runs.push((a, n)),
        }
    }
    for (addr, len) in runs {
        segments.push(Segment { addr, flags: SEG_DATA | SEG_ZERO, len, bytes: Vec::new() });
    }
    for b in buffers {
        let slot = match b.kind {
            MemKind::Tensor => &mut memory.tensors,
            MemKind::Descriptor => &mut memory.descriptors,
            MemKind::Exchange => &mut memory.exchange,
            MemKind::Profile => &mut memory.profile,
        };
        *slot += b.bytes;
    }
    segments.sort_by_key(|s| s.addr);
    let mut symbols: BTreeMap<String, u32> = prog.symbols.iter().map(|(n, v)| (n.to_string(), *v)).collect();
    symbols.extend(addr_of);
    let entry = symbols.get("main").copied().unwrap_or(TILE_MEM_BASE);
    segments.push(Segment {
        addr: HOST_AREA_BASE,
        flags: SEG_DATA | SEG_ZERO,
        len: HOST_AREA_BYTES,
        bytes: Vec::new(),
    });
    segments.sort_by_key(|s| s.addr);
    Ok(Linked {
        image: TileImage { tile, entry, segments: alloc::sync::Arc::new(segments) },
        symbols,
        memory,
        code_end,
    })
}

impl core::error::Error for LinkError {}

/// A placed buffer: bytes `[start, end)` and when they hold its value.
struct Placed {
    start: u32,
    end: u32,
    live: Live,
}

/// Orders in which buffers are placed, tried in turn until one fits every buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    /// Largest alignment, then largest first (classic first-fit decreasing).
    Largest,
    /// Largest alignment, then earliest first use, then largest: buffers of one stage packed
    /// together, so a later stage finds the bytes of an earlier one free in one range.
    FirstUse,
    /// Largest alignment, then the most bytes × positions live first: long-lived buffers at the
    /// bottom, short-lived ones sharing what is left above them.
    Footprint,
}

const ORDERS: [Order; 3] = [Order::Largest, Order::FirstUse, Order::Footprint];

/// Place every buffer in `order`, first fit: region 1, then region 0 after the code; `joined`:
/// one range from the code's end to the host area.
fn place(
    tile: u16,
    buffers: &[Buffer],
    code_end: u32,
    order: Order,
    joined: bool,
) -> Result<BTreeMap<String, u32>, LinkError> {
    let span = |b: &Buffer| (b.live.to.min(1 << 20) - b.live.from.min(1 << 20)) as u64 + 1;
    let mut sorted: Vec<&Buffer> = buffers.iter().collect();
    sorted.sort_by(|a, b| {
        let by = match order {
            Order::Largest => b.bytes.cmp(&a.bytes),
            Order::FirstUse => a.live.from.cmp(&b.live.from).then(b.bytes.cmp(&a.bytes)),
            Order::Footprint => (b.bytes as u64 * span(b)).cmp(&(a.bytes as u64 * span(a))),
        };
        b.align.cmp(&a.align).then(by).then(a.name.cmp(&b.name))
    });
    // The host area at the top of region 1 is reserved for the runtime's mailbox.
    let split = [(EXEC_REGION_END, HOST_AREA_BASE), (code_end, EXEC_REGION_END)];
    let whole = [(code_end, HOST_AREA_BASE)];
    let regions: &[(u32, u32)] = if joined { &whole } else { &split };
    let mut placed: [Vec<Placed>; 2] = [Vec::new(), Vec::new()];
    let mut addr_of: BTreeMap<String, u32> = BTreeMap::new();
    for b in sorted {
        let align = b.align.max(8);
        let mut at = None;
        let mut largest = 0;
        for (r, p) in regions.iter().zip(placed.iter_mut()) {
            // What the kernels read past the buffer must be memory: only the top region's end
            // (the host area, then the end of tile memory) can cut it short.
            let r = (r.0, r.1.min(TILE_MEM_END.saturating_sub(b.read_past)).max(r.0));
            match first_fit(r, p, b.bytes, align, b.live) {
                Ok(a) => {
                    p.push(Placed { start: a, end: a + b.bytes, live: b.live });
                    at = Some(a);
                    break;
                }
                Err(gap) => largest = largest.max(gap),
            }
        }
        let Some(a) = at else {
            return Err(LinkError::NoSpace {
                tile,
                buffer: b.name.to_string(),
                over: (b.bytes - largest.min(b.bytes)) as u64,
                code: code_end - TILE_MEM_BASE,
                peak: 0,
                room: 0,
            });
        };
        addr_of.insert(b.name.to_string(), a);
    }
    Ok(addr_of)
}

/// The lowest `align`-aligned address in `region` where `bytes` fit beside every placed buffer
/// whose lifetime overlaps `live` (candidates: the region's start and each such buffer's end);
/// otherwise the largest free gap, for the error.
fn first_fit(region: (u32, u32), placed: &[Placed], bytes: u32, align: u32, live: Live) -> Result<u32, u32> {
    let mut busy: Vec<(u32, u32)> =
        placed.iter().filter(|p| p.live.overlaps(live)).map(|p| (p.start, p.end)).collect();
    busy.sort_unstable();
    let mut largest = 0;
    let mut from = region.0;
    for &(s, e) in busy.iter().chain(core::iter::once(&(region.1, region.1))) {
        let a = from.div_ceil(align) * align;
        if s > from {
            largest = largest.max(s - from);
            if a as u64 + bytes as u64 <= s as u64 {
                return Ok(a);
            }
        }
        from = from.max(e);
    }
    Err(largest)
}
