//! `splice simulate`: replays the API server's mutating chain for one pod, with the webhook's own
//! engine: every webhook entry in configuration-name order (a shared entry applying its policies
//! in name order, in one call), then one reinvocation pass for the `IfNeeded` ones a later
//! entry's change concerns. `--all-orders` replays every order of the entries (the order within a
//! shared entry is Splice's and never varies) and reports which policies' results depend on it,
//! and where.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::Value;
use splice_crds::{Operation, STATUS_ANNOTATION};

use super::offline::{
    self, Admission, ChainError, Entry, InputError, LoadedPolicy, NamespaceArgs, Outcome, Pass,
    Reinvocation, Step, Subject, skip_text,
};
use super::offline_diff::{self, Depth, LogicalPath, Norm, Seg};

/// `--all-orders` walks all n! orders of n webhook entries. Webhook calls are shared between orders (see [`Explorer`]),
/// but the walk itself is n!: 8! = 40320 orders take a few seconds, 9! would take ten times that.
const MAX_ALL_ORDERS_POLICIES: usize = 8;

#[derive(clap::Args)]
pub struct Args {
    /// InjectionPolicy files (several documents each, or directories of them).
    #[arg(short = 'p', long = "policy", value_name = "POLICY.yaml", required = true, num_args = 1..)]
    policies: Vec<PathBuf>,
    /// The pod to admit (or a workload, whose pod template is admitted); `-` reads stdin.
    #[arg(short = 'f', long = "filename", value_name = "POD.yaml")]
    file: PathBuf,
    #[command(flatten)]
    namespace: NamespaceArgs,
    /// Replay every order of the policies and report the ones whose result depends on it;
    /// exit 1 when any does.
    #[arg(long)]
    all_orders: bool,
}

pub fn main(args: Args) -> ExitCode {
    match run(&args) {
        Ok((text, code, warnings)) => {
            for warning in &warnings {
                eprintln!("warning: {warning}");
            }
            super::print_or_fail(&text, code)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// The report for stdout, the exit code, and the policies' warnings for stderr.
fn run(args: &Args) -> Result<(String, ExitCode, Vec<String>), InputError> {
    args.namespace
        .validate()
        .map_err(|e| InputError::file("--namespace-label", e))?;
    offline::stdin_at_most_once(args.policies.iter().chain([&args.file]))?;
    let mut policies = offline::load_policies_at(&args.policies, args.namespace.revision)?;
    offline::resolve_values_from(
        &mut policies,
        &args.namespace.values_from,
        &args.namespace.splice_namespace,
    )?;
    let warnings = offline::policy_warnings(&policies);
    let paused = offline::without_paused(&mut policies);
    let subject = offline::read_subject(&args.file)?;
    let namespace = args.namespace.context(subject.own_namespace.as_deref());
    let exclusions = args.namespace.exclusions();
    let admission = Admission {
        operation: Operation::Create,
        namespace: &namespace,
        exclusions: &exclusions,
        trust_domain: &args.namespace.trust_domain,
    };

    let mut out = String::new();
    let labels: Vec<String> = namespace
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let _ = writeln!(
        out,
        "{}: CREATE in namespace {} (labels: {})",
        subject.title,
        namespace.name,
        labels.join(", ")
    );

    if !paused.is_empty() {
        let _ = writeln!(
            out,
            "paused, so never called (no webhook configuration): {}",
            paused.join(", ")
        );
    }
    for line in offline::pod_security_lines(&policies)
        .into_iter()
        .chain(offline::mode_lines(&policies))
    {
        let _ = writeln!(out, "{line}");
    }
    let entries = offline::entries(&policies, &args.namespace.splice_namespace);
    render_entries(&policies, &entries, &mut out);

    if args.all_orders {
        if entries.len() > MAX_ALL_ORDERS_POLICIES {
            return Err(InputError::file(
                "--all-orders",
                format!(
                    "compares every order of at most {MAX_ALL_ORDERS_POLICIES} webhook entries \
                     ({} orders); got {} entries",
                    factorial(MAX_ALL_ORDERS_POLICIES),
                    entries.len()
                ),
            ));
        }
        let analysis = all_orders(&policies, &entries, &subject, admission)?;
        let code = analysis.render(&policies, &mut out);
        return Ok((out, code, warnings));
    }

    let (_, steps) = offline::run_chain(&policies, &entries, subject.pod.clone(), admission)
        .map_err(|e| subject.error(e.to_string()))?;
    render_steps(&policies, &steps, &mut out);
    Ok((out, ExitCode::SUCCESS, warnings))
}

/// The webhook entries and the order the API server calls them in; a shared entry's policies are
/// applied in one call, in name order, so their relative order is Splice's and never varies.
fn render_entries(policies: &[LoadedPolicy], entries: &[Entry], out: &mut String) {
    let _ = writeln!(
        out,
        "admission in the API server's order (in-tree policies first, then webhook entries by \
         configuration name):"
    );
    for entry in entries {
        let names: Vec<&str> = entry
            .members
            .iter()
            .map(|&i| policies[i].name.as_str())
            .collect();
        if names.len() > 1 {
            let _ = writeln!(
                out,
                "  {}: one call, applying {} in that order",
                entry.configuration,
                names.join(" → ")
            );
        } else {
            let _ = writeln!(out, "  {}: {}", entry.configuration, names.join(""));
        }
    }
}

fn render_steps(policies: &[LoadedPolicy], steps: &[Step], out: &mut String) {
    let names: Vec<&str> = policies.iter().map(|p| p.name.as_str()).collect();
    let mut changed_by: Vec<&str> = Vec::new();
    let mut announced_reinvocation = false;
    for (i, step) in steps.iter().enumerate() {
        if step.pass == Pass::Reinvocation && !announced_reinvocation {
            let _ = writeln!(
                out,
                "reinvocation pass (IfNeeded webhooks that ran before a later webhook's change):"
            );
            announced_reinvocation = true;
        }
        let name = names[step.policy];
        let pass = match step.pass {
            Pass::First => "",
            Pass::Reinvocation => " (reinvoked)",
        };
        match &step.outcome {
            Outcome::Skipped(reason) => {
                let _ = writeln!(
                    out,
                    "step {}: {name}{pass}: not called: {}",
                    i + 1,
                    skip_text(*reason)
                );
            }
            Outcome::LeftOut { warning } => {
                let _ = writeln!(
                    out,
                    "step {}: {name}{pass}: failed, left out of its entry's call",
                    i + 1
                );
                let _ = writeln!(out, "    warning: {warning}");
            }
            Outcome::Patched { patch, warnings } => {
                let ops = patch.as_array().map(Vec::as_slice).unwrap_or_default();
                if ops.is_empty() {
                    let _ = writeln!(out, "step {}: {name}{pass}: no change", i + 1);
                } else {
                    let _ = writeln!(
                        out,
                        "step {}: {name}{pass}: patch with {} operation{}{}",
                        i + 1,
                        ops.len(),
                        if ops.len() == 1 { "" } else { "s" },
                        if step.changed {
                            ""
                        } else {
                            " (the pod does not change)"
                        }
                    );
                    for op in ops {
                        let _ = writeln!(out, "    {op}");
                    }
                    if step.changed && !changed_by.contains(&name) {
                        changed_by.push(name);
                    }
                }
                for w in warnings {
                    let _ = writeln!(out, "    warning: {w}");
                }
            }
        }
    }
    if changed_by.is_empty() {
        let _ = writeln!(out, "result: unchanged");
    } else {
        let _ = writeln!(out, "result: changed by {}", changed_by.join(", "));
    }
}

/// One distinct outcome over all orders.
struct Group {
    result: Result<Norm, ChainError>,
    orders: u64,
    /// The first order (in lexicographic order of policy indexes) that gives it.
    example: Vec<usize>,
}

struct Analysis {
    orders: u64,
    groups: Vec<Group>,
    /// Per policy, the logical leaf paths its webhook changed in any order.
    touched: Vec<BTreeSet<LogicalPath>>,
}

/// A distinct pod met while replaying orders.
struct State {
    object: Value,
    norm: Norm,
}

/// What calling one webhook on one state gives.
#[derive(Clone, Copy)]
struct Call {
    called: bool,
    changed: bool,
    next: usize,
}

/// Replays every order of the policies. Pods that are equal as Kubernetes reads them (see
/// `offline_diff`) are one state, and each webhook entry is called once per state, so the n! orders cost
/// table look-ups rather than n! · 2n engine calls. The approximation: a policy whose output
/// depends on the order of named items (say, a template reading `pod.spec.containers[0]`) is
/// assumed to give the same pod for the same items in another order.
struct Explorer<'a> {
    policies: &'a [LoadedPolicy],
    entries: &'a [Entry],
    admission: Admission<'a>,
    states: Vec<State>,
    by_canonical: HashMap<String, usize>,
    /// (entry, state) → the call's result.
    calls: HashMap<(usize, usize), Result<Call, ChainError>>,
    touched: Vec<BTreeSet<LogicalPath>>,
    /// Outcome → its group index.
    groups: Vec<(Result<usize, ChainError>, u64, Vec<usize>)>,
    group_of_state: HashMap<usize, usize>,
    group_of_error: HashMap<String, usize>,
    orders: u64,
}

fn all_orders(
    policies: &[LoadedPolicy],
    entries: &[Entry],
    subject: &Subject,
    admission: Admission<'_>,
) -> Result<Analysis, InputError> {
    let mut explorer = Explorer {
        policies,
        entries,
        admission,
        states: Vec::new(),
        by_canonical: HashMap::new(),
        calls: HashMap::new(),
        touched: vec![BTreeSet::new(); policies.len()],
        groups: Vec::new(),
        group_of_state: HashMap::new(),
        group_of_error: HashMap::new(),
        orders: 0,
    };
    let start = explorer.intern(subject.pod.clone());
    let mut prefix = Vec::with_capacity(entries.len());
    let mut remaining: Vec<usize> = (0..entries.len()).collect();
    explorer.explore(start, &Reinvocation::default(), &mut prefix, &mut remaining);

    // The same failure in every order is not about order: it is a broken policy or pod.
    if let [(Err(e), _, _)] = explorer.groups.as_slice() {
        return Err(subject.error(e.to_string()));
    }
    let Explorer {
        states,
        groups,
        touched,
        orders,
        ..
    } = explorer;
    let groups = groups
        .into_iter()
        .map(|(result, orders, example)| Group {
            result: result.map(|s| states[s].norm.clone()),
            orders,
            example,
        })
        .collect();
    Ok(Analysis {
        orders,
        groups,
        touched,
    })
}

impl Explorer<'_> {
    fn intern(&mut self, object: Value) -> usize {
        let norm = offline_diff::normalize(&object);
        let key = norm.canonical();
        if let Some(&id) = self.by_canonical.get(&key) {
            return id;
        }
        let id = self.states.len();
        self.states.push(State { object, norm });
        self.by_canonical.insert(key, id);
        id
    }

    /// Calls entry `e` on a state as one webhook call, as the API server would.
    fn call_entry(&mut self, e: usize, state: usize) -> Result<Call, ChainError> {
        if let Some(known) = self.calls.get(&(e, state)) {
            return known.clone();
        }
        let entries = self.entries;
        let result = offline::call_entry(
            self.policies,
            &entries[e].members,
            Pass::First,
            &self.states[state].object,
            self.admission,
        )
        .map(|call| {
            // Who changed what: each member against the object the ones before it left.
            let mut before = state;
            for (&index, after) in entries[e].members.iter().zip(call.after) {
                let Some(object) = after else { continue };
                let after = self.intern(object);
                if after != before {
                    let touched = offline_diff::diff(
                        &self.states[before].norm,
                        &self.states[after].norm,
                        Depth::Leaves,
                    );
                    self.touched[index].extend(touched);
                }
                before = after;
            }
            let changed = call.next.is_some();
            Call {
                called: call.steps.iter().any(offline::Step::called),
                changed,
                next: call.next.map_or(state, |object| self.intern(object)),
            }
        });
        self.calls.insert((e, state), result.clone());
        result
    }

    /// An order of entries as the order of the policies they apply.
    fn flat(&self, order: &[usize]) -> Vec<usize> {
        order
            .iter()
            .flat_map(|&e| self.entries[e].members.iter().copied())
            .collect()
    }

    fn explore(
        &mut self,
        state: usize,
        reinvocation: &Reinvocation,
        prefix: &mut Vec<usize>,
        remaining: &mut Vec<usize>,
    ) {
        if remaining.is_empty() {
            self.reinvocation_pass(state, reinvocation.clone(), prefix);
            return;
        }
        for i in 0..remaining.len() {
            let e = remaining.remove(i);
            prefix.push(e);
            match self.call_entry(e, state) {
                Ok(call) => {
                    let mut next = reinvocation.clone();
                    let policy = self.entries[e]
                        .members
                        .first()
                        .map(|&index| self.policies[index].reinvocation);
                    next.record(e, call.called, call.changed, policy.unwrap_or_default());
                    self.explore(call.next, &next, prefix, remaining);
                }
                Err(err) => {
                    // Every completion of this prefix fails the same way.
                    let mut example = prefix.clone();
                    example.extend(remaining.iter().copied());
                    let example = self.flat(&example);
                    self.add(Err(err), factorial(remaining.len()), example);
                }
            }
            prefix.pop();
            remaining.insert(i, e);
        }
    }

    fn reinvocation_pass(
        &mut self,
        mut state: usize,
        mut reinvocation: Reinvocation,
        order: &[usize],
    ) {
        let flat = self.flat(order);
        for &e in order {
            if !reinvocation.take(e) {
                continue;
            }
            match self.call_entry(e, state) {
                Ok(call) => state = call.next,
                Err(err) => {
                    let err = ChainError {
                        message: format!("when reinvoked: {}", err.message),
                        ..err
                    };
                    self.add(Err(err), 1, flat);
                    return;
                }
            }
        }
        self.add(Ok(state), 1, flat);
    }

    fn add(&mut self, result: Result<usize, ChainError>, orders: u64, example: Vec<usize>) {
        self.orders += orders;
        let known = match &result {
            Ok(state) => self.group_of_state.get(state),
            Err(e) => self.group_of_error.get(&e.message),
        };
        if let Some(&g) = known {
            self.groups[g].1 += orders;
            return;
        }
        let g = self.groups.len();
        match &result {
            Ok(state) => self.group_of_state.insert(*state, g),
            Err(e) => self.group_of_error.insert(e.message.clone(), g),
        };
        self.groups.push((result, orders, example));
    }
}

impl Analysis {
    fn render(&self, policies: &[LoadedPolicy], out: &mut String) -> ExitCode {
        let names: Vec<&str> = policies.iter().map(|p| p.name.as_str()).collect();
        let order_text = |order: &[usize]| {
            order
                .iter()
                .map(|&i| names[i])
                .collect::<Vec<_>>()
                .join(" → ")
        };
        if self.groups.len() <= 1 {
            let _ = writeln!(
                out,
                "order-independent: all {} orders of {} polic{} ({}) give the same pod",
                self.orders,
                names.len(),
                if names.len() == 1 { "y" } else { "ies" },
                names.join(", ")
            );
            return ExitCode::SUCCESS;
        }

        let ok: Vec<(&Group, &Norm)> = self
            .groups
            .iter()
            .filter_map(|g| g.result.as_ref().ok().map(|n| (g, n)))
            .collect();
        let mut paths: BTreeSet<LogicalPath> = BTreeSet::new();
        if let Some((_, baseline)) = ok.first() {
            for (_, other) in &ok[1..] {
                paths.extend(offline_diff::diff(baseline, other, Depth::Shallow));
            }
        }

        let mut findings: Vec<(LogicalPath, Vec<&str>)> = Vec::new();
        let mut implicated: BTreeSet<&str> = BTreeSet::new();
        for path in &paths {
            let who: Vec<&str> = (0..policies.len())
                .filter(|&i| self.touched[i].iter().any(|t| t.overlaps(path)))
                .map(|i| names[i])
                .collect();
            implicated.extend(who.iter().copied());
            findings.push((path.clone(), who));
        }
        let failures: Vec<&Group> = self.groups.iter().filter(|g| g.result.is_err()).collect();
        for g in &failures {
            // A policy that fails in some orders only depends on what another one injects first.
            if let Err(e) = &g.result
                && let Some(name) = names.iter().find(|n| **n == e.policy)
            {
                implicated.insert(name);
            }
        }

        let _ = writeln!(
            out,
            "order-dependent: {} distinct results over {} orders; policies whose order matters: {}",
            self.groups.len(),
            self.orders,
            if implicated.is_empty() {
                "(could not tell)".to_owned()
            } else {
                implicated.iter().copied().collect::<Vec<_>>().join(", ")
            }
        );
        // Splice's provenance annotation differs whenever what each policy injected does; it is
        // only worth detailing when nothing else differs (two policies injecting the same item).
        let (provenance, content): (Vec<_>, Vec<_>) = findings
            .into_iter()
            .partition(|(path, _)| is_provenance(path));
        let detailed = if content.is_empty() {
            provenance.iter().collect::<Vec<_>>()
        } else {
            content.iter().collect()
        };
        for (path, who) in detailed {
            let _ = writeln!(out, "\n{path}");
            let _ = writeln!(
                out,
                "  set by: {}",
                if who.is_empty() {
                    "(could not tell)".to_owned()
                } else {
                    who.join(", ")
                }
            );
            // Distinct values at this path, each with how many orders give it and one of them.
            let mut values: BTreeMap<String, (u64, &[usize])> = BTreeMap::new();
            for (g, norm) in &ok {
                let shown = show(norm, path);
                let entry = values.entry(shown).or_insert((0, &g.example));
                entry.0 += g.orders;
            }
            for (value, (count, example)) in &values {
                let _ = writeln!(
                    out,
                    "  {value}  in {count} order{}, e.g. {}",
                    if *count == 1 { "" } else { "s" },
                    order_text(example)
                );
            }
        }
        if !content.is_empty() && !provenance.is_empty() {
            let who: BTreeSet<&str> = provenance
                .iter()
                .flat_map(|(_, w)| w.iter().copied())
                .collect();
            let _ = writeln!(
                out,
                "\n{STATUS_ANNOTATION} differs accordingly (what {} recorded as injected)",
                who.into_iter().collect::<Vec<_>>().join(", ")
            );
        }
        for g in failures {
            if let Err(e) = &g.result {
                let _ = writeln!(
                    out,
                    "\nfails in {} order{}, e.g. {}: {e}",
                    g.orders,
                    if g.orders == 1 { "" } else { "s" },
                    order_text(&g.example)
                );
            }
        }
        ExitCode::from(1)
    }
}

fn is_provenance(path: &LogicalPath) -> bool {
    matches!(
        path.0.as_slice(),
        [Seg::Field(m), Seg::Field(a), Seg::Field(s), ..]
            if m == "metadata" && a == "annotations" && s == STATUS_ANNOTATION
    )
}

/// The value at `path` in one result, compact, for the report.
fn show(norm: &Norm, path: &LogicalPath) -> String {
    const MAX: usize = 160;
    let Some(found) = norm.get(path.value_path()) else {
        return "(absent)".to_owned();
    };
    let text = if path.is_order() {
        match found {
            Norm::Keyed {
                order: Some(order), ..
            } => format!("order {}", order.join(", ")),
            other => other.to_value().to_string(),
        }
    } else {
        found.to_value().to_string()
    };
    if text.chars().count() > MAX {
        let cut: String = text.chars().take(MAX).collect();
        format!("{cut}…")
    } else {
        text
    }
}

fn factorial(n: usize) -> u64 {
    (1..=n as u64).product()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factorials_count_the_orders() {
        assert_eq!(factorial(0), 1);
        assert_eq!(factorial(1), 1);
        assert_eq!(factorial(8), 40320);
    }

    #[test]
    fn a_value_is_shown_compactly_and_absence_is_named() {
        let norm = offline_diff::normalize(&serde_json::json!({
            "spec": {"initContainers": [{"name": "b"}, {"name": "a"}], "x": "y".repeat(300)}
        }));
        let order = LogicalPath(vec![
            offline_diff::Seg::Field("spec".into()),
            offline_diff::Seg::Field("initContainers".into()),
            offline_diff::Seg::Order,
        ]);
        assert_eq!(show(&norm, &order), "order b, a");
        let absent = LogicalPath(vec![offline_diff::Seg::Field("nope".into())]);
        assert_eq!(show(&norm, &absent), "(absent)");
        let long = LogicalPath(vec![
            offline_diff::Seg::Field("spec".into()),
            offline_diff::Seg::Field("x".into()),
        ]);
        assert!(show(&norm, &long).ends_with('…'));
    }
}
