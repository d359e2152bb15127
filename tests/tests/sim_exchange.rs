//! Cycle-exact exchange: a word lands only if the receiver's mux selects the sender when it
//! arrives (docs/target.md §5).

mod common;
use common::*;
use ipu_host::sim::SimDevice;
use ipu_host::{Device, DeviceError, ExchangeFault, StopState};

fn two_tiles(mux_delay: u32, drain: u32) -> (SimDevice, Result<ipu_host::RunReport, DeviceError>) {
    let tx = program(&include_str!("../programs/exch_sender.s").replace("DRAIN", &drain.to_string()));
    let rx = program(&format!(".equ MUXDELAY, {mux_delay}\n{}", include_str!("../programs/exch_receiver.s")));
    let mut dev = device(2, 1);
    load(&mut dev, 0, &tx);
    load(&mut dev, 1, &rx);
    let r = dev.run_to_host_sync();
    (dev, r)
}

#[test]
fn two_tile_exchange_lands_when_mux_is_exact() {
    assert_eq!(ipu_core::topology::latency(0, 1), 13);
    let (mut dev, r) = two_tiles(10, 1);
    let r = r.expect("runs");
    // Sender: send@91 (4), delay@95 (1), sync@96. Receiver: setzi@90, put@91 ($INCOMING_DCOUNT),
    // setzi@92, put@93, delayxpic@94 (11), sync@105. Release 105 + 90 = 195; sync 15 @195 on
    // both, release 285.
    assert_eq!(r.cycle, 285);
    assert_eq!(r.syncs, 2);
    let buf = 0x60000;
    assert_eq!(
        read(&mut dev, 1, buf, 16),
        [0x11u8; 4].iter().chain(&[0x22; 4]).chain(&[0x33; 4]).chain(&[0x44; 4]).copied().collect::<Vec<_>>()
    );
}

#[test]
fn mux_set_one_cycle_late_is_an_exchange_fault() {
    let (_, r) = two_tiles(11, 1);
    let err = r.unwrap_err();
    match &err {
        DeviceError::Exchange(ExchangeFault::Lost {
            sender: 0,
            cycle: 91,
            word: 0,
            receiver: Some(1),
            arrival: 104,
            mux_at_arrival: 0x640,
            selects_from: Some(105),
        }) => {}
        other => panic!("unexpected: {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "exchange fault: word 0 sent by tile 0 at cycle 91 was received by no tile; it reached tile 1 at \
         cycle 104 but tile 1's incoming mux selected 0x640 (it selects tile 0 from cycle 105)"
    );
}

#[test]
fn landing_write_outside_tile_memory_is_an_exchange_fault() {
    // Four words from 0xe7ff8: the third would be written at 0xe8000, the end of tile memory. It
    // arrives at 91 + 2 + 13 = 106.
    let tx = program(&include_str!("../programs/exch_sender.s").replace("DRAIN", "1"));
    let rx_src = format!(".equ MUXDELAY, 10\n{}", include_str!("../programs/exch_receiver.s"))
        .replace("setzi $m1, buf", "setzi $m1, 0xe7ff8");
    let rx = program(&rx_src);
    let mut dev = device(2, 1);
    load(&mut dev, 0, &tx);
    load(&mut dev, 1, &rx);
    let err = dev.run_to_host_sync().unwrap_err();
    assert!(
        matches!(
            err,
            DeviceError::Exchange(ExchangeFault::OutOfRange { receiver: 1, addr: 0xe8000, cycle: 106 })
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "exchange fault: tile 1 received a word at cycle 106 for address 0xe8000 outside tile memory"
    );
}

#[test]
fn words_landing_on_a_tile_that_expects_none_fault_at_the_sync() {
    // docs/target.md §5: the count is 0 after every sync, so receiving without setting it faults.
    let tx = program(&include_str!("../programs/exch_sender.s").replace("DRAIN", "1"));
    let rx_src = format!(".equ MUXDELAY, 10\n{}", include_str!("../programs/exch_receiver.s"))
        .replace("    setzi $m2, 4\n    put 0xa6, $m2\n", "");
    assert!(!rx_src.contains("0xa6"), "the count must be gone from the program");
    let mut dev = device(2, 1);
    load(&mut dev, 0, &tx);
    load(&mut dev, 1, &program(&rx_src));
    let err = dev.run_to_host_sync().unwrap_err();
    assert!(
        matches!(err, DeviceError::Exchange(ExchangeFault::Unexpected { receiver: 1, extra: 4 })),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "exchange fault: tile 1 received 4 more words than its $INCOMING_DCOUNT expected before the sync"
    );
    // Expecting fewer than arrive is the same fault.
    let rx_src = format!(".equ MUXDELAY, 10\n{}", include_str!("../programs/exch_receiver.s"))
        .replace("setzi $m2, 4", "setzi $m2, 3");
    let mut dev = device(2, 1);
    load(&mut dev, 0, &tx);
    load(&mut dev, 1, &program(&rx_src));
    let err = dev.run_to_host_sync().unwrap_err();
    assert!(
        matches!(err, DeviceError::Exchange(ExchangeFault::Unexpected { receiver: 1, extra: 1 })),
        "{err}"
    );
}

const BROADCAST_TX: &str = "
main:
    sync 3
    setzi $m1, data
    delay 20
    send 8, data, 1
    delay DRAIN
    sync 3
    sync 15
    halt
.org 0x60000
data: .word 1, 2, 3, 4, 5, 6, 7, 8
";

const BROADCAST_RX: &str = "
main:
    sync 3
    setzi $m1, buf
    put 0xa4, $m1
    setzi $m2, 0
    put 0xa0, $m2
    setzi $m3, 8
    put 0xa6, $m3
    sync 3
    sync 15
    halt
.org 0x60000
buf: .space 32
";

fn broadcast(
    tiles: usize,
    threads: usize,
    drain: u32,
    expect: u32,
) -> Result<(SimDevice, ipu_host::RunReport), DeviceError> {
    let tx = program(&BROADCAST_TX.replace("DRAIN", &drain.to_string()));
    let rx = program(&BROADCAST_RX.replace("setzi $m3, 8", &format!("setzi $m3, {expect}")));
    let mut dev = device(tiles, threads);
    load(&mut dev, 0, &tx);
    for t in 1..tiles {
        load(&mut dev, t as u16, &rx);
    }
    let r = dev.run_to_host_sync()?;
    Ok((dev, r))
}

#[test]
fn broadcast_to_the_whole_chip() {
    // send@111..118, delay 150 @119, sync 3 @269 -> release 359; sync 15 @359 -> 449.
    let (mut dev, r) = broadcast(1472, 0, 150, 8).expect("runs");
    assert_eq!((r.state, r.cycle), (StopState::HostSync, 449));
    assert_eq!(dev.exchanged_words, 8 * 1471);
    let expected: Vec<u8> = (1..=8u32).flat_map(|v| v.to_le_bytes()).collect();
    for t in [1u16, 2, 63, 700, 1471] {
        assert_eq!(read(&mut dev, t, 0x60000, 32), expected, "tile {t}");
    }
}

#[test]
fn words_arriving_after_the_closing_sync_are_rejected() {
    // Without the drain delay the sender syncs at 120 and the sync releases at 210, before the
    // words reach the far side of the chip (latency up to 147).
    let err = broadcast(1472, 0, 1, 8).unwrap_err();
    assert!(
        matches!(err, DeviceError::Exchange(ExchangeFault::Late { sender: 0, release: 210, .. })),
        "{err}"
    );
}

#[test]
fn expected_word_count_is_checked_at_the_sync() {
    let err = broadcast(4, 1, 150, 9).unwrap_err();
    assert_eq!(err.to_string(), "exchange fault: tile 1 expected 1 more incoming words at the sync");
}

#[test]
fn same_results_and_cycles_for_one_and_two_threads() {
    let (mut d1, r1) = broadcast(256, 1, 150, 8).unwrap();
    let (mut d2, r2) = broadcast(256, 2, 150, 8).unwrap();
    assert_eq!(r1, r2);
    for t in 0..256u16 {
        assert_eq!(read(&mut d1, t, 0x4c000, 0x20000), read(&mut d2, t, 0x4c000, 0x20000), "tile {t}");
        assert_eq!(d1.tile(t).issued, d2.tile(t).issued);
    }
}
