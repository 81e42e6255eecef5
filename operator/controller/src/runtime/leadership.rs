//! One leadership term: the leader's work, started when this replica becomes leader and ended,
//! every task of it, when it stops.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, MutatingWebhookConfiguration,
};
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use splice_crds::{InjectionPolicy, MANAGED_BY_LABEL, MANAGER};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::janitor::sweep_orphans;
use super::{Caches, changes, policy_api, watcher_config};
use crate::context::ContextParts;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::policy::reconcile::{error_policy, reconcile};
use crate::policy::{neighbours, validating};
use crate::{Context, Settings, certs, coverage, driver, guard, identity, probe, rollout, view};

/// The tasks of one leadership term, owned together: ending the term (or dropping it) aborts
/// every one of them, whichever await each is in. A dropped `JoinHandle` would detach its task
/// instead, and a task that outlived its term would keep writing as a leader.
#[derive(Default)]
pub(super) struct Term {
    tasks: JoinSet<()>,
}

impl Term {
    fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(task);
    }

    /// Aborts every task of the term and waits until each has stopped.
    async fn end(mut self) {
        self.tasks.shutdown().await;
    }
}

/// Starts a term (`begin`) whenever this replica becomes leader and ends it, every task of it,
/// when it stops being leader; a replica elected again starts one new term, never a second
/// copy of a loop.
pub(super) async fn supervise_leadership(
    metrics: Arc<Metrics>,
    mut leading: Leadership,
    mut begin: impl FnMut(Leadership) -> Term,
) {
    loop {
        if !leading.begun().await {
            return;
        }
        tracing::info!("leading: starting the controller");
        metrics.set_leader(true);
        let term = begin(leading.clone());
        let lost = !leading.ended().await;
        term.end().await;
        metrics.set_leader(false);
        tracing::info!("no longer leading: controller stopped");
        if lost {
            return;
        }
    }
}

/// The leader's work for one term: keep the CA Secret and the validating configuration, run the
/// controller, sweep orphans, the guard, coverage and the probe, each a task of the term.
pub(super) fn lead(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    leading: Leadership,
    caches: Caches,
) -> Term {
    let mut term = Term::default();
    let Caches {
        values,
        webhook_policies: served,
        ca_bundle,
        policies_changed,
        secret_changed,
        serving,
        pod_certificates,
    } = caches;
    let policies = policy_api(&client);
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let (neighbours, requeue) = neighbours::Neighbours::new();
    let neighbours = Arc::new(neighbours);
    let (store, writer) = reflector::store::<InjectionPolicy>();
    // `Store::wait_until_ready` wakes only the last of several waiters (its oneshot keeps one
    // waker), and the controller's runner is one: every other task waits on this instead.
    let (listed_tx, listed) = watch::channel(false);
    let policy_events = {
        let neighbours = Arc::clone(&neighbours);
        let store = store.clone();
        watcher(policies, watcher_config(&settings.policy_selector))
            .default_backoff()
            .modify(slim)
            .reflect(writer)
            .inspect(move |event| match event {
                Ok(watcher::Event::Delete(p)) => neighbours.forget(&p.name_any()),
                // A relist does not report what was deleted during the gap; the store knows.
                Ok(watcher::Event::InitDone) => {
                    neighbours.forget_all_but(|name| store.get(&ObjectRef::new(name)).is_some());
                    listed_tx.send_replace(true);
                }
                _ => {}
            })
            .applied_objects()
    };
    let controller = Controller::for_stream(policy_events, store);
    let secret_changed_for_status = secret_changed.clone();
    let keeper = certs::Keeper::new(&client, &settings, controller.store(), leading.clone());
    let certificate_problem = keeper.problems();
    term.spawn(certs::maintain_ca(keeper, secret_changed));
    term.spawn(validating::maintain(
        client.clone(),
        validating::Writer {
            target: settings.target.clone(),
            splice_namespace: settings.namespace.clone(),
            policy_selector: settings.policy_selector.clone(),
            enabled: settings.validating_webhook,
        },
        ca_bundle.clone(),
        leading.clone(),
        Arc::clone(&metrics),
    ));
    term.spawn(sweep_orphans(
        client.clone(),
        controller.store(),
        listed.clone(),
        leading.clone(),
        policies_changed.clone(),
    ));
    let (guard_tx, guard_rx) = watch::channel(guard::GuardStatus::not_observed());
    term.spawn(guard::watch(
        client.clone(),
        settings.guard.clone(),
        settings.policy_selector.clone(),
        Arc::clone(&metrics),
        guard_tx,
    ));
    // One namespace watch and one pod watch for coverage, the probe, the rollout and the
    // reconcile's evidence of enforcement.
    let observed = view::LeaderView::default();
    let namespaces = Arc::clone(&observed.namespaces);
    let ctx = Arc::new(Context::new(
        &settings,
        ContextParts {
            client: client.clone(),
            policies: controller.store(),
            ca_bundle: ca_bundle.clone(),
            metrics,
            leading,
            guard: guard_rx.clone(),
            certificate_problem: certificate_problem.clone(),
            serving,
            neighbours,
            values: Arc::clone(&values),
            namespaces: Arc::clone(&namespaces),
            pod_certificates: pod_certificates.clone(),
        },
    ));
    term.spawn(view::watch_namespaces(
        Api::all(client.clone()),
        Arc::clone(&namespaces),
    ));
    term.spawn(view::watch_pods(
        Api::all(client.clone()),
        Arc::clone(&observed.pods),
    ));
    let inputs = |view: view::LeaderView| driver::Inputs {
        policies: view::Policies {
            cache: ctx.policies.clone(),
            listed: listed.clone(),
            webhook_policies: Arc::clone(&served),
        },
        view,
        client: client.clone(),
        recorder: ctx.recorder.clone(),
        metrics: Arc::clone(&ctx.metrics),
        leading: ctx.leading.clone(),
    };
    term.spawn(rollout::run(
        rollout::Config {
            splice_namespace: settings.namespace.clone(),
            max_concurrent: settings.rollout_max_concurrent,
            trust_domain: settings.trust_domain.clone(),
        },
        inputs(observed.clone()),
    ));
    term.spawn(coverage::run(
        settings.namespace.clone(),
        inputs(observed.clone()),
    ));
    // Runs only when the API server serves podcertificaterequests (checked at each term).
    term.spawn(identity::run(
        identity::Config {
            trust_domain: settings.trust_domain.clone(),
            splice_namespace: settings.namespace.clone(),
            max_lifetime_seconds: identity::decide::DEFAULT_MAX_LIFETIME_SECONDS,
            trust_propagation: settings.identity_trust_propagation,
        },
        inputs(observed.clone()),
    ));
    if let Some(interval) = settings.probe_interval {
        let config = probe::Config {
            interval,
            splice_namespace: settings.namespace.clone(),
        };
        term.spawn(probe::run(config, inputs(observed)));
    }
    // A spec change or deletion re-reconciles only its conflict partners (`neighbours`); a new CA
    // changes every caBundle; the guard's verdict changes every policy that requests Fail.
    let everything = futures::stream::select(changes(ca_bundle), changes(guard_rx.clone()));
    // A new serving certificate changes every policy's certificateNotAfter.
    let everything = futures::stream::select(everything, changes(secret_changed_for_status));
    let everything = futures::stream::select(everything, changes(certificate_problem));
    // A change of valuesFrom data may make a source missing or present again (Ready).
    let everything = futures::stream::select(everything, changes(values.subscribe()));
    // PodCertificateRequests served or gone: Ready of every identity policy.
    let everything = futures::stream::select(everything, changes(pod_certificates));
    let controller = controller
        .owns(
            configurations,
            watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGER}")),
        )
        // The in-tree objects of a policy, for drift repair like its webhook configuration.
        .owns(
            Api::<MutatingAdmissionPolicy>::all(client.clone()),
            watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGER}")),
        )
        .owns(
            Api::<MutatingAdmissionPolicyBinding>::all(client),
            watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGER}")),
        )
        .reconcile_all_on(everything)
        .reconcile_on(requeue)
        .with_config(controller::Config::default().concurrency(4));
    term.spawn(async move {
        // Without this, a new leader would first write every Fail policy with Ignore, then Fail
        // again.
        guard::first_verdict(guard_rx, guard::FIRST_VERDICT_WAIT).await;
        controller
            .run(reconcile, error_policy, ctx)
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "controller event");
                }
            })
            .await;
    });
    term
}

/// What the leader's cache keeps of a policy: everything but managedFields and kubectl's
/// last-applied copy of the spec, which nothing reads and which can be most of a small object.
fn slim(policy: &mut InjectionPolicy) {
    policy.managed_fields_mut().clear();
    if let Some(annotations) = policy.metadata.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http::{Request, Response};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use kube::client::Body;
    use tokio::time::Instant;
    use tower_test::mock;

    use std::time::Duration;

    use kube::Client;
    use splice_server::store::PolicyStore;
    use tokio::task::JoinHandle;

    use super::*;
    use crate::certs::ServingCert;
    use crate::context::tests::settings;
    use crate::leader;

    /// Waits (at most 5 s) until `done` holds.
    async fn eventually(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// How many loops hold `alive`: the test and the supervisor's `begin` hold one each.
    fn running(alive: &Arc<()>) -> usize {
        Arc::strong_count(alive) - 2
    }

    /// A term of three loops, each holding `alive` while it runs: one waits forever, one sleeps
    /// in a loop, one waits on a channel nobody writes to.
    fn three_loops(alive: &Arc<()>, begun: &Arc<AtomicUsize>) -> Term {
        begun.fetch_add(1, Ordering::SeqCst);
        let mut term = Term::default();
        let held = Arc::clone(alive);
        term.spawn(async move {
            let _held = held;
            std::future::pending::<()>().await;
        });
        let held = Arc::clone(alive);
        term.spawn(async move {
            let _held = held;
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let held = Arc::clone(alive);
        term.spawn(async move {
            let _held = held;
            let (_tx, mut rx) = watch::channel(0u8);
            let _ = rx.wait_for(|v| *v > 0).await;
        });
        term
    }

    /// A supervisor whose every term is [`three_loops`], and the election that drives it.
    fn supervise_three_loops(
        alive: &Arc<()>,
        begun: &Arc<AtomicUsize>,
    ) -> (leader::LeadershipSender, JoinHandle<()>) {
        let (tx, leading) = Leadership::channel();
        let (alive, begun) = (Arc::clone(alive), Arc::clone(begun));
        let supervisor = tokio::spawn(supervise_leadership(
            Arc::new(Metrics::new()),
            leading,
            move |_| three_loops(&alive, &begun),
        ));
        (tx, supervisor)
    }

    fn elect(tx: &leader::LeadershipSender, leading: bool) {
        tx.send_replace(leading.then(|| Instant::now() + Duration::from_secs(60)));
    }

    #[tokio::test]
    async fn losing_leadership_ends_every_task_of_the_term_whatever_it_awaits() {
        let (alive, begun) = (Arc::new(()), Arc::new(AtomicUsize::new(0)));
        let (tx, supervisor) = supervise_three_loops(&alive, &begun);
        elect(&tx, true);
        eventually("the term's three loops run", || running(&alive) == 3).await;
        elect(&tx, false);
        eventually("every loop of the term has ended", || running(&alive) == 0).await;
        assert!(
            !supervisor.is_finished(),
            "the supervisor waits for the next term"
        );
        supervisor.abort();
    }

    #[tokio::test]
    async fn a_replica_elected_again_runs_each_loop_once() {
        let (alive, begun) = (Arc::new(()), Arc::new(AtomicUsize::new(0)));
        let (tx, supervisor) = supervise_three_loops(&alive, &begun);
        elect(&tx, true);
        eventually("the first term runs", || running(&alive) == 3).await;
        elect(&tx, false);
        eventually("the first term ended", || running(&alive) == 0).await;
        elect(&tx, true);
        eventually("the second term runs", || begun.load(Ordering::SeqCst) == 2).await;
        eventually("the second term's loops run", || running(&alive) == 3).await;
        // Renewals within a term start nothing more.
        elect(&tx, true);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(running(&alive), 3, "each loop runs once");
        assert_eq!(begun.load(Ordering::SeqCst), 2);
        supervisor.abort();
    }

    #[tokio::test]
    async fn ending_a_real_term_leaves_no_task_that_can_reach_the_api() {
        // An API server that never answers: every task of the term is parked on a request.
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let requests = Arc::new(AtomicUsize::new(0));
        let answering = tokio::spawn({
            let requests = Arc::clone(&requests);
            async move {
                let mut handle = std::pin::pin!(handle);
                let mut parked = Vec::new();
                // `None` once every clone of the client is gone.
                while let Some(request) = handle.next_request().await {
                    requests.fetch_add(1, Ordering::SeqCst);
                    parked.push(request);
                }
            }
        });
        let client = Client::new(service, "default");
        let (_ca_tx, ca_bundle) = watch::channel(None);
        let (_changed_tx, policies_changed) = watch::channel(0);
        let (_secret_tx, secret_changed) = watch::channel(0);
        let (_serving_tx, serving) = watch::channel(ServingCert::default());
        let term = lead(
            client,
            settings(),
            Arc::new(Metrics::new()),
            Leadership::fixed(true),
            Caches {
                values: Arc::new(crate::values::ValuesCache::new(
                    vec!["splice-system".into()],
                    "splice-system".into(),
                )),
                webhook_policies: Arc::new(PolicyStore::new()),
                ca_bundle,
                policies_changed,
                secret_changed,
                serving,
                pod_certificates: watch::channel(None).1,
            },
        );
        // The CA loop, the validating configuration, and the policy, namespace and pod watches.
        eventually("the term's loops are waiting on the API", || {
            requests.load(Ordering::SeqCst) >= 5
        })
        .await;
        term.end().await;
        tokio::time::timeout(Duration::from_secs(5), answering)
            .await
            .expect("a task of the ended term still holds a client")
            .expect("the fake API server ran");
    }

    #[test]
    fn the_leaders_cache_drops_managed_fields_and_last_applied_but_keeps_the_rest() {
        let mut p = InjectionPolicy::new("p", Default::default());
        p.spec.paused = true;
        p.metadata.generation = Some(4);
        p.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kubectl".into()),
            ..ManagedFieldsEntry::default()
        }]);
        p.metadata.annotations = Some(BTreeMap::from([
            (
                "kubectl.kubernetes.io/last-applied-configuration".to_owned(),
                "{\"spec\":{}}".to_owned(),
            ),
            ("team".to_owned(), "a".to_owned()),
        ]));
        slim(&mut p);
        assert!(p.metadata.managed_fields.unwrap_or_default().is_empty());
        assert_eq!(
            p.metadata.annotations,
            Some(BTreeMap::from([("team".to_owned(), "a".to_owned())]))
        );
        assert!(p.spec.paused);
        assert_eq!(p.metadata.generation, Some(4));
    }
}
