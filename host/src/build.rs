//! `build`: model → plan → tile code → linked images → package (docs/architecture.md).
//! Phases are tracing spans named as in the seed log; each ends with
//! `package build phase finished phase=… elapsed_ms=… success=…`.

use crate::model::{self, ModelError};
use crate::package::Package;
use ipu_core::plan::chain::SideCast;
use ipu_core::plan::{self, PlanOptions};
use ipu_linker::{link, LinkError, Linked};
use ipu_schema::{Binding, BuildInfo, Call, HostExchange, PlanSummary, Slice, Symbol};
use rayon::prelude::*;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::time::Instant;
use tracing::{info, info_span, warn};

/// Build settings.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// Target tiles.
    pub tiles: usize,
    /// Host threads for the parallel phases (0 = all cores).
    pub threads: usize,
    /// Force a tile grid `[tm, tn, tk]` for the (single) op.
    pub grid: Option<[u32; 3]>,
    /// Candidates the search evaluates beyond the baseline (0 = baseline only).
    pub search_attempts: u32,
    /// Where to save (and from where to resume) the search state.
    pub search_state: Option<std::path::PathBuf>,
    /// Carry a profile plan: the runtime stores cycle stamps for `run --profile` (docs/profile.md).
    pub profile: bool,
    /// Force the placement of side-operand casts (row chains); `None`: the search chooses.
    pub side_cast: Option<SideCast>,
    /// Force the column groups of a row chain's final matmul; `None`: the search chooses.
    pub column_groups: Option<u32>,
    /// Emit runs of kernel launches as supervisor loops (`ipu_runtime_tile::launch_loop`); off,
    /// as straight-line code — the same cycles, more code (for tests that compare the two).
    pub launch_loops: bool,
    /// Write each distinct tile program's assembly to this directory as `tile{N}.s`.
    pub emit_asm: Option<std::path::PathBuf>,
}

impl BuildOptions {
    /// Defaults for `tiles` tiles: all threads, no forced grid, the default search.
    pub fn new(tiles: usize) -> Self {
        BuildOptions {
            tiles,
            threads: 0,
            grid: None,
            search_attempts: DEFAULT_SEARCH_ATTEMPTS,
            search_state: None,
            profile: false,
            side_cast: None,
            column_groups: None,
            launch_loops: true,
            emit_asm: None,
        }
    }
}

/// Default number of search attempts.
pub const DEFAULT_SEARCH_ATTEMPTS: u32 = 16;

/// What a build produced.
#[derive(Clone, Debug)]
pub struct Built {
    /// The package.
    pub package: Package,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// SHA-256 of the bytes, hex.
    pub sha256: String,
    /// Milliseconds per phase, in order.
    pub timings: Vec<(&'static str, u128)>,
    /// Each exchange superstep's bytes, predicted cycles and floor, in program order.
    pub exchanges: Vec<plan::supersteps::ExchangeFigure>,
}

/// Build failures.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The model file.
    #[error("{0}")]
    Model(#[from] ModelError),
    /// Planning: `file:line: op N (kind): …` where the refusal concerns one op.
    #[error("{0}")]
    Plan(String),
    /// Linking.
    #[error("{0}")]
    Link(#[from] LinkError),
    /// Settings.
    #[error("{0}")]
    Options(String),
}

/// A link refusal as a person reads it: a buffer the stage planner made carries its stage's tag,
/// so the message names the stage's first op (`plan::stage_op`), as the planner's refusals do.
/// The planner checks each tile's peak of live bytes; the linker must also find one free range
/// for each buffer, which can fail when the tile's free space is split.
fn link_error_message(
    file: &str,
    src: &str,
    g: &ipu_core::graph::Graph,
    plan: &plan::Plan,
    err: &LinkError,
) -> String {
    if let LinkError::CodeTooLarge(t, bytes) = err {
        return format!("{file}: {err}{}", code_by_phase(plan, *t, *bytes));
    }
    let LinkError::NoSpace { buffer, peak, room, code, .. } = err else { return err.to_string() };
    let why = if *peak > *room as u64 && *code as u64 > plan::RUNTIME_RESERVE {
        format!(
            ": the planner kept {} bytes for code and this tile's code takes more (fewer exchange \
             pieces or launches on it, or more tiles, leave room)",
            plan::RUNTIME_RESERVE
        )
    } else if *peak > *room as u64 {
        ": the tile's buffers at their peak take more than the room beside its code and the host \
         area (more tiles, or fewer ops kept live across this stage, leave room)"
            .to_string()
    } else {
        ": the stage's buffers fit the tile by size but not in one free range each (more tiles, or \
         fewer ops kept live across this stage, leave room)"
            .to_string()
    };
    match plan::stage_op(g, buffer) {
        Some((i, _)) => format!("{}: {err}{why}", op_location(file, src, g, i)),
        None => format!("{file}: {err}{why}"),
    }
}

/// The phases that take most of a tile's code (bytes shared out by their lines of code; the
/// supervisor code is straight-line, one sequence per kernel launch and exchange event).
fn code_by_phase(plan: &plan::Plan, tile: u16, bytes: u32) -> String {
    if tile as usize >= plan.tiles.len() {
        return String::new();
    }
    let t = &plan.tiles[tile as usize];
    let mut parts = ipu_runtime_tile::runtime::phase_code_lines(t);
    let total: usize = parts.iter().map(|p| p.1).sum();
    if total == 0 {
        return String::new();
    }
    parts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let list: Vec<String> = parts
        .iter()
        .take(4)
        .map(|(p, n)| format!("`{p}` ≈ {} bytes", *n as u64 * bytes as u64 / total as u64))
        .collect();
    format!(
        "; the largest parts: {} (supervisor code is one straight sequence per kernel launch and \
         exchange event of the tile: fewer launches or exchange pieces on it make it smaller)",
        list.join(", ")
    )
}

/// Where op `i` is, as the parser's errors say it: `file:line: op i (kind)`.
fn op_location(file: &str, src: &str, g: &ipu_core::graph::Graph, i: usize) -> String {
    let line = crate::model::op_lines(src).get(i).copied().unwrap_or(0);
    let kind = plan::op_phase(g, i);
    let kind = kind.split(' ').next().unwrap_or("op");
    format!("{file}:{line}: op {i} ({kind})")
}

/// A planner refusal as a person reads it: the model file, the line of the op concerned and its
/// kind, as the parser's errors have them. Memory refusals name the op that defines the tensor.
pub fn plan_error_message(
    file: &str,
    src: &str,
    g: &ipu_core::graph::Graph,
    err: &plan::PlanError,
) -> String {
    let at = |i: usize| op_location(file, src, g, i);
    match err {
        plan::PlanError::Unsupported(i, w) => format!("{}: {w}", at(*i)),
        plan::PlanError::NoRoom { tile, op, needed, free, held } => {
            format!("{}: {}", at(*op), plan::no_room(*tile, *needed, *free, held))
        }
        plan::PlanError::Memory { tile, buffer, over } => {
            let name = buffer.strip_prefix("tensor `").and_then(|b| b.strip_suffix('`'));
            let op = name.and_then(|n| g.ops.iter().position(|o| g.tensor(o.output).name == n));
            let what = format!("tile {tile}: {buffer} does not fit in tile memory ({over} bytes over)");
            match op {
                Some(i) => format!("{}: {what}", at(i)),
                None => format!("{file}: {what}"),
            }
        }
        plan::PlanError::OverBudget { .. } => format!("{file}: {err}"),
    }
}

/// Configuration writes replayed before loading: enable the host sync groups GS1 and GS2
/// (FS §8: HSP_GS1_CONTROL 0x302C, HSP_GS2_CONTROL 0x3030).
const CONFIG_WRITES: [(u32, u32); 2] = [(0x302C, 1), (0x3030, 1)];

fn phase<T>(name: &'static str, timings: &mut Vec<(&'static str, u128)>, f: impl FnOnce() -> T) -> T {
    let span = info_span!("ipu_codegen.package.phase", phase = name);
    let _g = span.enter();
    let start = Instant::now();
    let out = f();
    let ms = start.elapsed().as_millis();
    info!(phase = name, elapsed_ms = ms as u64, success = true, "package build phase finished");
    timings.push((name, ms));
    out
}

/// Build a package from model text. `file` names the model in messages.
pub fn build(file: &str, src: &str, opts: &BuildOptions) -> Result<Built, BuildError> {
    build_model(file, src, None, opts)
}

/// Build a package from model text whose param values are given (`Some`: an imported model,
/// docs/onnx.md) or read from the files the model names (`None`).
pub fn build_model(
    file: &str,
    src: &str,
    given: Option<BTreeMap<String, crate::reference::HostTensor>>,
    opts: &BuildOptions,
) -> Result<Built, BuildError> {
    if opts.tiles == 0 || opts.tiles > ipu_core::target::NUM_TILES {
        return Err(BuildError::Options(format!("--tiles {} not in 1..=1472", opts.tiles)));
    }
    let graph = model::parse(file, src)?;
    for &t in graph.inputs.iter().chain(&graph.params) {
        if !graph.is_read(t) {
            let kind = if graph.params.contains(&t) { "param" } else { "input" };
            warn!("{kind} `{}` is read by no op: it is not placed on the chip", graph.tensor(t).name);
        }
    }
    // Params are read before planning, so a missing or mismatched file fails fast.
    let model_dir = std::path::Path::new(file).parent().unwrap_or(std::path::Path::new("."));
    let param_values = match given {
        Some(values) => crate::params::from_values(&graph, values),
        None => crate::params::load(file, model_dir, &graph, &model::param_specs(src)),
    }
    .map_err(BuildError::Options)?;
    if !param_values.is_empty() {
        let bytes: u64 = graph
            .params
            .iter()
            .map(|p| graph.tensor(*p).elements() * graph.tensor(*p).dtype.size() as u64)
            .sum();
        info!(params = param_values.len(), bytes, "loaded params");
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .build()
        .map_err(|e| BuildError::Options(format!("thread pool: {e}")))?;
    let span = info_span!("ipu_codegen.package.build", tile_count = opts.tiles, operations = graph.ops.len());
    let _g = span.enter();
    let mut timings = Vec::new();
    phase("compile_runtime", &mut timings, || ());
    let outer = info_span!("ipu_codegen.package.phase", phase = "plan_package");
    let plan_start = Instant::now();
    let og = outer.enter();
    let mut grid = opts.grid;
    // Baseline cycles and attempts of whichever search ran.
    let mut searched: Option<(u64, u32)> = None;
    if let (None, Some(mm)) = (grid, crate::search::searchable(&graph)) {
        let out = phase("search_plan", &mut timings, || {
            crate::search::run(
                &mm,
                src,
                opts.tiles,
                opts.search_attempts,
                opts.search_state.as_deref(),
                &pool,
            )
        })
        .map_err(|e| BuildError::Options(format!("{file}: search: {e}")))?;
        if let Some(out) = out {
            grid = Some(out.grid);
            searched = Some((out.baseline_cycles, out.attempts));
        }
    }
    let mut side_cast = opts.side_cast.unwrap_or(SideCast::Replicated);
    let mut column_groups = opts.column_groups.unwrap_or(1);
    // A graph planned as stages with matmul stages: the stage search (cast placements and stage
    // grids); `Ok(None)` for any other graph, which the row-chain layout search may take.
    let mut stage_grids: Vec<Option<[u32; 3]>> = Vec::new();
    // The layout searches run only when nothing about the layout was forced.
    let layout_free = opts.side_cast.is_none()
        && opts.column_groups.is_none()
        && grid.is_none()
        && opts.search_attempts > 0;
    if layout_free && searched.is_none() {
        let state = opts.search_state.as_deref();
        if let Some(out) = phase("search_plan", &mut timings, || {
            crate::stage_search::stage_grids(&graph, src, opts.tiles, opts.search_attempts, state, &pool)
        })
        .map_err(|e| BuildError::Options(format!("{file}: search: {e}")))?
        {
            side_cast = out.side_cast;
            stage_grids = out.grids;
            searched = Some((out.baseline_cycles, out.attempts));
        }
    }
    if layout_free && searched.is_none() {
        let state = opts.search_state.as_deref();
        if let Some(out) = phase("search_plan", &mut timings, || {
            crate::search::chain_layout(&graph, src, opts.tiles, opts.search_attempts, state, &pool)
        })
        .map_err(|e| BuildError::Options(format!("{file}: search: {e}")))?
        {
            side_cast = out.side_cast;
            column_groups = out.column_groups;
            searched = Some((out.baseline_cycles, out.attempts));
        }
    }
    if searched.is_none() && opts.search_state.is_some() {
        tracing::warn!("--search-state: no search applies to this model, so no state is kept");
    }
    let plan_opts = PlanOptions {
        grid,
        profile: opts.profile,
        side_cast,
        column_groups,
        progress: Some(log_stage),
        ..PlanOptions::new(opts.tiles)
    };
    let mut plan =
        phase("plan_kernels", &mut timings, || plan::plan_with_grids(&graph, plan_opts, &stage_grids))
            .map_err(|err| BuildError::Plan(plan_error_message(file, src, &graph, &err)))?;
    for m in &plan.mapping {
        info!("screened tile mappings {m}");
    }
    let exchanges = plan::supersteps::exchange_figures(&plan.tiles, &plan.horizons);
    crate::params::embed(&graph, &mut plan, &param_values).map_err(BuildError::Options)?;
    info!(removed = plan.eliminated_clears, "eliminated padding clears of zero-filled buffers");
    if plan.cleared_bytes > 0 {
        info!(bytes = plan.cleared_bytes, "tiles reuse memory; reused buffers are cleared each run");
    }
    // Code is emitted once per distinct program (tiles that share one share its code), and
    // linked once per distinct code and buffers (all idle tiles, for one).
    let class_of = plan.tiles.class_of();
    let codes: Vec<String> = phase("emit_tile_code", &mut timings, || {
        let distinct = plan.tiles.distinct();
        let loops = opts.launch_loops;
        pool.install(|| {
            distinct.par_iter().map(|(_, p)| ipu_runtime_tile::runtime::tile_code_with(p, loops)).collect()
        })
    });
    if let Some(dir) = &opts.emit_asm {
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(dir)?;
            for ((t, _), code) in plan.tiles.distinct().iter().zip(&codes) {
                std::fs::write(dir.join(format!("tile{t}.s")), code)?;
            }
            Ok(())
        };
        write().map_err(|e| BuildError::Options(format!("--emit-asm {}: {e}", dir.display())))?;
    }
    let linked: Vec<Linked> =
        phase("build_tile_images", &mut timings, || -> Result<Vec<Linked>, LinkError> {
            let distinct = plan.tiles.distinct();
            // Keyed by the code itself (borrowed: at SigLIP scale the codes are hundreds of MB).
            let mut first: BTreeMap<(&str, &[ipu_core::plan::Buffer]), usize> = BTreeMap::new();
            let mut unique = Vec::new();
            let mut index = Vec::with_capacity(codes.len());
            for (c, code) in codes.iter().enumerate() {
                let key = (code.as_str(), distinct[c].1.buffers.as_slice());
                let u = *first.entry(key).or_insert_with(|| {
                    unique.push(c);
                    unique.len() - 1
                });
                index.push(u);
            }
            info!(
                tiles = class_of.len(),
                programs = codes.len(),
                unique = unique.len(),
                "linking distinct tile programs"
            );
            let done: Vec<Result<Linked, LinkError>> = pool.install(|| {
                unique
                    .par_iter()
                    .map(|&c| link(distinct[c].0 as u16, &codes[c], &distinct[c].1.buffers))
                    .collect()
            });
            let done: Vec<Linked> = done.into_iter().collect::<Result<_, _>>()?;
            // Each tile gets its program's image (the segments are shared, not copied).
            Ok(class_of
                .iter()
                .enumerate()
                .map(|(t, &c)| {
                    let mut l = done[index[c]].clone();
                    l.image.tile = t as u16;
                    l
                })
                .collect())
        })
        .map_err(|e| BuildError::Plan(link_error_message(file, src, &graph, &plan, &e)))?;
    let code_max = linked.iter().map(|l| l.memory.code).max().unwrap_or(0);
    info!(
        host_code_base = format!("{:#x}", ipu_core::target::HOST_AREA_BASE),
        generated_code_bytes = code_max,
        executable_ranges =
            format!("[({:#x}, {:#x})]", ipu_core::target::TILE_MEM_BASE, ipu_core::target::EXEC_REGION_END),
        "placing generated tile programs"
    );
    let bindings = phase("place_storage", &mut timings, || resolve_bindings(&graph, &plan, &linked));
    // The tiles' plans and code texts are in the images now: at SigLIP scale they are most of the
    // build's memory (attention on 1472 tiles: 0.5 GB of descriptor words), so they go before the
    // package is written.
    let phases = plan.phases();
    drop(codes);
    drop(core::mem::take(&mut plan.tiles));
    let memory: Vec<_> = linked.iter().map(|l| l.memory).collect();
    let profile = plan.profile.as_ref().map(|p| {
        let mut p = p.clone();
        for (t, samples) in p.tiles.iter_mut().enumerate() {
            samples.buffer = linked[t].symbols[ipu_core::plan::profile::BUFFER];
        }
        p
    });
    info!(
        final_cycles = plan.cost.cycles,
        final_exchange = plan.cost.exchange,
        "costed final placed program"
    );
    drop(og);
    let ms = plan_start.elapsed().as_millis();
    info!(phase = "plan_package", elapsed_ms = ms as u64, success = true, "package build phase finished");
    timings.push(("plan_package", ms));
    let package = Package {
        tile_count: opts.tiles as u32,
        tiles: linked.into_iter().map(|l| l.image).collect(),
        config: CONFIG_WRITES.to_vec(),
        bindings,
        host: HostExchange {
            page_bytes: ipu_core::target::HOST_PAGE_BYTES as u32,
            mailbox: ipu_runtime_tile::runtime::MAILBOX_ADDR,
            calls: vec![Call { name: "run".into(), command: 0, phases }],
        },
        symbols: vec![Symbol {
            name: "mailbox".into(),
            tile: u16::MAX,
            addr: ipu_runtime_tile::runtime::MAILBOX_ADDR,
        }],
        info: BuildInfo {
            compiler: env!("CARGO_PKG_VERSION").into(),
            model: graph.name.clone(),
            model_digest: Sha256::digest(src.as_bytes()).into(),
            target: format!("mk2-{}", opts.tiles),
            tiles_used: plan.tiles_used,
            model_source: src.to_string(),
        },
        plan: PlanSummary {
            predicted_cycles: plan.cost.cycles,
            predicted_exchange_cycles: plan.cost.exchange,
            baseline_cycles: searched.map(|s| s.0).unwrap_or(plan.cost.cycles),
            search_attempts: searched.map(|s| s.1).unwrap_or(0),
            memory,
            grids: plan.grids.clone(),
            alpha_on_a: plan.alpha_on_a.iter().map(|&i| i as u32).collect(),
            profile,
        },
    };
    info!(tiles = opts.tiles, "writing application package");
    let bytes = package.to_bytes();
    let sha256 = hex(&Sha256::digest(&bytes));
    Ok(Built { package, bytes, sha256, timings, exchanges })
}

fn resolve_bindings(g: &ipu_core::graph::Graph, plan: &plan::Plan, linked: &[Linked]) -> Vec<Binding> {
    plan.bindings
        .iter()
        .map(|b| {
            let t = g.tensor(b.tensor);
            Binding {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                direction: b.direction,
                transpose: b.transpose,
                scale: t.scale,
                slices: b
                    .slices
                    .iter()
                    .map(|s| Slice {
                        tile: s.tile,
                        addr: linked[s.tile as usize].symbols[s.buffer.as_str()] + s.offset,
                        tensor_offset: s.tensor_offset,
                        rows: s.rows,
                        row_bytes: s.row_bytes,
                        tensor_stride: s.tensor_stride,
                        tile_stride: s.tile_stride,
                    })
                    .collect(),
            }
        })
        .collect()
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The stage planner's progress, in the build log (a graph of hundreds of stages takes a while).
fn log_stage(stage: usize, stages: usize, what: &str) {
    info!(stage = stage + 1, stages, "planning stage {what}");
}
