//! `ipu-core`: the Mk2 target model and the tile ISA, shared by the compiler and the simulator.
//!
//! `no_std` and allocation-free: everything here works on caller-provided buffers so that the same
//! semantics can run inside firmware-adjacent tools. See `docs/target.md` for the specification
//! this crate implements.
//!
//! The tile model (ISA, execution) is allocation-free. The graph IR and the planner use `alloc`:
//! plans grow with tiles × operations (1472 tiles, hundreds of ops) and fixed worst-case buffers
//! would be megabytes of static memory; see `docs/architecture.md`.
#![no_std]
#![forbid(unsafe_code)]
extern crate alloc;

pub mod f16bits;
pub mod fp8;
pub mod graph;
pub mod isa;
pub mod plan;
pub mod target;
pub mod tile;
pub mod topology;
