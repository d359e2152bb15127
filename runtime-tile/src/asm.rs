//! A small two-pass text assembler for tile programs (`no_std`, no allocation).
//!
//! Syntax, one statement per line:
//! - `label:` defines a symbol (an instruction may follow on the same line);
//! - an instruction as printed by the disassembler, or a bundle `{ main ; aux }`;
//! - operands may be symbols, `symbol+N` / `symbol-N`, or integers (decimal or `0x` hex);
//! - `.org ADDR` starts a new segment, `.align N` pads with zeros (a `nop`/`fnop` is not implied),
//!   `.word V, …` emits 32-bit words, `.half V, …` 16-bit values, `.space N` N zero bytes,
//!   `.equ NAME, VALUE` defines a constant, `.kind K` (0..=3) counts the bytes that follow in
//!   [`Program::kind_bytes`]`[K]` (the code generator marks runtime, kernel, launch and exchange
//!   code this way, so that a tile's code size is reported by kind);
//! - `#` or `//` start a comment.
//!
//! Output goes into a caller buffer; segments record which addresses each part of it covers.

use core::fmt::{self, Write};
use heapless::{String, Vec};
use ipu_core::isa::{encode_issue, parse_int, parse_issue, EncodeError, ParseError};

/// Most symbols per program.
pub const MAX_SYMBOLS: usize = 1024;
/// Most segments (`.org` blocks) per program.
pub const MAX_SEGMENTS: usize = 32;
/// Longest statement after symbol substitution.
pub const MAX_LINE: usize = 256;

/// Why assembly failed, with the 1-based source line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsmError {
    /// Line number (1-based).
    pub line: usize,
    /// What is wrong.
    pub kind: AsmErrorKind,
}

/// The kinds of assembly error.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsmErrorKind {
    /// The statement is not an instruction.
    Parse(ParseError),
    /// An operand does not fit its field.
    Encode(EncodeError),
    /// A symbol that is never defined.
    UnknownSymbol(String<64>),
    /// A symbol defined twice.
    DuplicateSymbol(String<64>),
    /// More than [`MAX_SYMBOLS`] symbols.
    TooManySymbols,
    /// More than [`MAX_SEGMENTS`] segments.
    TooManySegments,
    /// The output buffer is too small.
    OutputFull,
    /// A statement longer than [`MAX_LINE`] after substitution.
    LineTooLong,
    /// An unknown directive or a malformed one.
    BadDirective,
    /// Code placed before anything was `.org`-ed and without a default origin.
    Overlap,
    /// A bundle at an address that is not a multiple of 8 (docs/target.md §4.1).
    MisalignedBundle(u32),
    /// An address outside the 21-bit tile address space.
    AddressRange(u64),
}

/// Tile addresses are 21 bits (FS §1.1).
pub const ADDRESS_LIMIT: u64 = 1 << 21;

impl fmt::Display for AsmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: ", self.line)?;
        match &self.kind {
            AsmErrorKind::Parse(e) => write!(f, "{e}"),
            AsmErrorKind::Encode(e) => write!(f, "{e}"),
            AsmErrorKind::UnknownSymbol(s) => write!(f, "unknown symbol `{s}`"),
            AsmErrorKind::DuplicateSymbol(s) => write!(f, "symbol `{s}` defined twice"),
            AsmErrorKind::TooManySymbols => write!(f, "more than {MAX_SYMBOLS} symbols"),
            AsmErrorKind::TooManySegments => write!(f, "more than {MAX_SEGMENTS} segments"),
            AsmErrorKind::OutputFull => f.write_str("program larger than the output buffer"),
            AsmErrorKind::LineTooLong => write!(f, "statement longer than {MAX_LINE} characters"),
            AsmErrorKind::BadDirective => f.write_str("unknown or malformed directive"),
            AsmErrorKind::Overlap => f.write_str("segment overlaps an earlier one"),
            AsmErrorKind::AddressRange(a) => {
                write!(f, "address {a:#x} outside the 21-bit tile address space")
            }
            AsmErrorKind::MisalignedBundle(a) => {
                write!(f, "bundle at {a:#x} is not 8-byte aligned (insert a nop before it)")
            }
        }
    }
}

/// A contiguous piece of the program: `len` bytes at tile address `addr`, stored at `offset` in
/// the output buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Tile byte address.
    pub addr: u32,
    /// Offset in the output buffer.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

/// The result: segments into the caller's buffer and the symbol table.
#[derive(Debug)]
pub struct Program<'src> {
    /// Segments in source order.
    pub segments: Vec<Segment, MAX_SEGMENTS>,
    /// Symbols (labels and `.equ`).
    pub symbols: Vec<(&'src str, u32), MAX_SYMBOLS>,
    /// Bytes of the buffer in use.
    pub used: usize,
    /// Bytes emitted under each `.kind K` directive (bytes before the first `.kind` count as 0).
    pub kind_bytes: [u32; KINDS],
}

/// Counters of `.kind` (docs/format.md: the code of a tile by kind).
pub const KINDS: usize = 4;

impl Program<'_> {
    /// The value of a symbol.
    pub fn symbol(&self, name: &str) -> Option<u32> {
        self.symbols.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }
}

/// The line before its comment (`#` or `//`), trimmed; one pass over the bytes.
fn strip_comment(line: &str) -> &str {
    let b = line.as_bytes();
    let end = (0..b.len())
        .find(|&i| b[i] == b'#' || (b[i] == b'/' && b.get(i + 1) == Some(&b'/')))
        .unwrap_or(b.len());
    line[..end].trim()
}

fn is_ident(s: &str) -> bool {
    let mut ch = s.chars();
    matches!(ch.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == '.')
        && ch.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

fn name64(s: &str) -> String<64> {
    let mut out = String::new();
    for c in s.chars().take(64) {
        let _ = out.push(c);
    }
    out
}

struct State<'src, 'buf> {
    out: &'buf mut [u8],
    prog: Program<'src>,
    addr: u32,
    pass: u8,
    kind: usize,
}

impl<'src> State<'src, '_> {
    fn value(&self, expr: &str) -> Result<u32, AsmErrorKind> {
        let expr = expr.trim();
        if let Some(v) = parse_int(expr) {
            return Ok(v as u32);
        }
        let (name, off) = match expr.find(['+', '-']) {
            Some(i) if i > 0 => {
                let off = parse_int(&expr[i + 1..]).ok_or(AsmErrorKind::BadDirective)?;
                (expr[..i].trim(), if &expr[i..i + 1] == "-" { -off } else { off })
            }
            _ => (expr, 0),
        };
        match self.prog.symbol(name) {
            Some(v) => Ok((v as i64 + off) as u32),
            None if self.pass == 1 => Ok(0),
            None => Err(AsmErrorKind::UnknownSymbol(name64(name))),
        }
    }

    fn define(&mut self, name: &'src str, value: u32) -> Result<(), AsmErrorKind> {
        if self.pass == 2 {
            return Ok(());
        }
        if self.prog.symbol(name).is_some() {
            return Err(AsmErrorKind::DuplicateSymbol(name64(name)));
        }
        self.prog.symbols.push((name, value)).map_err(|_| AsmErrorKind::TooManySymbols)
    }

    fn start_segment(&mut self, addr: u32) -> Result<(), AsmErrorKind> {
        if let Some(last) = self.prog.segments.last() {
            if last.len == 0 {
                self.prog.segments.pop();
            }
        }
        for s in &self.prog.segments {
            if (addr as u64) < s.addr as u64 + s.len as u64 && s.addr <= addr {
                return Err(AsmErrorKind::Overlap);
            }
        }
        if addr as u64 >= ADDRESS_LIMIT {
            return Err(AsmErrorKind::AddressRange(addr as u64));
        }
        let seg = Segment { addr, offset: self.prog.used, len: 0 };
        self.prog.segments.push(seg).map_err(|_| AsmErrorKind::TooManySegments)?;
        self.addr = addr;
        Ok(())
    }

    fn emit(&mut self, bytes: &[u8]) -> Result<(), AsmErrorKind> {
        if self.prog.segments.is_empty() {
            return Err(AsmErrorKind::Overlap);
        }
        let o = self.prog.used;
        if self.pass == 2 {
            let dst = self.out.get_mut(o..o + bytes.len()).ok_or(AsmErrorKind::OutputFull)?;
            dst.copy_from_slice(bytes);
        } else if o + bytes.len() > self.out.len() {
            return Err(AsmErrorKind::OutputFull);
        }
        self.prog.used += bytes.len();
        self.prog.kind_bytes[self.kind] += bytes.len() as u32;
        if let Some(seg) = self.prog.segments.last_mut() {
            seg.len += bytes.len();
        }
        let next = self.addr as u64 + bytes.len() as u64;
        if next > ADDRESS_LIMIT {
            return Err(AsmErrorKind::AddressRange(next));
        }
        self.addr = next as u32;
        Ok(())
    }

    fn directive(&mut self, d: &str, args: &'src str) -> Result<(), AsmErrorKind> {
        let mut vals = args.split(',').map(str::trim).filter(|s| !s.is_empty());
        match d {
            ".org" => {
                let a = self.value(args)?;
                self.start_segment(a)
            }
            ".align" => {
                let n = self.value(args)?;
                if n == 0 || !n.is_power_of_two() {
                    return Err(AsmErrorKind::BadDirective);
                }
                while !self.addr.is_multiple_of(n) {
                    self.emit(&[0])?;
                }
                Ok(())
            }
            ".word" => vals.try_for_each(|v| {
                let x = self.value(v)?;
                self.emit(&x.to_le_bytes())
            }),
            ".half" => vals.try_for_each(|v| {
                let x = self.value(v)? as u16;
                self.emit(&x.to_le_bytes())
            }),
            ".space" => {
                let n = self.value(args)?;
                (0..n).try_for_each(|_| self.emit(&[0]))
            }
            ".kind" => {
                let k = self.value(args)? as usize;
                if k >= KINDS {
                    return Err(AsmErrorKind::BadDirective);
                }
                self.kind = k;
                Ok(())
            }
            ".equ" => {
                let (name, v) = args.split_once(',').ok_or(AsmErrorKind::BadDirective)?;
                let name = name.trim();
                if !is_ident(name) {
                    return Err(AsmErrorKind::BadDirective);
                }
                let v = self.value(v)?;
                self.define(name, v)
            }
            _ => Err(AsmErrorKind::BadDirective),
        }
    }

    /// Replace symbol operands by numbers so the table's parser sees only registers and integers.
    fn substitute(&self, stmt: &str) -> Result<String<MAX_LINE>, AsmErrorKind> {
        let mut out: String<MAX_LINE> = String::new();
        let (mnemonic, rest) = match stmt.find(char::is_whitespace) {
            Some(i) => (&stmt[..i], &stmt[i..]),
            None => (stmt, ""),
        };
        out.push_str(mnemonic).map_err(|_| AsmErrorKind::LineTooLong)?;
        let mut first = true;
        for op in rest.split(',') {
            let op = op.trim();
            if op.is_empty() {
                continue;
            }
            out.push_str(if first { " " } else { ", " }).map_err(|_| AsmErrorKind::LineTooLong)?;
            first = false;
            if op.starts_with('$') || parse_int(op).is_some() {
                out.push_str(op).map_err(|_| AsmErrorKind::LineTooLong)?;
            } else {
                let v = self.value(op)?;
                write!(out, "{v}").map_err(|_| AsmErrorKind::LineTooLong)?;
            }
        }
        Ok(out)
    }

    fn statement(&mut self, stmt: &'src str) -> Result<(), AsmErrorKind> {
        if let Some(d) = stmt.strip_prefix('.').map(|_| stmt) {
            let (d, args) = d.split_once(char::is_whitespace).unwrap_or((d, ""));
            return self.directive(d, args.trim());
        }
        let bundle = stmt.starts_with('{');
        if bundle && !self.addr.is_multiple_of(8) {
            return Err(AsmErrorKind::MisalignedBundle(self.addr));
        }
        if self.pass == 1 {
            // Sizes only (a bundle is two words, an instruction one): operands may name labels not
            // yet known, and pass 2 parses and encodes every statement anyway.
            return (0..if bundle { 2 } else { 1 }).try_for_each(|_| self.emit(&[0; 4]));
        }
        let text: String<MAX_LINE> = if let Some(inner) = stmt.strip_prefix('{') {
            let inner = inner.strip_suffix('}').ok_or(AsmErrorKind::Parse(ParseError::BadBundle))?;
            let (a, b) = inner.split_once(';').ok_or(AsmErrorKind::Parse(ParseError::BadBundle))?;
            let (a, b) = (self.substitute(a.trim())?, self.substitute(b.trim())?);
            let mut s = String::new();
            write!(s, "{{ {a} ; {b} }}").map_err(|_| AsmErrorKind::LineTooLong)?;
            s
        } else {
            self.substitute(stmt)?
        };
        let issue = parse_issue(&text).map_err(AsmErrorKind::Parse)?;
        let (words, n) = encode_issue(&issue).map_err(AsmErrorKind::Encode)?;
        for w in &words[..n] {
            self.emit(&w.to_le_bytes())?;
        }
        Ok(())
    }
}

/// Assemble `src` into `out`. Code before any `.org` starts at `default_org`.
pub fn assemble<'src>(src: &'src str, default_org: u32, out: &mut [u8]) -> Result<Program<'src>, AsmError> {
    let mut st = State {
        out,
        prog: Program { segments: Vec::new(), symbols: Vec::new(), used: 0, kind_bytes: [0; KINDS] },
        addr: default_org,
        pass: 1,
        kind: 0,
    };
    for pass in [1u8, 2] {
        st.pass = pass;
        st.prog.segments.clear();
        st.prog.used = 0;
        st.prog.kind_bytes = [0; KINDS];
        st.kind = 0;
        st.start_segment(default_org).map_err(|kind| AsmError { line: 0, kind })?;
        for (n, raw) in src.lines().enumerate() {
            let err = |kind| AsmError { line: n + 1, kind };
            let mut stmt = strip_comment(raw);
            while let Some(i) = stmt.find(':') {
                let label = stmt[..i].trim();
                if !is_ident(label) || stmt[..i].contains('{') {
                    break;
                }
                st.define(label, st.addr).map_err(err)?;
                stmt = stmt[i + 1..].trim();
            }
            if !stmt.is_empty() {
                st.statement(stmt).map_err(err)?;
            }
        }
    }
    if let Some(last) = st.prog.segments.last() {
        if last.len == 0 {
            st.prog.segments.pop();
        }
    }
    Ok(st.prog)
}
