//! Assembly text of one instruction or bundle, both ways, from the table. The text printed by
//! [`Disasm`] parses back to the same instruction (tested over the whole table).

use super::{Field, Instr, Issue, Kind, MAX_FIELDS, TABLE};
use core::fmt;

/// Displays an instruction or bundle as assembly text.
pub struct Disasm<'a>(pub &'a Issue);

fn hex_field(fl: &Field) -> bool {
    matches!(fl.name, "addr" | "target" | "csr" | "source" | "offset")
}

fn write_instr(f: &mut fmt::Formatter<'_>, i: &Instr) -> fmt::Result {
    let info = i.info();
    f.write_str(info.mnemonic)?;
    for (n, fl) in info.fields.iter().enumerate() {
        f.write_str(if n == 0 { " " } else { ", " })?;
        let v = i.args[n];
        match fl.kind {
            Kind::MReg | Kind::MPair => write!(f, "$m{v}")?,
            Kind::AReg | Kind::APair | Kind::AQuad => write!(f, "$a{v}")?,
            Kind::Unsigned if hex_field(fl) => write!(f, "{v:#x}")?,
            // A stride select is written as its source writes it: two bits per address.
            Kind::Unsigned if fl.name == "strimm" => write!(f, "{v:#08b}")?,
            Kind::Unsigned => write!(f, "{v}")?,
            Kind::Signed => write!(f, "{}", v as i32)?,
        }
    }
    Ok(())
}

impl fmt::Display for Instr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_instr(f, self)
    }
}

impl fmt::Display for Disasm<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Issue::Single(i) => write_instr(f, i),
            Issue::Bundle(a, b) => {
                f.write_str("{ ")?;
                write_instr(f, a)?;
                f.write_str(" ; ")?;
                write_instr(f, b)?;
                f.write_str(" }")
            }
        }
    }
}

/// Why a line of assembly is not an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// No instruction has this mnemonic.
    UnknownMnemonic,
    /// The mnemonic exists but no form takes these operands.
    BadOperands,
    /// A `{ … ; … }` bundle is not well formed.
    BadBundle,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ParseError::UnknownMnemonic => "unknown mnemonic",
            ParseError::BadOperands => "operands match no form of this instruction",
            ParseError::BadBundle => "a bundle is written `{ main ; aux }`",
        })
    }
}

/// Parse an integer: decimal, `0x` hex, `0b` binary, optional leading `-`.
pub fn parse_int(s: &str) -> Option<i64> {
    let s = s.trim();
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s),
    };
    let v = if let Some(h) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        if h.starts_with(['-', '+']) {
            return None;
        }
        i64::from_str_radix(h, 16).ok()?
    } else if let Some(b) = body.strip_prefix("0b").or_else(|| body.strip_prefix("0B")) {
        if b.starts_with(['-', '+']) {
            return None;
        }
        i64::from_str_radix(b, 2).ok()?
    } else {
        body.parse::<i64>().ok()?
    };
    Some(if neg { -v } else { v })
}

fn parse_operand(fl: &Field, s: &str) -> Option<u32> {
    let s = s.trim();
    match fl.kind {
        Kind::MReg | Kind::MPair => s.strip_prefix("$m")?.parse::<u32>().ok().filter(|v| *v < 16),
        Kind::AReg | Kind::APair | Kind::AQuad => {
            s.strip_prefix("$a")?.parse::<u32>().ok().filter(|v| *v < 16)
        }
        Kind::Unsigned => parse_int(s).filter(|v| (0..=u32::MAX as i64).contains(v)).map(|v| v as u32),
        Kind::Signed => {
            parse_int(s).filter(|v| (i32::MIN as i64..=i32::MAX as i64).contains(v)).map(|v| v as i32 as u32)
        }
    }
}

/// Parse one instruction (no bundle braces, no labels).
pub fn parse_instr(line: &str) -> Result<Instr, ParseError> {
    let line = line.trim();
    let (mnemonic, rest) = match line.find(char::is_whitespace) {
        Some(i) => (&line[..i], line[i..].trim()),
        None => (line, ""),
    };
    let mut operands: [&str; MAX_FIELDS + 1] = [""; MAX_FIELDS + 1];
    let mut count = 0;
    if !rest.is_empty() {
        for op in rest.split(',') {
            if count > MAX_FIELDS {
                return Err(ParseError::BadOperands);
            }
            operands[count] = op;
            count += 1;
        }
    }
    let mut known = false;
    'rows: for info in TABLE.iter().filter(|i| i.mnemonic == mnemonic) {
        known = true;
        if info.fields.len() != count {
            continue;
        }
        let mut args = [0u32; MAX_FIELDS];
        for (n, fl) in info.fields.iter().enumerate() {
            match parse_operand(fl, operands[n]) {
                Some(v) => args[n] = v,
                None => continue 'rows,
            }
        }
        return Ok(Instr { op: info.op, args });
    }
    Err(if known { ParseError::BadOperands } else { ParseError::UnknownMnemonic })
}

/// Parse an instruction or a `{ main ; aux }` bundle.
pub fn parse_issue(line: &str) -> Result<Issue, ParseError> {
    let line = line.trim();
    if let Some(inner) = line.strip_prefix('{') {
        let inner = inner.strip_suffix('}').ok_or(ParseError::BadBundle)?;
        let (a, b) = inner.split_once(';').ok_or(ParseError::BadBundle)?;
        return Ok(Issue::Bundle(parse_instr(a)?, parse_instr(b)?));
    }
    Ok(Issue::Single(parse_instr(line)?))
}
