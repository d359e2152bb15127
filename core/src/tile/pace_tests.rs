//! `tapack` and `ld2xst64pace` as docs/target.md §4.8 specifies them: the packed layout, each
//! stride select, the faults (and that a fault writes no register and no
//! memory), the encoding and the text.

use super::exec::{pack_triple, unpack_triple, Cx, Flow};
use super::{FaultKind, NoBus, Regs, Shared, Tile, WorkerFp};
use crate::isa::{decode, encode, parse_issue, Disasm, Instr, Issue, Op};
use crate::target::{TILE_MEM_BASE, TILE_MEM_END, TILE_MEM_SIZE};
use alloc::string::ToString;
use alloc::vec::Vec;

/// A worker context and tile memory whose byte at address `a` is `a mod 251` (so every 8 bytes
/// read say where they came from).
struct World {
    regs: Regs,
    mem: Vec<u8>,
    shared: Shared,
    fp: WorkerFp,
}

impl World {
    fn new() -> Self {
        let mem = (0..TILE_MEM_SIZE).map(|i| ((TILE_MEM_BASE as usize + i) % 251) as u8).collect();
        World {
            regs: Regs::default(),
            mem,
            shared: Tile::new(0, TILE_MEM_BASE).shared,
            fp: WorkerFp::default(),
        }
    }
    /// Runs `text` (one instruction) through its encoding, as a fetch would.
    fn run(&mut self, text: &str) -> Result<Flow, FaultKind> {
        let Ok(Issue::Single(i)) = parse_issue(text) else { panic!("{text}") };
        let (i, _) = decode(encode(&i).expect("encodes")).expect("decodes");
        let mut cx = Cx {
            regs: &mut self.regs,
            mem: &mut self.mem,
            shared: &mut self.shared,
            fp: Some(&mut self.fp),
            bus: &mut NoBus,
            cycle: 0,
            pc: TILE_MEM_BASE,
        };
        (i.info().exec)(&mut cx, &i.args)
    }
    fn ld64(&self, a: u32) -> u64 {
        let o = (a - TILE_MEM_BASE) as usize;
        u64::from_le_bytes(self.mem[o..o + 8].try_into().expect("8 bytes"))
    }
    fn pair_m(&self, r: usize) -> u64 {
        self.regs.m[r] as u64 | (self.regs.m[r + 1] as u64) << 32
    }
    fn pair_a(&self, r: usize) -> u64 {
        self.regs.a[r] as u64 | (self.regs.a[r + 1] as u64) << 32
    }
}

#[test]
fn tapack_packs_three_21_bit_addresses() {
    let mut w = World::new();
    w.regs.m[1] = 0x4C008;
    w.regs.m[2] = 0x1F_FFF8;
    w.regs.m[3] = 0xE7FF8;
    assert_eq!(w.run("tapack $m4, $m1, $m2, $m3"), Ok(Flow::Next));
    let want = 0x4C008u64 | 0x1F_FFF8 << 21 | 0xE7FF8 << 42;
    assert_eq!(w.pair_m(4), want);
    assert_eq!(want >> 63, 0);
    assert_eq!(unpack_triple(want), [0x4C008, 0x1F_FFF8, 0xE7FF8]);
    assert_eq!(pack_triple([0x4C008, 0x1F_FFF8, 0xE7FF8]), want);
    // Into `$m14:15`: `$m15` stays 0, the low word is written.
    assert_eq!(w.run("tapack $m14, $m1, $m2, $m3"), Ok(Flow::Next));
    assert_eq!((w.regs.m[14], w.regs.m[15]), (want as u32, 0));
}

#[test]
fn tapack_faults_on_an_address_above_21_bits_and_writes_nothing() {
    let mut w = World::new();
    w.regs.m[1] = 0x4C000;
    w.regs.m[2] = 0x20_0000;
    w.regs.m[4] = 0x1234;
    w.regs.m[5] = 0x5678;
    assert_eq!(
        w.run("tapack $m4, $m1, $m2, $m1"),
        Err(FaultKind::BadOperand("tapack: an address does not fit 21 bits"))
    );
    assert_eq!((w.regs.m[4], w.regs.m[5]), (0x1234, 0x5678));
}

/// Loads at the first two packed addresses, a store at the third, each address stepping by its
/// select: `00` +8 bytes, `01`/`10`/`11` the stride register's fields 0/1/2 (signed, 8-byte units).
#[test]
fn ld2xst64pace_loads_stores_and_steps_each_address_by_its_select() {
    let (x, pin, out) = (0x80000u32, 0x90008, 0xA0010);
    // Field 0 = +5, field 1 = −3, field 2 = +511 (8-byte steps).
    let stride = 5 | (0x3FD << 10) | (511 << 20);
    for (strimm, incs) in [
        (0b00_00_00u32, [8i32, 8, 8]),
        (0b11_10_01, [40, -24, 4088]),
        (0b01_11_10, [-24, 4088, 40]),
        (0b10_01_11, [4088, 40, -24]),
    ] {
        let mut w = World::new();
        w.regs.m[8] = pack_triple([x, pin, out]) as u32;
        w.regs.m[9] = (pack_triple([x, pin, out]) >> 32) as u32;
        w.regs.m[7] = stride;
        w.regs.a[4] = 0xDEAD_BEEF;
        w.regs.a[5] = 0x0123_4567;
        let text = alloc::format!("ld2xst64pace $a0, $a4, $m8, $m7, {strimm:#b}");
        assert_eq!(w.run(&text), Ok(Flow::Next), "{text}");
        assert_eq!(w.pair_a(0), World::new().ld64(x), "{text}: first load");
        assert_eq!(w.pair_a(2), World::new().ld64(pin), "{text}: second load");
        assert_eq!(w.ld64(out), 0x0123_4567_DEAD_BEEF, "{text}: store");
        let next = [x, pin, out].map(|a| a as i64);
        let next: [u32; 3] = core::array::from_fn(|i| (next[i] + incs[i] as i64) as u32);
        assert_eq!(unpack_triple(w.pair_m(8)), next, "{text}");
        // Nothing else changed.
        assert_eq!(w.regs.m[7], stride);
        assert_eq!(&w.regs.a[6..], &[0; 10]);
    }
}

/// Each of the three accesses faults as `ld64`/`st64` does, in the order first load, second load,
/// store; a fault writes no register and no memory.
#[test]
fn ld2xst64pace_faults_write_nothing() {
    let good = [0x80000u32, 0x80008, 0x80010];
    for (k, bad, want) in [
        (0, 0x80004, FaultKind::Misaligned { addr: 0x80004, align: 8 }),
        (1, 0x4BFF8, FaultKind::OutOfRange { addr: 0x4BFF8, len: 8 }),
        (2, 0x80012, FaultKind::Misaligned { addr: 0x80012, align: 8 }),
        (2, TILE_MEM_END, FaultKind::OutOfRange { addr: TILE_MEM_END, len: 8 }),
    ] {
        let mut addrs = good;
        addrs[k] = bad;
        let mut w = World::new();
        let packed = pack_triple(addrs);
        (w.regs.m[6], w.regs.m[7]) = (packed as u32, (packed >> 32) as u32);
        w.regs.a[0] = 0x1111_1111;
        w.regs.a[14] = 0x7777_7777;
        let (regs, mem) = (w.regs, w.mem.clone());
        assert_eq!(w.run("ld2xst64pace $a0, $a14, $m6, $m15, 0b000000"), Err(want), "address {k}");
        assert_eq!(w.regs, regs, "address {k}: registers");
        assert!(w.mem == mem, "address {k}: memory");
    }
}

/// The encodings docs/target.md §4.8 gives, and text that reads back as it was written.
#[test]
fn pace_encodings_and_text_are_as_documented() {
    for (text, word) in [
        ("tapack $m8, $m3, $m4, $m5", 0x9C70_0000u32 | 4 | 3 << 4 | 4 << 8 | 5 << 12),
        ("ld2xst64pace $a0, $a4, $m8, $m7, 0b000010", 0x9E40_0000 | 2 << 2 | 4 << 5 | 7 << 8 | 2 << 12),
        (
            "ld2xst64pace $a12, $a14, $m14, $m15, 0b111111",
            0x9E40_0000 | 3 | 7 << 2 | 7 << 5 | 15 << 8 | 63 << 12,
        ),
    ] {
        let Ok(Issue::Single(i)) = parse_issue(text) else { panic!("{text}") };
        assert_eq!(encode(&i), Ok(word), "{text}");
        assert_eq!(decode(word), Ok((i, false)), "{text}");
        assert_eq!(Disasm(&Issue::Single(i)).to_string(), text);
    }
    // A quad starts at a multiple of 4; pairs at an even register.
    for bad in
        [Instr::new(Op::Ld2xst64Pace, &[2, 4, 8, 7, 0]), Instr::new(Op::Ld2xst64Pace, &[0, 4, 9, 7, 0])]
    {
        assert!(encode(&bad).is_err(), "{bad:?}");
    }
    assert!(encode(&Instr::new(Op::Tapack, &[3, 1, 2, 3])).is_err());
    // It may carry the co-issue bit: an MRF model instruction, bundled with an AMP.
    let b = parse_issue("{ ld2xst64pace $a0, $a4, $m8, $m7, 0b000010 ; f16amp $a4, $a2, $a0, 2 }");
    assert!(matches!(b, Ok(Issue::Bundle(..))));
}
