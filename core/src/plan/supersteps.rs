//! What each exchange superstep moves and how close its predicted cycles come to the fabric's
//! floor (issue #39 "Exchange at the fabric's rate"; docs/runtime.md "Superstep figures").
//!
//! A tile sends at most one word per cycle and takes at most one, so a superstep in which some
//! tile sends or receives `n` words takes at least `n` cycles however it is scheduled: that is its
//! floor. Every tile has one `Exchange` step per superstep (empty when it takes no part), the k-th
//! of each tile belonging to superstep k, whose predicted cycles are the plan's `horizons[k]`.

use alloc::string::String;
use alloc::vec::Vec;

use super::exchange::Event;
use super::{Step, Tiles};

/// One exchange superstep of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExchangeFigure {
    /// The phase the superstep belongs to (the last phase name before it on the first tile that
    /// takes part).
    pub phase: String,
    /// Bytes sent (a multicast counted once).
    pub bytes: u64,
    /// Predicted cycles from the release to the last landing.
    pub cycles: u64,
    /// The most words one tile sends or receives in it: no schedule takes fewer cycles.
    pub floor_words: u64,
}

/// The figures of every exchange superstep of a plan's `tiles`, in program order.
pub fn exchange_figures(tiles: &Tiles, horizons: &[u64]) -> Vec<ExchangeFigure> {
    let mut out: Vec<ExchangeFigure> = horizons
        .iter()
        .map(|&cycles| ExchangeFigure { phase: String::new(), bytes: 0, cycles, floor_words: 0 })
        .collect();
    for t in 0..tiles.len() {
        let mut k = 0usize;
        let mut phase: &str = "";
        for step in &tiles[t].steps {
            match step {
                Step::Phase(p) => phase = p.as_str(),
                Step::Exchange(events) => {
                    let Some(f) = out.get_mut(k) else { break };
                    let (mut sent, mut taken) = (0u64, 0u64);
                    for e in events {
                        match e {
                            Event::Send { words, .. } => sent += *words as u64,
                            Event::Expect(words) => taken += *words as u64,
                            _ => {}
                        }
                    }
                    f.bytes += 4 * sent;
                    f.floor_words = f.floor_words.max(sent).max(taken);
                    if f.phase.is_empty() && (sent > 0 || taken > 0) {
                        f.phase = phase.into();
                    }
                    k += 1;
                }
                _ => {}
            }
        }
    }
    out
}
