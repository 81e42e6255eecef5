use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "splice", version, about = "Owns the lifecycle of mutating admission webhooks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the InjectionPolicy CRD as YAML.
    Crd,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => print!("{}", splice_crds::crd_yaml()?),
    }
    Ok(())
}
