//! One module per subcommand; each owns its flags and returns the process exit code.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

mod crd;
mod explain;
mod inject;
mod offline;
mod offline_diff;
mod rollout;
pub(crate) mod rotate;
mod run;
mod simulate;
pub(crate) mod uninstall;
mod webhook;

#[derive(Parser)]
#[command(
    name = "splice",
    version,
    about = "Owns the lifecycle of mutating admission webhooks"
)]
pub struct Cli {
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(subcommand)]
    command: Command,
}

/// How commands that talk to the cluster (`run`, `explain POD`, `rotate`) find it: kubectl's own
/// flags, so `kubectl splice ...` (this binary installed as `kubectl-splice`) takes what kubectl
/// takes. kubectl hands a plugin its arguments as typed, not its environment.
#[derive(clap::Args, Clone, Debug, Default)]
pub(crate) struct ClusterArgs {
    /// Path to the kubeconfig file [default: $KUBECONFIG, else ~/.kube/config, else in-cluster].
    #[arg(long, global = true, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use [default: its current-context].
    #[arg(long, global = true, value_name = "NAME")]
    context: Option<String>,
}

impl ClusterArgs {
    /// A client for the cluster `--kubeconfig` and `--context` name, else kube's usual inference
    /// (KUBECONFIG, ~/.kube/config, in-cluster).
    pub(crate) async fn client(&self) -> anyhow::Result<kube::Client> {
        use anyhow::Context as _;
        use kube::config::{Config, KubeConfigOptions, Kubeconfig};
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let file = Kubeconfig::read_from(path)
                    .with_context(|| format!("reading --kubeconfig {}", path.display()))?;
                Config::from_custom_kubeconfig(file, &options)
                    .await
                    .with_context(|| format!("using --kubeconfig {}", path.display()))?
            }
            (None, Some(context)) => Config::from_kubeconfig(&options)
                .await
                .with_context(|| format!("using --context {context} of the kubeconfig"))?,
            (None, None) => Config::infer()
                .await
                .context("finding the cluster (in-cluster config or KUBECONFIG)")?,
        };
        Ok(kube::Client::try_from(config)?)
    }
}

/// `-n/--namespace`: Splice's own namespace, for the commands that act on an installed Splice
/// (`rotate`, `uninstall`).
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct SpliceNamespace {
    /// Splice's namespace (its CA Secret, its Deployment).
    #[arg(
        short = 'n',
        long,
        env = "SPLICE_NAMESPACE",
        default_value = "splice-system"
    )]
    pub(crate) namespace: String,
}

/// Runs a one-shot cluster command (`rotate`, `uninstall`) to its end on a single-threaded runtime
/// and turns its outcome into the exit code, printing `error: ...` on failure.
pub(crate) fn run_to_exit(work: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let outcome = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))
        .and_then(|runtime| runtime.block_on(work));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether the binary was started as kubectl's plugin (`kubectl-splice`, e.g. a link that
/// `make install` creates), from its program name.
fn invoked_as_kubectl_plugin(program: Option<&OsString>) -> bool {
    program
        .and_then(|p| std::path::Path::new(p).file_name())
        .is_some_and(|name| name == "kubectl-splice")
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller (leader only), the webhook server and the admin server.
    Run(Box<run::Args>),
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
    /// Show and steer a policy's rollout (spec.rollout): status [-w], halt, resume, promote, undo.
    Rollout(rollout::Args),
    /// Stop Splice and delete the admission configuration it wrote (policies stay).
    Uninstall(uninstall::Args),
}

impl Cli {
    /// Parses the process's arguments; started as `kubectl-splice`, usage and errors say
    /// `kubectl splice`, as the user typed it.
    pub fn from_args() -> Self {
        let mut command = Self::command();
        if invoked_as_kubectl_plugin(std::env::args_os().next().as_ref()) {
            command = command.bin_name("kubectl splice");
        }
        let matches = command.get_matches();
        Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }

    pub fn run(self) -> ExitCode {
        let cluster = &self.cluster;
        match self.command {
            Command::Run(args) => run::main(*args, cluster),
            Command::Inject(args) => inject::main(args),
            Command::Simulate(args) => simulate::main(args),
            Command::Webhook(args) => webhook::main(args),
            Command::Explain(args) => explain::main(args, cluster),
            Command::Crd => crd::main(),
            Command::Rotate(args) => rotate::main(args, cluster),
            Command::Rollout(args) => rollout::main(args, cluster),
            Command::Uninstall(args) => uninstall::main(args, cluster),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(argv: &[&str]) -> Cli {
        Cli::try_parse_from(argv).unwrap()
    }

    #[test]
    fn kubectls_kubeconfig_and_context_flags_are_taken_after_any_command_as_kubectl_passes_them() {
        for argv in [
            &[
                "kubectl-splice",
                "explain",
                "web",
                "-n",
                "shop",
                "--kubeconfig",
                "/k",
                "--context",
                "c",
            ][..],
            &[
                "kubectl-splice",
                "rotate",
                "--context",
                "c",
                "-n",
                "splice-system",
                "--kubeconfig",
                "/k",
            ],
            &["splice", "--kubeconfig", "/k", "--context", "c", "run"],
        ] {
            let cli = parse(argv);
            assert_eq!(
                cli.cluster.kubeconfig,
                Some(PathBuf::from("/k")),
                "{argv:?}"
            );
            assert_eq!(cli.cluster.context.as_deref(), Some("c"), "{argv:?}");
        }
        let cli = parse(&["splice", "crd"]);
        assert_eq!((cli.cluster.kubeconfig, cli.cluster.context), (None, None));
    }

    #[test]
    fn the_plugin_is_recognised_by_its_program_name_kubectl_splice() {
        let name = |p: &str| invoked_as_kubectl_plugin(Some(&OsString::from(p)));
        assert!(name("/usr/local/bin/kubectl-splice"));
        assert!(name("kubectl-splice"));
        assert!(!name("/usr/local/bin/splice"));
        assert!(!invoked_as_kubectl_plugin(None));
    }
}
