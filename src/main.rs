//! The `dlq` binary: parse, validate once, run one subcommand, return its exit code.

mod cli;

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(cli::main())
}
