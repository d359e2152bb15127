//! Mk2 target constants. Each value cites its source in `docs/target.md` (and through it the fact
//! sheet); values marked *model* are ours.

/// Tiles on a GC200 / Bow / C600 IPU (FS §1).
pub const NUM_TILES: usize = 1472;
/// Worker contexts per tile (FS §1).
pub const WORKERS: usize = 6;
/// Barrel slots: a worker issues once every `BARREL_SLOTS` tile cycles (FS §2).
pub const BARREL_SLOTS: u64 = 6;
/// Nominal GC200 clock, used only to convert cycles to time in reports (FS §1, inferred there).
pub const CLOCK_HZ: f64 = 1.33e9;

/// First byte of tile SRAM (FS §1.1).
pub const TILE_MEM_BASE: u32 = 0x4C000;
/// One past the last byte of tile SRAM (FS §1.1).
pub const TILE_MEM_END: u32 = 0xE8000;
/// Bytes of SRAM per tile: 624 KiB.
pub const TILE_MEM_SIZE: usize = (TILE_MEM_END - TILE_MEM_BASE) as usize;
/// End of region 0, the only region that supports instruction fetch (FS §1.1).
pub const EXEC_REGION_END: u32 = 0x80000;
/// One SRAM element (FS §1.1).
pub const MEM_ELEMENT_BYTES: u32 = 16 * 1024;

/// Cycles from the last arrival at an internal sync to the release (FS §4: ~90 per sync, PopLibs).
pub const SYNC_CYCLES: u64 = 90;
/// Base exchange latency between any two tiles, cycles (*model*).
pub const EXCHANGE_BASE_LATENCY: u32 = 11;
/// Extra latency per column step (FS §4, route model: 6 events per column).
pub const EXCHANGE_CYCLES_PER_COLUMN: u32 = 6;
/// Extra latency per row step (FS §4: 2 events per row).
pub const EXCHANGE_CYCLES_PER_ROW: u32 = 2;
/// Extra latency when the two tiles sit in different lanes of their column (*model*).
pub const EXCHANGE_CYCLES_LANE: u32 = 2;
/// Mux value meaning "no source selected" (FS §4: 0x640 `TILE_MUX_EXCHANGE`, used to park).
pub const MUX_NONE: u16 = 0x640;
/// Largest `send` in words (FS §4: 6-bit count).
pub const SEND_MAX_WORDS: u32 = 64;
/// Largest `rpt` count (FS §2: 12-bit `$REPEAT_COUNT`).
pub const RPT_MAX_COUNT: u32 = 4095;
/// Supervisor cycles to load the AMP weight store (FS §3: 16 engines with ld128).
pub const CWEI_LOAD_CYCLES: u32 = 32;
/// Bytes in the AMP weight store (16×16 f16).
pub const CWEI_BYTES: usize = 512;
/// Supervisor cycles of `ldcweih`, which loads only the 8 engines `f32amp` reads (FS §3: 8 engines
/// with ld128).
pub const CWEI_HALF_LOAD_CYCLES: u32 = 16;
/// Bytes `ldcweih` loads: the first half of the store, `f32amp`'s 16×8 f16 weights.
pub const CWEI_HALF_BYTES: usize = 256;
/// Host area at the top of data memory, below the range the SDK loader cannot write
/// (FS §1.1: 0xE7BB0..0xE7FFF): the command mailbox and host data (*model*).
pub const HOST_AREA_BASE: u32 = 0xE7B00;
/// Bytes of the host area.
pub const HOST_AREA_BYTES: u32 = 0xB0;
/// Host exchange page size (FS §5).
pub const HOST_PAGE_BYTES: usize = 4096;

/// f16 MACs per tile cycle of the AMP with f16 partials (FS §3).
pub const AMP_F16_MACS_PER_CYCLE: u32 = 64;
/// f16 MACs per tile cycle of the AMP with f32 partials (FS §3).
pub const AMP_F32_MACS_PER_CYCLE: u32 = 32;
/// FP8 MACs per tile cycle of the AMP (FS §3).
pub const AMP_F8_MACS_PER_CYCLE: u32 = 128;

/// Sync zones understood by the model (`docs/target.md` §6).
pub mod zone {
    /// Supervisor waits for its own workers.
    pub const LOCAL: u32 = 2;
    /// All tiles of the device.
    pub const INTERNAL: u32 = 3;
    /// All tiles, then the host takes over.
    pub const HOST: u32 = 15;
}

/// Control and status registers used by the model (numbers from FS §2/§4 where published).
pub mod csr {
    /// Incoming mux: source tile id (FS §4, 0xA0).
    pub const INCOMING_MUX: u32 = 0xA0;
    /// Incoming pointer, byte address (FS §4 `$INCOMING_BASE`, 0xA4).
    pub const INCOMING_BASE: u32 = 0xA4;
    /// Words still expected by this tile in the current superstep (FS §4, 0xA6).
    pub const INCOMING_DCOUNT: u32 = 0xA6;
    /// Base byte address for `sendoff` (FS §4 `$OUTGOING_BASE`, 0xA7).
    pub const OUTGOING_BASE: u32 = 0xA7;
    /// AMP FP8 input/weight formats (FS §2 `$FP_INFMT`, supervisor CSR 49).
    pub const FP_INFMT: u32 = 49;
    /// AMP FP8 scale (FS §2 `$FP_ISCL`, supervisor CSR 51).
    pub const FP_ISCL: u32 = 51;
    /// Tile cycle counter, low word (FS §2 `$COUNT_L` 96).
    pub const COUNT_L: u32 = 96;
    /// Tile cycle counter, high word (FS §2 `$COUNT_U` 97).
    pub const COUNT_U: u32 = 97;
    /// Logical id of this tile (*model*).
    pub const TILE_ID: u32 = 0x90;
    /// Worker conversion format, upper CSR 9 (FS §2 `$FP_NFMT`).
    pub const FP_NFMT: u32 = 9;
    /// Worker conversion scale, upper CSR 10 (FS §2 `$FP_SCL`).
    pub const FP_SCL: u32 = 10;
}

/// Whether `[addr, addr+len)` lies inside tile memory.
pub const fn in_tile_memory(addr: u32, len: u32) -> bool {
    addr >= TILE_MEM_BASE && (addr as u64) + (len as u64) <= TILE_MEM_END as u64
}
