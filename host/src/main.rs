//! `ipu-codegen`: build, run, inspect and debug Graphcore Mk2 programs without the vendor SDK.

mod cli;
mod term;

/// mimalloc instead of the system allocator: a whole-chip build allocates and frees hundreds of
/// kilobytes of descriptor words per tile, and glibc returned each such block to the kernel, so
/// the next one faulted in fresh zeroed pages (a third of the SigLIP attention build's time was
/// page faults; docs/dependencies.md). The allocator does not change what is built.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
