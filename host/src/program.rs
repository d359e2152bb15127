//! Tile programs from assembly text, for the CLI and for tests.

use ipu_core::isa::{decode, decode_bundle, Disasm, Issue};
use ipu_core::target::{TILE_MEM_BASE, TILE_MEM_SIZE};
use ipu_runtime_tile::asm::{assemble, AsmError};
use std::collections::BTreeMap;
use std::fmt::Write;

/// An assembled tile program: loadable segments, symbols and the entry point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileProgram {
    /// `(address, bytes)` in source order.
    pub segments: Vec<(u32, Vec<u8>)>,
    /// Symbols by name (sorted, so output derived from it is deterministic).
    pub symbols: BTreeMap<String, u32>,
    /// Supervisor entry: the symbol `main` if defined, else the first segment's address.
    pub entry: u32,
}

impl TileProgram {
    /// Assemble `src` (code before any `.org` starts at the bottom of tile memory).
    pub fn from_asm(src: &str) -> Result<Self, AsmError> {
        let mut buf = vec![0u8; TILE_MEM_SIZE];
        let prog = assemble(src, TILE_MEM_BASE, &mut buf)?;
        let segments: Vec<(u32, Vec<u8>)> =
            prog.segments.iter().map(|s| (s.addr, buf[s.offset..s.offset + s.len].to_vec())).collect();
        let symbols: BTreeMap<String, u32> = prog.symbols.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        let entry = symbols.get("main").copied().or(segments.first().map(|s| s.0)).unwrap_or(TILE_MEM_BASE);
        Ok(TileProgram { segments, symbols, entry })
    }

    /// Segments as borrowed slices, the form `Device::load_tile` takes.
    pub fn segment_refs(&self) -> Vec<(u32, &[u8])> {
        self.segments.iter().map(|(a, b)| (*a, b.as_slice())).collect()
    }

    /// A symbol's value; panics with the name if absent (test helper).
    pub fn sym(&self, name: &str) -> u32 {
        *self.symbols.get(name).unwrap_or_else(|| panic!("symbol `{name}` not defined"))
    }

    /// One flat image from the lowest to the highest address, zero-filled: `(base, bytes)`.
    pub fn flat_image(&self) -> (u32, Vec<u8>) {
        let base = self.segments.iter().map(|s| s.0).min().unwrap_or(TILE_MEM_BASE);
        let end = self.segments.iter().map(|s| s.0 + s.1.len() as u32).max().unwrap_or(base);
        let mut img = vec![0u8; (end - base) as usize];
        for (a, b) in &self.segments {
            let o = (a - base) as usize;
            img[o..o + b.len()].copy_from_slice(b);
        }
        (base, img)
    }
}

/// Disassemble a flat image at `base`, one issue unit per line: `address: words  text`.
/// Words that are not instructions are shown as `.word`.
pub fn disassemble(base: u32, bytes: &[u8]) -> String {
    let words: Vec<u32> = bytes
        .chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(w)
        })
        .collect();
    let mut out = String::new();
    let mut i = 0;
    while i < words.len() {
        let addr = base + 4 * i as u32;
        let w = words[i];
        // A run of zero words (an `.org` gap or `.space`) is one line, not thousands.
        let zeros = words[i..].iter().take_while(|&&x| x == 0).count();
        if zeros >= 4 {
            let _ = writeln!(
                out,
                "{addr:#07x}: .space {} (zero words up to {:#07x})",
                4 * zeros,
                addr + 4 * zeros as u32
            );
            i += zeros;
            continue;
        }
        let unit = match decode(w) {
            Ok((_, true)) if i + 1 < words.len() && addr.is_multiple_of(8) => {
                decode_bundle(w, words[i + 1]).ok().map(|b| (b, 2))
            }
            Ok((ins, false)) => Some((Issue::Single(ins), 1)),
            _ => None,
        };
        match unit {
            Some((issue, 2)) => {
                let _ = writeln!(out, "{addr:#07x}: {w:08x} {:08x}  {}", words[i + 1], Disasm(&issue));
                i += 2;
            }
            Some((issue, _)) => {
                let _ = writeln!(out, "{addr:#07x}: {w:08x}           {}", Disasm(&issue));
                i += 1;
            }
            None => {
                let _ = writeln!(out, "{addr:#07x}: {w:08x}           .word {w:#x}");
                i += 1;
            }
        }
    }
    out
}
