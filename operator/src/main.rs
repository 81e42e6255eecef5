//! The `splice` binary. Thin: parse the command line, hand off to one module per subcommand.

mod cli;

/// Under 32 concurrent creates a third of the webhook's CPU went to the C library's malloc and
/// free (docs/performance.md, "Where the time goes"); mimalloc's per-thread heaps take most of it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::Cli::from_args().run()
}
