//! Fuzz harnesses: one function per untrusted input format. Each must return for any input —
//! never panic — and says whether the input was accepted. `fuzz/` wraps them for cargo-fuzz
//! (libFuzzer) and `tests/tests/fuzz_smoke.rs` runs them on deterministic mutations in
//! `cargo test`, so they cannot rot.

use crate::package::Package;

/// The package reader and validator.
pub fn package(data: &[u8]) -> bool {
    Package::from_bytes(data).is_ok()
}

/// The model-file parser (and, for models that parse, the planner with a small tile count).
pub fn model(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else { return false };
    match crate::model::parse("fuzz.toml", text) {
        Ok(g) => {
            let _ = ipu_core::plan::plan(&g, ipu_core::plan::PlanOptions::new(4));
            true
        }
        Err(_) => false,
    }
}

/// The `.npy` reader.
pub fn npy(data: &[u8]) -> bool {
    crate::npy::from_bytes(data).is_ok()
}

/// The tile assembler.
pub fn asm(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else { return false };
    crate::program::TileProgram::from_asm(text).is_ok()
}

/// The search-state loader.
pub fn search_state(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else { return false };
    crate::search::parse_state(text).is_ok()
}

/// The profile reader (`schema/profile.capnp` with its validation).
pub fn profile(data: &[u8]) -> bool {
    crate::profile::Profile::from_capnp(data).is_ok()
}

/// The ONNX importer (protobuf decoding, constant folding, lowering); external data is looked
/// up in a directory that does not exist, so a hostile `location` reaches no file.
pub fn onnx(data: &[u8]) -> bool {
    let dir = std::path::Path::new("/nonexistent/ipu-codegen-fuzz");
    crate::onnx::import_bytes(data.to_vec(), "fuzz.onnx", dir, &crate::onnx::ImportOptions::new()).is_ok()
}
