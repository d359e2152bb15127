//! Profiles end to end through the command line (docs/profile.md): a profiled build of the Q·Kᵀ
//! example run on the simulator, the Cap'n Proto file read by three independent readers (ours,
//! `capnp decode`, pycapnp), the trace JSON checked against the trace-event format, and the HTML
//! report rendered in headless Chromium.
//!
//! External tools (capnp, python3 with pycapnp, chromium) are skipped with a message when absent,
//! unless `IPU_CODEGEN_REQUIRE_TOOLS=1` (set by `.ci/run`, which installs them) makes absence a
//! failure.

use ipu_host::profile::{trace, Profile};
use ipu_schema::SampleKind;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ipu-codegen"));
    c.env("RUST_LOG", "warn");
    c
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn ok(c: &mut Command) -> String {
    let o = c.output().expect("runs");
    assert!(o.status.success(), "{:?} failed: {}", c, String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into()
}

/// Whether an external tool is usable; absent tools fail the test only when CI requires them.
fn have(tool: &str, probe: &[&str]) -> bool {
    let found = Command::new(tool)
        .args(probe)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var("IPU_CODEGEN_REQUIRE_TOOLS").is_err(),
            "{tool} is required (IPU_CODEGEN_REQUIRE_TOOLS) but not usable"
        );
        eprintln!("skipped: {tool} not installed");
    }
    found
}

struct Run {
    dir: tempfile::TempDir,
    package: PathBuf,
    profile: PathBuf,
    trace: PathBuf,
    stdout: String,
}

/// The Q·Kᵀ example built with `--profile` for 64 tiles and run once (shared by the tests).
fn qk() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let package = dir.path().join("qk.ipuexe");
        let (profile, trace) = (dir.path().join("qk.capnp"), dir.path().join("qk.json"));
        ok(bin()
            .arg("build")
            .arg(repo().join("examples/qk.toml"))
            .args(["--tiles", "64", "--profile", "-o"])
            .arg(&package));
        let stdout =
            ok(bin().arg("run").arg(&package).arg("--profile").arg(&profile).arg("--trace").arg(&trace));
        Run { dir, package, profile, trace, stdout }
    })
}

fn read(p: &Path) -> Profile {
    Profile::from_capnp(&std::fs::read(p).expect("profile file")).expect("valid profile")
}

#[test]
fn profile_covers_every_cycle_of_every_tile() {
    let r = qk();
    assert!(r.stdout.contains("hardwareTest=PASS"), "{}", r.stdout);
    let p = read(&r.profile);
    let line = format!("profile={} tiles=64 samples={}", r.profile.display(), p.sample_count());
    assert!(r.stdout.contains(&line), "missing `{line}` in\n{}", r.stdout);
    assert_eq!(p.tiles.len(), 64);
    // The search casts K on a share of each tile and all-gathers it (the `gather K8` phase).
    assert_eq!(p.phases, ["dispatch+idle", "cast K8", "gather K8", "cast Q8", "matmul S"]);
    for t in &p.tiles {
        // Samples tile the call exactly: from the release to the next release.
        assert_eq!(t.samples.first().map(|s| s.start), Some(p.run_start), "tile {}", t.tile);
        assert_eq!(t.samples.last().map(|s| s.end), Some(p.run_start + p.run_cycles), "tile {}", t.tile);
        assert!(t.samples.windows(2).all(|w| w[0].end == w[1].start));
        let total: u64 = t.samples.iter().map(|s| s.cycles()).sum();
        assert_eq!(total, p.run_cycles);
        // One compute sample per kernel launch: two casts and the matmul's 2 × 4 blocks (the search
        // splits S into 8 column groups: 64 keys per tile); one sync and one exchange sample for
        // the all-gather.
        let count = |k: SampleKind| t.samples.iter().filter(|s| s.kind == k).count();
        assert_eq!(count(SampleKind::Compute), 2 + 8, "tile {}", t.tile);
        assert_eq!((count(SampleKind::Sync), count(SampleKind::Exchange)), (1, 1), "tile {}", t.tile);
        assert!(t.memory.profile >= 4 * (t.samples.len() as u32 - 1));
    }
    // The run's cycles printed by `run --json` on the same package agree with the profile.
    let j: Value =
        serde_json::from_str(ok(bin().arg("run").arg(&r.package).arg("--json")).lines().last().unwrap_or(""))
            .expect("json");
    assert_eq!(j["cycles"][0].as_u64(), Some(p.run_cycles));
    // Re-encoding is byte-identical (deterministic writer).
    assert_eq!(p.to_capnp(), std::fs::read(&r.profile).unwrap());
}

#[test]
fn profile_tables_group_by_phase_kernel_and_tile() {
    let r = qk();
    let text = ok(bin().arg("profile").arg(&r.profile));
    assert!(text.starts_with("profile package="), "{text}");
    assert!(text.lines().any(|l| l.starts_with("matmul S")), "{text}");
    let j: Value = serde_json::from_str(&ok(bin().arg("profile").arg(&r.profile).args([
        "--group-by",
        "kernel",
        "--json",
    ])))
    .unwrap();
    let rows = j["rows"].as_array().expect("rows");
    let launches: BTreeMap<&str, u64> = rows
        .iter()
        .map(|r| (r["kernel"].as_str().unwrap(), r["launches"].as_f64().unwrap() as u64))
        .collect();
    assert_eq!(launches, BTreeMap::from([("amp_f8", 64 * 8), ("cast_f16_f8", 2 * 64)]));
    let share: f64 = rows.iter().map(|r| r["compute_%"].as_f64().unwrap()).sum();
    assert!((share - 100.0).abs() < 0.2, "{share}");
    let j: Value = serde_json::from_str(&ok(bin().arg("profile").arg(&r.profile).args([
        "--group-by",
        "tile",
        "--top",
        "3",
        "--json",
    ])))
    .unwrap();
    assert_eq!(j["rows"].as_array().unwrap().len(), 3);
}

#[test]
fn capnp_decode_reads_the_profile() {
    if !have("capnp", &["--version"]) {
        return;
    }
    let r = qk();
    let p = read(&r.profile);
    let o = Command::new("capnp")
        .arg("decode")
        .arg(repo().join("schema/profile.capnp"))
        .arg("Profile")
        .stdin(std::fs::File::open(&r.profile).unwrap())
        .output()
        .expect("capnp runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("tileCount = 64"), "{}", &text[..text.len().min(800)]);
    assert!(text.contains(&format!("runCycles = {}", p.run_cycles)));
    assert!(text.contains(r#"phaseNames = ["dispatch+idle", "cast K8", "gather K8", "cast Q8", "matmul S"]"#));
    assert_eq!(text.matches("kind = compute").count(), 64 * 10);
    let s = &p.tiles[63].samples[5];
    assert!(text.contains(&format!("start = {}, end = {}", s.start, s.end)));
}

#[test]
fn pycapnp_reads_the_profile() {
    if !have("python3", &["-c", "import capnp"]) {
        return;
    }
    let r = qk();
    let p = read(&r.profile);
    let out = ok(Command::new("python3")
        .arg(repo().join("scripts/read_profile.py"))
        .arg(repo().join("schema/profile.capnp"))
        .arg(&r.profile));
    let j: Value = serde_json::from_str(&out).expect("json from pycapnp");
    assert_eq!(j["tileCount"], 64);
    assert_eq!(j["runCycles"].as_u64(), Some(p.run_cycles));
    assert_eq!(j["samples"].as_u64(), Some(p.sample_count() as u64));
    assert_eq!(j["phaseNames"], serde_json::json!(p.phases));
    for kind in SampleKind::ALL {
        let ours: u64 =
            p.tiles.iter().flat_map(|t| &t.samples).filter(|s| s.kind == kind).map(|s| s.cycles()).sum();
        assert_eq!(j["kindCycles"][kind.name()].as_u64().unwrap_or(0), ours, "{kind:?}");
    }
    let t7 = &j["tiles"][7];
    assert_eq!(t7[0], 7);
    assert_eq!(t7[1].as_u64(), Some(p.run_start));
    assert_eq!(t7[3].as_u64(), Some(p.tiles[7].memory.tensors as u64));
}

/// Check a trace against the trace-event format: every slice well formed, and on each track the
/// slices nest (a slice that starts inside another ends inside it).
fn check_trace(t: &Value) -> (usize, BTreeMap<u64, String>) {
    let events = t["traceEvents"].as_array().expect("traceEvents array");
    let mut names = BTreeMap::new();
    // Times as integer nanoseconds, as trace viewers convert them.
    let mut tracks: BTreeMap<u64, Vec<(i64, i64, String)>> = BTreeMap::new();
    let mut slices = 0;
    for e in events {
        let ph = e["ph"].as_str().expect("ph");
        assert!(e["pid"].is_u64() && e["tid"].is_u64(), "{e}");
        match ph {
            "M" => {
                if e["name"] == "thread_name" {
                    names.insert(e["tid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap().to_string());
                }
            }
            "X" => {
                let (ts, dur) = (e["ts"].as_f64().expect("ts"), e["dur"].as_f64().expect("dur"));
                assert!(ts >= 0.0 && dur >= 0.0, "{e}");
                assert!(e["name"].is_string() && e["cat"].is_string(), "{e}");
                let (ts, dur) = ((ts * 1000.0).round() as i64, (dur * 1000.0).round() as i64);
                tracks.entry(e["tid"].as_u64().unwrap()).or_default().push((
                    ts,
                    ts + dur,
                    e["name"].to_string(),
                ));
                slices += 1;
            }
            "i" => assert!(e["name"].is_string()),
            other => panic!("unexpected phase type {other}"),
        }
    }
    for (tid, mut v) in tracks {
        assert!(names.contains_key(&tid), "track {tid} has no thread_name");
        // Parents first at equal starts (longer first), then a stack of open slices.
        v.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        let mut open: Vec<(i64, i64, String)> = Vec::new();
        for s in v {
            while open.last().is_some_and(|o| o.1 <= s.0) {
                open.pop();
            }
            if let Some(o) = open.last() {
                assert!(
                    s.1 <= o.1,
                    "track {tid}: {} [{}, {}] overlaps {} [{}, {}]",
                    s.2,
                    s.0,
                    s.1,
                    o.2,
                    o.0,
                    o.1
                );
            }
            open.push(s);
        }
    }
    (slices, names)
}

#[test]
fn trace_is_valid_trace_event_json_with_nested_slices() {
    let r = qk();
    let t: Value = serde_json::from_slice(&std::fs::read(&r.trace).unwrap()).expect("trace is JSON");
    let p = read(&r.profile);
    let (slices, names) = check_trace(&t);
    assert_eq!(names.len(), 64);
    assert_eq!(names[&1], "tile 0");
    // Each tile: a slice per sample plus one per phase run (host, cast K8, gather K8, cast Q8,
    // matmul S, host).
    assert_eq!(slices, p.sample_count() + 64 * 6);
    assert!(t["otherData"]["note"].is_null());
    // Capped: whole tiles are dropped and a note says so; what remains still nests.
    let capped = trace::trace(&p, 1000);
    let (slices, names) = check_trace(&capped);
    assert!(slices <= 1000 && !names.is_empty() && names.len() < 64);
    let note = capped["otherData"]["note"].as_str().expect("note when capped");
    assert!(note.starts_with("trace capped at 1000 slices"), "{note}");
}

#[test]
fn report_is_self_contained_and_renders_in_headless_chromium() {
    let r = qk();
    let html = r.dir.path().join("report.html");
    let out = ok(bin().arg("report").arg(&r.profile).arg("--package").arg(&r.package).arg("-o").arg(&html));
    assert!(out.starts_with("report="), "{out}");
    let text = std::fs::read_to_string(&html).unwrap();
    for needle in ["http:", "https:", "//cdn", "<link", " src="] {
        assert!(!text.contains(needle), "report refers outside itself: {needle}");
    }
    assert!(text.contains("Top tiles by memory") && text.contains("matmul S"));
    // The heatmap's colours span the used range, and the legend says which bytes they stand for.
    let p = ipu_host::profile::Profile::from_capnp(&std::fs::read(&r.profile).unwrap()).unwrap();
    let (lo, hi) = ipu_host::profile::report::memory_range(&p);
    assert!(lo < hi && hi < 638_976 / 4, "a lightly filled chip: {lo}..{hi}");
    let legend = ipu_host::profile::report::heat_legend(lo, hi);
    assert!(text.contains(&legend), "the legend is in the page");
    assert!(
        legend.contains(&format!("colour scale: <b>{lo}</b> bytes"))
            && legend.contains(&format!("<b>{hi}</b> bytes"))
    );
    assert!(legend.contains("% of a tile") && legend.contains("not in target"), "{legend}");
    assert!(text.contains(&format!("\"memLo\":{lo},\"memHi\":{hi}")), "the script scales to the same range");
    // A profile of another package is refused.
    let o = bin()
        .arg("report")
        .arg(&r.profile)
        .arg("--package")
        .arg(repo().join("README.md"))
        .arg("-o")
        .arg(&html)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    if !have("chromium", &["--version"]) {
        return;
    }
    let chrome = |extra: &[&str]| {
        let profile_dir = tempfile::tempdir().unwrap();
        Command::new("chromium")
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"])
            .args(["--disable-background-networking", "--disable-component-update", "--disable-sync"])
            .args(["--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000"])
            .arg(format!("--user-data-dir={}", profile_dir.path().display()))
            .args(extra)
            .arg(format!("file://{}", html.display()))
            .output()
            .expect("chromium runs")
    };
    let dom = chrome(&["--dump-dom"]);
    let dom_text = String::from_utf8_lossy(&dom.stdout);
    let log = String::from_utf8_lossy(&dom.stderr);
    assert!(dom_text.contains(r#"data-rendered="ok""#), "page did not finish rendering:\n{log}");
    assert!(dom_text.contains(r#"<div id="errors"></div>"#), "page reported errors");
    assert!(!log.contains("Uncaught") && !log.contains(":CONSOLE"), "console output:\n{log}");
    // Every phase that starts on the timeline has a label on its axis.
    let labels = dom_text.matches(r#"class="phase-label""#).count();
    let phases =
        ipu_host::profile::Profile::from_capnp(&std::fs::read(&r.profile).unwrap()).unwrap().phases.len();
    assert_eq!(labels, phases, "one axis label per phase:\n{dom_text}");
    let png = r.dir.path().join("report.png");
    let shot = chrome(&["--window-size=1300,1800", &format!("--screenshot={}", png.display())]);
    assert!(shot.status.success(), "{}", String::from_utf8_lossy(&shot.stderr));
    let decoder = png::Decoder::new(std::fs::File::open(&png).expect("screenshot written"));
    let mut reader = decoder.read_info().expect("png");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("frame");
    assert_eq!((info.width, info.height), (1300, 1800));
    // The timeline and heatmap are drawn: many saturated pixels (the page itself is white and
    // grey), not a blank page.
    let px = info.line_size / info.width as usize;
    let colour =
        buf.chunks(px).filter(|c| c[..3].iter().max().unwrap() - c[..3].iter().min().unwrap() > 60).count();
    assert!(colour > 50_000, "only {colour} coloured pixels");
}

#[test]
fn full_chip_report_stays_under_two_megabytes() {
    // The K-split matmul on all 1472 tiles: syncs and an exchange on every tile.
    let dir = tempfile::tempdir().unwrap();
    let (pkg, prof, html) =
        (dir.path().join("m.ipuexe"), dir.path().join("m.capnp"), dir.path().join("m.html"));
    ok(bin().arg("build").arg(repo().join("examples/matmul.toml")).args(["--profile", "-o"]).arg(&pkg));
    ok(bin().arg("run").arg(&pkg).arg("--profile").arg(&prof));
    let p = read(&prof);
    assert_eq!(p.tiles.len(), 1472);
    ok(bin().arg("report").arg(&prof).arg("--package").arg(&pkg).arg("-o").arg(&html));
    let size = std::fs::metadata(&html).unwrap().len();
    println!("full-chip report: {size} bytes for {} samples", p.sample_count());
    assert!(size < 2 * 1024 * 1024, "{size} bytes");
}

#[test]
fn profile_errors_name_the_problem() {
    let r = qk();
    let dir = tempfile::tempdir().unwrap();
    // An unprofiled package: `run --profile` says how to get a profile plan.
    let plain = dir.path().join("plain.ipuexe");
    ok(bin().arg("build").arg(repo().join("examples/qk.toml")).args(["--tiles", "8", "-o"]).arg(&plain));
    let o = bin().arg("run").arg(&plain).arg("--profile").arg(dir.path().join("p.capnp")).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("the package has no profile plan; rebuild it with `ipu-codegen build --profile`"),
        "{err}"
    );
    assert!(!dir.path().join("p.capnp").exists());
    // A truncated profile: refused with the file's name, exit 2.
    let cut = dir.path().join("cut.capnp");
    let bytes = std::fs::read(&r.profile).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let o = bin().arg("profile").arg(&cut).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cut.capnp: not a readable profile message"), "{err}");
}
