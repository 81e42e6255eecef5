//! The `splice` binary. Thin: parse the command line, hand off to one module per subcommand.

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    cli::Cli::parse().run()
}
