//! The `throng` binary: the command line over the scenarios throng ships.

fn main() -> std::process::ExitCode {
    throng::cli::main_with(throng::scenarios::Registry::builtin())
}
