//! The tile ISA. `table.rs` lists every opcode once; encoding, decoding, text, cost, permitted
//! contexts and execution semantics are all read from that table (docs/target.md §4).

mod code;
mod table;
mod text;

pub use code::{decode, decode_bundle, encode, encode_issue, DecodeError, EncodeError, COISSUE_BIT};
pub use table::{Op, TABLE};
pub use text::{parse_instr, parse_int, parse_issue, Disasm, ParseError};

use crate::tile::exec::ExecFn;

/// Whether an encoding is published or ours (docs/target.md §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provenance {
    /// Published encoding (fact sheet §4, [IPUSTACK]).
    Public,
    /// Provisional encoding of this project; swap the table to target real hardware.
    Model,
}

/// Pipeline class, which decides bundling and `rpt` eligibility.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Control, system and exchange: never in a bundle or an `rpt` body.
    Sys,
    /// Integer and load/store (main half of a bundle).
    Mrf,
    /// Floating point (aux half of a bundle).
    Arf,
}

/// Which contexts may execute an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ctx {
    /// Supervisor only.
    Sup,
    /// Workers only.
    Worker,
    /// Either.
    Any,
}

/// How an operand is written in text and stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `$m0..$m15`.
    MReg,
    /// `$a0..$a15`.
    AReg,
    /// Even `$a` register naming a 64-bit pair; stored as index/2 in 3 bits.
    APair,
    /// `$a` register, a multiple of 4, naming four registers (`ld2xst64pace`'s two loads); stored
    /// as index/4 in 2 bits.
    AQuad,
    /// Even `$m` register naming a pair (a triple-packed address, docs/target.md §4.8); stored as
    /// index/2 in 3 bits.
    MPair,
    /// Unsigned immediate.
    Unsigned,
    /// Signed (two's complement) immediate.
    Signed,
}

/// One operand field: value = stored·scale + bias. `hi` holds the upper bits of a split field.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    /// Operand name, for errors.
    pub name: &'static str,
    /// Syntax and signedness.
    pub kind: Kind,
    /// Bit position of the (low part of the) stored value.
    pub shift: u8,
    /// Width in bits of the low part.
    pub width: u8,
    /// Optional upper part: (shift, width).
    pub hi: Option<(u8, u8)>,
    /// Units per stored step (4 for word addresses, 8 for 64-bit offsets).
    pub scale: u8,
    /// Added to the stored value (1 for counts encoded as n−1).
    pub bias: u8,
}

impl Field {
    /// Total stored width.
    pub const fn bits(&self) -> u32 {
        self.width as u32
            + match self.hi {
                Some((_, w)) => w as u32,
                None => 0,
            }
    }
    /// Bits of the instruction word this field occupies.
    pub const fn mask(&self) -> u32 {
        let lo = (((1u64 << self.width) - 1) as u32) << self.shift;
        match self.hi {
            Some((s, w)) => lo | ((((1u64 << w) - 1) as u32) << s),
            None => lo,
        }
    }
}

/// What an instruction costs, in issues (docs/target.md §4.3).
#[derive(Clone, Copy, Debug)]
pub enum Cost {
    /// A fixed number of issues.
    Fixed(u32),
    /// The value of operand `i` plus a constant.
    Operand(usize, u32),
}

/// A table row.
pub struct OpInfo {
    /// The opcode.
    pub op: Op,
    /// Assembly mnemonic (several rows may share one; operands disambiguate).
    pub mnemonic: &'static str,
    /// Base encoding: the word with all operand fields zero.
    pub base: u32,
    /// Operand fields in text order.
    pub fields: &'static [Field],
    /// Pipeline class.
    pub class: Class,
    /// Permitted contexts.
    pub ctx: Ctx,
    /// Cost.
    pub cost: Cost,
    /// Where the encoding comes from.
    pub provenance: Provenance,
    /// Execution semantics.
    pub exec: ExecFn,
}

impl OpInfo {
    /// Bits fixed by the opcode (everything that is not an operand; the co-issue bit is an
    /// operand-like flag of MRF model instructions).
    pub fn fixed_mask(&self) -> u32 {
        let mut m = !0u32;
        for f in self.fields {
            m &= !f.mask();
        }
        if self.can_coissue() {
            m &= !COISSUE_BIT;
        }
        m
    }
    /// MRF model instructions may carry the co-issue bit (docs/target.md §4.1).
    pub fn can_coissue(&self) -> bool {
        self.class == Class::Mrf && self.provenance == Provenance::Model
    }
    /// Cost in issues of a decoded instance.
    pub fn cost_of(&self, args: &[u32; MAX_FIELDS]) -> u32 {
        match self.cost {
            Cost::Fixed(c) => c,
            Cost::Operand(i, add) => args[i] + add,
        }
    }
}

/// Most operands of any instruction.
pub const MAX_FIELDS: usize = 6;

/// A decoded instruction: the opcode and operand values (registers as indices, immediates as
/// their value; signed immediates as two's complement bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Instr {
    /// Opcode.
    pub op: Op,
    /// Operand values in text order; unused slots are 0.
    pub args: [u32; MAX_FIELDS],
}

impl Instr {
    /// Build an instruction from operand values (unused trailing values may be omitted).
    pub fn new(op: Op, values: &[u32]) -> Self {
        let mut args = [0; MAX_FIELDS];
        args[..values.len()].copy_from_slice(values);
        Instr { op, args }
    }
    /// The instruction's table row.
    pub fn info(&self) -> &'static OpInfo {
        self.op.info()
    }
}

/// One issued unit: a single instruction or a `{main ; aux}` bundle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Issue {
    /// One 32-bit instruction.
    Single(Instr),
    /// A 64-bit bundle.
    Bundle(Instr, Instr),
}
