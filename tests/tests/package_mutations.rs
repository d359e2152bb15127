//! Hostile packages: more than 1,000 mutations of a valid package — bit flips, truncations,
//! header and section-table edits (with checksums recomputed so the later checks are reached), and
//! semantic edits re-encoded with valid checksums — are all rejected by the reader with a message
//! naming the problem, before anything could reach a device, and none panics.

use ipu_host::build::{build, BuildOptions};
use ipu_host::package::Package;
use ipu_schema::{Segment, SEG_DATA, SEG_EXEC, SEG_ZERO};
use sha2::{Digest, Sha256};

mod common;
use common::Rng;

fn base() -> (Package, Vec<u8>) {
    let src =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/matmul.toml")).unwrap();
    let b = build("m.toml", &src, &BuildOptions { threads: 1, grid: None, ..BuildOptions::new(8) }).unwrap();
    (b.package, b.bytes)
}

/// Recompute the header checksum after editing header or table bytes.
fn reseal(bytes: &mut [u8]) {
    let n = u32::from_le_bytes(bytes[24..28].try_into().unwrap()) as usize;
    let table_end = (80 + n * 56).min(bytes.len());
    let mut h = bytes[..80].to_vec();
    h[48..80].fill(0);
    let mut d = Sha256::new();
    d.update(&h);
    d.update(&bytes[80..table_end]);
    let sum: [u8; 32] = d.finalize().into();
    bytes[48..80].copy_from_slice(&sum);
}

fn must_reject(kind: &str, bytes: &[u8], counts: &mut std::collections::BTreeMap<String, usize>) {
    let r = std::panic::catch_unwind(|| Package::from_bytes(bytes));
    match r {
        Err(_) => panic!("{kind}: the reader panicked"),
        Ok(Ok(_)) => panic!("{kind}: a mutated package was accepted"),
        Ok(Err(e)) => {
            let msg = e.to_string();
            assert!(msg.len() > 10, "{kind}: message too thin: {msg}");
            *counts.entry(kind.to_string()).or_default() += 1;
        }
    }
}

/// An edit of a decoded package.
type Mutation = Box<dyn Fn(&mut Package)>;

#[test]
fn a_thousand_mutations_are_all_rejected() {
    let (pkg, good) = base();
    assert!(Package::from_bytes(&good).is_ok());
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut counts = std::collections::BTreeMap::new();
    // 1. Bit flips anywhere (every byte is covered by a checksum).
    for _ in 0..500 {
        let mut b = good.clone();
        let i = rng.below(b.len());
        b[i] ^= 1 << rng.below(8);
        must_reject("bit flip", &b, &mut counts);
    }
    // 2. Truncations and extensions.
    for _ in 0..200 {
        let cut = rng.below(good.len());
        must_reject("truncation", &good[..cut], &mut counts);
    }
    for extra in 1..=20 {
        let mut b = good.clone();
        b.extend(std::iter::repeat_n(0u8, extra * 8));
        must_reject("extension", &b, &mut counts);
    }
    // 3. Header field edits, resealed: version, arch, tile count, section count, table offset, size.
    for field in [8usize, 16, 20, 24, 32, 40] {
        for _ in 0..20 {
            let mut b = good.clone();
            let v = match rng.below(4) {
                0 => 0u32,
                1 => u32::MAX,
                2 => rng.next() as u32,
                _ => u32::from_le_bytes(b[field..field + 4].try_into().unwrap()).wrapping_add(1),
            };
            b[field..field + 4].copy_from_slice(&v.to_le_bytes());
            reseal(&mut b);
            must_reject("header edit", &b, &mut counts);
        }
    }
    // 4. Section table edits, resealed: kind, flags, offset, length.
    let n = u32::from_le_bytes(good[24..28].try_into().unwrap()) as usize;
    for _ in 0..150 {
        let mut b = good.clone();
        let e = 80 + 56 * rng.below(n);
        let (off, width) = [(0, 4), (4, 4), (8, 8), (16, 8)][rng.below(4)];
        let delta = [1u64, 8, 4096, u64::MAX / 2][rng.below(4)];
        let mut v = [0u8; 8];
        v[..width].copy_from_slice(&b[e + off..e + off + width]);
        let nv = u64::from_le_bytes(v).wrapping_add(delta);
        b[e + off..e + off + width].copy_from_slice(&nv.to_le_bytes()[..width]);
        reseal(&mut b);
        must_reject("section table edit", &b, &mut counts);
    }
    // 5. Semantic edits with every checksum valid: the reader's own checks must catch them.
    let semantic: Vec<(&str, &str, Mutation)> = vec![
        (
            "segment out of range",
            "outside tile memory",
            Box::new(|p| std::sync::Arc::make_mut(&mut p.tiles[1].segments)[0].addr = 0xE7FF0),
        ),
        (
            "segment below memory",
            "outside tile memory",
            Box::new(|p| std::sync::Arc::make_mut(&mut p.tiles[2].segments)[0].addr = 0x1000),
        ),
        (
            "code in region 1",
            "outside the executable region",
            Box::new(|p| {
                let s = &mut std::sync::Arc::make_mut(&mut p.tiles[0].segments)[0];
                s.addr = 0x90000;
            }),
        ),
        (
            "image larger than memory",
            "outside tile memory",
            Box::new(|p| {
                std::sync::Arc::make_mut(&mut p.tiles[3].segments).push(Segment {
                    addr: 0x4C000,
                    flags: SEG_DATA | SEG_ZERO,
                    len: 0x100000,
                    bytes: vec![],
                })
            }),
        ),
        (
            "overlapping segments",
            "overlaps the previous segment",
            Box::new(|p| {
                let s = std::sync::Arc::make_mut(&mut p.tiles[4].segments)[0].clone();
                std::sync::Arc::make_mut(&mut p.tiles[4].segments)
                    .insert(1, Segment { addr: s.addr + 4, flags: SEG_DATA, len: 4, bytes: vec![0; 4] });
            }),
        ),
        ("entry outside code", "is not inside a code segment", Box::new(|p| p.tiles[5].entry = 0x90000)),
        ("wrong tile order", "images ordered by their first tile", Box::new(|p| p.tiles.swap(0, 1))),
        (
            "missing tile",
            "tile images for a 8-tile target",
            Box::new(|p| {
                p.tiles.pop();
            }),
        ),
        (
            "length mismatch",
            "bytes",
            Box::new(|p| std::sync::Arc::make_mut(&mut p.tiles[6].segments)[0].len += 4),
        ),
        (
            "bad flags",
            "invalid flags",
            Box::new(|p| std::sync::Arc::make_mut(&mut p.tiles[7].segments)[0].flags = SEG_EXEC | SEG_DATA),
        ),
        (
            "zero segment with bytes",
            "zero-filled segments are data without bytes",
            Box::new(|p| {
                std::sync::Arc::make_mut(&mut p.tiles[0].segments).last_mut().unwrap().bytes = vec![1; 4]
            }),
        ),
        (
            "binding tile out of range",
            "tile 99 out of range",
            Box::new(|p| p.bindings[0].slices[0].tile = 99),
        ),
        (
            "binding beyond tensor",
            "-byte tensor",
            Box::new(|p| p.bindings[0].slices[0].tensor_offset = 1 << 40),
        ),
        (
            "binding beyond tile memory",
            "outside tile memory",
            Box::new(|p| p.bindings[2].slices[0].addr = 0xE7FFE),
        ),
        ("empty shape", "empty shape", Box::new(|p| p.bindings[1].shape = vec![])),
        ("mailbox outside memory", "host mailbox", Box::new(|p| p.host.mailbox = 0x100)),
        ("no run call", "no `run` call", Box::new(|p| p.host.calls.clear())),
        (
            "memory table short",
            "memory table",
            Box::new(|p| {
                p.plan.memory.pop();
            }),
        ),
    ];
    for round in 0..10 {
        for (name, needle, f) in &semantic {
            let mut p = pkg.clone();
            f(&mut p);
            // Vary something harmless so each round is a different file.
            p.info.compiler = format!("0.1.0-r{round}");
            let bytes = p.to_bytes();
            let msg = Package::from_bytes(&bytes).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(msg.contains(needle), "{name}: expected `{needle}` in `{msg}`");
            must_reject(name, &bytes, &mut counts);
        }
    }
    let total: usize = counts.values().sum();
    println!("rejected {total} mutated packages: {counts:?}");
    assert!(total >= 1000, "{total}");
}
