//! `ipu-codegen`: build, run, inspect and debug Graphcore Mk2 programs without the vendor SDK.

mod cli;
mod term;

fn main() -> std::process::ExitCode {
    cli::main()
}
