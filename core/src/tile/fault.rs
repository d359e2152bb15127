//! Faults raised by tile execution (docs/target.md §7).

use crate::isa::{decode, decode_bundle, DecodeError, Disasm, Issue};
use core::fmt;

/// Which context of a tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtxId {
    /// The supervisor.
    Sup,
    /// Worker in barrel slot `k` (0..5).
    Worker(u8),
}

impl fmt::Display for CtxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CtxId::Sup => f.write_str("sup"),
            CtxId::Worker(k) => write!(f, "w{k}"),
        }
    }
}

/// Why execution stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FaultKind {
    /// The word(s) at pc are not an instruction.
    Undecodable(DecodeError),
    /// The instruction may not run in this context (e.g. `sync` on a worker).
    WrongContext,
    /// Instruction fetch outside region 0 (0x4C000..0x80000).
    FetchOutsideExecRegion,
    /// Instruction fetch not 4-aligned, or a bundle not 8-aligned.
    FetchMisaligned,
    /// Data access outside tile memory.
    OutOfRange {
        /// First byte.
        addr: u32,
        /// Length in bytes.
        len: u32,
    },
    /// Data access not naturally aligned.
    Misaligned {
        /// Address.
        addr: u32,
        /// Required alignment.
        align: u32,
    },
    /// An operand value the model does not allow.
    BadOperand(&'static str),
    /// `rpt` count above 4095.
    RptCount(u32),
    /// `rpt` placed so that its body is not 8-aligned.
    RptAlign,
    /// A word in an `rpt` body that is not a bundle.
    RptBody,
    /// `run`/`runall` with no free worker slot.
    NoFreeWorker,
    /// Internal or host sync, or `halt`, while workers run.
    WorkersRunning,
    /// A sync zone the model does not define.
    InvalidZone(u32),
    /// A CSR the model does not define (or not writable from this context).
    UnknownCsr(u32),
    /// `send` with the 64-bit flag: the pair path is not implemented yet.
    PairedSendUnsupported,
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultKind::Undecodable(e) => write!(f, "{e}"),
            FaultKind::WrongContext => f.write_str("instruction not allowed in this context"),
            FaultKind::FetchOutsideExecRegion => {
                f.write_str("instruction fetch outside executable region 0 (0x4c000..0x80000)")
            }
            FaultKind::FetchMisaligned => f.write_str("misaligned instruction fetch"),
            FaultKind::OutOfRange { addr, len } => {
                write!(f, "access of {len} bytes at {addr:#x} outside tile memory 0x4c000..0xe8000")
            }
            FaultKind::Misaligned { addr, align } => {
                write!(f, "access at {addr:#x} not aligned to {align} bytes")
            }
            FaultKind::BadOperand(w) => write!(f, "invalid operand: {w}"),
            FaultKind::RptCount(n) => write!(f, "rpt count {n} exceeds 4095"),
            FaultKind::RptAlign => f.write_str("rpt body must start 8-byte aligned"),
            FaultKind::RptBody => f.write_str("rpt body may contain only bundles"),
            FaultKind::NoFreeWorker => f.write_str("no free worker slot"),
            FaultKind::WorkersRunning => f.write_str("internal/host sync or halt while workers are running"),
            FaultKind::InvalidZone(z) => write!(f, "sync zone {z} is not defined by the model"),
            FaultKind::UnknownCsr(c) => write!(f, "CSR {c:#x} not defined for this context"),
            FaultKind::PairedSendUnsupported => {
                f.write_str("64-bit (paired) send is not implemented by the model")
            }
        }
    }
}

/// A fault with its location: tile, context, pc, the instruction words and the cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Logical tile.
    pub tile: u16,
    /// Context.
    pub ctx: CtxId,
    /// Program counter of the faulting instruction.
    pub pc: u32,
    /// The instruction words (second is 0 unless a bundle).
    pub words: [u32; 2],
    /// Tile cycle of the issue.
    pub cycle: u64,
    /// Reason.
    pub kind: FaultKind,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tile {} {} pc={:#x} cycle={}: ", self.tile, self.ctx, self.pc, self.cycle)?;
        let issue: Option<Issue> = match decode(self.words[0]) {
            Ok((i, false)) => Some(Issue::Single(i)),
            Ok((_, true)) => decode_bundle(self.words[0], self.words[1]).ok(),
            Err(_) => None,
        };
        match issue {
            Some(i) => write!(f, "`{}`", Disasm(&i))?,
            None => write!(f, "word {:#010x}", self.words[0])?,
        }
        write!(f, ": {}", self.kind)
    }
}
