//! `inspect`: what a package holds — tiles used, memory per tile by kind, sections, bindings, calls.

use crate::package::Package;
use ipu_schema::{read_container, Direction};

/// A package summary: text, or one JSON object on one line.
pub fn render(pkg: &Package, bytes: &[u8], json: bool) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let (_, sections) = read_container(bytes).expect("validated by the caller");
    let mem = &pkg.plan.memory;
    let total = |f: fn(&ipu_schema::TileMemory) -> u32| mem.iter().map(|m| f(m) as u64).sum::<u64>();
    let size = crate::profile::table::memory_total;
    // A tile's peak: the bytes its image occupies (segments are disjoint; buffers with disjoint
    // lifetimes share bytes, so this can be less than the sum by kind).
    let occupied =
        |t: usize| pkg.tiles.get(t).map_or(0, |im| im.segments.iter().map(|s| s.len as u64).sum::<u64>());
    let max_tile = (0..mem.len())
        .max_by_key(|&i| (occupied(i), usize::MAX - i))
        .map(|i| (i, occupied(i)))
        .unwrap_or((0, 0));
    let kinds = |m: &ipu_schema::TileMemory| {
        format!(
            "code {} tensors {} descriptors {} exchange {} host {} profile {}",
            m.code, m.tensors, m.descriptors, m.exchange, m.host, m.profile
        )
    };
    // Params are tensor memory whose values came with the package: their bytes per tile, from the
    // param bindings' slices.
    let mut params = vec![0u64; pkg.tiles.len()];
    for b in pkg.bindings.iter().filter(|b| b.direction == Direction::Param) {
        for s in &b.slices {
            if let Some(p) = params.get_mut(s.tile as usize) {
                *p += s.rows as u64 * s.row_bytes as u64;
            }
        }
    }
    let params_total: u64 = params.iter().sum();
    let params_max =
        params.iter().enumerate().max_by_key(|(i, b)| (**b, usize::MAX - i)).map(|(i, b)| (i, *b));
    let samples = |p: &ipu_schema::ProfilePlan| p.tiles.iter().map(|t| t.samples.len()).sum::<usize>();
    let code = code_by_kind(mem);
    let distinct_images = ipu_schema::share_images(&pkg.tiles).len();
    if json {
        let v = serde_json::json!({
            "model": pkg.info.model,
            "compiler": pkg.info.compiler,
            "tile_count": pkg.tile_count,
            "tiles_used": pkg.info.tiles_used,
            "predicted_cycles": pkg.plan.predicted_cycles,
            "memory_bytes": {"code": total(|m| m.code), "tensors": total(|m| m.tensors), "params": params_total,
                "descriptors": total(|m| m.descriptors), "exchange": total(|m| m.exchange), "host": total(|m| m.host),
                "profile": total(|m| m.profile)},
            "code_bytes_per_tile": code.iter().map(|(kind, max, tile, mean)| (kind.to_string(),
                serde_json::json!({"max": max, "max_tile": tile, "mean": mean}))).collect::<serde_json::Map<_, _>>(),
            "distinct_tile_images": distinct_images,
            "profile_plan": pkg.plan.profile.as_ref().map(|p| serde_json::json!({"phases": p.phases,
                "kernels": p.kernels, "samples": samples(p)})),
            "largest_tile": {"tile": max_tile.0, "bytes": max_tile.1, "by_kind": mem.get(max_tile.0).map(|m| serde_json::json!({
                "code": m.code, "tensors": m.tensors, "params": params.get(max_tile.0), "descriptors": m.descriptors,
                "exchange": m.exchange, "host": m.host, "profile": m.profile, "sum": size(m)}))},
            "largest_params_tile": params_max.map(|(t, b)| serde_json::json!({"tile": t, "bytes": b})),
            "sections": sections.iter().map(|(k, b)| serde_json::json!({"kind": k.name(), "bytes": b.len()})).collect::<Vec<_>>(),
            "bindings": pkg.bindings.iter().map(|b| serde_json::json!({"name": b.name, "dtype": b.dtype.name(),
                "shape": b.shape, "direction": direction(b.direction).trim(),
                "slices": b.slices.len()})).collect::<Vec<_>>(),
            "calls": pkg.host.calls.iter().map(|c| serde_json::json!({"name": c.name, "command": c.command, "phases": c.phases})).collect::<Vec<_>>(),
        });
        return format!("{v}\n");
    }
    let _ = writeln!(
        out,
        "model {} (compiler {}), target {} tiles, {} used",
        pkg.info.model, pkg.info.compiler, pkg.tile_count, pkg.info.tiles_used
    );
    let _ = writeln!(out, "predicted cycles per run call: {}", pkg.plan.predicted_cycles);
    let _ = writeln!(
        out,
        "memory over all tiles (bytes): code={} tensors={} (params {params_total}) descriptors={} exchange={} host={} profile={}",
        total(|m| m.code),
        total(|m| m.tensors),
        total(|m| m.descriptors),
        total(|m| m.exchange),
        total(|m| m.host),
        total(|m| m.profile)
    );
    let _ =
        writeln!(out, "code bytes per tile (max on tile / mean), {distinct_images} distinct tile images:");
    for (kind, max, tile, mean) in &code {
        let _ = writeln!(out, "  {kind:<9} {max:>7} on tile {tile:<5} mean {mean:>9.1}");
    }
    match &pkg.plan.profile {
        Some(p) => {
            let _ = writeln!(out, "profile plan: {} samples, phases {}", samples(p), p.phases.join(", "));
        }
        None => {
            let _ = writeln!(out, "profile plan: none (build with --profile to profile runs)");
        }
    }
    let _ = writeln!(out, "largest tile: {} with {} bytes of 638976 at its peak", max_tile.0, max_tile.1);
    if let Some(m) = mem.get(max_tile.0) {
        let shared = size(m).saturating_sub(max_tile.1);
        let _ = writeln!(
            out,
            "  by kind: {} (params {}); {shared} bytes shared by buffers whose lifetimes do not overlap",
            kinds(m),
            params.get(max_tile.0).copied().unwrap_or(0)
        );
    }
    if let Some((t, b)) = params_max.filter(|p| p.1 > 0) {
        let _ = writeln!(
            out,
            "most params on one tile: {b} bytes on tile {t} (resident, loaded with the program)"
        );
    }
    let _ = writeln!(out, "sections:");
    for (k, b) in &sections {
        let _ = writeln!(out, "  {:<14} {:>10} bytes", k.name(), b.len());
    }
    let _ = writeln!(out, "bindings:");
    for b in &pkg.bindings {
        let dir = direction(b.direction);
        let t = if b.transpose { " transposed" } else { "" };
        let _ = writeln!(
            out,
            "  {dir} {:<12} {} {:?} slices={}{t}",
            b.name,
            b.dtype.name(),
            b.shape,
            b.slices.len()
        );
    }
    let _ = writeln!(out, "calls:");
    for c in &pkg.host.calls {
        let _ = writeln!(out, "  {} command={} phases={}", c.name, c.command, c.phases);
    }
    out
}

/// A binding's direction as `inspect` prints it (padded to one width).
fn direction(d: Direction) -> &'static str {
    match d {
        Direction::Input => "input ",
        Direction::Output => "output",
        Direction::Param => "param ",
    }
}

/// One figure of a tile's memory.
type Field = fn(&ipu_schema::TileMemory) -> u32;

/// Per kind of code (all, runtime, kernels, launches, exchange): the largest per-tile figure, the
/// first tile that has it, and the mean over tiles.
fn code_by_kind(mem: &[ipu_schema::TileMemory]) -> Vec<(&'static str, u32, usize, f64)> {
    let kinds: [(&str, Field); 5] = [
        ("all", |m| m.code),
        ("runtime", |m| m.code_runtime),
        ("kernels", |m| m.code_kernels),
        ("launches", |m| m.code_launches),
        ("exchange", |m| m.code_exchange),
    ];
    kinds
        .iter()
        .map(|(name, f)| {
            let (tile, max) = mem
                .iter()
                .enumerate()
                .map(|(t, m)| (t, f(m)))
                .max_by_key(|&(t, v)| (v, usize::MAX - t))
                .unwrap_or((0, 0));
            let mean = mem.iter().map(|m| f(m) as f64).sum::<f64>() / mem.len().max(1) as f64;
            (*name, max, tile, mean)
        })
        .collect()
}
