//! `ipu-codegen profile`: where the cycles go, as text tables or JSON, grouped by phase, kernel or
//! tile. Tile-cycles are summed over tiles (a phase on 64 tiles for 100 cycles is 6,400
//! tile-cycles); `span` is the wall-clock extent of a phase (first start to last end on any tile).

use super::{Profile, Sample};
use ipu_schema::{SampleKind, TileMemory};
use std::collections::BTreeMap;
use std::fmt::Write;

/// How to group the samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupBy {
    /// Per phase (op).
    Phase,
    /// Per kernel (compute samples only).
    Kernel,
    /// Per tile, busiest first.
    Tile,
}

/// A table: column names and rows of (label, numbers).
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// Label column name.
    pub key: &'static str,
    /// Number column names.
    pub columns: Vec<&'static str>,
    /// Rows.
    pub rows: Vec<(String, Vec<f64>)>,
}

/// Tile-cycles by kind, in `SampleKind::ALL` order.
fn by_kind<'a>(samples: impl Iterator<Item = &'a Sample>) -> [u64; 4] {
    let mut out = [0u64; 4];
    for s in samples {
        out[s.kind as usize] += s.cycles();
    }
    out
}

/// Total bytes of a tile's memory.
pub fn memory_total(m: &TileMemory) -> u64 {
    [m.code, m.tensors, m.descriptors, m.exchange, m.host, m.profile].iter().map(|&b| u64::from(b)).sum()
}

/// Default rows when grouping by tile.
pub const DEFAULT_TOP_TILES: usize = 20;

/// Build the table for a grouping. `top` keeps the busiest rows of a tile table (default
/// [`DEFAULT_TOP_TILES`]) or kernel table (default all); phase tables list every phase.
pub fn table(p: &Profile, group: GroupBy, top: Option<usize>) -> Table {
    match group {
        GroupBy::Phase => {
            // Shares in `SampleKind::ALL` order, as `by_kind` returns them.
            let columns = vec!["span", "tile_cycles", "compute_%", "sync_%", "exchange_%", "host_%"];
            let rows = (0..p.phases.len())
                .filter_map(|ph| {
                    let all =
                        || p.tiles.iter().flat_map(|t| &t.samples).filter(move |s| s.phase as usize == ph);
                    let start = all().map(|s| s.start).min()?;
                    let end = all().map(|s| s.end).max()?;
                    let k = by_kind(all());
                    let total: u64 = k.iter().sum();
                    let mut v = vec![(end - start) as f64, total as f64];
                    v.extend(k.iter().map(|&c| pct(c, total)));
                    Some((p.phases[ph].clone(), v))
                })
                .collect();
            Table { key: "phase", columns, rows }
        }
        GroupBy::Kernel => {
            let mut per: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new(); // launches, cycles, max
            for s in p.tiles.iter().flat_map(|t| &t.samples).filter(|s| s.kind == SampleKind::Compute) {
                let name = p.kernel_name(s).unwrap_or("(set-up)").to_string();
                let e = per.entry(name).or_default();
                e.0 += 1;
                e.1 += s.cycles();
                e.2 = e.2.max(s.cycles());
            }
            let all: u64 = per.values().map(|v| v.1).sum();
            let mut rows: Vec<(String, Vec<f64>)> = per
                .into_iter()
                .map(|(k, (n, c, mx))| {
                    (k, vec![n as f64, c as f64, c as f64 / n as f64, mx as f64, pct(c, all)])
                })
                .collect();
            rows.sort_by(|a, b| b.1[1].total_cmp(&a.1[1]).then(a.0.cmp(&b.0)));
            rows.truncate(top.unwrap_or(usize::MAX));
            Table {
                key: "kernel",
                columns: vec!["launches", "tile_cycles", "mean", "max", "compute_%"],
                rows,
            }
        }
        GroupBy::Tile => {
            let mut rows: Vec<(u64, String, Vec<f64>)> = p
                .tiles
                .iter()
                .map(|t| {
                    let k = by_kind(t.samples.iter());
                    let mut v: Vec<f64> = k.iter().map(|&c| c as f64).collect();
                    v.push(memory_total(&t.memory) as f64);
                    (k[SampleKind::Compute as usize], t.tile.to_string(), v)
                })
                .collect();
            rows.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.parse::<u32>().ok().cmp(&b.1.parse::<u32>().ok())));
            let mut columns: Vec<&'static str> = SampleKind::ALL.iter().map(|k| k.name()).collect();
            columns.push("memory_bytes");
            Table {
                key: "tile",
                columns,
                rows: rows
                    .into_iter()
                    .take(top.unwrap_or(DEFAULT_TOP_TILES))
                    .map(|(_, k, v)| (k, v))
                    .collect(),
            }
        }
    }
}

fn pct(part: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        (1000.0 * part as f64 / total as f64).round() / 10.0
    }
}

/// The heading line: what was profiled.
pub fn heading(p: &Profile) -> String {
    format!(
        "profile package={} device={} tiles={} samples={} iteration={} run_cycles={} ({:.2} µs at {:.2} GHz)",
        p.package,
        p.device,
        p.tiles.len(),
        p.sample_count(),
        p.iteration,
        p.run_cycles,
        p.run_cycles as f64 / p.clock_hz as f64 * 1e6,
        p.clock_hz as f64 / 1e9
    )
}

/// Render as aligned text.
pub fn render_text(p: &Profile, t: &Table) -> String {
    let mut out = heading(p);
    out.push('\n');
    let cell = |v: f64, col: &str| {
        if col.ends_with('%') || col == "mean" {
            format!("{v:.1}")
        } else {
            format!("{v:.0}")
        }
    };
    let width0 = t.rows.iter().map(|r| r.0.len()).chain([t.key.len()]).max().unwrap_or(0);
    let widths: Vec<usize> = t
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| t.rows.iter().map(|r| cell(r.1[i], c).len()).chain([c.len()]).max().unwrap_or(0))
        .collect();
    let _ = write!(out, "{:<width0$}", t.key);
    for (c, w) in t.columns.iter().zip(&widths) {
        let _ = write!(out, "  {c:>w$}");
    }
    out.push('\n');
    for (label, vals) in &t.rows {
        let _ = write!(out, "{label:<width0$}");
        for ((v, c), w) in vals.iter().zip(&t.columns).zip(&widths) {
            let _ = write!(out, "  {:>w$}", cell(*v, c));
        }
        out.push('\n');
    }
    out
}

/// Render as one JSON object.
pub fn render_json(p: &Profile, t: &Table) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = t
        .rows
        .iter()
        .map(|(label, vals)| {
            let mut o = serde_json::Map::new();
            o.insert(t.key.into(), label.clone().into());
            for (c, v) in t.columns.iter().zip(vals) {
                o.insert((*c).into(), (*v).into());
            }
            serde_json::Value::Object(o)
        })
        .collect();
    serde_json::json!({
        "package": p.package,
        "device": p.device,
        "tiles": p.tiles.len(),
        "samples": p.sample_count(),
        "run_cycles": p.run_cycles,
        "clock_hz": p.clock_hz,
        "group_by": t.key,
        "rows": rows,
    })
}
