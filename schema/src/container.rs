//! The container: header, section table, checksummed bodies (`docs/format.md`).

use alloc::vec::Vec;
use core::fmt;
use sha2::{Digest, Sha256};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// File magic.
pub const MAGIC: [u8; 8] = *b"IPUEXE\0\x01";
/// Current format version.
pub const FORMAT_VERSION: u32 = 5;
/// Architecture id of the Mk2 model.
pub const ARCH_MK2: u32 = 2;
/// Most sections in a package.
pub const MAX_SECTIONS: u32 = 64;

/// The 80-byte header.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct Header {
    /// `MAGIC`.
    pub magic: [u8; 8],
    /// `FORMAT_VERSION`.
    pub format_version: U32,
    /// 80.
    pub header_size: U32,
    /// `ARCH_MK2`.
    pub arch: U32,
    /// Tiles of the target.
    pub tile_count: U32,
    /// Entries in the section table.
    pub section_count: U32,
    /// 0.
    pub reserved: U32,
    /// Offset of the section table.
    pub section_table_offset: U64,
    /// Total file size.
    pub file_size: U64,
    /// SHA-256 of header (this field zeroed) + section table.
    pub checksum: [u8; 32],
}
const _: () = assert!(core::mem::size_of::<Header>() == 80);

/// One 56-byte section table entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct SectionEntry {
    /// `SectionKind` as u32.
    pub kind: U32,
    /// 0.
    pub flags: U32,
    /// Body offset (8-aligned).
    pub offset: U64,
    /// Body length.
    pub length: U64,
    /// SHA-256 of the body.
    pub sha256: [u8; 32],
}
const _: () = assert!(core::mem::size_of::<SectionEntry>() == 56);

/// Section kinds, in the order a writer emits them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u32)]
pub enum SectionKind {
    /// `Vec<SharedImage>`: each distinct tile image once, with the tiles that load it.
    TileImages = 1,
    /// `Vec<(u32, u32)>`.
    ConfigWrites = 2,
    /// `Vec<Binding>`.
    Bindings = 3,
    /// `HostExchange`.
    HostExchange = 4,
    /// `Vec<Symbol>`.
    Symbols = 5,
    /// `BuildInfo`.
    BuildInfo = 6,
    /// `PlanSummary`.
    Plan = 7,
}

impl SectionKind {
    /// All kinds in file order.
    pub const ALL: [SectionKind; 7] = [
        SectionKind::TileImages,
        SectionKind::ConfigWrites,
        SectionKind::Bindings,
        SectionKind::HostExchange,
        SectionKind::Symbols,
        SectionKind::BuildInfo,
        SectionKind::Plan,
    ];
    /// Kind from its number.
    pub fn from_u32(v: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|k| *k as u32 == v)
    }
    /// Name as in `docs/format.md`.
    pub fn name(self) -> &'static str {
        match self {
            SectionKind::TileImages => "TILE_IMAGES",
            SectionKind::ConfigWrites => "CONFIG_WRITES",
            SectionKind::Bindings => "BINDINGS",
            SectionKind::HostExchange => "HOST_EXCHANGE",
            SectionKind::Symbols => "SYMBOLS",
            SectionKind::BuildInfo => "BUILD_INFO",
            SectionKind::Plan => "PLAN",
        }
    }
}

/// What is wrong with a container. Every variant names the problem; none is a panic.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ContainerError {
    /// Fewer bytes than a header.
    TooSmall(u64),
    /// Not a package.
    BadMagic,
    /// Another format version.
    Version {
        /// In the file.
        found: u32,
        /// Supported.
        supported: u32,
    },
    /// A header field out of range.
    Header(&'static str),
    /// Header and table checksum mismatch.
    Checksum,
    /// A section entry is invalid.
    Section {
        /// Index in the table.
        index: u32,
        /// What.
        what: &'static str,
    },
    /// A section body's SHA-256 does not match.
    SectionChecksum(&'static str),
}

impl fmt::Display for ContainerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ContainerError::TooSmall(n) => {
                write!(f, "file is {n} bytes, smaller than the 80-byte package header")
            }
            ContainerError::BadMagic => f.write_str("not an ipu-codegen package (bad magic)"),
            ContainerError::Version { found, supported } => {
                write!(f, "package format version {found}, this reader supports {supported}")
            }
            ContainerError::Header(w) => write!(f, "invalid package header: {w}"),
            ContainerError::Checksum => {
                f.write_str("header/section-table checksum mismatch (corrupted package)")
            }
            ContainerError::Section { index, what } => write!(f, "section table entry {index}: {what}"),
            ContainerError::SectionChecksum(name) => {
                write!(f, "section {name}: SHA-256 mismatch (corrupted package)")
            }
        }
    }
}

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

fn align8(n: usize) -> usize {
    (n + 7) & !7
}

/// Assemble a container from section bodies (in `SectionKind::ALL` order).
pub fn write_container(tile_count: u32, bodies: &[(SectionKind, Vec<u8>)]) -> Vec<u8> {
    let table_off = core::mem::size_of::<Header>();
    let mut off = align8(table_off + bodies.len() * core::mem::size_of::<SectionEntry>());
    let mut entries = Vec::with_capacity(bodies.len());
    for (kind, body) in bodies {
        entries.push(SectionEntry {
            kind: U32::new(*kind as u32),
            flags: U32::new(0),
            offset: U64::new(off as u64),
            length: U64::new(body.len() as u64),
            sha256: sha256(&[body]),
        });
        off = align8(off + body.len());
    }
    let file_size = off;
    let mut header = Header {
        magic: MAGIC,
        format_version: U32::new(FORMAT_VERSION),
        header_size: U32::new(80),
        arch: U32::new(ARCH_MK2),
        tile_count: U32::new(tile_count),
        section_count: U32::new(bodies.len() as u32),
        reserved: U32::new(0),
        section_table_offset: U64::new(table_off as u64),
        file_size: U64::new(file_size as u64),
        checksum: [0; 32],
    };
    let table: Vec<u8> = entries.iter().flat_map(|e| e.as_bytes().iter().copied()).collect();
    header.checksum = sha256(&[header.as_bytes(), &table]);
    let mut out = Vec::with_capacity(file_size);
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&table);
    for (e, (_, body)) in entries.iter().zip(bodies) {
        out.resize(e.offset.get() as usize, 0);
        out.extend_from_slice(body);
    }
    out.resize(file_size, 0);
    out
}

/// Section bodies of a container, in file order.
pub type Sections<'a> = Vec<(SectionKind, &'a [u8])>;

/// Check the container and return the header and each section's body, indexed by kind order.
pub fn read_container(bytes: &[u8]) -> Result<(Header, Sections<'_>), ContainerError> {
    let (header, _) =
        Header::read_from_prefix(bytes).map_err(|_| ContainerError::TooSmall(bytes.len() as u64))?;
    if header.magic != MAGIC {
        return Err(ContainerError::BadMagic);
    }
    if header.format_version.get() != FORMAT_VERSION {
        return Err(ContainerError::Version {
            found: header.format_version.get(),
            supported: FORMAT_VERSION,
        });
    }
    if header.header_size.get() != 80 {
        return Err(ContainerError::Header("header size is not 80"));
    }
    if header.arch.get() != ARCH_MK2 {
        return Err(ContainerError::Header("unknown architecture id"));
    }
    let tiles = header.tile_count.get();
    if tiles == 0 || tiles > 1472 {
        return Err(ContainerError::Header("tile count not in 1..=1472"));
    }
    if header.file_size.get() != bytes.len() as u64 {
        return Err(ContainerError::Header(
            "file size field does not match the file (truncated or extended)",
        ));
    }
    let n = header.section_count.get();
    if n == 0 || n > MAX_SECTIONS {
        return Err(ContainerError::Header("section count not in 1..=64"));
    }
    let table_off = header.section_table_offset.get();
    let table_len = n as u64 * 56;
    if table_off != 80 || table_off + table_len > bytes.len() as u64 {
        return Err(ContainerError::Header("section table outside the file"));
    }
    let table = &bytes[80..(80 + table_len) as usize];
    let mut zeroed = header;
    zeroed.checksum = [0; 32];
    if sha256(&[zeroed.as_bytes(), table]) != header.checksum {
        return Err(ContainerError::Checksum);
    }
    let mut out: Vec<(SectionKind, &[u8])> = Vec::new();
    let mut prev_end = 80 + table_len;
    for i in 0..n {
        let bad = |what| ContainerError::Section { index: i, what };
        let (e, _) =
            SectionEntry::read_from_prefix(&table[(i * 56) as usize..]).map_err(|_| bad("truncated"))?;
        let kind = SectionKind::from_u32(e.kind.get()).ok_or(bad("unknown section kind"))?;
        if out.iter().any(|(k, _)| *k == kind) {
            return Err(bad("duplicate section kind"));
        }
        if out.last().is_some_and(|(k, _)| *k > kind) {
            return Err(bad("sections out of order"));
        }
        if e.flags.get() != 0 {
            return Err(bad("unknown flags"));
        }
        let (off, len) = (e.offset.get(), e.length.get());
        if off % 8 != 0 {
            return Err(bad("body not 8-byte aligned"));
        }
        if off < prev_end {
            return Err(bad("body overlaps the table or the previous body"));
        }
        if off - prev_end >= 8 || bytes[prev_end as usize..off as usize].iter().any(|b| *b != 0) {
            return Err(bad("bytes before the body are not zero alignment padding"));
        }
        let end = off.checked_add(len).ok_or(bad("body length overflows"))?;
        if end > bytes.len() as u64 {
            return Err(bad("body extends past the end of the file"));
        }
        let body = &bytes[off as usize..end as usize];
        if sha256(&[body]) != e.sha256 {
            return Err(ContainerError::SectionChecksum(kind.name()));
        }
        prev_end = end;
        out.push((kind, body));
    }
    let tail = &bytes[prev_end as usize..];
    if tail.len() >= 8 || tail.iter().any(|b| *b != 0) {
        return Err(ContainerError::Header("bytes after the last section are not zero alignment padding"));
    }
    Ok((header, out))
}
