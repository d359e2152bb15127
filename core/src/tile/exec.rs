//! Execution semantics of every instruction (docs/target.md §4–§5). The ISA table points at these
//! functions; `decoded::Decoded::execute` applies the table's context and bundle rules around them.

use super::{mem, FaultKind, Regs, Shared, TileBus, WorkerFp};
use crate::f16bits;
use crate::fp8::{self, Fp8Format};
use crate::isa::MAX_FIELDS;
use crate::target::{csr, CWEI_BYTES, CWEI_HALF_BYTES};
use half::f16;

/// Semantics of one instruction.
pub type ExecFn = fn(&mut Cx<'_>, &[u32; MAX_FIELDS]) -> Result<Flow, FaultKind>;

/// Everything an instruction may touch.
pub struct Cx<'a> {
    /// The issuing context's registers.
    pub regs: &'a mut Regs,
    /// Tile memory (`TILE_MEM_BASE..TILE_MEM_END`).
    pub mem: &'a mut [u8],
    /// Tile-shared state.
    pub shared: &'a mut Shared,
    /// Worker FP state (`None` on the supervisor).
    pub fp: Option<&'a mut WorkerFp>,
    /// The fabric.
    pub bus: &'a mut dyn TileBus,
    /// Issue cycle.
    pub cycle: u64,
    /// Address of the instruction.
    pub pc: u32,
}

/// Control effect of an instruction, applied by the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Fall through.
    Next,
    /// Continue at an address.
    Jump(u32),
    /// `sync zone`.
    Sync(u32),
    /// Start one (`all == false`) or six workers.
    Run {
        /// Entry address.
        entry: u32,
        /// Value for the workers' `$m1`.
        arg: u32,
        /// `runall`.
        all: bool,
    },
    /// Worker `exit`.
    Exit,
    /// Supervisor `halt`.
    Halt,
    /// Start a repeat block.
    Rpt {
        /// Iterations.
        count: u32,
        /// Body length in bundles.
        bundles: u32,
    },
}

// ---- helpers -----------------------------------------------------------------------------

impl Cx<'_> {
    fn m(&self, r: u32) -> u32 {
        self.regs.m[r as usize]
    }
    fn set_m(&mut self, r: u32, v: u32) {
        if r != 15 {
            self.regs.m[r as usize] = v;
        }
    }
    /// A pair register (`$a{r}:{r+1}`, `r` even: the encoding stores `r / 2`, isa::code).
    #[inline(always)]
    pub(super) fn pair(&self, r: u32) -> u64 {
        debug_assert!(r.is_multiple_of(2) && r < 16);
        read_pair(&self.regs.a, r)
    }
    #[inline(always)]
    pub(super) fn set_pair(&mut self, r: u32, v: u64) {
        debug_assert!(r.is_multiple_of(2) && r < 16);
        write_pair(&mut self.regs.a, r, v);
    }
    fn af(&self, r: u32) -> f32 {
        f32::from_bits(self.regs.a[r as usize])
    }
    fn set_af(&mut self, r: u32, v: f32) {
        self.regs.a[r as usize] = v.to_bits();
    }
    fn worker_fp(&mut self) -> Result<&mut WorkerFp, FaultKind> {
        self.fp.as_deref_mut().ok_or(FaultKind::WrongContext)
    }
}

/// `$a{r & 14}:{(r & 14) + 1}` as one 64-bit value. Pairs are read and written as one 64-bit
/// access: two 32-bit stores followed by a 64-bit load of the same bytes cannot be forwarded by
/// the host CPU and stall every AMP bundle that reads a pair the bundle before it loaded.
#[inline(always)]
pub(crate) fn read_pair(a: &[u32; 16], r: u32) -> u64 {
    let i = (r & 14) as usize;
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&a[i].to_le_bytes());
    b[4..].copy_from_slice(&a[i + 1].to_le_bytes());
    u64::from_le_bytes(b)
}

/// Writes `$a{r & 14}:{(r & 14) + 1}` as one 64-bit store ([`read_pair`]).
#[inline(always)]
pub(crate) fn write_pair(a: &mut [u32; 16], r: u32, v: u64) {
    let i = (r & 14) as usize;
    let pair: &mut [u32; 2] = (&mut a[i..i + 2]).try_into().expect("two registers");
    *pair = [v as u32, (v >> 32) as u32];
}

/// The four f16 lanes of a register pair, as f32 values.
#[inline(always)]
pub(super) fn halves(v: u64) -> [f32; 4] {
    f16bits::to_f32x4(v)
}
/// Four f32 values rounded to f16 lanes of a register pair.
#[inline(always)]
pub(super) fn from_halves(h: [f32; 4]) -> u64 {
    pack_halves([
        f16bits::from_f32(h[0]),
        f16bits::from_f32(h[1]),
        f16bits::from_f32(h[2]),
        f16bits::from_f32(h[3]),
    ])
}
#[inline(always)]
fn pack_halves(h: [u16; 4]) -> u64 {
    h[0] as u64 | (h[1] as u64) << 16 | (h[2] as u64) << 32 | (h[3] as u64) << 48
}

pub(super) type R = Result<Flow, FaultKind>;

// ---- system and exchange ----------------------------------------------------------------

pub(crate) fn sync(_: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    Ok(Flow::Sync(a[0]))
}
pub(crate) fn sans(_: &mut Cx<'_>, _: &[u32; MAX_FIELDS]) -> R {
    Ok(Flow::Next)
}
pub(crate) fn delay(_: &mut Cx<'_>, _: &[u32; MAX_FIELDS]) -> R {
    Ok(Flow::Next)
}
pub(crate) fn delaypic(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    if a[1] != 0 {
        return Err(FaultKind::BadOperand("delaypic flag must be 0 in this model"));
    }
    cx.bus.set_incoming_ptr(cx.cycle + a[0] as u64, a[2]);
    Ok(Flow::Next)
}
pub(crate) fn delayxpic(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    if a[1] != 0 {
        return Err(FaultKind::BadOperand("delayxpic flag must be 0 in this model"));
    }
    cx.bus.set_mux(cx.cycle + a[0] as u64, a[2]);
    Ok(Flow::Next)
}
fn send_from(cx: &mut Cx<'_>, words: u32, addr: u32, control: u32) -> R {
    if control & 4 != 0 {
        return Err(FaultKind::PairedSendUnsupported);
    }
    let data = mem::bytes(cx.mem, addr, words * 4, 4)?;
    cx.bus.send(cx.cycle, data);
    Ok(Flow::Next)
}
pub(crate) fn send(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    send_from(cx, a[0], a[1], a[2])
}
pub(crate) fn sendoff(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let addr = cx.shared.outgoing_base.wrapping_add(a[1]);
    send_from(cx, a[0], addr, a[2])
}
pub(crate) fn put(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let v = cx.m(a[1]);
    let sup = cx.fp.is_none();
    match a[0] {
        csr::INCOMING_MUX if sup => cx.bus.set_mux(cx.cycle, v),
        csr::INCOMING_BASE if sup => cx.bus.set_incoming_ptr(cx.cycle, v),
        csr::INCOMING_DCOUNT if sup => cx.bus.set_dcount(cx.cycle, v),
        csr::OUTGOING_BASE if sup => cx.shared.outgoing_base = v,
        csr::FP_INFMT if sup => cx.shared.fp_infmt = v,
        csr::FP_ISCL if sup => cx.shared.fp_iscl = v,
        c => return Err(FaultKind::UnknownCsr(c)),
    }
    Ok(Flow::Next)
}
pub(crate) fn get(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let v = match a[1] {
        csr::COUNT_L => cx.cycle as u32,
        csr::COUNT_U => (cx.cycle >> 32) as u32,
        csr::TILE_ID => cx.shared.id as u32,
        csr::FP_INFMT => cx.shared.fp_infmt,
        csr::FP_ISCL => cx.shared.fp_iscl,
        csr::OUTGOING_BASE => cx.shared.outgoing_base,
        c => return Err(FaultKind::UnknownCsr(c)),
    };
    cx.set_m(a[0], v);
    Ok(Flow::Next)
}
pub(crate) fn uput(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let v = cx.m(a[1]);
    let fp = cx.worker_fp()?;
    match a[0] {
        csr::FP_NFMT => fp.nfmt = v,
        csr::FP_SCL => fp.scl = v,
        c => return Err(FaultKind::UnknownCsr(c + 256)),
    }
    Ok(Flow::Next)
}
pub(crate) fn exit(_: &mut Cx<'_>, _: &[u32; MAX_FIELDS]) -> R {
    Ok(Flow::Exit)
}
pub(crate) fn halt(_: &mut Cx<'_>, _: &[u32; MAX_FIELDS]) -> R {
    Ok(Flow::Halt)
}
pub(crate) fn run(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    Ok(Flow::Run { entry: cx.m(a[0]), arg: cx.m(a[1]), all: false })
}
pub(crate) fn runall(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    Ok(Flow::Run { entry: cx.m(a[0]), arg: cx.m(a[1]), all: true })
}
pub(crate) fn rpt(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    Ok(Flow::Rpt { count: cx.m(a[0]), bundles: a[1] })
}
pub(crate) fn ldcwei(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let src = mem::bytes(cx.mem, cx.m(a[0]), CWEI_BYTES as u32, 16)?;
    cx.shared.load_cwei(src.try_into().expect("CWEI_BYTES bytes"));
    Ok(Flow::Next)
}
pub(crate) fn ldcweih(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let src = mem::bytes(cx.mem, cx.m(a[0]), CWEI_HALF_BYTES as u32, 16)?;
    cx.shared.load_cwei_half(src.try_into().expect("CWEI_HALF_BYTES bytes"));
    Ok(Flow::Next)
}

// ---- control ------------------------------------------------------------------------------

pub(crate) fn br(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    Ok(Flow::Jump(cx.m(a[0])))
}
pub(crate) fn bri(_: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    Ok(Flow::Jump(a[0]))
}
pub(crate) fn call(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let ret = cx.pc + 4;
    cx.set_m(a[0], ret);
    Ok(Flow::Jump(a[1]))
}
pub(crate) fn brz(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    Ok(if cx.m(a[0]) == 0 { Flow::Jump(a[1]) } else { Flow::Next })
}
pub(crate) fn brnz(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    Ok(if cx.m(a[0]) != 0 { Flow::Jump(a[1]) } else { Flow::Next })
}
pub(crate) fn brnzdec(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let v = cx.m(a[0]);
    if v != 0 {
        cx.set_m(a[0], v - 1);
        return Ok(Flow::Jump(a[1]));
    }
    Ok(Flow::Next)
}

// ---- integer ------------------------------------------------------------------------------

macro_rules! alu {
    ($name:ident, |$x:ident, $y:ident| $e:expr) => {
        pub(crate) fn $name(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
            let ($x, $y) = (cx.m(a[1]), cx.m(a[2]));
            cx.set_m(a[0], $e);
            Ok(Flow::Next)
        }
    };
}
alu!(add, |x, y| x.wrapping_add(y));
alu!(sub, |x, y| x.wrapping_sub(y));
alu!(mul, |x, y| x.wrapping_mul(y));
alu!(or, |x, y| x | y);
alu!(and, |x, y| x & y);
alu!(shr, |x, y| x >> (y & 31));
alu!(shl, |x, y| x << (y & 31));
alu!(cmpult, |x, y| (x < y) as u32);
alu!(cmpeq, |x, y| (x == y) as u32);
alu!(min, |x, y| x.min(y));

pub(crate) fn nop(_: &mut Cx<'_>, _: &[u32; MAX_FIELDS]) -> R {
    Ok(Flow::Next)
}
pub(crate) fn setzi(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    cx.set_m(a[0], a[1]);
    Ok(Flow::Next)
}
pub(crate) fn seths(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let v = (cx.m(a[0]) & 0xFFFF) | a[1] << 16;
    cx.set_m(a[0], v);
    Ok(Flow::Next)
}
pub(crate) fn add_imm(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let v = cx.m(a[1]).wrapping_add(a[2]);
    cx.set_m(a[0], v);
    Ok(Flow::Next)
}
pub(crate) fn and_imm(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let v = cx.m(a[1]) & a[2];
    cx.set_m(a[0], v);
    Ok(Flow::Next)
}
pub(crate) fn shl_imm(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let v = cx.m(a[1]).checked_shl(a[2]).unwrap_or(0);
    cx.set_m(a[0], v);
    Ok(Flow::Next)
}
pub(crate) fn movam(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    cx.regs.a[a[0] as usize] = cx.m(a[1]);
    Ok(Flow::Next)
}
pub(crate) fn movma(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let v = cx.regs.a[a[1] as usize];
    cx.set_m(a[0], v);
    Ok(Flow::Next)
}

// ---- loads and stores ---------------------------------------------------------------------

fn ea(cx: &Cx<'_>, a: &[u32; MAX_FIELDS]) -> u32 {
    cx.m(a[1]).wrapping_add(cx.m(a[2])).wrapping_add(a[3])
}
pub(crate) fn ld32(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let v = mem::ld32(cx.mem, ea(cx, a))?;
    cx.set_m(a[0], v);
    Ok(Flow::Next)
}
pub(crate) fn st32(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let addr = ea(cx, a);
    mem::st32(cx.mem, addr, cx.m(a[0]))?;
    Ok(Flow::Next)
}
pub(crate) fn lda32(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    cx.regs.a[a[0] as usize] = mem::ld32(cx.mem, ea(cx, a))?;
    Ok(Flow::Next)
}
pub(crate) fn sta32(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let addr = ea(cx, a);
    mem::st32(cx.mem, addr, cx.regs.a[a[0] as usize])?;
    Ok(Flow::Next)
}
pub(crate) fn ldh16(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    cx.regs.a[a[0] as usize] = mem::ld16(cx.mem, ea(cx, a))? as u32;
    Ok(Flow::Next)
}
pub(crate) fn sth16(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let addr = ea(cx, a);
    let o = mem::offset(addr, 2, 2)?;
    let v = cx.regs.a[a[0] as usize] as u16;
    cx.mem[o..o + 2].copy_from_slice(&v.to_le_bytes());
    Ok(Flow::Next)
}
pub(crate) fn ld64(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let v = mem::ld64(cx.mem, ea(cx, a))?;
    cx.set_pair(a[0], v);
    Ok(Flow::Next)
}
pub(crate) fn st64(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let addr = ea(cx, a);
    mem::st64(cx.mem, addr, cx.pair(a[0]))?;
    Ok(Flow::Next)
}
pub(crate) fn ld64pi(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let p = cx.m(a[1]);
    let v = mem::ld64(cx.mem, p)?;
    cx.set_pair(a[0], v);
    cx.set_m(a[1], p.wrapping_add(a[2]));
    Ok(Flow::Next)
}
pub(crate) fn st64pi(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let p = cx.m(a[1]);
    mem::st64(cx.mem, p, cx.pair(a[0]))?;
    cx.set_m(a[1], p.wrapping_add(a[2]));
    Ok(Flow::Next)
}
pub(crate) fn ld32pi(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let p = cx.m(a[1]);
    let v = mem::ld32(cx.mem, p)?;
    cx.set_m(a[0], v);
    cx.set_m(a[1], p.wrapping_add(a[2]));
    Ok(Flow::Next)
}
pub(crate) fn st32pi(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let p = cx.m(a[1]);
    mem::st32(cx.mem, p, cx.m(a[0]))?;
    cx.set_m(a[1], p.wrapping_add(a[2]));
    Ok(Flow::Next)
}
#[inline(always)]
pub(crate) fn ld2st64pi(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let (pa, pb, ps) = (cx.m(a[3]), cx.m(a[4]), cx.m(a[5]));
    let store = cx.pair(a[2]);
    let va = mem::ld64(cx.mem, pa)?;
    let vb = mem::ld64(cx.mem, pb)?;
    mem::st64(cx.mem, ps, store)?;
    cx.set_pair(a[0], va);
    cx.set_pair(a[1], vb);
    cx.set_m(a[3], pa.wrapping_add(8));
    cx.set_m(a[4], pb.wrapping_add(8));
    cx.set_m(a[5], ps.wrapping_add(8));
    Ok(Flow::Next)
}

// ---- triple-packed addresses (docs/target.md §4.8) ----------------------------------------

/// Bits of one address in the triple-packed format (ours: three 21-bit fields at 0, 21, 42).
pub const PACKED_ADDR_BITS: u32 = 21;
const PACKED_MASK: u64 = (1 << PACKED_ADDR_BITS) - 1;

/// The three addresses of a triple-packed register pair value.
#[inline(always)]
pub fn unpack_triple(v: u64) -> [u32; 3] {
    [0, 1, 2].map(|i| ((v >> (PACKED_ADDR_BITS * i)) & PACKED_MASK) as u32)
}

/// Three addresses (each below 2^21) in the triple-packed format; bit 63 is 0.
#[inline(always)]
pub fn pack_triple(a: [u32; 3]) -> u64 {
    a.iter().enumerate().fold(0, |v, (i, &x)| v | ((x as u64 & PACKED_MASK) << (PACKED_ADDR_BITS * i as u32)))
}

/// The byte increment of packed address `i` (0, 1: the loads; 2: the store) selected by
/// `strimm` from the stride register `stride`: `00` one 8-byte step, `01`/`10`/`11` field 0/1/2 of
/// the register (10 bits each, signed) in 8-byte steps.
#[inline(always)]
pub fn pace_increment(strimm: u32, stride: u32, i: usize) -> u32 {
    match (strimm >> (2 * i)) & 3 {
        0 => 8,
        sel => {
            let field = (stride >> (10 * (sel - 1))) & 0x3FF;
            let signed = ((field << 22) as i32) >> 22;
            (signed * 8) as u32
        }
    }
}

/// A packed address advanced by `inc` bytes, modulo 2^21 (the field's width).
#[inline(always)]
pub fn pace_advance(addr: u32, inc: u32) -> u32 {
    addr.wrapping_add(inc) & PACKED_MASK as u32
}

fn m_pair(cx: &Cx<'_>, r: u32) -> u64 {
    cx.m(r) as u64 | (cx.m(r + 1) as u64) << 32
}
fn set_m_pair(cx: &mut Cx<'_>, r: u32, v: u64) {
    cx.set_m(r, v as u32);
    cx.set_m(r + 1, (v >> 32) as u32);
}

/// `tapack $mD, $mA0, $mA1, $mA2`: three absolute addresses into the packed format. Strict where
/// the chip is silent: an address that does not fit its 21-bit field is a fault, not truncated.
pub(crate) fn tapack(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let addrs = [cx.m(a[1]), cx.m(a[2]), cx.m(a[3])];
    if addrs.iter().any(|&x| x as u64 > PACKED_MASK) {
        return Err(FaultKind::BadOperand("tapack: an address does not fit 21 bits"));
    }
    set_m_pair(cx, a[0], pack_triple(addrs));
    Ok(Flow::Next)
}

/// `ld2xst64pace $aQ, $aS, $mP, $mR, strimm`: 64-bit loads at the first two packed addresses into
/// `$aQ:Q+1` and `$aQ+2:Q+3`, a 64-bit store of `$aS:S+1` at the third, then each address advances
/// by its selected increment. The accesses come first, as in `ld2st64pi`: a fault writes no
/// register, and the store being last, no memory either.
#[inline(always)]
pub(crate) fn ld2xst64pace(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let [pa, pb, ps] = unpack_triple(m_pair(cx, a[2]));
    let (stride, strimm) = (cx.m(a[3]), a[4]);
    let store = cx.pair(a[1]);
    let va = mem::ld64(cx.mem, pa)?;
    let vb = mem::ld64(cx.mem, pb)?;
    mem::st64(cx.mem, ps, store)?;
    cx.set_pair(a[0], va);
    cx.set_pair(a[0] + 2, vb);
    let next = [pa, pb, ps];
    let next = core::array::from_fn(|i| pace_advance(next[i], pace_increment(strimm, stride, i)));
    set_m_pair(cx, a[2], pack_triple(next));
    Ok(Flow::Next)
}

// ---- floating point ---------------------------------------------------------------------

macro_rules! f32op {
    ($name:ident, |$x:ident, $y:ident| $e:expr) => {
        pub(crate) fn $name(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
            let ($x, $y) = (cx.af(a[1]), cx.af(a[2]));
            cx.set_af(a[0], $e);
            Ok(Flow::Next)
        }
    };
}
f32op!(f32add, |x, y| x + y);
f32op!(f32sub, |x, y| x - y);
f32op!(f32mul, |x, y| x * y);
f32op!(f32max, |x, y| x.max(y));
f32op!(f32div, |x, y| x / y);

pub(crate) fn f32exp(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let v = libm::expf(cx.af(a[1]));
    cx.set_af(a[0], v);
    Ok(Flow::Next)
}

/// Natural logarithm (`libm::logf`: the same bits on every host; −∞ at ±0, NaN below 0).
pub(crate) fn f32ln(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let v = libm::logf(cx.af(a[1]));
    cx.set_af(a[0], v);
    Ok(Flow::Next)
}

/// IEEE-754 square root, correctly rounded (`libm::sqrtf`: the same bits on every host).
pub(crate) fn f32sqrt(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let v = libm::sqrtf(cx.af(a[1]));
    cx.set_af(a[0], v);
    Ok(Flow::Next)
}

macro_rules! pairop {
    ($name:ident, $lanes:ident, $from:ident, |$x:ident, $y:ident| $e:expr) => {
        pub(crate) fn $name(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
            let (xs, ys) = ($lanes(cx.pair(a[1])), $lanes(cx.pair(a[2])));
            let mut out = xs;
            for i in 0..out.len() {
                let ($x, $y) = (xs[i], ys[i]);
                out[i] = $e;
            }
            cx.set_pair(a[0], $from(out));
            Ok(Flow::Next)
        }
    };
}
pub(super) fn floats(v: u64) -> [f32; 2] {
    [f32::from_bits(v as u32), f32::from_bits((v >> 32) as u32)]
}
pub(super) fn from_floats(f: [f32; 2]) -> u64 {
    f[0].to_bits() as u64 | (f[1].to_bits() as u64) << 32
}
pairop!(f32v2add, floats, from_floats, |x, y| x + y);
pairop!(f32v2mul, floats, from_floats, |x, y| x * y);
pairop!(f16v4add, halves, from_halves, |x, y| x + y);
pairop!(f16v4mul, halves, from_halves, |x, y| x * y);
pairop!(f16v4sub, halves, from_halves, |x, y| x - y);
// The larger lane, as `f32max` (maxNum: a NaN lane loses to a number); exact, as it is one of them.
pairop!(f16v4max, halves, from_halves, |x, y| x.max(y));

pub(crate) fn f16v2tof32(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let s = cx.regs.a[a[1] as usize];
    let lo = f16bits::to_f32(s as u16);
    let hi = f16bits::to_f32((s >> 16) as u16);
    cx.set_pair(a[0], from_floats([lo, hi]));
    Ok(Flow::Next)
}
pub(crate) fn f32v2tof16(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let [lo, hi] = floats(cx.pair(a[1]));
    cx.regs.a[a[0] as usize] = f16bits::from_f32(lo) as u32 | (f16bits::from_f32(hi) as u32) << 16;
    Ok(Flow::Next)
}
pub(crate) fn f8v4tof16(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let s = cx.regs.a[a[1] as usize];
    let fp = cx.worker_fp()?;
    let (fmt, scale) = (Fp8Format::from_bit(fp.nfmt), fp8::scale_from_bits(fp.scl));
    let h = [0, 8, 16, 24].map(|sh| fp8::to_f16_scaled((s >> sh) as u8, fmt, scale).to_bits());
    cx.set_pair(a[0], pack_halves(h));
    Ok(Flow::Next)
}
pub(crate) fn f16v4tof8(cx: &mut Cx<'_>, a: &[u32; MAX_FIELDS]) -> R {
    let pair = cx.pair(a[1]);
    let fp = cx.worker_fp()?;
    let (fmt, scale) = (Fp8Format::from_bit(fp.nfmt), fp8::scale_from_bits(fp.scl));
    let mut v = 0u32;
    for i in 0..4 {
        let x = f16::from_bits((pair >> (16 * i)) as u16);
        v |= (fp8::from_f16_scaled(x, fmt, scale) as u32) << (8 * i);
    }
    cx.regs.a[a[0] as usize] = v;
    Ok(Flow::Next)
}

pub use super::amp::FusedFn;
pub(crate) use super::amp::{f16amp, f32amp, f8amp};
