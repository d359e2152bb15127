//! `ipu-codegen report`: one self-contained HTML file (no network references) with the package
//! summary, a 1472-tile memory heatmap, the BSP timeline (compute/sync/exchange/host per tile and
//! phase), the phase table and the top tiles by memory and by cycles. Tables are static HTML; the
//! heatmap and timeline are drawn by inline script from an embedded JSON blob that stores sample
//! durations only (samples of a tile are contiguous), which keeps the full chip well under 2 MB.

use super::table::{memory_total, table, GroupBy, Table};
use super::Profile;
use crate::package::Package;
use ipu_schema::SampleKind;
use std::fmt::Write;

/// Escape text for HTML.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn html_table(t: &Table, caption: &str) -> String {
    let mut s = format!("<table><caption>{}</caption><tr><th>{}</th>", esc(caption), esc(t.key));
    for c in &t.columns {
        let _ = write!(s, "<th>{}</th>", esc(c));
    }
    s.push_str("</tr>");
    for (label, vals) in &t.rows {
        let _ = write!(s, "<tr><td>{}</td>", esc(label));
        for (v, c) in vals.iter().zip(&t.columns) {
            let text = if c.ends_with('%') || *c == "mean" { format!("{v:.1}") } else { format!("{v:.0}") };
            let _ = write!(s, "<td>{text}</td>");
        }
        s.push_str("</tr>");
    }
    s.push_str("</table>");
    s
}

/// The data the script draws: per tile `[memory, first_start, phase, kind, dur, phase, kind, dur…]`.
fn data_json(p: &Profile) -> String {
    let mut s = String::with_capacity(p.sample_count() * 12 + 256);
    let _ = write!(
        s,
        "{{\"runCycles\":{},\"memLimit\":{},\"chipTiles\":{},\"phases\":{},\"kinds\":{},\"tiles\":[",
        p.run_cycles,
        ipu_core::target::TILE_MEM_SIZE,
        ipu_core::target::NUM_TILES,
        serde_json::to_string(&p.phases).unwrap_or_default(),
        serde_json::to_string(&SampleKind::ALL.iter().map(|k| k.name()).collect::<Vec<_>>())
            .unwrap_or_default()
    );
    for (i, t) in p.tiles.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let first = t.samples.first().map(|x| x.start.saturating_sub(p.run_start)).unwrap_or(0);
        let _ = write!(s, "[{},{}", memory_total(&t.memory), first);
        for x in &t.samples {
            let _ = write!(s, ",{},{},{}", x.phase, x.kind as u8, x.cycles());
        }
        s.push(']');
    }
    s.push_str("]}");
    // Inside <script>: never let the data close the element.
    s.replace("</", "<\\/")
}

/// Render the report.
pub fn render(p: &Profile, pkg: &Package, package_path: &str) -> String {
    let used = pkg.info.tiles_used;
    let mem_all: u64 = p.tiles.iter().map(|t| memory_total(&t.memory)).sum();
    let mem_max = p.tiles.iter().map(|t| memory_total(&t.memory)).max().unwrap_or(0);
    let mut summary = String::new();
    for (k, v) in [
        ("package", package_path.to_string()),
        ("package sha256", p.package_sha256.clone()),
        ("model", pkg.info.model.clone()),
        ("compiler", pkg.info.compiler.clone()),
        ("target", pkg.info.target.clone()),
        ("tiles used", format!("{used} of {}", pkg.tile_count)),
        ("device", p.device.clone()),
        (
            "run cycles (profiled)",
            format!("{} ({:.2} µs)", p.run_cycles, p.run_cycles as f64 / p.clock_hz as f64 * 1e6),
        ),
        ("predicted cycles", pkg.plan.predicted_cycles.to_string()),
        ("predicted exchange cycles", pkg.plan.predicted_exchange_cycles.to_string()),
        ("samples", p.sample_count().to_string()),
        (
            "memory (all tiles)",
            format!("{mem_all} bytes; largest tile {mem_max} of {} bytes", ipu_core::target::TILE_MEM_SIZE),
        ),
    ] {
        let _ = write!(summary, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(&v));
    }
    let phases = html_table(&table(p, GroupBy::Phase, None), "Where the cycles go, per phase (tile-cycles)");
    let kernels = html_table(&table(p, GroupBy::Kernel, None), "Kernels");
    let top_cycles = html_table(&table(p, GroupBy::Tile, Some(10)), "Top tiles by compute cycles");
    let mut by_mem: Vec<&super::TileProfile> = p.tiles.iter().collect();
    by_mem.sort_by(|a, b| memory_total(&b.memory).cmp(&memory_total(&a.memory)).then(a.tile.cmp(&b.tile)));
    let mem_rows = Table {
        key: "tile",
        columns: vec!["total", "code", "tensors", "descriptors", "exchange", "host", "profile"],
        rows: by_mem
            .iter()
            .take(10)
            .map(|t| {
                let m = &t.memory;
                let v = [m.code, m.tensors, m.descriptors, m.exchange, m.host, m.profile];
                let mut vals = vec![memory_total(m) as f64];
                vals.extend(v.iter().map(|&b| b as f64));
                (t.tile.to_string(), vals)
            })
            .collect(),
    };
    let top_mem = html_table(&mem_rows, "Top tiles by memory (bytes)");
    let (lo, hi) = memory_range(p);
    TEMPLATE
        .replace("{{TITLE}}", &esc(&format!("ipu-codegen report — {}", pkg.info.model)))
        .replace("{{SUMMARY}}", &summary)
        .replace("{{PHASES}}", &phases)
        .replace("{{KERNELS}}", &kernels)
        .replace("{{TOP_CYCLES}}", &top_cycles)
        .replace("{{TOP_MEM}}", &top_mem)
        .replace("{{HEAT_LEGEND}}", &heat_legend(lo, hi))
        .replace("{{DATA}}", &data_json(p).replacen('{', &format!("{{\"memLo\":{lo},\"memHi\":{hi},"), 1))
}

/// The smallest and largest memory of the target's tiles: the heatmap's colour scale spans this
/// range, so a chip filled to 6% is as readable as one filled to 90%.
pub fn memory_range(p: &Profile) -> (u64, u64) {
    let used = p.tiles.iter().map(|t| memory_total(&t.memory));
    let lo = used.clone().min().unwrap_or(0);
    let hi = used.max().unwrap_or(0).max(lo + 1);
    (lo, hi)
}

/// The heatmap legend: a gradient from the least to the most filled tile, both labelled with bytes
/// and the share of the 624 KiB tile; the grey of tiles outside the target is labelled too.
pub fn heat_legend(lo: u64, hi: u64) -> String {
    let size = ipu_core::target::TILE_MEM_SIZE as f64;
    let pct = |b: u64| 100.0 * b as f64 / size;
    format!(
        "<span>colour scale: <b>{lo}</b> bytes ({:.1}% of a tile) \
         <i class=\"grad\" style=\"background:linear-gradient(to right,rgb(247,251,255),rgb(66,133,244),rgb(120,20,30))\"></i> \
         <b>{hi}</b> bytes ({:.1}%)</span><span><i style=\"background:#e4e6ea\"></i>not in target</span>",
        pct(lo),
        pct(hi)
    )
}

const TEMPLATE: &str = include_str!("report.html");
