//! The `mnemo` binary: the command line (`cli`) over the server library, and the evaluation and
//! benchmark commands (`tools`), which live here rather than in the library.

mod cli;
mod tools;

fn main() -> std::process::ExitCode {
    // The extraction worker the server runs for each document: nothing else is set up.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(mnemo::text::extract::WORKER_COMMAND) {
        return mnemo::text::extract::worker_main(&args[1..]);
    }
    cli::main()
}
