//! THE instruction table. One row per opcode; see `docs/target.md` §4 for the meaning of each
//! column. Public rows cite FS §4 ([IPUSTACK instruction.rs, ipu21_instruction.def]); model rows use
//! opcode bytes 0x80..0xEF, which no public encoding occupies. MRF model rows use even opcode bytes
//! because bit 24 is their co-issue flag.

use super::{Class, Cost, Ctx, Field, Kind, OpInfo, Provenance};
use crate::tile::exec as x;

const fn f(name: &'static str, kind: Kind, shift: u8, width: u8) -> Field {
    Field { name, kind, shift, width, hi: None, scale: 1, bias: 0 }
}
const fn m(name: &'static str, shift: u8) -> Field {
    f(name, Kind::MReg, shift, 4)
}
const fn a(name: &'static str, shift: u8) -> Field {
    f(name, Kind::AReg, shift, 4)
}
const fn p(name: &'static str, shift: u8) -> Field {
    f(name, Kind::APair, shift, 3)
}
const fn mp(name: &'static str, shift: u8) -> Field {
    f(name, Kind::MPair, shift, 3)
}
const fn q(name: &'static str, shift: u8) -> Field {
    f(name, Kind::AQuad, shift, 2)
}
const fn u(name: &'static str, shift: u8, width: u8) -> Field {
    f(name, Kind::Unsigned, shift, width)
}
const fn s(name: &'static str, shift: u8, width: u8) -> Field {
    f(name, Kind::Signed, shift, width)
}
const fn scaled(mut fl: Field, scale: u8) -> Field {
    fl.scale = scale;
    fl
}
const fn biased(mut fl: Field, bias: u8) -> Field {
    fl.bias = bias;
    fl
}
const fn split(mut fl: Field, hi_shift: u8, hi_width: u8) -> Field {
    fl.hi = Some((hi_shift, hi_width));
    fl
}
const ONE: Cost = Cost::Fixed(1);

macro_rules! table {
    ($( $op:ident = $mn:literal, $base:literal, $class:ident, $ctx:ident, $cost:expr, $prov:ident,
        [$($fl:expr),* $(,)?], $exec:path; )*) => {
        /// Every opcode of the tile ISA, in table order.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        #[allow(missing_docs, reason = "variants are documented by their table row")]
        pub enum Op { $($op),* }

        /// The instruction table (indexed by `Op as usize`).
        pub static TABLE: &[OpInfo] = &[ $( OpInfo {
            op: Op::$op, mnemonic: $mn, base: $base, fields: &[$($fl),*], class: Class::$class,
            ctx: Ctx::$ctx, cost: $cost, provenance: Provenance::$prov, exec: $exec,
        } ),* ];
    };
}

impl Op {
    /// This opcode's table row.
    pub fn info(self) -> &'static OpInfo {
        &TABLE[self as usize]
    }
}

table! {
    // ---- public encodings (FS §4) ---------------------------------------------------------
    Sync = "sync", 0x4180_0000, Sys, Sup, ONE, Public, [u("zone", 0, 4)], x::sync;
    Sans = "sans", 0x40C0_0000, Sys, Sup, ONE, Public, [u("selector", 0, 8)], x::sans;
    Delay = "delay", 0x40A0_0000, Sys, Sup, Cost::Operand(0, 0), Public,
        [biased(u("cycles", 0, 19), 1)], x::delay;
    DelayPic = "delaypic", 0x6000_0000, Sys, Sup, Cost::Operand(0, 1), Public,
        [u("delay", 19, 7), u("flag", 18, 1), scaled(u("addr", 0, 18), 4)], x::delaypic;
    DelayXpic = "delayxpic", 0x6400_0000, Sys, Sup, Cost::Operand(0, 1), Public,
        [u("delay", 14, 12), u("flag", 13, 1), u("source", 0, 13)], x::delayxpic;
    Send = "send", 0x7800_0000, Sys, Sup, Cost::Operand(0, 0), Public,
        [biased(u("words", 21, 6), 1), scaled(u("addr", 3, 18), 4), u("control", 0, 3)], x::send;
    SendOff = "sendoff", 0x7000_0000, Sys, Sup, Cost::Operand(0, 0), Public,
        [biased(split(u("words", 21, 6), 14, 6), 1), scaled(u("offset", 3, 11), 4),
         u("control", 0, 3)], x::sendoff;
    Setzi = "setzi", 0x1900_0000, Sys, Any, ONE, Public, [m("dst", 20), u("imm", 0, 20)], x::setzi;
    Put = "put", 0x4300_8000, Sys, Any, ONE, Public, [u("csr", 0, 8), m("src", 20)], x::put;
    Br = "br", 0x4300_0000, Sys, Any, ONE, Public, [m("target", 20)], x::br;
    Call = "call", 0x1800_0000, Sys, Any, ONE, Public,
        [m("link", 20), scaled(u("target", 0, 19), 4)], x::call;
    AddImm = "add", 0x2200_0000, Sys, Any, ONE, Public,
        [m("dst", 16), m("src", 20), s("imm", 0, 16)], x::add_imm;
    AndImm = "and", 0x4200_0000, Sys, Any, ONE, Public,
        [m("dst", 16), m("src", 20), u("imm", 0, 12)], x::and_imm;
    ShlImm = "shl", 0x4200_A000, Sys, Any, ONE, Public,
        [m("dst", 16), m("src", 20), u("imm", 0, 12)], x::shl_imm;
    Brz = "brz", 0x1300_0000, Sys, Any, ONE, Public,
        [m("src", 20), scaled(u("target", 0, 19), 4)], x::brz;
    Ld32 = "ld32", 0x0100_0000, Sys, Any, ONE, Public,
        [m("dst", 16), m("base", 20), m("delta", 12), scaled(u("offset", 0, 12), 4)], x::ld32;
    St32 = "st32", 0x4F00_0000, Sys, Any, ONE, Public,
        [m("src", 16), m("base", 20), m("delta", 12), scaled(u("offset", 0, 12), 4)], x::st32;

    // ---- model: integer and load/store (MRF; bit 24 = co-issue) ---------------------------
    Nop = "nop", 0x8000_0000, Mrf, Any, ONE, Model, [], x::nop;
    Ld64 = "ld64", 0x8200_0000, Mrf, Any, ONE, Model,
        [p("dst", 0), m("base", 3), m("delta", 7), scaled(u("offset", 11, 12), 8)], x::ld64;
    St64 = "st64", 0x8400_0000, Mrf, Any, ONE, Model,
        [p("src", 0), m("base", 3), m("delta", 7), scaled(u("offset", 11, 12), 8)], x::st64;
    Ld64Pi = "ld64pi", 0x8600_0000, Mrf, Any, ONE, Model,
        [p("dst", 0), m("ptr", 3), scaled(s("inc", 7, 8), 8)], x::ld64pi;
    St64Pi = "st64pi", 0x8800_0000, Mrf, Any, ONE, Model,
        [p("src", 0), m("ptr", 3), scaled(s("inc", 7, 8), 8)], x::st64pi;
    Ld2St64Pi = "ld2st64pi", 0x8A00_0000, Mrf, Any, ONE, Model,
        [p("dst_a", 0), p("dst_b", 3), p("src", 6), m("ptr_a", 9), m("ptr_b", 13), m("ptr_s", 17)],
        x::ld2st64pi;
    Ld32Pi = "ld32pi", 0x8C00_0000, Mrf, Any, ONE, Model,
        [m("dst", 0), m("ptr", 4), scaled(s("inc", 8, 8), 4)], x::ld32pi;
    St32Pi = "st32pi", 0x8E00_0000, Mrf, Any, ONE, Model,
        [m("src", 0), m("ptr", 4), scaled(s("inc", 8, 8), 4)], x::st32pi;
    Lda32 = "lda32", 0x9000_0000, Mrf, Any, ONE, Model,
        [a("dst", 0), m("base", 4), m("delta", 8), scaled(u("offset", 12, 12), 4)], x::lda32;
    Sta32 = "sta32", 0x9200_0000, Mrf, Any, ONE, Model,
        [a("src", 0), m("base", 4), m("delta", 8), scaled(u("offset", 12, 12), 4)], x::sta32;
    Ldh16 = "ldh16", 0x9400_0000, Mrf, Any, ONE, Model,
        [a("dst", 0), m("base", 4), m("delta", 8), scaled(u("offset", 12, 12), 2)], x::ldh16;
    Add = "add", 0x9600_0000, Mrf, Any, ONE, Model, [m("dst", 0), m("a", 4), m("b", 8)], x::add;
    Sub = "sub", 0x9800_0000, Mrf, Any, ONE, Model, [m("dst", 0), m("a", 4), m("b", 8)], x::sub;
    Mul = "mul", 0x9A00_0000, Mrf, Any, ONE, Model, [m("dst", 0), m("a", 4), m("b", 8)], x::mul;
    Or = "or", 0x9C00_0000, Mrf, Any, ONE, Model, [m("dst", 0), m("a", 4), m("b", 8)], x::or;
    Shr = "shr", 0x9C10_0000, Mrf, Any, ONE, Model, [m("dst", 0), m("a", 4), m("b", 8)], x::shr;
    CmpUlt = "cmpult", 0x9C20_0000, Mrf, Any, ONE, Model,
        [m("dst", 0), m("a", 4), m("b", 8)], x::cmpult;
    CmpEq = "cmpeq", 0x9C30_0000, Mrf, Any, ONE, Model,
        [m("dst", 0), m("a", 4), m("b", 8)], x::cmpeq;
    Shl = "shl", 0x9C40_0000, Mrf, Any, ONE, Model, [m("dst", 0), m("a", 4), m("b", 8)], x::shl;
    And = "and", 0x9C50_0000, Mrf, Any, ONE, Model, [m("dst", 0), m("a", 4), m("b", 8)], x::and;
    Min = "min", 0x9C60_0000, Mrf, Any, ONE, Model, [m("dst", 0), m("a", 4), m("b", 8)], x::min;
    // `tapack` and `ld2xst64pace` are Mk2 instructions (graphcore/ipu_assembly_support,
    // isa_doc_generated/hover); their encodings and the packed layout are ours (docs/target.md §4.8).
    Tapack = "tapack", 0x9C70_0000, Mrf, Any, ONE, Model,
        [mp("dst", 0), m("a0", 4), m("a1", 8), m("a2", 12)], x::tapack;
    MovAM = "movam", 0x9E00_0000, Mrf, Any, ONE, Model, [a("dst", 0), m("src", 4)], x::movam;
    MovMA = "movma", 0x9E10_0000, Mrf, Any, ONE, Model, [m("dst", 0), a("src", 4)], x::movma;
    SetHi = "seths", 0x9E20_0000, Mrf, Any, ONE, Model, [m("dst", 0), u("imm", 4, 16)], x::seths;
    Sth16 = "sth16", 0x9E30_0000, Mrf, Any, ONE, Model,
        [a("src", 0), m("base", 4), m("delta", 8), scaled(u("offset", 12, 8), 2)], x::sth16;
    Ld2xst64Pace = "ld2xst64pace", 0x9E40_0000, Mrf, Any, ONE, Model,
        [q("dst", 0), p("src", 2), mp("addr", 5), m("stride", 8), u("strimm", 12, 6)], x::ld2xst64pace;

    // ---- model: control and system -------------------------------------------------------
    Exit = "exit", 0xA000_0000, Sys, Worker, ONE, Model, [], x::exit;
    Halt = "halt", 0xA100_0000, Sys, Sup, ONE, Model, [], x::halt;
    Run = "run", 0xA200_0000, Sys, Sup, ONE, Model, [m("entry", 0), m("arg", 4)], x::run;
    RunAll = "runall", 0xA300_0000, Sys, Sup, ONE, Model, [m("entry", 0), m("arg", 4)], x::runall;
    Get = "get", 0xA400_0000, Sys, Any, ONE, Model, [m("dst", 0), u("csr", 4, 8)], x::get;
    Uput = "uput", 0xA500_0000, Sys, Worker, ONE, Model, [u("csr", 0, 8), m("src", 8)], x::uput;
    Rpt = "rpt", 0xA600_0000, Sys, Worker, ONE, Model, [m("count", 0), u("bundles", 4, 8)], x::rpt;
    LdCwei = "ldcwei", 0xA700_0000, Sys, Sup, Cost::Fixed(crate::target::CWEI_LOAD_CYCLES), Model,
        [m("addr", 0)], x::ldcwei;
    LdCweiH = "ldcweih", 0xAB00_0000, Sys, Sup, Cost::Fixed(crate::target::CWEI_HALF_LOAD_CYCLES), Model,
        [m("addr", 0)], x::ldcweih;
    Brnz = "brnz", 0xA800_0000, Sys, Any, ONE, Model,
        [m("src", 0), scaled(u("target", 4, 19), 4)], x::brnz;
    Brnzdec = "brnzdec", 0xA900_0000, Sys, Any, ONE, Model,
        [m("src", 0), scaled(u("target", 4, 19), 4)], x::brnzdec;
    Bri = "bri", 0xAA00_0000, Sys, Any, ONE, Model, [scaled(u("target", 0, 19), 4)], x::bri;

    // ---- model: floating point (ARF) ----------------------------------------------------
    Fnop = "fnop", 0xC000_0000, Arf, Any, ONE, Model, [], x::nop;
    F32Add = "f32add", 0xC100_0000, Arf, Any, ONE, Model, [a("dst", 0), a("a", 4), a("b", 8)], x::f32add;
    F32Sub = "f32sub", 0xC200_0000, Arf, Any, ONE, Model, [a("dst", 0), a("a", 4), a("b", 8)], x::f32sub;
    F32Mul = "f32mul", 0xC300_0000, Arf, Any, ONE, Model, [a("dst", 0), a("a", 4), a("b", 8)], x::f32mul;
    F32Max = "f32max", 0xC400_0000, Arf, Any, ONE, Model, [a("dst", 0), a("a", 4), a("b", 8)], x::f32max;
    F32Div = "f32div", 0xC500_0000, Arf, Any, Cost::Fixed(2), Model,
        [a("dst", 0), a("a", 4), a("b", 8)], x::f32div;
    F32Exp = "f32exp", 0xC600_0000, Arf, Any, Cost::Fixed(2), Model, [a("dst", 0), a("src", 4)], x::f32exp;
    F32Sqrt = "f32sqrt", 0xC700_0000, Arf, Any, Cost::Fixed(2), Model, [a("dst", 0), a("src", 4)], x::f32sqrt;
    // `f32ln` is an ipu2 f32 instruction (docs/target.md §4.6); its encoding here is ours.
    F32Ln = "f32ln", 0xD400_0000, Arf, Any, Cost::Fixed(2), Model, [a("dst", 0), a("src", 4)], x::f32ln;
    F32v2Add = "f32v2add", 0xC800_0000, Arf, Any, ONE, Model, [p("dst", 0), p("a", 3), p("b", 6)], x::f32v2add;
    F32v2Mul = "f32v2mul", 0xC900_0000, Arf, Any, ONE, Model, [p("dst", 0), p("a", 3), p("b", 6)], x::f32v2mul;
    F16v4Add = "f16v4add", 0xCA00_0000, Arf, Any, ONE, Model, [p("dst", 0), p("a", 3), p("b", 6)], x::f16v4add;
    F16v4Mul = "f16v4mul", 0xCB00_0000, Arf, Any, ONE, Model, [p("dst", 0), p("a", 3), p("b", 6)], x::f16v4mul;
    F16v2ToF32 = "f16v2tof32", 0xCC00_0000, Arf, Any, ONE, Model, [p("dst", 0), a("src", 3)], x::f16v2tof32;
    F32v2ToF16 = "f32v2tof16", 0xCD00_0000, Arf, Any, ONE, Model, [a("dst", 0), p("src", 4)], x::f32v2tof16;
    F8v4ToF16 = "f8v4tof16", 0xCE00_0000, Arf, Worker, ONE, Model, [p("dst", 0), a("src", 3)], x::f8v4tof16;
    F16v4ToF8 = "f16v4tof8", 0xCF00_0000, Arf, Worker, ONE, Model, [a("dst", 0), p("src", 4)], x::f16v4tof8;
    F16Amp = "f16amp", 0xD000_0000, Arf, Worker, ONE, Model,
        [p("out", 0), p("pin", 3), p("in", 6), u("phase", 9, 2)], x::f16amp;
    F32Amp = "f32amp", 0xD100_0000, Arf, Worker, ONE, Model,
        [p("out", 0), p("pin", 3), p("in", 6), u("phase", 9, 2)], x::f32amp;
    F8Amp = "f8amp", 0xD200_0000, Arf, Worker, ONE, Model,
        [p("out", 0), p("pin", 3), p("in", 6), u("phase", 9, 2)], x::f8amp;
    // `f16v4sub` is an ipu2 instruction (LLVM Colossus tests: `fsub <4 x half>` selects it;
    // poplibs negates with it); its encoding here is ours.
    F16v4Sub = "f16v4sub", 0xD300_0000, Arf, Any, ONE, Model, [p("dst", 0), p("a", 3), p("b", 6)], x::f16v4sub;
    // `f16v4max` is an ipu2 instruction (LLVM Colossus tests: `llvm.maxnum.v4f16` selects it, and
    // `__builtin_ipu_max` on `half4` is `llvm.colossus.f16v4max`); its encoding here is ours.
    F16v4Max = "f16v4max", 0xD500_0000, Arf, Any, ONE, Model, [p("dst", 0), p("a", 3), p("b", 6)], x::f16v4max;
}
