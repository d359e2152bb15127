//! `ipu-core`: the Mk2 target model and the tile ISA, shared by the compiler and the simulator.
//!
//! `no_std` and allocation-free: everything here works on caller-provided buffers so that the same
//! semantics can run inside firmware-adjacent tools. See `docs/target.md` for the specification
//! this crate implements.
#![no_std]

pub mod fp8;
pub mod isa;
pub mod target;
pub mod tile;
pub mod topology;
