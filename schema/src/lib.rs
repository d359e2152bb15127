//! `ipu-schema`: the on-disk formats of `ipu-codegen` (`docs/format.md`).
//!
//! `no_std` with `alloc`: section bodies are variable-sized (hundreds of tensors, 1472 tile images)
//! and are decoded into owned values after their checksums pass; the container itself is read
//! through zerocopy views.
#![no_std]
#![forbid(unsafe_code)]
extern crate alloc;

mod container;
mod sections;

pub use container::{read_container, write_container, ContainerError, Header, SectionEntry, SectionKind};
pub use sections::*;
