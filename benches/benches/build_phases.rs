//! Build time per phase: the attention example (64 tiles) and a full-chip matmul with search.
//! `cargo bench --bench build_phases`. Each build is repeated and the median per phase printed.

use ipu_host::build::{build, BuildOptions};

fn run(name: &str, src: &str, tiles: usize) {
    let mut samples: Vec<Vec<(&'static str, u128)>> = Vec::new();
    let mut totals = Vec::new();
    for _ in 0..5 {
        let t = std::time::Instant::now();
        let b = build(name, src, &BuildOptions::new(tiles)).expect("builds");
        totals.push(t.elapsed().as_micros());
        samples.push(b.timings);
    }
    totals.sort_unstable();
    let phases: Vec<&str> = samples[0].iter().map(|(p, _)| *p).collect();
    let median = |p: &str| {
        let mut v: Vec<u128> =
            samples.iter().filter_map(|s| s.iter().find(|(q, _)| *q == p).map(|x| x.1)).collect();
        v.sort_unstable();
        v[v.len() / 2]
    };
    let parts: Vec<String> = phases.iter().map(|p| format!("{p}={}ms", median(p))).collect();
    println!(
        "build_phases model={name} tiles={tiles} total_ms={:.1} {}",
        totals[2] as f64 / 1000.0,
        parts.join(" ")
    );
}

fn main() {
    let ex = |n: &str| {
        std::fs::read_to_string(format!("{}/../examples/{n}.toml", env!("CARGO_MANIFEST_DIR"))).unwrap()
    };
    run("attention", &ex("attention"), 64);
    run("qk", &ex("qk"), 64);
    run("matmul-1472", &ex("matmul"), 1472);
    let big = "name = \"big\"\noutputs = [\"C\"]\n[inputs.A]\ndtype = \"f16\"\nshape = [2048, 1024]\n[inputs.B]\ndtype = \"f16\"\n\
               shape = [1024, 2048]\n[[ops]]\nop = \"matmul\"\na = \"A\"\nb = \"B\"\noutput = \"C\"\ndtype = \"f16\"\naccumulate = \"f16\"\n";
    run("matmul-2048x1024x2048", big, 1472);
}
