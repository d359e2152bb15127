//! The device interface shared by the simulator and the PCIe driver.

use ipu_core::tile::Fault;
use std::fmt;

/// How a run between host syncs ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopState {
    /// Every live tile waits on the host sync (zone 15); halted tiles stay halted.
    HostSync,
    /// Every tile has halted.
    Halted,
}

/// What a run between host syncs did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunReport {
    /// How it ended.
    pub state: StopState,
    /// Device cycle at the stop: the host-sync release cycle, or the last halt.
    pub cycle: u64,
    /// Cycles this run took (from its start to `cycle`).
    pub cycles: u64,
    /// Instructions (or bundles) issued by all tiles in this run.
    pub issued: u64,
    /// Internal syncs completed in this run.
    pub syncs: u64,
}

/// An exchange that the model rejects (docs/target.md §5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExchangeFault {
    /// A word no tile received.
    Lost {
        /// Sender.
        sender: u16,
        /// Cycle the word left.
        cycle: u64,
        /// Index of the word in the sender's stream this superstep.
        word: usize,
        /// The tile whose mux selected the sender nearest in time, if any.
        receiver: Option<u16>,
        /// That tile's arrival cycle for the word.
        arrival: u64,
        /// That tile's mux at the arrival cycle.
        mux_at_arrival: u32,
        /// The cycle from which that tile's mux selects the sender (if any, nearest).
        selects_from: Option<u64>,
    },
    /// A landing write outside tile memory.
    OutOfRange {
        /// Receiver.
        receiver: u16,
        /// Pointer.
        addr: u32,
        /// Arrival cycle.
        cycle: u64,
    },
    /// `$INCOMING_DCOUNT` not reached at the sync.
    Missing {
        /// Receiver.
        receiver: u16,
        /// Words still expected.
        expected: u32,
    },
    /// More words landed than `$INCOMING_DCOUNT` expected (the count would pass 0).
    Unexpected {
        /// Receiver.
        receiver: u16,
        /// Words beyond the expected count.
        extra: u32,
    },
    /// A word arriving after the sync that closes its superstep.
    Late {
        /// Sender.
        sender: u16,
        /// Receiver.
        receiver: u16,
        /// Arrival cycle.
        arrival: u64,
        /// Sync release cycle.
        release: u64,
    },
}

impl fmt::Display for ExchangeFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExchangeFault::Lost { sender, cycle, word, receiver, arrival, mux_at_arrival, selects_from } => {
                write!(f, "word {word} sent by tile {sender} at cycle {cycle} was received by no tile")?;
                if let Some(r) = receiver {
                    write!(f, "; it reached tile {r} at cycle {arrival} but tile {r}'s incoming mux selected {mux_at_arrival:#x}")?;
                    if let Some(c) = selects_from {
                        write!(f, " (it selects tile {sender} from cycle {c})")?;
                    }
                }
                Ok(())
            }
            ExchangeFault::OutOfRange { receiver, addr, cycle } => write!(
                f,
                "tile {receiver} received a word at cycle {cycle} for address {addr:#x} outside tile memory"
            ),
            ExchangeFault::Missing { receiver, expected } => {
                write!(f, "tile {receiver} expected {expected} more incoming words at the sync")
            }
            ExchangeFault::Unexpected { receiver, extra } => write!(
                f,
                "tile {receiver} received {extra} more words than its $INCOMING_DCOUNT expected before the sync"
            ),
            ExchangeFault::Late { sender, receiver, arrival, release } => write!(
                f,
                "word from tile {sender} reaches tile {receiver} at cycle {arrival}, after the sync released at {release}"
            ),
        }
    }
}

/// Errors of a device.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A tile faulted.
    #[error("tile fault: {0}")]
    Fault(Fault),
    /// The exchange was wrong.
    #[error("exchange fault: {0}")]
    Exchange(ExchangeFault),
    /// A sync that can never complete.
    #[error("deadlock at cycle {cycle}: tile {waiting} waits on sync zone {zone} but tile {blocker} {why}")]
    Deadlock {
        /// Device cycle.
        cycle: u64,
        /// A waiting tile.
        waiting: u16,
        /// Its zone.
        zone: u32,
        /// A tile that will never arrive.
        blocker: u16,
        /// What the blocker does instead.
        why: String,
    },
    /// The cycle budget ran out.
    #[error(
        "cycle budget of {budget} cycles exceeded (tile {tile} still running); raise it with --max-cycles"
    )]
    Budget {
        /// Budget.
        budget: u64,
        /// A tile still running.
        tile: u16,
    },
    /// A request the device cannot serve (bad tile, address, state).
    #[error("{0}")]
    Request(String),
    /// The device is absent or the OS refused.
    #[error("{0}")]
    Unavailable(String),
}

/// A device that runs application packages: the simulator or real hardware.
pub trait Device: Send {
    /// Human-readable name (`sim` or the device path).
    fn name(&self) -> String;
    /// Tiles available.
    fn tile_count(&self) -> usize;
    /// Replay a device configuration register write.
    fn write_config(&mut self, register: u32, value: u32) -> Result<(), DeviceError>;
    /// Load a tile image: segments `(address, bytes)` and the supervisor entry point.
    fn load_tile(&mut self, tile: u16, segments: &[(u32, &[u8])], entry: u32) -> Result<(), DeviceError>;
    /// Start, or release the host sync, and run until every tile waits on the host sync or halts.
    fn run_to_host_sync(&mut self) -> Result<RunReport, DeviceError>;
    /// Write tile memory while stopped at the host sync.
    fn write_memory(&mut self, tile: u16, addr: u32, data: &[u8]) -> Result<(), DeviceError>;
    /// Read tile memory while stopped at the host sync.
    fn read_memory(&mut self, tile: u16, addr: u32, out: &mut [u8]) -> Result<(), DeviceError>;
}
