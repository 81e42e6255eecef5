//! The request function: one HTTP request in, one response out, no I/O of its own besides reading
//! the body. The TLS listener and the fuzz target both drive it.

use std::error::Error as StdError;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Body;

use crate::admission::{self, Review};
use crate::metrics::{AdmissionMetrics, Metrics, Outcome};
use crate::server::{WebhookConfig, validate};
use crate::store::{NamespaceStore, PolicyStore, namespace_context};
use splice_engine::entry::{
    EntryPath, MAX_MEMBERS, MemberFailure, left_out_warning, member_failure, selection,
};
use splice_engine::{
    ChainCache, CompiledPolicy, Decision, EngineError, NamespaceContext, PodRequest, SkipReason,
};

/// The `policy` label of requests to `/inject/<name>` for a name no loaded policy has. Request
/// input never becomes a label value, so an unbounded set of paths cannot grow the registry.
pub const UNKNOWN_POLICY_LABEL: &str = "_unknown";
/// The `policy` label of the benchmark-only null handler.
#[cfg(feature = "bench-baselines")]
pub const NULL_POLICY_LABEL: &str = "_null";
/// The path of the validating webhook for InjectionPolicies.
pub const VALIDATE_PATH: &str = "/validate";
/// The `policy` label of requests to [`VALIDATE_PATH`].
pub const VALIDATE_POLICY_LABEL: &str = "_validate";

/// What a completed, non-dry-run admission tells the outside world. Nothing implements a side
/// effect today (the webhook is registered with `sideEffects: None`); the hook exists so that the
/// place where one would go is explicit and provably skipped for `dryRun` requests.
pub trait AdmissionHook: Send + Sync {
    fn admitted(&self, admission: &Admitted<'_>);
}

/// One admission the engine decided to inject (possibly with an empty patch).
#[derive(Debug)]
pub struct Admitted<'a> {
    pub policy: &'a str,
    pub uid: &'a str,
    pub namespace: &'a str,
    /// Empty for pods created with `generateName`.
    pub name: Option<&'a str>,
    pub operation: splice_crds::Operation,
    /// True when the response carries a non-empty patch.
    pub changed: bool,
}

type HttpResponse = Response<Full<Bytes>>;

struct Inner {
    config: WebhookConfig,
    policies: Arc<PolicyStore>,
    namespaces: Arc<NamespaceStore>,
    metrics: Arc<Metrics>,
    unknown: Arc<AdmissionMetrics>,
    validate: Arc<AdmissionMetrics>,
    hook: Option<Arc<dyn AdmissionHook>>,
    /// Answers of shared entries, for the pods of a burst that reach admission alike.
    chains: ChainCache,
}

/// The admission request handler. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct Handler {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handler")
            .field("policies", &self.inner.policies.names())
            .finish_non_exhaustive()
    }
}

enum Route<'a> {
    /// `/inject/<policy>[,<policy>...]`: the policies of one webhook entry, in the order to apply.
    Inject(EntryPath<'a>),
    Validate,
    #[cfg(feature = "bench-baselines")]
    Null(NullWork),
    NotFound,
}

/// How much of an injection's work a null-handler baseline does before answering "allowed".
#[cfg(feature = "bench-baselines")]
#[derive(Clone, Copy)]
enum NullWork {
    /// `/null`: finds the uid and nothing else; the server stack alone.
    Nothing,
    /// `/null/read`: reads the review as `/inject` does (UTF-8 and JSON checks of the whole body,
    /// the envelope and the pod view) and stops before the engine, so a benchmark can tell the
    /// cost of reading the request from the cost of deciding and writing the patch.
    Read,
    /// `/null/containers/<n>` (1 to 32): finds the uid and appends `n` constant containers
    /// (`null-sidecar-<i>`): the floor of any webhook that injects that many.
    Containers(u8),
}

/// One policy a webhook entry names, with its metrics; `policy` is `None` when this replica does
/// not know it (deleted a moment ago, or not delivered yet).
struct Member<'a> {
    name: &'a str,
    policy: Option<Arc<CompiledPolicy>>,
    metrics: Arc<AdmissionMetrics>,
}

enum Target<'a> {
    Policies(Vec<Member<'a>>),
    Validate,
    #[cfg(feature = "bench-baselines")]
    Null(NullWork),
}

impl Handler {
    pub fn new(
        config: WebhookConfig,
        policies: Arc<PolicyStore>,
        namespaces: Arc<NamespaceStore>,
        metrics: Arc<Metrics>,
        hook: Option<Arc<dyn AdmissionHook>>,
    ) -> Self {
        let unknown = metrics.admission(UNKNOWN_POLICY_LABEL);
        let validate = metrics.admission(VALIDATE_POLICY_LABEL);
        Handler {
            inner: Arc::new(Inner {
                config,
                policies,
                namespaces,
                metrics,
                unknown,
                validate,
                hook,
                chains: ChainCache::default(),
            }),
        }
    }

    /// A handler over a fixed set of policies (with the null routes when built with them), no namespace labels
    /// (namespace selectors see only the name), its own metrics and no hook: what benchmarks and
    /// fuzzers drive in memory.
    pub fn with_static_policies(policies: impl IntoIterator<Item = CompiledPolicy>) -> Self {
        let store = Arc::new(PolicyStore::new());
        store.replace_all(
            policies
                .into_iter()
                .map(|p| (p.name().to_owned(), Arc::new(p))),
        );
        let mut config = WebhookConfig::new("splice-system");
        #[cfg(feature = "bench-baselines")]
        {
            config.null_handler = true;
        }
        config.cache_wait = None;
        Handler::new(
            config,
            store,
            Arc::new(NamespaceStore::new()),
            Arc::new(Metrics::new()),
            None,
        )
    }

    fn route<'p>(&self, path: &'p str) -> Route<'p> {
        if path == VALIDATE_PATH {
            return Route::Validate;
        }
        if let Some(entry) = EntryPath::parse(path) {
            return Route::Inject(entry);
        }
        #[cfg(feature = "bench-baselines")]
        if self.inner.config.null_handler {
            match path {
                "/null" => return Route::Null(NullWork::Nothing),
                "/null/read" => return Route::Null(NullWork::Read),
                _ => {}
            }
            if let Some(n) = path
                .strip_prefix("/null/containers/")
                .and_then(|n| n.parse::<u8>().ok())
                .filter(|n| (1..=32).contains(n))
            {
                return Route::Null(NullWork::Containers(n));
            }
        }
        Route::NotFound
    }

    /// Answers one HTTP request. Never panics on input; every failure is a status and a reason.
    pub async fn handle<B>(&self, request: Request<B>) -> HttpResponse
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn StdError + Send + Sync>>,
    {
        let started = Instant::now();
        let (parts, body) = request.into_parts();
        let timeout = call_timeout(parts.uri.query());
        let target = match self.route(parts.uri.path()) {
            Route::NotFound => {
                return text(
                    StatusCode::NOT_FOUND,
                    "no such endpoint; POST /inject/<policy> or /validate",
                );
            }
            #[cfg(feature = "bench-baselines")]
            Route::Null(work) => Target::Null(work),
            Route::Validate => Target::Validate,
            Route::Inject(entry) => {
                if entry.too_long() {
                    return text(
                        StatusCode::BAD_REQUEST,
                        &format!("the path names more than {MAX_MEMBERS} policies"),
                    );
                }
                Target::Policies(self.members(entry).await)
            }
        };
        // Borrows what the call resolved (no copy on the request path); dropped before it.
        let _overdue = timeout.map(|timeout| Overdue {
            started,
            timeout,
            inner: &self.inner,
            target: &target,
        });
        let body = self.read_body(&parts, body).await;
        let (response, outcomes) = match (&target, body) {
            (_, Err(rejection)) => (rejection, Outcomes::All(Outcome::BadRequest)),
            #[cfg(feature = "bench-baselines")]
            (Target::Null(work), Ok(body)) => {
                let (response, outcome) = null_answer(*work, &body);
                (response, Outcomes::All(outcome))
            }
            (Target::Validate, Ok(body)) => {
                let config = &self.inner.config;
                let pod_certificates = config.pod_certificates.as_ref().and_then(|rx| *rx.borrow());
                let (response, outcome) =
                    validate_policy(&body, config.values_scope.as_ref(), pod_certificates);
                (response, Outcomes::All(outcome))
            }
            (Target::Policies(members), Ok(body)) => self.admit(members, &body).await,
        };
        let elapsed = started.elapsed();
        match &target {
            Target::Policies(members) => {
                for (i, member) in members.iter().enumerate() {
                    member.metrics.observe(outcomes.of(i), elapsed);
                }
            }
            Target::Validate => self.inner.validate.observe(outcomes.of(0), elapsed),
            #[cfg(feature = "bench-baselines")]
            Target::Null(_) => self
                .inner
                .metrics
                .admission(NULL_POLICY_LABEL)
                .observe(outcomes.of(0), elapsed),
        }
        response
    }

    /// The policies `/inject/<names>` asks for. The API server only calls a path that a webhook
    /// configuration names, so a policy missing here is one this replica's watch has not
    /// delivered yet (or one deleted a moment ago): wait for it, all of them within one bound,
    /// rather than admit the pod uninjected.
    async fn members<'n>(&self, entry: EntryPath<'n>) -> Vec<Member<'n>> {
        let policies = &self.inner.policies;
        let deadline = self.inner.config.cache_wait.map(|w| Instant::now() + w);
        let mut members = Vec::with_capacity(1);
        for name in entry.names() {
            let key = entry.key(name);
            let policy = match deadline {
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    policies.wait_for(&key, left).await
                }
                None => policies.get(&key),
            };
            let metrics = match &policy {
                Some(_) => self.inner.metrics.admission(name),
                None => Arc::clone(&self.inner.unknown),
            };
            members.push(Member {
                name,
                policy,
                metrics,
            });
        }
        members
    }

    /// The namespace a pod is admitted into. Selection is the API server's (see
    /// [`splice_engine::Selection::ByApiServer`]), so the context only feeds templates: an unknown namespace is
    /// waited for only when a template reads its labels or annotations.
    async fn namespace(&self, reads_metadata: bool, name: &str) -> Arc<NamespaceContext> {
        let store = &self.inner.namespaces;
        if let Some(within) = self.inner.config.cache_wait
            && reads_metadata
            && let Some(known) = store.wait_for(name, within).await
        {
            return known;
        }
        namespace_context(store, name)
    }

    /// Method, content type and size checks, then the body, read with a size cap so that an
    /// oversized request is refused without buffering more than the cap.
    async fn read_body<B>(
        &self,
        parts: &http::request::Parts,
        body: B,
    ) -> Result<Bytes, HttpResponse>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn StdError + Send + Sync>>,
    {
        let config = &self.inner.config;
        if parts.method != Method::POST {
            let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "only POST is allowed");
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
            return Err(response);
        }
        if !is_json(parts.headers.get(header::CONTENT_TYPE)) {
            return Err(text(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Content-Type must be application/json",
            ));
        }
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > config.max_body_bytes as u64) {
            return Err(too_large(config.max_body_bytes));
        }
        let limited = Limited::new(body, config.max_body_bytes);
        match tokio::time::timeout(config.body_read_timeout, limited.collect()).await {
            Err(_) => Err(text(
                StatusCode::REQUEST_TIMEOUT,
                "the request body did not arrive in time",
            )),
            Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
                Err(too_large(config.max_body_bytes))
            }
            Ok(Err(e)) => Err(text(
                StatusCode::BAD_REQUEST,
                &format!("cannot read the request body: {e}"),
            )),
            Ok(Ok(collected)) => Ok(collected.to_bytes()),
        }
    }

    /// Admits a pod through the policies of one webhook entry, in the entry's order, answering one
    /// patch. A policy that fails fails the call or is left out with a warning, as
    /// [`member_failure`] decides (the offline replay decides with it too).
    async fn admit(&self, members: &[Member<'_>], body: &[u8]) -> (HttpResponse, Outcomes) {
        let review = match admission::parse_review(body) {
            Ok(review) => review,
            Err(e) => {
                let (response, outcome) = malformed(&e);
                return (response, Outcomes::All(outcome));
            }
        };
        let skip_all = |reason: SkipReason| {
            for m in members.iter().filter(|m| m.policy.is_some()) {
                m.metrics.skipped(reason);
            }
            let each = members
                .iter()
                .map(|m| match m.policy {
                    Some(_) => Outcome::Skipped,
                    None => Outcome::UnknownPolicy,
                })
                .collect();
            (allow(&review, None, &[]), Outcomes::Each(each))
        };
        if !review.is_pod {
            return skip_all(SkipReason::NotAPod);
        }
        let Some(operation) = review.operation.injectable() else {
            return skip_all(SkipReason::OperationNotConfigured);
        };
        let Some(object) = review.object.as_ref() else {
            // parse_review refuses a pod CREATE/UPDATE without an object; stay total anyway.
            return skip_all(SkipReason::NotAPod);
        };
        let held: Vec<&Arc<CompiledPolicy>> =
            members.iter().filter_map(|m| m.policy.as_ref()).collect();
        let loaded: Vec<&CompiledPolicy> = held.iter().map(|p| &***p).collect();
        let reads_metadata = loaded.iter().any(|p| p.reads_namespace_metadata());
        let namespace = self.namespace(reads_metadata, &review.namespace).await;
        let request = PodRequest {
            operation,
            object,
            namespace: &namespace,
            exclusions: &self.inner.config.exclusions,
            trust_domain: &self.inner.config.trust_domain,
            selection: selection(&loaded, operation),
        };
        // A bug in the engine must cost one request, answered as an error, not the connection.
        let Ok(chained) = std::panic::catch_unwind(AssertUnwindSafe(|| {
            splice_engine::inject_in_order_kept(&self.inner.chains, &held, &request)
        })) else {
            tracing::error!(uid = %review.uid, "the injection engine panicked");
            let message = "splice could not compute the injection: internal error";
            return (
                text(StatusCode::INTERNAL_SERVER_ERROR, message),
                Outcomes::All(Outcome::Error),
            );
        };
        let mut warnings = chained.whole.warnings;
        let mut each = Vec::with_capacity(members.len());
        let mut decisions = chained.decisions.into_iter();
        let mut fatal = None;
        let mut refusals = Vec::new();
        for member in members {
            let Some(policy) = &member.policy else {
                // Counted and answered with a warning; a log line per request would flood during
                // the moment between a policy's deletion and its webhook configuration's update.
                tracing::debug!(uid = %review.uid, "admission request for a policy this webhook does not know");
                warnings.push(format!(
                    "splice: no InjectionPolicy {:?} is loaded on this webhook; it did not inject",
                    member.name
                ));
                each.push(Outcome::UnknownPolicy);
                continue;
            };
            let decided = decisions.next().unwrap_or_else(|| {
                Err(EngineError::Bug(
                    "no decision for a policy the call named".into(),
                ))
            });
            each.push(match decided {
                Ok(Decision::Inject(injection)) => {
                    if !review.dry_run {
                        if injection.changed {
                            member.metrics.injected();
                        }
                        if let Some(hook) = &self.inner.hook {
                            hook.admitted(&Admitted {
                                policy: member.name,
                                uid: &review.uid,
                                namespace: &review.namespace,
                                name: review.name.as_deref(),
                                operation,
                                changed: injection.changed,
                            });
                        }
                    }
                    if injection.changed {
                        Outcome::Injected
                    } else {
                        Outcome::Unchanged
                    }
                }
                Ok(Decision::Skip(reason)) => {
                    member.metrics.skipped(reason);
                    Outcome::Skipped
                }
                Ok(Decision::Refuse(refused)) => {
                    // The value is the pod's own annotation; the log names only where it is.
                    tracing::info!(
                        policy = member.name,
                        uid = %review.uid,
                        namespace = %review.namespace,
                        annotation = refused.refusal.annotation,
                        "refused a pod whose override annotation its policy does not accept"
                    );
                    refusals.push(refused.to_string());
                    Outcome::Denied
                }
                Err(e) => {
                    // An invalid-object message may quote the pod, which may hold secrets: log the
                    // kind only. Template errors name a field and a cause, which operators need.
                    let detail = match &e {
                        EngineError::InvalidObject(_) => String::new(),
                        other => other.to_string(),
                    };
                    tracing::warn!(
                        policy = member.name,
                        uid = %review.uid,
                        namespace = %review.namespace,
                        error = e.label(),
                        detail,
                        "injection failed; the API server applies the webhook's failure policy"
                    );
                    match member_failure(members.len(), policy.spec().failure_policy) {
                        MemberFailure::FailsTheCall => {
                            fatal.get_or_insert(e);
                        }
                        MemberFailure::LeftOut => warnings.push(left_out_warning(member.name, &e)),
                    }
                    Outcome::Error
                }
            });
        }
        // A refusal is the policy's decision: it stands whatever the failure policy, and before
        // another member's failure.
        if !refusals.is_empty() {
            let body = admission::denied_response(
                &review.api_version,
                &review.kind,
                &review.uid,
                &refusals.join("; "),
                &[],
            );
            return (json(body), Outcomes::Each(each));
        }
        if let Some(e) = fatal {
            let message = format!("splice could not compute the injection: {e}");
            return (
                text(StatusCode::INTERNAL_SERVER_ERROR, &message),
                Outcomes::Each(each),
            );
        }
        let patch = chained.whole.changed.then_some(&chained.whole.patch[..]);
        (allow(&review, patch, &warnings), Outcomes::Each(each))
    }
}

/// The outcome of one call for each policy it named (or one for all of them).
enum Outcomes {
    All(Outcome),
    Each(Vec<Outcome>),
}

impl Outcomes {
    fn of(&self, i: usize) -> Outcome {
        match self {
            Outcomes::All(o) => *o,
            Outcomes::Each(each) => each.get(i).copied().unwrap_or(Outcome::Error),
        }
    }
}

/// Answers the validating webhook: InjectionPolicy CREATE and UPDATE are judged by the compiler;
/// any other operation (DELETE above all) is allowed, so that removing a policy never depends on
/// Splice.
fn validate_policy(
    body: &[u8],
    values_scope: Option<&validate::ValuesScope>,
    pod_certificates: Option<bool>,
) -> (HttpResponse, Outcome) {
    let review = match admission::parse_review(body) {
        Ok(review) => review,
        Err(e) => return malformed(&e),
    };
    if review.operation.injectable().is_none() {
        return (allow(&review, None, &[]), Outcome::Allowed);
    }
    let Some(object) = review.object.as_ref() else {
        tracing::debug!(uid = %review.uid, "rejected a policy review without an object");
        let message = format!(
            "request.object is missing for a {} of an InjectionPolicy",
            review.operation.as_str()
        );
        return (text(StatusCode::BAD_REQUEST, &message), Outcome::BadRequest);
    };
    match validate::judge(object.text(), values_scope, pod_certificates) {
        validate::Verdict::Admit(warnings) => {
            let warnings: Vec<String> = warnings.iter().map(ToString::to_string).collect();
            (allow(&review, None, &warnings), Outcome::Allowed)
        }
        validate::Verdict::Refuse(message) => {
            let body = admission::denied_response(
                &review.api_version,
                &review.kind,
                &review.uid,
                &message,
                &[],
            );
            (json(body), Outcome::Denied)
        }
    }
}

fn is_json(content_type: Option<&HeaderValue>) -> bool {
    let Some(value) = content_type.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

fn allow(review: &Review<'_>, patch: Option<&[u8]>, warnings: &[String]) -> HttpResponse {
    let body = admission::allowed_response(
        &review.api_version,
        &review.kind,
        &review.uid,
        patch,
        warnings,
    );
    json(body)
}

/// The 400 for a body that is no AdmissionReview. The reason names the failure (class, byte
/// offset, the field) and never quotes the body beyond a clipped value.
fn malformed(e: &admission::ReviewError) -> (HttpResponse, Outcome) {
    tracing::debug!(reason = e.label(), "rejected a malformed AdmissionReview");
    (
        text(StatusCode::BAD_REQUEST, &e.to_string()),
        Outcome::BadRequest,
    )
}

/// A benchmark baseline's answer: "allowed", after `work`.
#[cfg(feature = "bench-baselines")]
fn null_answer(work: NullWork, body: &[u8]) -> (HttpResponse, Outcome) {
    match work {
        NullWork::Nothing => (null_response(body, None), Outcome::Null),
        NullWork::Read => match admission::parse_review(body) {
            Ok(review) => (allow(&review, None, &[]), Outcome::Null),
            Err(e) => malformed(&e),
        },
        NullWork::Containers(n) => {
            let ops: Vec<String> = (1..=n)
                .map(|i| {
                    format!(
                        r#"{{"op":"add","path":"/spec/containers/-","value":{{"name":"null-sidecar-{i}","image":"registry.invalid/null-sidecar:1"}}}}"#
                    )
                })
                .collect();
            let patch = format!("[{}]", ops.join(","));
            (null_response(body, Some(patch.as_bytes())), Outcome::Null)
        }
    }
}

#[cfg(feature = "bench-baselines")]
fn null_response(body: &[u8], patch: Option<&[u8]>) -> HttpResponse {
    let uid = admission::scan_uid(body).unwrap_or_default();
    json(admission::allowed_response(
        admission::API_VERSION,
        admission::KIND,
        uid,
        patch,
        &[],
    ))
}

/// A call still unanswered when the API server's timeout for it ran out: counted when the
/// handler finishes late, or when it is dropped because the API server closed the connection.
struct Overdue<'a> {
    started: Instant,
    timeout: Duration,
    inner: &'a Inner,
    target: &'a Target<'a>,
}

impl Drop for Overdue<'_> {
    fn drop(&mut self) {
        let elapsed = self.started.elapsed();
        if elapsed <= self.timeout {
            return;
        }
        let metrics: Vec<Arc<AdmissionMetrics>> = match self.target {
            Target::Policies(members) => members.iter().map(|m| Arc::clone(&m.metrics)).collect(),
            Target::Validate => vec![Arc::clone(&self.inner.validate)],
            #[cfg(feature = "bench-baselines")]
            Target::Null(_) => vec![self.inner.metrics.admission(NULL_POLICY_LABEL)],
        };
        for m in &metrics {
            m.overdue();
        }
        let policies: Vec<&str> = metrics.iter().map(|m| m.policy()).collect();
        tracing::warn!(
            policies = %policies.join(","),
            ?elapsed,
            timeout = ?self.timeout,
            "an admission call outlived the API server's timeout: it applied the webhook's failure policy"
        );
    }
}

/// The API server's timeout for this call: it sends the webhook's `timeoutSeconds` as the query
/// parameter `timeout`, a Go duration (`10s`).
fn call_timeout(query: Option<&str>) -> Option<Duration> {
    let value = query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("timeout="))?;
    go_duration(value)
}

/// A Go `time.Duration` as its `String` method writes it (`1m30s`, `1.5s`, `250ms`). Written
/// here: the duration crates at hand read neither the fractions nor the `1m0s` form.
fn go_duration(text: &str) -> Option<Duration> {
    const UNITS: [(&str, f64); 7] = [
        ("ns", 1e-9),
        ("us", 1e-6),
        ("µs", 1e-6),
        ("ms", 1e-3),
        ("h", 3600.0),
        ("m", 60.0),
        ("s", 1.0),
    ];
    let mut rest = text;
    let mut seconds = 0.0;
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..end].parse().ok()?;
        rest = &rest[end..];
        let (unit, scale) = UNITS.into_iter().find(|(u, _)| rest.starts_with(u))?;
        seconds += number * scale;
        rest = &rest[unit.len()..];
    }
    (!text.is_empty())
        .then(|| Duration::try_from_secs_f64(seconds).ok())
        .flatten()
}

fn json(body: Vec<u8>) -> HttpResponse {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn text(status: StatusCode, message: &str) -> HttpResponse {
    let mut response = Response::new(Full::new(Bytes::from(format!("{message}\n"))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn too_large(limit: usize) -> HttpResponse {
    text(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("the request body exceeds {limit} bytes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_content_types_with_parameters_are_accepted() {
        let ok = |v: &'static str| is_json(Some(&HeaderValue::from_static(v)));
        assert!(ok("application/json"));
        assert!(ok("application/json; charset=utf-8"));
        assert!(ok("Application/JSON;charset=UTF-8"));
        assert!(!ok("application/jsonx"));
        assert!(!ok("text/plain"));
        assert!(!ok("application/yaml; x=application/json"));
        assert!(!is_json(None));
    }

    #[test]
    fn the_api_servers_timeout_is_read_from_the_query_as_a_go_duration() {
        let t = |q: &str| call_timeout(Some(q));
        assert_eq!(t("timeout=10s"), Some(Duration::from_secs(10)));
        assert_eq!(t("x=1&timeout=1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(t("timeout=1m0s"), Some(Duration::from_secs(60)));
        assert_eq!(t("timeout=1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(t("timeout=250ms"), Some(Duration::from_millis(250)));
        assert_eq!(t("timeout=1h0m0s"), Some(Duration::from_secs(3600)));
        for bad in [
            "timeout=",
            "timeout=10",
            "timeout=s",
            "timeout=10x",
            "timeout=-1s",
            "other=1s",
        ] {
            assert_eq!(t(bad), None, "{bad}");
        }
        assert_eq!(call_timeout(None), None);
    }
}
