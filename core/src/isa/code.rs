//! Binary encoding and decoding, driven entirely by the table's field descriptions.

use super::{Class, Field, Instr, Issue, Kind, Op, OpInfo, MAX_FIELDS, TABLE};
use core::fmt;

/// Bit 24 of an MRF model instruction: co-issue with the next (ARF) word (docs/target.md §4.1).
pub const COISSUE_BIT: u32 = 1 << 24;

/// An operand that cannot be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeError {
    /// The instruction.
    pub op: Op,
    /// Operand name from the table.
    pub field: &'static str,
    /// The value given.
    pub value: u32,
    /// Why it does not fit.
    pub reason: &'static str,
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot encode {} operand `{}` = {} ({}): {}",
            self.op.info().mnemonic,
            self.field,
            self.value as i32,
            self.value,
            self.reason
        )
    }
}

/// A word that is not an instruction of the table (or an ill-formed bundle).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// No row matches the word.
    Unknown(u32),
    /// A bundle whose second word is not an ARF instruction, or whose first is not MRF.
    BadBundle(u32, u32),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Unknown(w) => write!(f, "undecodable instruction word {w:#010x}"),
            DecodeError::BadBundle(a, b) => {
                write!(f, "ill-formed bundle {a:#010x} {b:#010x}: need {{ MRF ; ARF }}")
            }
        }
    }
}

fn store_value(info: &OpInfo, fl: &Field, value: u32) -> Result<u32, EncodeError> {
    let err = |reason| EncodeError { op: info.op, field: fl.name, value, reason };
    let bits = fl.bits();
    match fl.kind {
        Kind::MReg | Kind::AReg => {
            if value >= 16 {
                return Err(err("register index must be 0..15"));
            }
            Ok(value)
        }
        Kind::APair | Kind::MPair => {
            if value >= 16 || !value.is_multiple_of(2) {
                return Err(err("a register pair must be an even register 0..14"));
            }
            Ok(value / 2)
        }
        Kind::AQuad => {
            if value >= 16 || !value.is_multiple_of(4) {
                return Err(err("a register quad must start at 0, 4, 8 or 12"));
            }
            Ok(value / 4)
        }
        Kind::Unsigned => {
            let v = value.checked_sub(fl.bias as u32).ok_or(err("below the field's minimum"))?;
            if v % fl.scale as u32 != 0 {
                return Err(err("not a multiple of the field's unit"));
            }
            let stored = v / fl.scale as u32;
            if bits < 32 && stored >> bits != 0 {
                return Err(err("too large for the field"));
            }
            Ok(stored)
        }
        Kind::Signed => {
            let v = (value as i32).wrapping_sub(fl.bias as i32);
            if v % fl.scale as i32 != 0 {
                return Err(err("not a multiple of the field's unit"));
            }
            let stored = v / fl.scale as i32;
            let lim = 1i32 << (bits - 1);
            if stored < -lim || stored >= lim {
                return Err(err("out of the field's signed range"));
            }
            Ok((stored as u32) & ((1u64 << bits) - 1) as u32)
        }
    }
}

fn place(fl: &Field, stored: u32) -> u32 {
    let lo_mask = ((1u64 << fl.width) - 1) as u32;
    let mut w = (stored & lo_mask) << fl.shift;
    if let Some((s, _)) = fl.hi {
        w |= (stored >> fl.width) << s;
    }
    w
}

fn extract(fl: &Field, word: u32) -> u32 {
    let lo_mask = ((1u64 << fl.width) - 1) as u32;
    let mut stored = (word >> fl.shift) & lo_mask;
    if let Some((s, w)) = fl.hi {
        stored |= ((word >> s) & ((1u32 << w) - 1)) << fl.width;
    }
    match fl.kind {
        Kind::MReg | Kind::AReg => stored,
        Kind::APair | Kind::MPair => stored * 2,
        Kind::AQuad => stored * 4,
        Kind::Unsigned => stored * fl.scale as u32 + fl.bias as u32,
        Kind::Signed => {
            let bits = fl.bits();
            let v = ((stored << (32 - bits)) as i32) >> (32 - bits);
            (v * fl.scale as i32 + fl.bias as i32) as u32
        }
    }
}

/// Encode one instruction (without the co-issue bit).
pub fn encode(instr: &Instr) -> Result<u32, EncodeError> {
    let info = instr.info();
    let mut word = info.base;
    for (i, fl) in info.fields.iter().enumerate() {
        word |= place(fl, store_value(info, fl, instr.args[i])?);
    }
    for i in info.fields.len()..MAX_FIELDS {
        if instr.args[i] != 0 {
            return Err(EncodeError {
                op: info.op,
                field: "-",
                value: instr.args[i],
                reason: "extra operand",
            });
        }
    }
    Ok(word)
}

/// Encode an issue unit into one or two words.
pub fn encode_issue(issue: &Issue) -> Result<([u32; 2], usize), EncodeError> {
    match issue {
        Issue::Single(i) => Ok(([encode(i)?, 0], 1)),
        Issue::Bundle(main, aux) => {
            let bad = |op: Op, reason| EncodeError { op, field: "-", value: 0, reason };
            if !main.info().can_coissue() {
                return Err(bad(main.op, "first half of a bundle must be an MRF model instruction"));
            }
            if aux.info().class != Class::Arf {
                return Err(bad(aux.op, "second half of a bundle must be an ARF instruction"));
            }
            Ok(([encode(main)? | COISSUE_BIT, encode(aux)?], 2))
        }
    }
}

/// Decode one word: the instruction and whether it carries the co-issue bit.
pub fn decode(word: u32) -> Result<(Instr, bool), DecodeError> {
    for info in TABLE {
        let fixed = info.fixed_mask();
        if word & fixed == info.base {
            let mut args = [0u32; MAX_FIELDS];
            for (i, fl) in info.fields.iter().enumerate() {
                args[i] = extract(fl, word);
            }
            let coissue = info.can_coissue() && word & COISSUE_BIT != 0;
            return Ok((Instr { op: info.op, args }, coissue));
        }
    }
    Err(DecodeError::Unknown(word))
}

/// Decode a bundle from its two words.
pub fn decode_bundle(w0: u32, w1: u32) -> Result<Issue, DecodeError> {
    let (main, co) = decode(w0)?;
    let (aux, co2) = decode(w1)?;
    if !co || co2 || aux.info().class != Class::Arf {
        return Err(DecodeError::BadBundle(w0, w1));
    }
    Ok(Issue::Bundle(main, aux))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Table rows must not overlap: no word may match two rows.
    #[test]
    fn rows_do_not_overlap() {
        for (i, a) in TABLE.iter().enumerate() {
            for b in &TABLE[i + 1..] {
                let common = a.fixed_mask() & b.fixed_mask();
                assert!((a.base ^ b.base) & common != 0, "{} and {} overlap", a.mnemonic, b.mnemonic);
            }
        }
    }

    #[test]
    fn bases_have_no_operand_bits() {
        for info in TABLE {
            assert_eq!(info.base & !info.fixed_mask(), 0, "{}", info.mnemonic);
        }
    }
}
