//! The `mnemo` binary: parses the command line and hands over to `mnemo::cli`.

fn main() -> std::process::ExitCode {
    mnemo::cli::main()
}
