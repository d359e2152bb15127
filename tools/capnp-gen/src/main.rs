//! Regenerates `host/src/profile/profile_capnp.rs` from `schema/profile.capnp`
//! (`scripts/gen-capnp.sh`; CI checks the committed file is what this produces). Needs the
//! `capnp` compiler (Debian package capnproto).

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, root, out] = &args[..] else {
        eprintln!("usage: capnp-gen REPO_ROOT OUT_DIR");
        std::process::exit(2);
    };
    capnpc::CompilerCommand::new()
        .src_prefix(format!("{root}/schema"))
        .file(format!("{root}/schema/profile.capnp"))
        .default_parent_module(vec!["profile".into()])
        .output_path(out)
        .run()
        .expect("capnp compile");
}
