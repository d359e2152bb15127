//! `graph_fuzz`: random model graphs through build, the simulator and the verdict (issue 38,
//! docs/reliability.md "Random graphs"). A binary of the test crate rather than an `ipu-codegen`
//! subcommand: it needs the generator, oracle and minimiser that live here beside the tests, and
//! the product binary should not carry test machinery.
//!
//! ```text
//! graph_fuzz N [START] [--jobs J] [--save DIR] [--no-shrink] [--per-bug K] [--budget CALLS] [--timeout SECS]
//! graph_fuzz --emit SEED DIR        # write seed's model.toml and params into DIR, print its tiles
//! graph_fuzz --check FILE.toml...   # rerun saved regression models (header: seed, tiles)
//! ```
//! Exit status: 0 when no new bug (one no open finding in FINDINGS.md explains), 1 otherwise.

use ipu_tests::campaign;
use ipu_tests::graphgen;
use ipu_tests::oracle::{self, Limits, Outcome};
use ipu_tests::{findings, shrink};
use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn usage() -> ! {
    eprintln!(
        "usage: graph_fuzz N [START] [--jobs J] [--save DIR] [--no-shrink] [--per-bug K] [--budget CALLS] [--timeout SECS]\n       \
         graph_fuzz --emit SEED DIR\n       graph_fuzz --check FILE.toml..."
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |s: Option<&String>| s.and_then(|v| v.parse::<u64>().ok()).unwrap_or_else(|| usage());
    match args.first().map(String::as_str) {
        Some("--emit") => {
            let seed = num(args.get(1));
            let dir = PathBuf::from(args.get(2).unwrap_or_else(|| usage()));
            let spec = graphgen::generate(seed);
            std::fs::create_dir_all(&dir).expect("create DIR");
            spec.write_params(&dir).expect("write params");
            std::fs::write(dir.join("model.toml"), spec.to_toml("")).expect("write model");
            println!("tiles={} seed={seed}", spec.tiles);
        }
        Some("--check") => check_files(&args[1..]),
        Some(_) => campaign_main(&args),
        None => usage(),
    }
}

/// Rerun saved regression models; exit 1 when one fails in a way no open finding explains.
fn check_files(files: &[String]) {
    let mut bad = 0;
    for f in files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{f}: {e}"));
        let Some((seed, tiles, class)) = shrink::read_header(&text) else {
            eprintln!("{f}: no `# graph_fuzz:` header");
            bad += 1;
            continue;
        };
        let out = oracle::check_text(std::path::Path::new(f), &text, tiles, seed, Limits::default());
        let known = match &out {
            Outcome::Bug(fl) => findings::known(&text, fl).map(|o| o.id),
            _ => None,
        };
        let detail = match &out {
            Outcome::Bug(fl) => fl.message.clone(),
            Outcome::Refused { message, .. } => message.clone(),
            _ => String::new(),
        };
        println!(
            "{f}: recorded {class}, now {} {} {detail}",
            out.class(),
            known.map_or(String::new(), |k| format!("(known {k})"))
        );
        if matches!(out, Outcome::Bug(_)) && known.is_none() {
            bad += 1;
        }
    }
    std::process::exit(i32::from(bad > 0));
}

fn campaign_main(args: &[String]) {
    let mut pos = Vec::new();
    let (mut jobs, mut save, mut shrink_on, mut budget) =
        (2usize, PathBuf::from("target/graph_fuzz"), true, 150usize);
    let mut per_key = 1usize;
    let mut limits = Limits::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_else(|| usage());
        match a.as_str() {
            "--jobs" => jobs = val().parse().unwrap_or_else(|_| usage()),
            "--save" => save = PathBuf::from(val()),
            "--no-shrink" => shrink_on = false,
            "--per-bug" => per_key = val().parse().unwrap_or_else(|_| usage()),
            "--budget" => budget = val().parse().unwrap_or_else(|_| usage()),
            "--timeout" => limits.timeout = Duration::from_secs(val().parse().unwrap_or_else(|_| usage())),
            s if s.starts_with("--") => usage(),
            _ => pos.push(a.clone()),
        }
    }
    let count = num_arg(pos.first()) as usize;
    let start = pos.get(1).map_or(0, |s| num_arg(Some(s)));
    let t0 = Instant::now();
    let tell = |done: usize| {
        if done.is_multiple_of(50) || done == count {
            eprint!("\r{done}/{count} graphs, {:.0} s", t0.elapsed().as_secs_f64());
            let _ = std::io::stderr().flush();
        }
    };
    let results = campaign::run(start, count, jobs, limits, &tell);
    let wall = t0.elapsed();
    eprintln!();
    print!("{}", campaign::report(&results, wall));
    let new_bugs = campaign::summarise(&results).new_bugs;
    if shrink_on {
        for (r, f) in campaign::distinct_bugs(&results, per_key) {
            let t = Instant::now();
            let same = |c: &graphgen::GraphSpec| matches!(oracle::check(c, limits), Outcome::Bug(g) if g.class == f.class && g.key == f.key);
            let (small, calls) = shrink::minimise(&r.spec, budget, same);
            let name = format!("{}-{}", f.class, r.seed);
            let msg = match oracle::check(&small, limits) {
                Outcome::Bug(g) => g.message,
                _ => f.message.clone(),
            };
            shrink::save(&small, &save, &name, f.class, &msg).expect("save the minimised model");
            println!(
                "minimised seed {} ({}, {} ops → {} ops, {} tiles → {}) in {calls} checks, {:.1} s: {}/{name}.toml",
                r.seed,
                f.class,
                r.spec.ops.len(),
                small.ops.len(),
                r.spec.tiles,
                small.tiles,
                t.elapsed().as_secs_f64(),
                save.display()
            );
        }
    }
    std::process::exit(i32::from(new_bugs > 0));
}

fn num_arg(s: Option<&String>) -> u64 {
    s.and_then(|v| v.parse().ok()).unwrap_or_else(|| usage())
}
