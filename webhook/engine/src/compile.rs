//! Compiling a policy once: templates parsed, selectors validated, names checked, the Pod
//! Security gate and the template hash, then shared read-only by every request.

use std::collections::BTreeMap;

use minijinja::Value as JValue;
use selector::Selector;
use splice_crds::{InjectionPolicySpec, NAMESPACE_NAME_LABEL, STATUS_ANNOTATION};
use template::{Templates, first_duplicate};

use crate::overrides::Overrides;
use crate::*;

/// A policy checked and compiled once (templates parsed, selectors validated, hash computed), then
/// shared read-only by every request.
#[derive(Debug)]
pub struct CompiledPolicy {
    pub(crate) name: String,
    pub(crate) generation: i64,
    pub(crate) spec: InjectionPolicySpec,
    pub(crate) hash: String,
    pub(crate) namespace_selector: Selector,
    pub(crate) object_selector: Selector,
    pub(crate) templates: Templates,
    pub(crate) policy_ctx: JValue,
    pub(crate) values_ctx: JValue,
    /// The render context when no template reads `pod` or `namespace`.
    pub(crate) static_ctx: JValue,
    /// Renderings reused across requests when no template reads `pod`.
    pub(crate) render_cache: cache::RenderCache,
    /// Patches reused across pods of one shape, for those renderings.
    pub(crate) plan_cache: cache::PlanCache,
    /// The Pod Security level the injected content satisfies, and why no stricter one.
    pub(crate) pod_security: PodSecurity,
    /// What the policy will do that its author probably did not mean.
    pub(crate) warnings: Vec<PolicyWarning>,
    /// Per `valuesFrom` source, the digest of the data rendered (empty without data).
    pub(crate) data: BTreeMap<String, String>,
    /// `spec.overrides`, compiled.
    pub(crate) overrides: Overrides,
    /// The spec or its `valuesFrom` data holds `kube-api-access-`: its output may depend on the
    /// name of a pod's token volume beyond the token mount (see `cache::ChainCache`).
    pub(crate) names_token_volumes: bool,
}

/// How the API server's ServiceAccount plugin names the token volume it adds to a pod
/// (`kube-api-access-<5 random characters>`).
pub(crate) const TOKEN_VOLUME_PREFIX: &str = "kube-api-access-";

/// Where a pod's token volume name stood, in what the caches compare: no volume name holds `*`.
pub(crate) const TOKEN_MASK: &str = "kube-api-access-*";

/// The most renderings of one string Pod Security judges; past it, the string counts as set at
/// admission (privileged).
const MAX_VARIANTS: usize = 64;

/// Every rendering of `hole` over the values its overrides allow, when it reads only privileged
/// overrides (bounded to enumerated sets), `policy` and `values`; `None` otherwise.
fn override_variants(
    templates: &Templates,
    overrides: &Overrides,
    hole: &template::Hole,
    policy_ctx: &JValue,
    values_ctx: &JValue,
) -> Option<Vec<String>> {
    let mut names: Vec<&str> = Vec::new();
    for var in &hole.vars {
        let mut parts = var.split('.');
        match parts.next() {
            Some("policy" | "values") => {}
            Some("overrides") => {
                let name = parts.next()?;
                if overrides.allowed(name).is_empty() {
                    return None;
                }
                if !names.contains(&name) {
                    names.push(name);
                }
            }
            _ => return None,
        }
    }
    if names.is_empty() {
        return None;
    }
    let mut combos: Vec<Vec<(&str, &str)>> = vec![Vec::new()];
    for name in &names {
        let allowed = overrides.allowed(name);
        if combos.len() * allowed.len() > MAX_VARIANTS {
            return None;
        }
        combos = combos
            .into_iter()
            .flat_map(|c| {
                allowed.iter().map(move |v| {
                    let mut c = c.clone();
                    c.push((*name, v.as_str()));
                    c
                })
            })
            .collect();
    }
    combos
        .iter()
        .map(|combo| {
            let values: BTreeMap<&str, JValue> = combo
                .iter()
                .map(|(n, v)| (*n, overrides.typed(n, v)))
                .collect();
            let ctx = minijinja::context! {
                policy => policy_ctx.clone(),
                values => values_ctx.clone(),
                overrides => JValue::from_serialize(&values),
            };
            templates.render_hole(hole, &ctx).ok()
        })
        .collect()
}

impl CompiledPolicy {
    /// Compiles `spec` for the policy `name` at `generation`. Fails with an error naming the field
    /// (e.g. `spec.template.containers[0].image`) when a template does not parse, a selector is
    /// invalid, or the injected content holds what Pod Security `baseline` forbids while
    /// `spec.allowPrivileged` is false.
    ///
    /// A policy with `spec.valuesFrom` compiles here with stand-ins for its data (what apply can
    /// check); [`Self::compile_with`] compiles it with the data it serves.
    pub fn compile(
        name: &str,
        generation: i64,
        spec: &InjectionPolicySpec,
    ) -> Result<Self, PolicyError> {
        Self::compile_data(name, generation, spec, None)
    }

    /// Compiles `spec` with its `valuesFrom` resolved ([`values_from::resolve`]): the values
    /// merged after `spec.values`, Secret-fed ones readable only through `sha256`, and the data
    /// digests recorded in each pod's `splice.dev/status`.
    pub fn compile_with(
        name: &str,
        generation: i64,
        spec: &InjectionPolicySpec,
        data: &ResolvedValues,
    ) -> Result<Self, PolicyError> {
        Self::compile_data(name, generation, spec, Some(data))
    }

    fn compile_data(
        name: &str,
        generation: i64,
        spec: &InjectionPolicySpec,
        data: Option<&ResolvedValues>,
    ) -> Result<Self, PolicyError> {
        let policy = name.to_owned();
        let selector = |sel, field: &str| {
            Selector::compile(sel).map_err(|e| PolicyError::Selector {
                policy: policy.clone(),
                field: format!("{field}.{}", e.field),
                message: e.message,
            })
        };
        let namespace_selector =
            selector(spec.namespace_selector.as_ref(), "spec.namespaceSelector")?;
        let object_selector = selector(spec.object_selector.as_ref(), "spec.objectSelector")?;
        let invalid = |field: String, message: String| PolicyError::InvalidField {
            policy: policy.clone(),
            field,
            message,
        };
        if let Some(rollout) = &spec.rollout
            && rollout.timeout().is_none()
        {
            return Err(invalid(
                "spec.rollout.timeout".into(),
                format!(
                    "{:?} is not a duration between 1s and 24h (e.g. 45s, 5m, 1h30m)",
                    rollout.timeout
                ),
            ));
        }
        identity::check(spec).map_err(|(field, message)| invalid(field, message))?;
        for (list, key) in [
            ("labels", &spec.template.labels),
            ("annotations", &spec.template.annotations),
        ] {
            for k in key.keys() {
                let mut field = format!("spec.template.{list}");
                template::push_key(&mut field, k);
                validate::qualified_name(k)
                    .map_err(|e| invalid(field.clone(), format!("invalid key: {e}")))?;
                if k == STATUS_ANNOTATION {
                    return Err(invalid(
                        field,
                        "is reserved for Splice's provenance record".into(),
                    ));
                }
            }
        }
        let overrides = Overrides::compile(spec).map_err(|e| invalid(e.field, e.message))?;
        let templates =
            Templates::compile_with(name, generation, spec, data, &overrides).map_err(|e| {
                PolicyError::Template {
                    policy: policy.clone(),
                    field: e.field,
                    message: e.message,
                }
            })?;
        check_unique(&policy, &templates)?;
        let (policy_ctx, values_ctx) = template::static_context_with(name, generation, spec, data);
        let variants = |hole: &template::Hole| {
            override_variants(&templates, &overrides, hole, &policy_ctx, &values_ctx)
        };
        let pod_security = podsecurity::assess(&templates, &variants);
        if !spec.allow_privileged
            && let Some(finding) = pod_security.privileged().next()
        {
            return Err(PolicyError::Privileged {
                policy: policy.clone(),
                field: finding.field.clone(),
                message: format!(
                    "{}: Pod Security baseline forbids this, so it is only allowed when \
                     spec.allowPrivileged is true",
                    finding.message
                ),
            });
        }
        let static_ctx =
            minijinja::context! { policy => policy_ctx.clone(), values => values_ctx.clone() };
        let warnings = warnings::collect(spec, &templates, &static_ctx, &pod_security);
        for l in &templates.labels {
            if let Some(value) = l.static_value() {
                validate::label_value(value).map_err(|e| {
                    let mut field = "spec.template.labels".to_owned();
                    template::push_key(&mut field, &l.key);
                    invalid(field, format!("label value {value:?} {e}"))
                })?;
            }
        }
        let hash = template::template_hash(name, spec)
            .map_err(|e| invalid("spec.template".into(), format!("cannot be hashed: {e}")))?;
        Ok(Self {
            name: policy,
            generation,
            spec: spec.clone(),
            hash,
            namespace_selector,
            object_selector,
            templates,
            policy_ctx,
            values_ctx,
            static_ctx,
            render_cache: cache::RenderCache::default(),
            plan_cache: cache::PlanCache::default(),
            pod_security,
            warnings,
            data: data.map(|d| d.digests.clone()).unwrap_or_default(),
            overrides,
            names_token_volumes: serde_json::to_string(spec)
                .map_or(true, |s| s.contains(TOKEN_VOLUME_PREFIX))
                || data.is_some_and(|d| d.values.values().any(|v| v.contains(TOKEN_VOLUME_PREFIX))),
        })
    }
    /// The strictest Pod Security level the injected content satisfies, and why no stricter one.
    pub fn pod_security(&self) -> &PodSecurity {
        &self.pod_security
    }
    /// What the policy will do that its author probably did not mean (reads of fields absent at
    /// admission, privileged content driven by the pod).
    pub fn warnings(&self) -> &[PolicyWarning] {
        &self.warnings
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Stable hash of everything that decides the injected content (template + values + policy
    /// name); recorded in `splice.dev/status` and `status.templateHash`.
    pub fn template_hash(&self) -> &str {
        &self.hash
    }
    /// Per `valuesFrom` source (`ConfigMap ns/name`), the digest of the data this compilation
    /// renders; empty when compiled without data.
    pub fn data_digests(&self) -> &BTreeMap<String, String> {
        &self.data
    }
    /// `spec.overrides`, compiled: [`Overrides::resolve`] gives a pod's values.
    pub fn overrides(&self) -> &Overrides {
        &self.overrides
    }
    pub fn spec(&self) -> &InjectionPolicySpec {
        &self.spec
    }
    pub fn generation(&self) -> i64 {
        self.generation
    }
    /// True when some template reads `pod` (the engine then builds a full JSON tree of the pod
    /// for each request).
    pub fn reads_pod(&self) -> bool {
        self.templates.deps.pod
    }
    /// True when some template reads the namespace's labels or annotations (not just its name).
    pub fn reads_namespace_metadata(&self) -> bool {
        self.templates.deps.namespace_beyond_name
    }
    /// Evaluates the namespace and object selectors (full LabelSelector semantics). `None` when
    /// both select; otherwise the reason this policy leaves the pod alone.
    pub fn check_selectors(
        &self,
        namespace: &NamespaceContext,
        pod_labels: &BTreeMap<String, String>,
    ) -> Option<SkipReason> {
        if !self.selects_namespace(namespace) {
            return Some(SkipReason::NamespaceNotSelected);
        }
        if !self
            .object_selector
            .matches(|k| pod_labels.get(k).map(String::as_str))
        {
            return Some(SkipReason::ObjectNotSelected);
        }
        None
    }
    /// True when both selectors select the pod.
    pub fn selects(
        &self,
        namespace: &NamespaceContext,
        pod_labels: &BTreeMap<String, String>,
    ) -> bool {
        self.check_selectors(namespace, pod_labels).is_none()
    }

    /// The API server sets `kubernetes.io/metadata.name` on every namespace; offline callers
    /// often omit it, so it is implied from the name.
    pub(crate) fn selects_namespace(&self, ns: &NamespaceContext) -> bool {
        self.namespace_selector.matches(|k| match ns.labels.get(k) {
            Some(v) => Some(v.as_str()),
            None if k == NAMESPACE_NAME_LABEL && !ns.name.is_empty() => Some(ns.name.as_str()),
            None => None,
        })
    }
}

/// Injected names that do not depend on the request must be unique at compile time (containers
/// and init containers share one name space in a pod).
pub(crate) fn check_unique(policy: &str, t: &Templates) -> Result<(), PolicyError> {
    let lists: [(Vec<&template::TemplateItem>, &str); 4] = [
        (
            t.init_containers.iter().chain(&t.containers).collect(),
            "name",
        ),
        (t.volumes.iter().collect(), "name"),
        (t.env_vars.iter().collect(), "name"),
        (t.volume_mounts.iter().collect(), "mountPath"),
    ];
    for (items, key) in lists {
        if let Some(dup) = first_duplicate(items.iter().filter_map(|i| i.static_key())) {
            let field = items
                .iter()
                .filter(|i| i.static_key() == Some(dup))
                .nth(1)
                .map(|i| format!("{}.{key}", i.field))
                .unwrap_or_default();
            return Err(PolicyError::DuplicateName {
                policy: policy.to_owned(),
                field,
                name: dup.to_owned(),
            });
        }
    }
    Ok(())
}
