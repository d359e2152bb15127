//! Programs the chip would get wrong must fault with tile, context, pc, instruction and reason.

mod common;
use common::*;
use ipu_core::tile::{CtxId, FaultKind};
use ipu_host::{Device, DeviceError};

fn fault_of(src: &str) -> ipu_core::tile::Fault {
    match run_one(src).2 {
        Err(DeviceError::Fault(f)) => f,
        other => panic!("expected a fault, got {other:?}"),
    }
}

#[test]
fn load_outside_tile_memory() {
    let f = fault_of("main:\n setzi $m1, 0xe8000\n ld32 $m2, $m1, $m15, 0\n halt\n");
    assert_eq!((f.ctx, f.pc, f.cycle), (CtxId::Sup, 0x4c004, 1));
    assert_eq!(f.kind, FaultKind::OutOfRange { addr: 0xe8000, len: 4 });
    assert_eq!(
        f.to_string(),
        "tile 0 sup pc=0x4c004 cycle=1: `ld32 $m2, $m1, $m15, 0x0`: access of 4 bytes at 0xe8000 outside tile memory 0x4c000..0xe8000"
    );
}

#[test]
fn load_below_tile_memory_and_misaligned() {
    let f = fault_of("main:\n setzi $m1, 0x4bffc\n ld32 $m2, $m1, $m15, 0\n halt\n");
    assert_eq!(f.kind, FaultKind::OutOfRange { addr: 0x4bffc, len: 4 });
    let f = fault_of("main:\n setzi $m1, 0x60002\n ld32 $m2, $m1, $m15, 0\n halt\n");
    assert_eq!(f.kind, FaultKind::Misaligned { addr: 0x60002, align: 4 });
}

#[test]
fn executing_from_region_1() {
    let f = fault_of("main:\n setzi $m1, 0x80000\n br $m1\n.org 0x80000\n halt\n");
    assert_eq!((f.pc, f.kind), (0x80000, FaultKind::FetchOutsideExecRegion));
    assert!(f.to_string().contains("instruction fetch outside executable region 0"), "{f}");
}

#[test]
fn worker_may_not_sync_and_rpt_is_bounded() {
    let f = fault_of("main:\n setzi $m0, w\n run $m0, $m0\n sync 2\n halt\nw:\n sync 3\n");
    assert_eq!((f.ctx, f.kind), (CtxId::Worker(0), FaultKind::WrongContext));
    let f = fault_of("main:\n setzi $m0, w\n run $m0, $m0\n sync 2\n halt\n.align 8\nw:\n setzi $m2, 4096\n rpt $m2, 1\n { nop ; fnop }\n exit\n");
    assert_eq!(f.kind, FaultKind::RptCount(4096));
    let f = fault_of("main:\n setzi $m0, w\n run $m0, $m0\n sync 2\n halt\n.align 8\nw:\n setzi $m2, 2\n rpt $m2, 1\n nop\n exit\n");
    assert_eq!(f.kind, FaultKind::RptBody);
    let f = fault_of("main:\n setzi $m0, w\n run $m0, $m0\n sync 2\n halt\n.align 8\nw:\n setzi $m2, 2\n nop\n rpt $m2, 1\n .word 0x81000000, 0xc0000000\n exit\n");
    // The assembler refuses a misaligned bundle, so the words are written by hand: `{ nop ; fnop }`.
    assert_eq!(f.kind, FaultKind::RptAlign);
}

#[test]
fn internal_sync_with_workers_running_faults() {
    let f = fault_of("main:\n setzi $m0, w\n run $m0, $m0\n sync 3\nw:\n bri w\n");
    assert_eq!((f.ctx, f.kind), (CtxId::Sup, FaultKind::WorkersRunning));
}

#[test]
fn undecodable_word() {
    let f = fault_of("main:\n .word 0\n");
    assert!(matches!(f.kind, FaultKind::Undecodable(_)));
    assert!(f.to_string().contains("undecodable instruction word 0x00000000"), "{f}");
}

#[test]
fn sync_that_can_never_complete_is_a_deadlock() {
    let a = program("main:\n sync 3\n halt\n");
    let b = program("main:\n sync 15\n halt\n");
    let mut dev = device(3, 1);
    load(&mut dev, 0, &a);
    load(&mut dev, 1, &a);
    load(&mut dev, 2, &b);
    let err = dev.run_to_host_sync().unwrap_err();
    assert_eq!(
        err.to_string(),
        "deadlock at cycle 0: tile 0 waits on sync zone 3 but tile 2 waits on the host sync (zone 15)"
    );
    let c = program("main:\n halt\n");
    let mut dev = device(2, 1);
    load(&mut dev, 0, &a);
    load(&mut dev, 1, &c);
    assert!(matches!(dev.run_to_host_sync(), Err(DeviceError::Deadlock { blocker: 1, .. })));
}

#[test]
fn endless_program_stops_at_the_cycle_budget() {
    let prog = program("main:\n bri main\n");
    let mut dev =
        ipu_host::sim::SimDevice::new(ipu_host::sim::SimConfig { tiles: 1, threads: 1, max_cycles: 10_000 })
            .unwrap();
    load(&mut dev, 0, &prog);
    let err = dev.run_to_host_sync().unwrap_err();
    assert!(matches!(err, DeviceError::Budget { budget: 10_000, tile: 0 }), "{err}");
}

#[test]
fn host_requests_outside_memory_are_refused() {
    let mut dev = device(2, 1);
    let err = dev.write_memory(1, 0xe7ffe, &[0; 4]).unwrap_err();
    assert_eq!(err.to_string(), "tile 1: 4 bytes at 0xe7ffe are outside tile memory 0x4c000..0xe8000");
    assert!(dev.write_memory(5, 0x4c000, &[0; 4]).is_err());
}

#[test]
fn run_with_no_free_worker_slot() {
    // docs/target.md §3: `runall` needs all six slots free; one running worker leaves it none.
    let f = fault_of("main:\n setzi $m0, w\n run $m0, $m0\n runall $m0, $m0\n halt\n.align 8\nw:\n bri w\n");
    assert_eq!((f.ctx, f.pc, f.kind), (CtxId::Sup, 0x4c008, FaultKind::NoFreeWorker));
    assert!(f.to_string().ends_with("no free worker slot"), "{f}");
    // With six workers running the supervisor cannot issue a seventh `run` at all (§3): it
    // stalls until a worker exits, so that program runs into the cycle budget instead.
    let src = format!("main:\n setzi $m0, w\n{}halt\n.align 8\nw:\n bri w\n", " run $m0, $m0\n".repeat(7));
    assert!(matches!(run_one(&src).2, Err(DeviceError::Budget { .. })));
}

#[test]
fn sync_on_an_undefined_zone() {
    for z in [0u32, 1, 4, 14] {
        let f = fault_of(&format!("main:\n sync {z}\n halt\n"));
        assert_eq!((f.ctx, f.pc, f.kind), (CtxId::Sup, 0x4c000, FaultKind::InvalidZone(z)), "zone {z}");
        assert!(f.to_string().ends_with(&format!("sync zone {z} is not defined by the model")), "{f}");
    }
}

#[test]
fn paired_send_is_refused() {
    // docs/target.md §5: the 64-bit pair path (`c & 4`) is not implemented: invalid instruction.
    let f = fault_of("main:\n send 1, data, 4\n halt\n.org 0x60000\ndata: .word 7\n");
    assert_eq!((f.ctx, f.pc, f.kind), (CtxId::Sup, 0x4c000, FaultKind::PairedSendUnsupported));
}

#[test]
fn misaligned_instruction_fetch() {
    let f = fault_of("main:\n setzi $m1, 0x4c102\n br $m1\n");
    assert_eq!((f.pc, f.kind), (0x4c102, FaultKind::FetchMisaligned));
    assert!(f.to_string().contains("misaligned instruction fetch"), "{f}");
}

#[test]
fn halt_with_workers_running() {
    let f = fault_of("main:\n setzi $m0, w\n run $m0, $m0\n halt\nw:\n bri w\n");
    assert_eq!((f.ctx, f.pc, f.kind), (CtxId::Sup, 0x4c008, FaultKind::WorkersRunning));
}

#[test]
fn weight_loads_are_aligned_in_memory_and_supervisor_only() {
    // `ldcweih` reads 256 bytes, 16-byte aligned (docs/target.md §4.4), as `ldcwei` reads 512.
    let f = fault_of("main:\n setzi $m1, 0x60008\n ldcweih $m1\n halt\n");
    assert_eq!(f.kind, FaultKind::Misaligned { addr: 0x60008, align: 16 });
    // The last 256 bytes of tile memory can be loaded by `ldcweih`, not by `ldcwei`.
    let last = ipu_core::target::TILE_MEM_END - 256;
    assert!(run_one(&format!("main:\n setzi $m1, {last:#x}\n ldcweih $m1\n sync 15\n halt\n")).2.is_ok());
    let f = fault_of(&format!("main:\n setzi $m1, {last:#x}\n ldcwei $m1\n halt\n"));
    assert_eq!(f.kind, FaultKind::OutOfRange { addr: last, len: 512 });
    let f = fault_of("main:\n setzi $m0, w\n run $m0, $m0\n sync 2\n halt\nw:\n ldcweih $m0\n exit\n");
    assert_eq!((f.ctx, f.kind), (CtxId::Worker(0), FaultKind::WrongContext));
}
