//! Random graphs in CI (issue 38, docs/reliability.md "Random graphs"): a fixed range of seeds
//! through the generator, `build`, the simulator and the verdict. Every graph must be refused
//! with a message naming the op, or pass; any other outcome is a bug and fails the test, unless an
//! open finding (`ipu_tests::findings`, tests/data/fuzz/FINDINGS.md) explains it — printed with
//! its reason, and re-enabled by deleting that entry. `scripts/graph_fuzz.sh N` runs more seeds.

use ipu_core::graph::OpKind;
use ipu_schema::DType;
use ipu_tests::graphgen::{self, Attr, GraphSpec};
use ipu_tests::oracle::{self, Limits, Outcome};
use ipu_tests::{campaign, findings, shrink};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Seeds run in CI: measured to take about two minutes of a debug build on 2 cores.
const CI_SEEDS: usize = 2000;

/// Count feature `k` when `c` (every feature gets an entry, so a zero count shows).
fn hit(seen: &mut BTreeMap<String, usize>, k: &str, c: bool) {
    *seen.entry(k.to_string()).or_default() += usize::from(c);
}

#[test]
fn the_generator_is_deterministic_valid_and_covers_the_format() {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for seed in 0..3000 {
        let spec = graphgen::generate(seed);
        let text = spec.to_toml("");
        assert_eq!(text, graphgen::generate(seed).to_toml(""), "seed {seed}: the same seed, the same graph");
        let g =
            ipu_host::model::parse("m.toml", &text).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
        for op in &spec.ops {
            *seen.entry(format!("op {}", op.op)).or_default() += 1;
            let attr = |f: &str| op.attrs.iter().find(|(n, _)| n == f).map(|(_, a)| a.clone());
            hit(&mut seen, "gelu tanh", attr("approximate") == Some(Attr::Str("tanh".into())));
            hit(&mut seen, "gelu none", attr("approximate") == Some(Attr::Str("none".into())));
            hit(&mut seen, "gelu sigmoid", attr("approximate") == Some(Attr::Str("sigmoid".into())));
            hit(&mut seen, "alpha", attr("alpha").is_some());
            hit(&mut seen, "transpose_a", attr("transpose_a").is_some());
            hit(&mut seen, "transpose_b", attr("transpose_b").is_some());
            hit(&mut seen, "layernorm gamma", op.operands.iter().any(|(f, _)| f == "gamma"));
            hit(&mut seen, "layernorm alone", op.op == "layernorm" && op.operands.len() == 1);
        }
        for op in &g.ops {
            let dt = |t| g.tensor(t).dtype;
            let out = dt(op.output);
            match op.kind {
                OpKind::MatMul { a, b, accumulate, .. } => {
                    hit(
                        &mut seen,
                        "matmul f16/f16",
                        accumulate == DType::F16 && out == DType::F16 && dt(a) == DType::F16,
                    );
                    hit(
                        &mut seen,
                        "matmul f32 sums, f16 result",
                        accumulate == DType::F32 && out == DType::F16,
                    );
                    hit(&mut seen, "matmul f32/f32", out == DType::F32);
                    hit(&mut seen, "matmul FP8", dt(a) != DType::F16);
                    hit(&mut seen, "matmul FP8 param", g.params.contains(&b) && dt(b) != DType::F16);
                    hit(&mut seen, "matmul param a", g.params.contains(&a));
                    hit(&mut seen, "matmul param b", g.params.contains(&b));
                    hit(&mut seen, "matmul batched", g.tensor(a).shape.len() > 2);
                }
                OpKind::Cast { input } => {
                    hit(&mut seen, "cast to e4m3", out == DType::F8E4M3);
                    hit(&mut seen, "cast to e5m2", out == DType::F8E5M2);
                    hit(&mut seen, "cast FP8 to f16", dt(input) != DType::F16 && dt(input) != DType::F32);
                    hit(&mut seen, "cast f16 to f32", out == DType::F32);
                    hit(&mut seen, "cast f32 to f16", dt(input) == DType::F32);
                }
                _ => {}
            }
        }
        let reads = spec.reads();
        hit(&mut seen, "unused input", g.inputs.iter().any(|&t| !reads.contains(&g.tensor(t).name.as_str())));
        hit(&mut seen, "unused param", g.params.iter().any(|&t| !reads.contains(&g.tensor(t).name.as_str())));
        hit(&mut seen, "several outputs", spec.outputs.len() > 1);
        hit(&mut seen, "intermediate output", spec.outputs.iter().any(|o| reads.contains(&o.as_str())));
        hit(&mut seen, "1 tile", spec.tiles == 1);
        hit(&mut seen, "over 128 tiles", spec.tiles > 128);
        hit(&mut seen, "1472 tiles", spec.tiles == 1472);
        let dims = || g.tensors.iter().flat_map(|t| t.shape.iter().copied());
        hit(&mut seen, "odd size", dims().any(|d| d > 1 && d % 2 == 1));
        hit(&mut seen, "1-element axis", g.tensors.iter().any(|t| t.shape.len() > 1 && t.shape.contains(&1)));
    }
    let ops = [
        "matmul",
        "cast",
        "add",
        "sub",
        "mul",
        "gelu",
        "softmax",
        "layernorm",
        "reshape",
        "transpose",
        "slice",
        "reduce_sum",
        "reduce_mean",
    ];
    let maps = [
        "tanh",
        "sigmoid",
        "exp",
        "log",
        "sqrt",
        "reciprocal",
        "abs",
        "erf",
        "pow",
        "max",
        "min",
        "leaky_relu",
    ];
    for op in ops.iter().chain(&maps) {
        assert!(seen.get(&format!("op {op}")).copied().unwrap_or(0) > 0, "no {op} in 3000 graphs: {seen:?}");
    }
    let missing: Vec<_> = seen.iter().filter(|(_, &n)| n == 0).map(|(k, _)| k.clone()).collect();
    assert!(missing.is_empty(), "never generated: {missing:?}");
    assert_ne!(graphgen::generate(1).to_toml(""), graphgen::generate(2).to_toml(""));
}

#[test]
fn fixed_seeds_pass_or_are_refused_naming_the_op() {
    let t0 = Instant::now();
    let limits = Limits { timeout: Duration::from_secs(300), ..Limits::default() };
    let results = campaign::run(0, CI_SEEDS, 2, limits, &|_| {});
    let report = campaign::report(&results, t0.elapsed());
    println!("{report}");
    for o in findings::OPEN {
        let n = results.iter().filter(|r| r.known == Some(o.id)).count();
        if n > 0 {
            println!("EXCLUDED {} ({n} graphs): {} — tests/data/fuzz/FINDINGS.md", o.id, o.why);
        }
    }
    let s = campaign::summarise(&results);
    assert_eq!(s.new_bugs, 0, "bugs no open finding explains:\n{report}");
    // Refusals must say which op and why (the model file's line, `op N (kind): reason`).
    for r in &results {
        if let Outcome::Refused { message, .. } = &r.outcome {
            assert!(
                message.contains("op ") && message.contains("):"),
                "seed {}: unclear refusal: {message}",
                r.seed
            );
        }
    }
    let pass = s.classes.get("pass").copied().unwrap_or(0);
    assert!(pass * 3 >= CI_SEEDS, "too few graphs built and passed to mean anything: {pass}\n{report}");
    // The overflow path (FP8 casts drawn to overflow sometimes) and the refusal path were taken.
    assert!(s.classes.get("overflow-reported").copied().unwrap_or(0) > 0, "no overflow reported\n{report}");
    assert!(!s.reasons.is_empty(), "no refusal among {CI_SEEDS} graphs\n{report}");
    for op in ["matmul", "softmax", "layernorm", "gelu", "cast", "transpose", "slice", "reshape"] {
        assert!(s.ops.get(op).copied().unwrap_or(0) > 0, "no {op} among the CI seeds");
    }
}

/// The minimiser keeps what the predicate needs and drops the rest: a softmax alone, one tile,
/// and its sizes as small as the predicate allows.
#[test]
fn the_minimiser_shrinks_to_what_the_failure_needs() {
    let spec = (0..500)
        .map(graphgen::generate)
        .find(|s| s.ops.len() >= 5 && s.tiles > 4 && s.ops.iter().any(|o| o.op == "softmax"))
        .expect("a graph with a softmax among others");
    let fails = |s: &GraphSpec| s.ops.iter().any(|o| o.op == "softmax");
    let (small, calls) = shrink::minimise(&spec, 2000, fails);
    assert!(calls > 0 && calls < 2000, "{calls}");
    assert_eq!(small.ops.len(), 1, "{}", small.to_toml(""));
    assert_eq!(small.ops[0].op, "softmax");
    assert_eq!(small.tiles, 1);
    assert_eq!(small.outputs.len(), 1);
    let g = ipu_host::model::parse("m.toml", &small.to_toml("")).expect("parses");
    assert_eq!(g.inputs.len() + g.params.len(), 1, "{}", small.to_toml(""));
    assert!(g.tensors.iter().all(|t| t.shape.iter().all(|&d| d == 1)), "{}", small.to_toml(""));
}

#[test]
fn refusal_reasons_are_counted_once_whatever_the_names_and_numbers() {
    let a = oracle::normalise("/tmp/x/model.toml:31: op 4 (matmul): `t3` is made on the chip, 12 tiles");
    let b = oracle::normalise("/tmp/y/model.toml:7: op 12 (matmul): `x10` is made on the chip, 3 tiles");
    assert_eq!(a, b);
    assert_eq!(a, "op N (matmul): `_` is made on the chip, N tiles");
}

/// Every saved regression model (`tests/data/fuzz/ID-CLASS-SEED.toml`). While its finding ID is
/// open (`ipu_tests::findings::OPEN`) it must still fail as recorded, explained by that finding
/// (strict: the oracle is seen to catch it, and a fix is noticed); once the entry is deleted it
/// must pass, or be refused naming the op: a regression test as it stands.
#[test]
fn saved_regression_models_fail_as_recorded_until_fixed_then_pass() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/fuzz");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/data/fuzz")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= findings::OPEN.len(), "a model per open finding in {}", dir.display());
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        let (seed, tiles, class) =
            shrink::read_header(&text).unwrap_or_else(|| panic!("{}: header", f.display()));
        let name = f.file_stem().and_then(|s| s.to_str()).expect("name").to_string();
        let id = name.split('-').next().expect("ID-");
        let out = oracle::check_text(&f, &text, tiles, seed, Limits::default());
        match findings::OPEN.iter().find(|o| o.id == id) {
            Some(open) => {
                let Outcome::Bug(fl) = &out else {
                    panic!("{name}: now {}: is {id} fixed? delete it from OPEN (tests/src/findings.rs) and mark it fixed in FINDINGS.md", out.class())
                };
                assert_eq!(fl.class, class, "{name}: {}", fl.message);
                let by = findings::known(&text, fl).map(|o| o.id);
                assert_eq!(by, Some(id), "{name}: {} not explained by its finding", fl.message);
                println!("{name}: still {class} — EXCLUDED {id}: {}", open.why);
            }
            None => assert!(!matches!(out, Outcome::Bug(_)), "{name}: {id} is closed but: {out:?}"),
        }
    }
}

/// The oracle's own failure paths: the wall-clock guard reports a hang, a run stopped by the
/// simulator's cycle limit is a device error, and a graph that passes does so.
#[test]
fn the_oracle_reports_hangs_and_cycle_limits_as_bugs() {
    let spec = (0..200)
        .map(graphgen::generate)
        .find(|s| s.ops.len() >= 2 && matches!(oracle::check(s, Limits::default()), Outcome::Pass))
        .expect("a graph that passes");
    let hang = oracle::check(&spec, Limits { timeout: Duration::from_nanos(1), ..Limits::default() });
    assert!(matches!(&hang, Outcome::Bug(f) if f.class == "hang"), "{hang:?}");
    let stopped = oracle::check(&spec, Limits { max_cycles: 10, ..Limits::default() });
    assert!(matches!(&stopped, Outcome::Bug(f) if f.class == "device-error"), "{stopped:?}");
}
