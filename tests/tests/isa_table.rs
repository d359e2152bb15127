//! The ISA table: golden bytes for every public encoding and round trips over every row.

use ipu_core::isa::{
    decode, decode_bundle, encode, encode_issue, parse_issue, Disasm, Instr, Issue, Kind, Provenance, TABLE,
};

/// (text, word): words computed by hand from the published base opcodes and field layouts
/// (fact sheet §4, [IPUSTACK instruction.rs / ipu21_instruction.def]).
const GOLDEN: &[(&str, u32)] = &[
    ("sync 3", 0x4180_0003),
    ("sync 15", 0x4180_000F),
    ("sans 0", 0x40C0_0000),
    ("delay 1", 0x40A0_0000),
    ("delay 100", 0x40A0_0063),
    ("delaypic 2, 0, 0x50000", 0x6011_4000),
    ("delayxpic 5, 0, 0x640", 0x6401_4640),
    ("send 4, 0x50000, 1", 0x786A_0001),
    ("sendoff 65, 0x10, 2", 0x7000_4022),
    ("setzi $m1, 0x12345", 0x1911_2345),
    ("put 0xa0, $m2", 0x4320_80A0),
    ("br $m10", 0x43A0_0000),
    ("call $m10, 0x4c100", 0x18A1_3040),
    ("add $m1, $m2, -4", 0x2221_FFFC),
    ("and $m1, $m2, 255", 0x4221_00FF),
    ("shl $m1, $m2, 3", 0x4221_A003),
    ("brz $m3, 0x4c010", 0x1331_3004),
    ("ld32 $m1, $m2, $m15, 0x4", 0x0121_F001),
    ("st32 $m1, $m2, $m15, 0x8", 0x4F21_F002),
];

#[test]
fn golden_bytes_of_public_encodings() {
    for (text, word) in GOLDEN {
        let issue = parse_issue(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let Issue::Single(i) = issue else { panic!("{text} is not single") };
        assert_eq!(i.info().provenance, Provenance::Public, "{text}");
        assert_eq!(encode(&i).unwrap(), *word, "{text}: got {:#010x}", encode(&i).unwrap());
        assert_eq!(decode(*word).unwrap().0, i, "{text}");
    }
    // Every public row has a golden word.
    for info in TABLE.iter().filter(|i| i.provenance == Provenance::Public) {
        assert!(
            GOLDEN.iter().any(|(t, _)| t.split_whitespace().next() == Some(info.mnemonic)),
            "public `{}` has no golden bytes",
            info.mnemonic
        );
    }
}

mod common;
use common::Rng;

fn random_instr(info: &ipu_core::isa::OpInfo, rng: &mut Rng) -> Instr {
    let mut vals = Vec::new();
    for fl in info.fields {
        let bits = fl.bits();
        let stored = (rng.next() & ((1u64 << bits) - 1)) as u32;
        let v = match fl.kind {
            Kind::MReg | Kind::AReg => stored & 15,
            Kind::APair | Kind::MPair => (stored & 7) * 2,
            Kind::AQuad => (stored & 3) * 4,
            Kind::Unsigned => stored * fl.scale as u32 + fl.bias as u32,
            Kind::Signed => {
                let s = ((stored << (32 - bits)) as i32) >> (32 - bits);
                (s * fl.scale as i32 + fl.bias as i32) as u32
            }
        };
        vals.push(v);
    }
    Instr::new(info.op, &vals)
}

#[test]
fn every_row_round_trips_through_bytes_and_text() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for info in TABLE {
        for _ in 0..500 {
            let i = random_instr(info, &mut rng);
            let w = encode(&i).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(decode(w).unwrap(), (i, false), "{} {w:#x}", info.mnemonic);
            let text = Disasm(&Issue::Single(i)).to_string();
            assert_eq!(parse_issue(&text).unwrap(), Issue::Single(i), "{text}");
        }
    }
}

#[test]
fn bundles_round_trip_and_reject_bad_pairs() {
    let mut rng = Rng(42);
    let mrf: Vec<_> = TABLE.iter().filter(|i| i.can_coissue()).collect();
    let arf: Vec<_> = TABLE.iter().filter(|i| i.class == ipu_core::isa::Class::Arf).collect();
    for m in &mrf {
        for a in &arf {
            let b = Issue::Bundle(random_instr(m, &mut rng), random_instr(a, &mut rng));
            let (w, n) = encode_issue(&b).unwrap();
            assert_eq!(n, 2);
            assert_eq!(decode_bundle(w[0], w[1]).unwrap(), b);
            assert_eq!(parse_issue(&Disasm(&b).to_string()).unwrap(), b);
        }
    }
    let sync = parse_issue("sync 3").unwrap();
    let Issue::Single(s) = sync else { unreachable!() };
    let nop = Instr::new(ipu_core::isa::Op::Nop, &[]);
    assert!(encode_issue(&Issue::Bundle(s, nop)).is_err(), "sync cannot open a bundle");
    assert!(encode_issue(&Issue::Bundle(nop, nop)).is_err(), "nop is not an ARF instruction");
}

#[test]
fn encode_errors_name_the_field() {
    let i = parse_issue("send 4, 0x50000, 1").unwrap();
    let Issue::Single(mut i) = i else { unreachable!() };
    i.args[0] = 65;
    let e = encode(&i).unwrap_err();
    assert_eq!(e.to_string(), "cannot encode send operand `words` = 65 (65): too large for the field");
    i.args[0] = 4;
    i.args[1] = 0x50002;
    assert_eq!(encode(&i).unwrap_err().reason, "not a multiple of the field's unit");
}

#[test]
fn unknown_words_do_not_decode() {
    // 0xF0.. is sendpicp, a two-word instruction this model does not define.
    assert!(decode(0xFFFF_FFFF).is_err());
    // 0x00000000 lies in no row: opcode byte 0x00 is unused.
    assert_eq!(decode(0).unwrap_err().to_string(), "undecodable instruction word 0x00000000");
}
