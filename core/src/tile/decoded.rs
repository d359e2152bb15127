//! Issue units decoded once (docs/target.md §2, fetch): each tile keeps a direct-mapped cache of
//! decoded issue units with everything the scheduler needs resolved up front — the semantics'
//! function pointers, operand values, cost, length and which contexts may issue it — so a hit costs
//! one tag compare instead of a table walk, two table lookups and a cost computation.
//!
//! Why a cache checked against memory and not a program decoded at load: tile memory is writable
//! (by stores and by the exchange), so the words at `pc` are read on every fetch and compared with
//! the words the entry was decoded from. Code that rewrites itself runs exactly as before.

use super::amp::{self, AmpKernels};
use super::exec::{self, Cx, ExecFn, Flow};
use super::{mem, FaultKind};
use crate::isa::{decode, decode_bundle, Ctx, Instr, Issue, Kind, COISSUE_BIT, MAX_FIELDS};
use crate::target::{EXEC_REGION_END, TILE_MEM_BASE};

/// Entries per tile. Kernel loops are a few dozen issue units; 256 covers a tile's hot code.
pub const ENTRIES: usize = 256;

/// One decoded issue unit with its tag.
#[derive(Clone, Copy)]
pub struct Decoded {
    /// Address it was decoded at (`u32::MAX`: empty).
    pc: u32,
    /// The words it was decoded from (`w1` = 0 for a single instruction).
    words: [u32; 2],
    /// The single instruction, or the main half of a bundle.
    main: ExecFn,
    main_args: [u32; MAX_FIELDS],
    /// The aux half of a bundle (`None`: a single instruction).
    aux: Option<(ExecFn, [u32; MAX_FIELDS])>,
    /// The `$a` registers the aux half's operands name (the only ones it reads or writes).
    aux_regs: AuxRegs,
    /// Both halves as one function, for the bundles that have one (`amp::fused`), and how the
    /// main half streams its addresses.
    fused: Option<(exec::FusedFn, amp::Streams)>,
    /// Cost in issues (the larger half's for a bundle).
    pub cost: u32,
    /// Length in bytes (4 or 8).
    pub len: u32,
    /// Whether the supervisor / a worker may issue it.
    allowed: [bool; 2],
}

impl Decoded {
    const EMPTY: Decoded = Decoded {
        pc: u32::MAX,
        words: [0, 0],
        main: exec::nop,
        main_args: [0; MAX_FIELDS],
        aux: None,
        aux_regs: AuxRegs::NONE,
        fused: None,
        cost: 1,
        len: 4,
        allowed: [false, false],
    };

    fn new(pc: u32, words: [u32; 2], issue: &Issue, kernels: &AmpKernels) -> Self {
        let allowed = |i: &Instr, ctx: Ctx| {
            let c = i.info().ctx;
            c == Ctx::Any || c == ctx
        };
        match issue {
            Issue::Single(i) => Decoded {
                pc,
                words,
                main: i.info().exec,
                main_args: i.args,
                aux: None,
                aux_regs: AuxRegs::NONE,
                fused: None,
                cost: i.info().cost_of(&i.args),
                len: 4,
                allowed: [allowed(i, Ctx::Sup), allowed(i, Ctx::Worker)],
            },
            // `decode_bundle` only accepts an ARF aux half.
            Issue::Bundle(m, x) => Decoded {
                pc,
                words,
                main: m.info().exec,
                main_args: m.args,
                aux: Some((x.info().exec, x.args)),
                aux_regs: AuxRegs::of(x),
                fused: amp::fused(m, x, kernels),
                cost: m.info().cost_of(&m.args).max(x.info().cost_of(&x.args)),
                len: 8,
                allowed: [
                    allowed(m, Ctx::Sup) && allowed(x, Ctx::Sup),
                    allowed(m, Ctx::Worker) && allowed(x, Ctx::Worker),
                ],
            },
        }
    }

    /// The fused `{ld2st64pi ; AMP}` or `{ld2xst64pace ; AMP}` form of this bundle (the only
    /// fused forms, `amp::fused`): the function, how its main half streams, the main half's
    /// operands and the AMP's.
    #[allow(clippy::type_complexity)]
    pub(super) fn fused_amp(
        &self,
    ) -> Option<(exec::FusedFn, amp::Streams, [u32; MAX_FIELDS], [u32; MAX_FIELDS])> {
        let (f, streams) = self.fused?;
        Some((f, streams, self.main_args, self.aux.as_ref()?.1))
    }

    /// Whether this is a `{main ; aux}` bundle.
    pub fn is_bundle(&self) -> bool {
        self.aux.is_some()
    }

    /// The words it was decoded from, for fault reports.
    pub fn words(&self) -> [u32; 2] {
        self.words
    }

    /// Execute it in context `ctx` (`0` supervisor, `1` worker): its control effect.
    #[inline(always)]
    pub fn execute(&self, cx: &mut Cx<'_>, ctx: usize) -> Result<Flow, FaultKind> {
        if !self.allowed[ctx] {
            return Err(FaultKind::WrongContext);
        }
        let Some((aux, aux_args)) = &self.aux else {
            return (self.main)(cx, &self.main_args);
        };
        if let Some((fused, _)) = self.fused {
            return fused(cx, &self.main_args, aux_args);
        }
        // Both halves read the registers as they were before the bundle (docs/target.md §4.1).
        // The aux (ARF) half reads and writes only the `$a` registers its operands name, so only
        // those (as whole even/odd pairs) are set aside while the main half runs first, then given
        // back to the aux half. Pairs move as one 64-bit access: the AMP reads its operands as
        // pairs, and a pair stored as two 32-bit halves cannot be forwarded to a 64-bit load.
        let pairs = self.aux_regs.pairs();
        let mut before = [0u64; AuxRegs::PAIRS];
        for (b, &p) in before.iter_mut().zip(pairs) {
            *b = exec::read_pair(&cx.regs.a, p as u32);
        }
        (self.main)(cx, &self.main_args)?;
        let mut after_main = [0u64; AuxRegs::PAIRS];
        for ((m, b), &p) in after_main.iter_mut().zip(before).zip(pairs) {
            *m = exec::read_pair(&cx.regs.a, p as u32);
            exec::write_pair(&mut cx.regs.a, p as u32, b);
        }
        aux(cx, aux_args)?;
        let mut clash = false;
        for ((m, b), &p) in after_main.iter().zip(before).zip(pairs) {
            let x = exec::read_pair(&cx.regs.a, p as u32);
            // Per 32-bit register: all ones where the aux half changed it.
            let lo = if x as u32 != b as u32 { 0xFFFF_FFFFu64 } else { 0 };
            let hi = if (x >> 32) != (b >> 32) { 0xFFFF_FFFF_0000_0000u64 } else { 0 };
            let aux_wrote = lo | hi;
            // A clash: a register both halves changed.
            clash |= aux_wrote & (m ^ b) != 0;
            exec::write_pair(&mut cx.regs.a, p as u32, (x & aux_wrote) | (m & !aux_wrote));
        }
        if clash {
            return Err(FaultKind::BadOperand("both halves of a bundle write the same register"));
        }
        Ok(Flow::Next)
    }
}

/// The `$a` register pairs (even first registers) holding the registers an instruction's operands
/// name (a pair operand names both of its registers; a single register brings its pair along).
#[derive(Clone, Copy)]
struct AuxRegs {
    pairs: [u8; AuxRegs::PAIRS],
    len: u8,
}

impl AuxRegs {
    /// Three register operands at most.
    const PAIRS: usize = 3;
    const NONE: AuxRegs = AuxRegs { pairs: [0; AuxRegs::PAIRS], len: 0 };

    fn of(i: &Instr) -> Self {
        let mut out = AuxRegs::NONE;
        for (f, &v) in i.info().fields.iter().zip(&i.args) {
            if matches!(f.kind, Kind::AReg | Kind::APair) {
                let p = (v & !1) as u8;
                if !out.pairs().contains(&p) {
                    out.pairs[out.len as usize] = p;
                    out.len += 1;
                }
            }
        }
        out
    }

    fn pairs(&self) -> &[u8] {
        &self.pairs[..self.len as usize]
    }
}

/// A tile's cache of decoded issue units.
#[derive(Clone)]
pub struct DecodeCache {
    entries: [Decoded; ENTRIES],
    /// The fused AMP bundles' functions (`amp::AmpKernels`: the host may supply faster ones).
    kernels: AmpKernels,
}

impl Default for DecodeCache {
    fn default() -> Self {
        DecodeCache { entries: [Decoded::EMPTY; ENTRIES], kernels: AmpKernels::PORTABLE }
    }
}

impl DecodeCache {
    /// Use `kernels` for the fused AMP bundles from now on (entries decoded before, if any, are
    /// dropped: a fresh cache is left as it is).
    pub fn set_amp_kernels(&mut self, kernels: AmpKernels) {
        self.kernels = kernels;
        if self.entries.iter().any(|e| e.pc != Decoded::EMPTY.pc) {
            self.entries = [Decoded::EMPTY; ENTRIES];
        }
    }

    /// The issue unit at `pc`, decoded (from the cache when the words in memory are the words it
    /// was decoded from). Faults as docs/target.md §2 and §7 say a fetch faults.
    #[inline(always)]
    pub fn fetch(&mut self, mem: &[u8], pc: u32) -> Result<&Decoded, FaultKind> {
        if !(TILE_MEM_BASE..EXEC_REGION_END).contains(&pc) {
            return Err(FaultKind::FetchOutsideExecRegion);
        }
        let w0 = mem::ld32(mem, pc).map_err(|_| FaultKind::FetchMisaligned)?;
        let w1 = if w0 & COISSUE_BIT != 0 && pc + 4 < EXEC_REGION_END { mem::ld32(mem, pc + 4)? } else { 0 };
        let slot = ((pc >> 2) as usize) % ENTRIES;
        let e = &self.entries[slot];
        if e.pc == pc && e.words == [w0, w1] {
            return Ok(&self.entries[slot]);
        }
        let (first, co) = decode(w0).map_err(FaultKind::Undecodable)?;
        let issue = if co {
            if !pc.is_multiple_of(8) {
                return Err(FaultKind::FetchMisaligned);
            }
            decode_bundle(w0, w1).map_err(FaultKind::Undecodable)?
        } else {
            Issue::Single(first)
        };
        self.entries[slot] = Decoded::new(pc, [w0, w1], &issue, &self.kernels);
        Ok(&self.entries[slot])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::{encode, Class, Op, TABLE};
    use crate::target::{CWEI_BYTES, TILE_MEM_SIZE};
    use crate::tile::{Regs, Tile, WorkerFp};
    use alloc::vec;

    /// An empty entry never hits: its tag is not a fetchable address.
    #[test]
    fn empty_entries_never_hit() {
        let mut mem = [0u8; 64];
        let nop = encode(&Instr::new(Op::Nop, &[])).expect("nop encodes");
        mem[..4].copy_from_slice(&nop.to_le_bytes());
        let mut c = DecodeCache::default();
        assert!(!(TILE_MEM_BASE..EXEC_REGION_END).contains(&Decoded::EMPTY.pc));
        let d = c.fetch(&mem, TILE_MEM_BASE).expect("nop decodes");
        assert_eq!(d.words(), [nop, 0]);
        assert_eq!((d.len, d.cost, d.allowed), (4, 1, [true, true]));
    }

    use crate::tile::NoBus;

    /// The bundle rule as docs/target.md §4.1 states it, on the whole `$a` file: both halves
    /// read the registers as they were before; a register both halves change is a fault.
    fn bundle_by_the_rule(cx: &mut Cx<'_>, main: &Instr, aux: &Instr) -> Result<Flow, FaultKind> {
        let before = cx.regs.a;
        (main.info().exec)(cx, &main.args)?;
        let after_main = core::mem::replace(&mut cx.regs.a, before);
        (aux.info().exec)(cx, &aux.args)?;
        for r in 0..16 {
            let (b, m, x) = (before[r], after_main[r], cx.regs.a[r]);
            if x != b && m != b {
                return Err(FaultKind::BadOperand("both halves of a bundle write the same register"));
            }
            cx.regs.a[r] = if x != b { x } else { m };
        }
        Ok(Flow::Next)
    }

    /// The decoded bundle path (which sets aside only the aux half's operand registers) gives
    /// the rule's registers, FP state, memory and faults for random bundles of every main and
    /// aux instruction, with register clashes included.
    #[test]
    fn decoded_bundles_follow_the_bundle_rule() {
        let mains: vec::Vec<_> = TABLE.iter().filter(|i| i.can_coissue()).collect();
        let auxes: vec::Vec<_> = TABLE.iter().filter(|i| i.class == Class::Arf).collect();
        let (faults, clashes, _) = compare_with_the_rule(&mains, &auxes, 3000, 2, false);
        // Both outcomes are exercised, not only the fault-free path.
        assert!(faults > 100 && clashes > 20 && faults < 2500, "{faults} faults, {clashes} clashes");
    }

    /// The fused `{ld2st64pi ; AMP}` bundles (`amp::fused`) follow the rule too: with every `$m`
    /// register an address, most run without a fault, and the fused function is the one taken
    /// unless the AMP writes a pair `ld2st64pi` loads (then the general path, and a clash).
    #[test]
    fn fused_amp_bundles_follow_the_bundle_rule() {
        let mains: vec::Vec<_> = TABLE.iter().filter(|i| i.mnemonic == "ld2st64pi").collect();
        let auxes: vec::Vec<_> = TABLE.iter().filter(|i| i.mnemonic.ends_with("amp")).collect();
        assert_eq!((mains.len(), auxes.len()), (1, 3));
        let (faults, clashes, fused) = compare_with_the_rule(&mains, &auxes, 1500, 1, false);
        assert!(
            faults < 700 && clashes > 10 && fused > 700,
            "{faults} faults, {clashes} clashes, {fused} fused"
        );
    }

    /// The same for `{ld2xst64pace ; AMP}`: with every `$m` pair a packed triple of aligned
    /// addresses (and strides from whatever register the bundle names), most run fused and
    /// without a fault; an AMP writing a pair of the loaded quad takes the general path and clashes.
    #[test]
    fn fused_pace_amp_bundles_follow_the_bundle_rule() {
        let mains: vec::Vec<_> = TABLE.iter().filter(|i| i.mnemonic == "ld2xst64pace").collect();
        let auxes: vec::Vec<_> = TABLE.iter().filter(|i| i.mnemonic.ends_with("amp")).collect();
        assert_eq!((mains.len(), auxes.len()), (1, 3));
        let (faults, clashes, fused) = compare_with_the_rule(&mains, &auxes, 1500, 1, true);
        assert!(
            faults < 700 && clashes > 10 && fused > 700,
            "{faults} faults, {clashes} clashes, {fused} fused"
        );
    }

    /// Runs `samples` random bundles of `mains[i] ; auxes[j]` (pairs in turn) both ways — decoded
    /// and by the rule — and compares registers, FP state, memory and faults. Every
    /// `address_every`-th `$m` register holds an aligned address, the others small offsets; with
    /// `packed`, every pair `$m0:1..$m12:13` holds three aligned addresses, packed (§4.8).
    /// Returns the faults, the clashes among them, and how many decoded bundles were fused.
    fn compare_with_the_rule(
        mains: &[&crate::isa::OpInfo],
        auxes: &[&crate::isa::OpInfo],
        samples: usize,
        address_every: usize,
        packed: bool,
    ) -> (u32, u32, u32) {
        let mut fused = 0;
        let mut s = 0x2545_F491u32;
        let mut rand = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        let (mut faults, mut clashes) = (0, 0);
        let mut mems = [vec![0u8; TILE_MEM_SIZE], vec![0u8; TILE_MEM_SIZE]];
        let mut template = vec![0u8; 64 * 1024];
        for n in 0..samples {
            let (mi, xi) = (mains[n % mains.len()], auxes[(n / mains.len()) % auxes.len()]);
            let w0 = (rand() & !mi.fixed_mask()) | mi.base | COISSUE_BIT;
            let w1 = (rand() & !xi.fixed_mask()) | xi.base;
            let Ok(Issue::Bundle(main, aux)) = decode_bundle(w0, w1) else { panic!("{w0:#x} {w1:#x}") };
            let mut regs = Regs::default();
            for r in 0..15 {
                // Half the `$m` registers are aligned addresses, half small offsets.
                regs.m[r] = if r % address_every == 0 {
                    TILE_MEM_BASE + 8 * (rand() % 4096)
                } else {
                    8 * (rand() % 8)
                };
            }
            if packed {
                for r in (0..14).step_by(2) {
                    let v = exec::pack_triple([0; 3].map(|_| TILE_MEM_BASE + 8 * (rand() % 4096)));
                    (regs.m[r], regs.m[r + 1]) = (v as u32, (v >> 32) as u32);
                }
            }
            for v in regs.a.iter_mut() {
                // f16/f32 bit patterns from a narrow exponent range keep the arithmetic finite.
                *v = (rand() & 0x83FF_83FF) | 0x3800_3800;
            }
            let mut shared = Tile::new(0, TILE_MEM_BASE).shared;
            let mut cwei = [0u8; CWEI_BYTES];
            for b in cwei.iter_mut() {
                *b = (rand() & 0xBB) as u8;
            }
            shared.load_cwei(&cwei);
            let mut fp = WorkerFp { nfmt: rand() & 1, scl: rand() & 7, ..WorkerFp::default() };
            for v in fp.aacc.iter_mut() {
                *v = (rand() % 64) as f32;
            }
            let (k, c) = (rand() | 1, rand());
            for (i, b) in template.iter_mut().enumerate() {
                *b = ((i as u32).wrapping_mul(k).wrapping_add(c) >> 13) as u8;
            }
            let mut run = |decoded: bool| {
                let (mut regs, mut shared, mut fp) = (regs, shared, fp);
                let mem = &mut mems[decoded as usize];
                mem[..template.len()].copy_from_slice(&template);
                let mut cx = Cx {
                    regs: &mut regs,
                    mem,
                    shared: &mut shared,
                    fp: Some(&mut fp),
                    bus: &mut NoBus,
                    cycle: 0,
                    pc: TILE_MEM_BASE,
                };
                let r = if decoded {
                    let d = Decoded::new(
                        TILE_MEM_BASE,
                        [w0, w1],
                        &Issue::Bundle(main, aux),
                        &AmpKernels::PORTABLE,
                    );
                    fused += d.fused.is_some() as u32;
                    d.execute(&mut cx, 1)
                } else {
                    bundle_by_the_rule(&mut cx, &main, &aux)
                };
                // A fault stops the device: registers are not observable after it, memory is.
                r.is_ok().then(|| (regs, fp.aacc.map(f32::to_bits), fp.drain.map(f32::to_bits))).ok_or(r)
            };
            let (want, got) = (run(false), run(true));
            assert!(want == got, "{main:?} ; {aux:?}: {:?} vs {:?}", want.err(), got.err());
            assert!(mems[0] == mems[1], "{main:?} ; {aux:?}: memory differs");
            faults += want.is_err() as u32;
            clashes += matches!(want, Err(Err(FaultKind::BadOperand(_)))) as u32;
        }
        (faults, clashes, fused)
    }
}
