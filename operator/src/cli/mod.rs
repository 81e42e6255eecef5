//! One module per subcommand; each owns its flags and returns the process exit code.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

mod crd;
mod explain;
mod inject;
mod offline;
mod offline_diff;
pub(crate) mod rotate;
mod run;
mod simulate;
mod webhook;

#[derive(Parser)]
#[command(
    name = "splice",
    version,
    about = "Owns the lifecycle of mutating admission webhooks"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller (leader only), the webhook server and the admin server.
    Run(run::Args),
    /// Apply policies offline to manifests (the GitOps path).
    Inject(inject::Args),
    /// Replay the API server's mutating chain for a pod.
    Simulate(simulate::Args),
    /// Serve the webhook alone, with static policies and no cluster.
    Webhook(webhook::Args),
    /// Explain which policies apply to a pod, and why.
    Explain(explain::Args),
    /// Print the InjectionPolicy CRD as YAML.
    Crd,
    /// Ask the running leader to rotate the webhook CA now.
    Rotate(rotate::Args),
}

impl Cli {
    pub fn run(self) -> ExitCode {
        match self.command {
            Command::Run(args) => run::main(args),
            Command::Inject(args) => inject::main(args),
            Command::Simulate(args) => simulate::main(args),
            Command::Webhook(args) => webhook::main(args),
            Command::Explain(args) => explain::main(args),
            Command::Crd => crd::main(),
            Command::Rotate(args) => rotate::main(args),
        }
    }
}

/// A duration flag: `90` (seconds), `90s`, `5m`, `1h` or `3d`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 90s, 5m, 1h or 3d"))?;
    let factor = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "{s:?} has an unknown unit {unit:?} (use s, m, h or d)"
            ));
        }
    };
    n.checked_mul(factor)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// Writes a command's whole output to stdout, or says why it could not and gives exit code 2
/// (a closed pipe must not look like success).
pub(crate) fn print_or_fail(text: &str, code: ExitCode) -> ExitCode {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => code,
        Err(e) => {
            eprintln!("error: cannot write the output: {e}");
            ExitCode::from(2)
        }
    }
}
