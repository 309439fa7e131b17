//! The `mnemo` binary: the command line (`cli`) over the server library, and the evaluation and
//! benchmark commands (`tools`), which live here rather than in the library.

mod cli;
mod tools;

fn main() -> std::process::ExitCode {
    cli::main()
}
