//! `ipu-host`: the std shell around the no_std crates.
