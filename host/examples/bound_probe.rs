//! Where the f64 bound is loose: for a package, the host reference of every tensor (the
//! device-precision value the device must match bit for bit, the f64 value and its bound), and
//! per op output the largest error, the largest bound and the worst error/bound ratio.
//!
//! `cargo run --release -p ipu-host --example bound_probe -- PACKAGE [NAME=FILE.npy]... [--seed S]`

use ipu_host::{npy, reference, session, verdict};
use ipu_schema::Direction;
use std::collections::BTreeMap;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: bound_probe PACKAGE [NAME=FILE.npy]... [--seed S]");
    let mut files = BTreeMap::new();
    let mut seed = 1u64;
    while let Some(a) = args.next() {
        if a == "--seed" {
            seed = args.next().expect("--seed S").parse().expect("seed");
        } else {
            let (n, f) = a.split_once('=').expect("NAME=FILE.npy");
            files.insert(n.to_string(), npy::read(std::path::Path::new(f)).expect("npy"));
        }
    }
    let pkg = session::read_package(std::path::Path::new(&path)).expect("package");
    let g = ipu_host::model::parse("<package model>", &pkg.info.model_source).expect("model");
    let mut src = session::param_values(&pkg).expect("params");
    for b in pkg.bindings.iter().filter(|b| b.direction == Direction::Input) {
        let t =
            files.remove(&b.name).unwrap_or_else(|| session::generated(b, session::iteration_seed(seed, 1)));
        src.insert(b.name.clone(), t);
    }
    let t0 = std::time::Instant::now();
    let ev = reference::evaluate(&g, &src, &pkg.plan.grids, &pkg.plan.alpha_on_a).expect("evaluate");
    eprintln!("reference: {:.3} s", t0.elapsed().as_secs_f64());
    println!(
        "{:>4} {:<24} {:<10} {:>7} {:>10} {:>10} {:>10} {:>10} {:>8} {:>5}",
        "op", "output", "kind", "elems", "max_err", "max_bound", "max_rig", "max_|y|", "worst_r", "over"
    );
    for (i, op) in g.ops.iter().enumerate() {
        let t = g.tensor(op.output);
        let dev = &ev.device[&t.name];
        let (ex, bd) = (&ev.exact[&t.name], &ev.bound[&t.name]);
        let mr = ev.rigorous_max.get(&t.name).copied().unwrap_or(0.0);
        let v = verdict::Values { dtype: dev.dtype, scale: t.scale, data: &dev.data };
        let (mut me, mut mb, mut my, mut wr, mut over) = (0f64, 0f64, 0f64, 0f64, 0u64);
        for j in 0..ex.len() {
            let e = verdict::abs_error(verdict::real(&v, j), ex[j]);
            me = me.max(e);
            mb = mb.max(bd[j]);
            my = my.max(ex[j].abs());
            if e > 0.0 {
                wr = wr.max(e / bd[j]);
            }
            if e > bd[j] || e.is_nan() {
                over += 1;
            }
        }
        let kind = format!("{:?}", op.kind);
        let kind: String = kind.chars().take_while(|c| c.is_alphanumeric()).collect();
        println!(
            "{i:>4} {:<24} {:<10} {:>7} {me:>10.3e} {mb:>10.3e} {mr:>10.3e} {my:>10.3e} {wr:>9.3e} {over:>5}",
            &t.name[..t.name.len().min(24)],
            kind,
            ex.len()
        );
    }
    println!(
        "probabilistic elements: {} (union bound {:.2e})",
        ev.events,
        ev.events as f64 * 2.0 * (-reference::LAMBDA.powi(2) / 2.0).exp()
    );
}
