//! `ipu-runtime-tile`: on-tile code — the assembler, the supervisor runtime and kernels; no_std.
#![no_std]

pub mod asm;
