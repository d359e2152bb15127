//! Per-tile memory liveness (docs/graph-planner.md §5, `ipu_core::plan::liveness`): a buffer's
//! bytes are reused once its last reader has run, reused bytes are cleared by `zero_words` at
//! the start of their stage every run (the kernels rely on zero padding), and a tile shares
//! memory only when its buffers do not fit side by side.

mod common;

use ipu_core::plan::{Buffer, Live, MemKind};
use ipu_host::build::{build, BuildOptions};

/// Four matmuls in a row, each reading the same weight: `Y = ((X·W)·W·W)·W`. Each stage's
/// operand blocks are dead once the next stage has its input, so few tiles suffice only with
/// reuse.
fn chain() -> String {
    let input = |n: &str, s: &str| format!("[inputs.{n}]\ndtype = \"f16\"\nshape = {s}\n");
    let mm = |a: &str, o: &str| {
        format!(
            "[[ops]]\nop = \"matmul\"\na = \"{a}\"\nb = \"W\"\noutput = \"{o}\"\naccumulate = \"f16\"\ndtype = \"f16\"\n"
        )
    };
    [
        "name = \"chain\"\noutputs = [\"Y\"]\n".to_string(),
        input("X", "[128, 256]"),
        input("W", "[256, 256]"),
        mm("X", "H1"),
        mm("H1", "H2"),
        mm("H2", "H3"),
        mm("H3", "Y"),
    ]
    .concat()
}

/// The largest tile's peak (bytes its image occupies) and the sum of its buffers by kind.
fn peak_and_sum(tiles: usize) -> (u64, u64) {
    let built = build("chain.toml", &chain(), &BuildOptions { threads: 1, ..BuildOptions::new(tiles) })
        .unwrap_or_else(|e| panic!("{tiles} tiles: {e}"));
    let pkg = ipu_host::package::Package::from_bytes(&built.bytes).expect("reads back");
    let v: serde_json::Value =
        serde_json::from_str(&ipu_host::inspect::render(&pkg, &built.bytes, true)).expect("json");
    let t = &v["largest_tile"];
    (t["bytes"].as_u64().expect("peak"), t["by_kind"]["sum"].as_u64().expect("sum"))
}

#[test]
fn a_graph_that_fits_only_with_reuse_builds_and_runs_bit_exact_twice() {
    for tiles in [2, 3] {
        // Two inferences: the second starts from the first one's leftovers in reused bytes.
        let (out, pkg) = common::build_and_run(&chain(), tiles, None, 7, 2);
        assert_eq!(out.compared_elements, 2 * 128 * 256, "{out:?}");
        let (sim, pred) = (out.cycles[1], pkg.plan.predicted_cycles);
        assert!(sim.abs_diff(pred) * 100 <= sim, "{tiles} tiles: simulated {sim} predicted {pred}");
        let (peak, sum) = peak_and_sum(tiles);
        assert!(peak < sum, "{tiles} tiles: buffers share bytes: peak {peak} sum {sum}");
        assert!(peak <= 638_976, "{peak}");
    }
}

#[test]
fn a_graph_that_fits_side_by_side_shares_nothing() {
    let (peak, sum) = peak_and_sum(4);
    assert_eq!(peak, sum, "no clears and no shared bytes where everything fits");
}

#[test]
fn one_tile_is_still_refused_with_the_op_and_bytes() {
    let e = build("chain.toml", &chain(), &BuildOptions { threads: 1, ..BuildOptions::new(1) })
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("op 1 (matmul): tile 0: placing it needs") && e.contains("are free"), "{e}");
}

fn buffer(name: &str, bytes: u32, live: Live) -> Buffer {
    Buffer {
        name: name.into(),
        bytes,
        align: 16,
        kind: MemKind::Tensor,
        init: ipu_core::plan::Init::new(),
        live,
        read_past: 0,
    }
}

#[test]
fn the_linker_shares_bytes_only_between_disjoint_lifetimes() {
    let early = Live { from: 0, to: 1 };
    let late = Live { from: 2, to: 3 };
    let both = Live { from: 1, to: 2 };
    let bufs = [buffer("a", 4096, early), buffer("b", 4096, late), buffer("c", 1024, both)];
    let l = ipu_linker::link(0, "main:\n    exit\n", &bufs).expect("links");
    let (a, b, c) = (l.symbols["a"], l.symbols["b"], l.symbols["c"]);
    assert_eq!(a, b, "a dies before b is made: same bytes");
    assert!(c >= a + 4096 || c + 1024 <= a, "c overlaps both in time: own bytes ({a:#x} {c:#x})");
    // Zero-fill segments stay disjoint where buffers share bytes.
    let mut segs: Vec<_> = l.image.segments.iter().map(|s| (s.addr, s.addr + s.len)).collect();
    segs.sort();
    assert!(segs.windows(2).all(|w| w[0].1 <= w[1].0), "{segs:?}");
}

#[test]
fn a_buffer_alive_throughout_never_shares() {
    let bufs = [buffer("a", 4096, Live { from: 0, to: 1 }), buffer("p", 4096, Live::ALWAYS)];
    let l = ipu_linker::link(0, "main:\n    exit\n", &bufs).expect("links");
    let (a, p) = (l.symbols["a"], l.symbols["p"]);
    assert!(p >= a + 4096 || p + 4096 <= a, "{a:#x} {p:#x}");
}

/// Largest-first placement leaves no free range for one of these buffers (found by a search over
/// random lifetimes and sizes); the linker then tries other orders (by first use, by bytes ×
/// lifetime) and places all five, never two live at once in the same bytes.
#[test]
fn the_linker_tries_other_orders_when_largest_first_fragments() {
    let live = |from, to| Live { from, to };
    let bufs = [
        buffer("b0", 122_880, live(1, 1)),
        buffer("b1", 163_840, live(0, 2)),
        buffer("b2", 126_976, live(2, 3)),
        buffer("b3", 200_704, live(2, 3)),
        buffer("b4", 118_784, live(0, 3)),
    ];
    let l = ipu_linker::link(0, "main:\n    exit\n", &bufs).expect("links with another order");
    for (i, a) in bufs.iter().enumerate() {
        for b in &bufs[i + 1..] {
            let (x, y) = (l.symbols[a.name.as_str()], l.symbols[b.name.as_str()]);
            let apart = x + a.bytes <= y || y + b.bytes <= x;
            assert!(apart || !a.live.overlaps(b.live), "{} at {x:#x} and {} at {y:#x}", a.name, b.name);
        }
    }
}

#[test]
fn what_a_kernel_reads_past_a_buffer_stays_inside_tile_memory() {
    use ipu_core::target::{EXEC_REGION_END, HOST_AREA_BASE, TILE_MEM_END};
    // A buffer filling region 1 ends where the host area starts; the host area and the end of
    // tile memory follow it.
    let whole = HOST_AREA_BASE - EXEC_REGION_END;
    let after = TILE_MEM_END - HOST_AREA_BASE;
    let fill = |read_past| [Buffer { read_past, ..buffer("a", whole, Live::ALWAYS) }];
    let l = ipu_linker::link(0, "main:\n    exit\n", &fill(after)).expect("reads end at the last byte");
    assert_eq!(l.symbols.get("a").map(|a| a + whole + after), Some(TILE_MEM_END));
    // Reading one word more would leave tile memory; region 0 alone is too small for it, so it
    // starts after the code and ends in region 1, its reads inside tile memory.
    let l = ipu_linker::link(0, "main:\n    exit\n", &fill(after + 4)).expect("links across 0x80000");
    let a = l.symbols["a"];
    assert!(a < EXEC_REGION_END && a >= l.code_end && a + whole + after + 4 <= TILE_MEM_END, "{a:#x}");
    // A smaller buffer with a long read-ahead goes lower in region 1, so its reads stay inside.
    let b = [Buffer { read_past: 4096, ..buffer("b", whole - 8192, Live::ALWAYS) }];
    let l = ipu_linker::link(0, "main:\n    exit\n", &b).expect("links");
    let end = l.symbols["b"] + whole - 8192;
    assert!(end + 4096 <= TILE_MEM_END, "{end:#x}");
}

/// A buffer larger than either data range (region 0 after the code, region 1 below the host area)
/// but not than both: placed across 0x80000 once the split placements fail (data may sit
/// anywhere in tile memory; only code is bound to region 0). One byte more than both: refused,
/// the error giving the buffers' peak and the room the code leaves.
#[test]
fn a_buffer_larger_than_either_region_straddles_them() {
    use ipu_core::target::{EXEC_REGION_END, HOST_AREA_BASE};
    let code = "main:\n    exit\n";
    let probe = ipu_linker::link(0, code, &[]).expect("links");
    let room = HOST_AREA_BASE - probe.code_end;
    let big = (HOST_AREA_BASE - EXEC_REGION_END) + 1024;
    let l = ipu_linker::link(0, code, &[buffer("a", big, Live::ALWAYS)]).expect("straddles");
    let a = l.symbols["a"];
    assert!(a < EXEC_REGION_END && a + big > EXEC_REGION_END && a + big <= HOST_AREA_BASE, "{a:#x}");
    // Buffers placed with the split ranges keep their addresses (region 1 first).
    let l = ipu_linker::link(0, code, &[buffer("b", 4096, Live::ALWAYS)]).expect("links");
    assert_eq!(l.symbols["b"], EXEC_REGION_END);
    let e = ipu_linker::link(0, code, &[buffer("a", room + 16, Live::ALWAYS)]).map(|_| ()).unwrap_err();
    let text = e.to_string();
    let peak = (room + 16).div_ceil(16) * 16;
    assert!(text.contains(&format!("leaving {room} for buffers, which take {peak} at their peak")), "{text}");
}
