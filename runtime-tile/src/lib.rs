//! `ipu-runtime-tile`: on-tile code — the assembler, the supervisor runtime and the worker
//! kernels. `no_std`; code generation uses `alloc` for its text.
#![no_std]
#![forbid(unsafe_code)]
extern crate alloc;

mod amp_strided;
pub mod asm;
pub mod kernels;
pub mod launch_loop;
pub mod layernorm;
pub mod map;
pub mod reduce_rows;
pub mod runtime;
mod softmax;
