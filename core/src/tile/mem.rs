//! Checked tile-memory access (docs/target.md §2). `mem` covers `TILE_MEM_BASE..TILE_MEM_END`.

use super::FaultKind;
use crate::target::{in_tile_memory, TILE_MEM_BASE};

/// Offset of `[addr, addr+len)` in the memory slice, after range and alignment checks.
#[inline]
pub fn offset(addr: u32, len: u32, align: u32) -> Result<usize, FaultKind> {
    if !addr.is_multiple_of(align) {
        return Err(FaultKind::Misaligned { addr, align });
    }
    if !in_tile_memory(addr, len) {
        return Err(FaultKind::OutOfRange { addr, len });
    }
    Ok((addr - TILE_MEM_BASE) as usize)
}

/// Load 16 bits.
#[inline]
pub fn ld16(mem: &[u8], addr: u32) -> Result<u16, FaultKind> {
    let o = offset(addr, 2, 2)?;
    let mut b = [0u8; 2];
    b.copy_from_slice(&mem[o..o + 2]);
    Ok(u16::from_le_bytes(b))
}

/// Load 32 bits.
#[inline]
pub fn ld32(mem: &[u8], addr: u32) -> Result<u32, FaultKind> {
    // One bounds check and one host load (four indexed bytes would be four of each).
    let o = offset(addr, 4, 4)?;
    let mut b = [0u8; 4];
    b.copy_from_slice(&mem[o..o + 4]);
    Ok(u32::from_le_bytes(b))
}

/// Store 32 bits.
#[inline]
pub fn st32(mem: &mut [u8], addr: u32, v: u32) -> Result<(), FaultKind> {
    let o = offset(addr, 4, 4)?;
    mem[o..o + 4].copy_from_slice(&v.to_le_bytes());
    Ok(())
}

/// Load 64 bits.
#[inline]
pub fn ld64(mem: &[u8], addr: u32) -> Result<u64, FaultKind> {
    let o = offset(addr, 8, 8)?;
    let mut b = [0u8; 8];
    b.copy_from_slice(&mem[o..o + 8]);
    Ok(u64::from_le_bytes(b))
}

/// Store 64 bits.
#[inline]
pub fn st64(mem: &mut [u8], addr: u32, v: u64) -> Result<(), FaultKind> {
    let o = offset(addr, 8, 8)?;
    mem[o..o + 8].copy_from_slice(&v.to_le_bytes());
    Ok(())
}

/// A checked byte range.
#[inline]
pub fn bytes(mem: &[u8], addr: u32, len: u32, align: u32) -> Result<&[u8], FaultKind> {
    let o = offset(addr, len, align)?;
    Ok(&mem[o..o + len as usize])
}
