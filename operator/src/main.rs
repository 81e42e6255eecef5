//! The `splice` binary. Thin: parse the command line, hand off to one module per subcommand.

mod cli;

fn main() -> std::process::ExitCode {
    cli::Cli::from_args().run()
}
