//! The one source of what a policy's injected content demands from Pod Security admission: the
//! strictest Pod Security Standards level (`restricted`, `baseline`, `privileged`) the content
//! satisfies, and where it falls short of the stricter ones.
//!
//! The content is judged on its own, as injected into any pod: injected containers and init
//! containers (container level), injected volumes, and the pod-level fields a template sets (its
//! annotations). A setting a pod may or may not carry at pod level (`runAsNonRoot`, a seccomp
//! profile) counts as absent, since the policy serves pods that do not set it.
//!
//! A static template (one that only reads `policy` and `values`) is already rendered when this
//! runs, so it is judged on its value. A security setting read from privileged overrides, which
//! are bounded to enumerated values, is judged on each value they allow (the worst counts). Any
//! other security setting that depends on the pod or its namespace cannot be judged before
//! admission and counts as demanding `privileged`.
//!
//! `spec.allowPrivileged: false` refuses every finding at `privileged` ([`CompiledPolicy::compile`]
//! enforces it, so the reconcile, the validating webhook and the offline CLI share the rule).
//!
//! [`CompiledPolicy::compile`]: super::CompiledPolicy::compile

use serde_json::Value;
use splice_crds::PodSecurityLevel;

use super::template::{self, Hole, TemplateItem, Templates};

/// Every rendering a per-request string can have, when it reads only overrides bounded to
/// enumerated values (besides `policy` and `values`); `None` otherwise.
pub(crate) type Variants<'a> = &'a dyn Fn(&Hole) -> Option<Vec<String>>;

/// Capabilities `baseline` lets a container add; anything else (including `ALL`) is forbidden.
const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];
/// The only capability `restricted` lets a container add.
const RESTRICTED_CAPABILITY: &str = "NET_BIND_SERVICE";
/// SELinux types `baseline` allows (besides none at all).
const BASELINE_SELINUX_TYPES: [&str; 4] = [
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];
/// Volume sources `restricted` allows.
const RESTRICTED_VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];
/// The pod annotation prefix that still sets a container's AppArmor profile.
const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// One reason the injected content does not satisfy a stricter level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The strictest level the content can satisfy given this finding: `privileged` for what
    /// `baseline` forbids, `baseline` for what only `restricted` forbids.
    pub allows: PodSecurityLevel,
    /// The policy field, e.g. `spec.template.initContainers[0].securityContext.capabilities.add[0]`.
    pub field: String,
    /// What the field does, e.g. `adds the NET_ADMIN capability`.
    pub message: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// The verdict on a policy's injected content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSecurity {
    /// The strictest level the content satisfies.
    pub level: PodSecurityLevel,
    /// Why it satisfies no stricter level, in field order.
    pub findings: Vec<Finding>,
}

impl PodSecurity {
    /// What `baseline` forbids (what `spec.allowPrivileged` gates).
    pub fn privileged(&self) -> impl Iterator<Item = &Finding> {
        self.findings
            .iter()
            .filter(|f| f.allows == PodSecurityLevel::Privileged)
    }
}

/// Judges the compiled templates of a policy.
pub(crate) fn assess(t: &Templates, variants: Variants<'_>) -> PodSecurity {
    let mut findings = Vec::new();
    for item in t.init_containers.iter().chain(&t.containers) {
        container(item, variants, &mut findings);
    }
    for item in &t.volumes {
        volume(item, &mut findings);
    }
    for a in &t.annotations {
        let Some(container) = a.key.strip_prefix(APPARMOR_ANNOTATION_PREFIX) else {
            continue;
        };
        let mut field = "spec.template.annotations".to_owned();
        template::push_key(&mut field, &a.key);
        match a.static_value() {
            None => findings.push(templated(field)),
            Some(v) if v.is_empty() || v == "runtime/default" || v.starts_with("localhost/") => {}
            Some(v) => findings.push(privileged(
                field,
                format!("sets the AppArmor profile of container {container:?} to {v:?}"),
            )),
        }
    }
    let level = findings
        .iter()
        .map(|f| f.allows)
        .min()
        .unwrap_or(PodSecurityLevel::Restricted);
    PodSecurity { level, findings }
}

fn privileged(field: String, message: String) -> Finding {
    Finding {
        allows: PodSecurityLevel::Privileged,
        field,
        message,
    }
}

fn baseline_only(field: String, message: String) -> Finding {
    Finding {
        allows: PodSecurityLevel::Baseline,
        field,
        message,
    }
}

fn templated(field: String) -> Finding {
    privileged(
        field,
        "is a security setting that depends on the pod or its namespace, so the level it demands \
         is only known at admission (counted as privileged)"
            .to_owned(),
    )
}

fn at<'v>(v: &'v Value, path: &[&str]) -> Option<&'v Value> {
    path.iter().try_fold(v, |v, key| v.get(key))
}

fn container(item: &TemplateItem, variants: Variants<'_>, out: &mut Vec<Finding>) {
    // A templated string still holds its source in `base`: judge it as templated, never by value,
    // unless every value it can take is known: then the container is judged with each of them.
    let mut templated_fields = Vec::new();
    let mut varied = Vec::new();
    for hole in item.holes() {
        if hole.under(&["securityContext"]) {
            match variants(hole) {
                Some(values) => varied.push((hole, values)),
                None => out.push(templated(hole.field.clone())),
            }
            templated_fields.push(hole.field.as_str());
        }
    }
    if varied.is_empty() {
        judge_container(item.base(), &item.field, &templated_fields, out);
        return;
    }
    let mut all = Vec::new();
    for (hole, values) in &varied {
        let others: Vec<&str> = templated_fields
            .iter()
            .copied()
            .filter(|f| *f != hole.field)
            .collect();
        for value in values {
            let mut base = item.base().clone();
            if let Some(slot) = template::walk_mut(&mut base, &hole.path) {
                *slot = Value::String(value.clone());
            }
            judge_container(&base, &item.field, &others, &mut all);
        }
    }
    for f in all {
        if !out.contains(&f) {
            out.push(f);
        }
    }
}

/// Judges one container as `base` holds it; the `templated` fields are not judged by value.
fn judge_container(base: &Value, item_field: &str, templated: &[&str], out: &mut Vec<Finding>) {
    let field = |path: &str| format!("{item_field}.{path}");
    let is_templated = |f: &str| templated.contains(&f);
    let sc_str = |path: &[&str]| {
        let f = field(&format!("securityContext.{}", path.join(".")));
        let v = at(base, &["securityContext"])
            .and_then(|sc| at(sc, path))
            .and_then(Value::as_str);
        (v.filter(|_| !is_templated(&f)), f)
    };
    let sc_bool = |path: &[&str]| {
        at(base, &["securityContext"])
            .and_then(|sc| at(sc, path))
            .and_then(Value::as_bool)
    };

    // baseline
    if sc_bool(&["privileged"]) == Some(true) {
        out.push(privileged(
            field("securityContext.privileged"),
            "makes the container privileged".into(),
        ));
    }
    if sc_bool(&["windowsOptions", "hostProcess"]) == Some(true) {
        out.push(privileged(
            field("securityContext.windowsOptions.hostProcess"),
            "makes it a Windows HostProcess container".into(),
        ));
    }
    let added = at(base, &["securityContext", "capabilities", "add"])
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for (j, cap) in added.iter().enumerate() {
        let f = field(&format!("securityContext.capabilities.add[{j}]"));
        let Some(cap) = cap.as_str().filter(|_| !is_templated(&f)) else {
            continue;
        };
        if !BASELINE_CAPABILITIES.contains(&cap) {
            out.push(privileged(f, format!("adds the {cap} capability")));
        } else if cap != RESTRICTED_CAPABILITY {
            out.push(baseline_only(
                f,
                format!("adds the {cap} capability (restricted allows only NET_BIND_SERVICE)"),
            ));
        }
    }
    let ports = base
        .get("ports")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for (j, port) in ports.iter().enumerate() {
        if let Some(p) = port.get("hostPort").and_then(Value::as_i64)
            && p != 0
        {
            out.push(privileged(
                field(&format!("ports[{j}].hostPort")),
                format!("binds host port {p}"),
            ));
        }
    }
    let (seccomp, seccomp_field) = sc_str(&["seccompProfile", "type"]);
    if seccomp == Some("Unconfined") {
        out.push(privileged(
            seccomp_field.clone(),
            "runs without a seccomp profile (Unconfined)".into(),
        ));
    }
    let (apparmor, apparmor_field) = sc_str(&["appArmorProfile", "type"]);
    if apparmor == Some("Unconfined") {
        out.push(privileged(
            apparmor_field,
            "runs without an AppArmor profile (Unconfined)".into(),
        ));
    }
    let (se_type, se_type_field) = sc_str(&["seLinuxOptions", "type"]);
    if let Some(t) = se_type
        && !t.is_empty()
        && !BASELINE_SELINUX_TYPES.contains(&t)
    {
        out.push(privileged(
            se_type_field,
            format!("sets the custom SELinux type {t:?}"),
        ));
    }
    for key in ["user", "role"] {
        let (v, f) = sc_str(&["seLinuxOptions", key]);
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            out.push(privileged(f, format!("sets the SELinux {key} {v:?}")));
        }
    }
    let (proc_mount, proc_mount_field) = sc_str(&["procMount"]);
    if let Some(p) = proc_mount.filter(|p| *p != "Default") {
        out.push(privileged(
            proc_mount_field,
            format!("mounts /proc as {p} instead of Default"),
        ));
    }

    // restricted
    if sc_bool(&["allowPrivilegeEscalation"]) != Some(false) {
        out.push(baseline_only(
            field("securityContext.allowPrivilegeEscalation"),
            "is not false (restricted requires it)".into(),
        ));
    }
    if sc_bool(&["runAsNonRoot"]) != Some(true) {
        out.push(baseline_only(
            field("securityContext.runAsNonRoot"),
            "is not true (restricted requires it; a pod-level setting is not part of the \
             injected content)"
                .into(),
        ));
    }
    if at(base, &["securityContext", "runAsUser"]).and_then(Value::as_i64) == Some(0) {
        out.push(baseline_only(
            field("securityContext.runAsUser"),
            "runs as root (user 0)".into(),
        ));
    }
    if !is_templated(&seccomp_field)
        && !matches!(seccomp, Some("RuntimeDefault" | "Localhost"))
        && seccomp != Some("Unconfined")
    {
        out.push(baseline_only(
            seccomp_field,
            "is not RuntimeDefault or Localhost (restricted requires one)".into(),
        ));
    }
    let drops_all = at(base, &["securityContext", "capabilities", "drop"])
        .and_then(Value::as_array)
        .is_some_and(|d| d.iter().any(|c| c.as_str() == Some("ALL")));
    if !drops_all {
        out.push(baseline_only(
            field("securityContext.capabilities.drop"),
            "does not drop ALL (restricted requires it)".into(),
        ));
    }
}

fn volume(item: &TemplateItem, out: &mut Vec<Finding>) {
    let Some(source) = item.base().as_object() else {
        return;
    };
    for kind in source.keys().filter(|k| *k != "name") {
        let field = format!("{}.{kind}", item.field);
        if kind == "hostPath" {
            out.push(privileged(field, "is a hostPath volume".into()));
        } else if !RESTRICTED_VOLUMES.contains(&kind.as_str()) {
            out.push(baseline_only(
                field,
                format!(
                    "is a {kind} volume (restricted allows only {})",
                    RESTRICTED_VOLUMES.join(", ")
                ),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use splice_crds::{InjectionPolicySpec, PodSecurityLevel as L};

    use super::*;

    /// A restricted-compliant container with `extra` merged into its securityContext.
    fn container_with(security: Value, extra: Value) -> Value {
        let mut sc = serde_json::json!({
            "allowPrivilegeEscalation": false,
            "runAsNonRoot": true,
            "seccompProfile": {"type": "RuntimeDefault"},
            "capabilities": {"drop": ["ALL"]},
        });
        merge(&mut sc, security);
        let mut c = serde_json::json!({"name": "c", "image": "busybox", "securityContext": sc});
        merge(&mut c, extra);
        c
    }

    fn merge(into: &mut Value, from: Value) {
        match (into, from) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    match a.get_mut(&k) {
                        Some(slot) if v.is_object() => merge(slot, v),
                        _ => {
                            a.insert(k, v);
                        }
                    }
                }
            }
            (slot, v) => *slot = v,
        }
    }

    fn judge(template: Value) -> PodSecurity {
        let spec: InjectionPolicySpec = serde_json::from_value(serde_json::json!({
            "allowPrivileged": true,
            "values": {"cap": "NET_ADMIN", "fine": "CHOWN"},
            "template": template,
        }))
        .unwrap();
        let t = Templates::compile("p", 1, &spec).unwrap();
        assess(&t, &|_| None)
    }

    fn judge_container(security: Value, extra: Value) -> PodSecurity {
        judge(serde_json::json!({"initContainers": [container_with(security, extra)]}))
    }

    fn level(security: Value) -> L {
        judge_container(security, serde_json::json!({})).level
    }

    #[test]
    fn a_hardened_container_with_safe_volumes_is_restricted() {
        let ps = judge(serde_json::json!({
            "containers": [container_with(serde_json::json!({"capabilities": {"add": ["NET_BIND_SERVICE"]}}), serde_json::json!({}))],
            "volumes": [{"name": "a", "emptyDir": {}}, {"name": "b", "configMap": {"name": "x"}}],
            "annotations": {"container.apparmor.security.beta.kubernetes.io/c": "runtime/default"},
        }));
        assert_eq!(ps.level, L::Restricted, "{:?}", ps.findings);
        assert!(ps.findings.is_empty());
    }

    #[test]
    fn a_privileged_container_is_privileged_and_an_unprivileged_one_is_not() {
        assert_eq!(
            level(serde_json::json!({"privileged": true})),
            L::Privileged
        );
        assert_eq!(
            level(serde_json::json!({"privileged": false})),
            L::Restricted
        );
    }

    #[test]
    fn capabilities_beyond_baselines_list_are_privileged_and_baselines_own_are_baseline() {
        for cap in [
            "NET_ADMIN",
            "SYS_ADMIN",
            "ALL",
            "BPF",
            "NET_RAW",
            "SYS_TIME",
        ] {
            let ps = judge_container(
                serde_json::json!({"capabilities": {"add": [cap]}}),
                serde_json::json!({}),
            );
            assert_eq!(ps.level, L::Privileged, "{cap}");
            assert_eq!(
                ps.findings[0].field,
                "spec.template.initContainers[0].securityContext.capabilities.add[0]"
            );
        }
        for cap in ["CHOWN", "KILL", "SETUID"] {
            assert_eq!(
                level(serde_json::json!({"capabilities": {"add": [cap]}})),
                L::Baseline,
                "{cap}"
            );
        }
        assert_eq!(
            level(serde_json::json!({"capabilities": {"add": ["NET_BIND_SERVICE"]}})),
            L::Restricted
        );
    }

    #[test]
    fn host_ports_are_privileged_and_port_zero_is_not() {
        let ps = judge_container(
            serde_json::json!({}),
            serde_json::json!({"ports": [{"containerPort": 80}, {"containerPort": 81, "hostPort": 8081}]}),
        );
        assert_eq!(ps.level, L::Privileged);
        assert_eq!(
            ps.findings[0].field,
            "spec.template.initContainers[0].ports[1].hostPort"
        );
        let ps = judge_container(
            serde_json::json!({}),
            serde_json::json!({"ports": [{"containerPort": 80, "hostPort": 0}]}),
        );
        assert_eq!(ps.level, L::Restricted);
    }

    #[test]
    fn an_unconfined_seccomp_profile_is_privileged_and_a_missing_one_is_baseline() {
        assert_eq!(
            level(serde_json::json!({"seccompProfile": {"type": "Unconfined"}})),
            L::Privileged
        );
        assert_eq!(
            level(
                serde_json::json!({"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}})
            ),
            L::Restricted
        );
        let mut c = container_with(serde_json::json!({}), serde_json::json!({}));
        c["securityContext"]
            .as_object_mut()
            .unwrap()
            .remove("seccompProfile");
        assert_eq!(
            judge(serde_json::json!({"containers": [c]})).level,
            L::Baseline
        );
    }

    #[test]
    fn an_unconfined_apparmor_profile_is_privileged_in_the_field_or_the_annotation() {
        assert_eq!(
            level(serde_json::json!({"appArmorProfile": {"type": "Unconfined"}})),
            L::Privileged
        );
        assert_eq!(
            level(serde_json::json!({"appArmorProfile": {"type": "RuntimeDefault"}})),
            L::Restricted
        );
        let ps = judge(serde_json::json!({
            "annotations": {"container.apparmor.security.beta.kubernetes.io/app": "unconfined"},
        }));
        assert_eq!(ps.level, L::Privileged);
        assert_eq!(
            ps.findings[0].field,
            r#"spec.template.annotations["container.apparmor.security.beta.kubernetes.io/app"]"#
        );
        let ps = judge(serde_json::json!({
            "annotations": {"container.apparmor.security.beta.kubernetes.io/app": "localhost/prof"},
        }));
        assert_eq!(ps.level, L::Restricted);
    }

    #[test]
    fn custom_selinux_types_users_and_roles_are_privileged_and_container_types_are_not() {
        for opts in [
            serde_json::json!({"type": "spc_t"}),
            serde_json::json!({"user": "system_u"}),
            serde_json::json!({"role": "system_r"}),
        ] {
            assert_eq!(
                level(serde_json::json!({"seLinuxOptions": opts})),
                L::Privileged,
                "{opts}"
            );
        }
        assert_eq!(
            level(
                serde_json::json!({"seLinuxOptions": {"type": "container_init_t", "level": "s0:c1,c2"}})
            ),
            L::Restricted
        );
    }

    #[test]
    fn an_unmasked_proc_mount_is_privileged_and_the_default_one_is_not() {
        assert_eq!(
            level(serde_json::json!({"procMount": "Unmasked"})),
            L::Privileged
        );
        assert_eq!(
            level(serde_json::json!({"procMount": "Default"})),
            L::Restricted
        );
    }

    #[test]
    fn a_windows_host_process_container_is_privileged() {
        assert_eq!(
            level(serde_json::json!({"windowsOptions": {"hostProcess": true}})),
            L::Privileged
        );
        assert_eq!(
            level(serde_json::json!({"windowsOptions": {"hostProcess": false}})),
            L::Restricted
        );
    }

    #[test]
    fn restricted_needs_no_escalation_non_root_and_all_capabilities_dropped() {
        for (security, field) in [
            (
                serde_json::json!({"allowPrivilegeEscalation": true}),
                "allowPrivilegeEscalation",
            ),
            (serde_json::json!({"runAsNonRoot": false}), "runAsNonRoot"),
            (serde_json::json!({"runAsUser": 0}), "runAsUser"),
            (
                serde_json::json!({"capabilities": {"drop": ["NET_RAW"]}}),
                "capabilities.drop",
            ),
        ] {
            let ps = judge_container(security, serde_json::json!({}));
            assert_eq!(ps.level, L::Baseline, "{field}");
            assert_eq!(
                ps.findings[0].field,
                format!("spec.template.initContainers[0].securityContext.{field}")
            );
        }
        assert_eq!(
            judge(serde_json::json!({"containers": [{"name": "bare", "image": "x"}]})).level,
            L::Baseline
        );
    }

    #[test]
    fn host_path_volumes_are_privileged_and_other_non_restricted_volumes_baseline() {
        let ps = judge(
            serde_json::json!({"volumes": [{"name": "h", "hostPath": {"path": "/var/run"}}]}),
        );
        assert_eq!(ps.level, L::Privileged);
        assert_eq!(ps.findings[0].field, "spec.template.volumes[0].hostPath");
        let ps = judge(
            serde_json::json!({"volumes": [{"name": "n", "nfs": {"server": "s", "path": "/"}}]}),
        );
        assert_eq!(ps.level, L::Baseline);
        let ps =
            judge(serde_json::json!({"volumes": [{"name": "p", "projected": {"sources": []}}]}));
        assert_eq!(ps.level, L::Restricted);
    }

    #[test]
    fn compiling_refuses_what_baseline_forbids_unless_allow_privileged_is_true() {
        use crate::{CompiledPolicy, PolicyError};
        let spec = |allow: bool| -> InjectionPolicySpec {
            serde_json::from_value(serde_json::json!({
                "allowPrivileged": allow,
                "template": {"initContainers": [{"name": "init", "image": "x",
                    "securityContext": {"seccompProfile": {"type": "Unconfined"}}}]},
            }))
            .unwrap()
        };
        let err = CompiledPolicy::compile("p", 1, &spec(false)).unwrap_err();
        assert!(matches!(err, PolicyError::Privileged { .. }), "{err}");
        assert_eq!(
            err.field(),
            "spec.template.initContainers[0].securityContext.seccompProfile.type"
        );
        assert!(err.to_string().contains("spec.allowPrivileged"), "{err}");
        let compiled = CompiledPolicy::compile("p", 1, &spec(true)).unwrap();
        assert_eq!(compiled.pod_security().level, L::Privileged);
    }

    #[test]
    fn a_capability_from_values_is_judged_on_its_value() {
        assert_eq!(
            level(serde_json::json!({"capabilities": {"add": ["{{ values.cap }}"]}})),
            L::Privileged
        );
        assert_eq!(
            level(serde_json::json!({"capabilities": {"add": ["{{ values.fine }}"]}})),
            L::Baseline
        );
    }

    #[test]
    fn a_security_setting_from_the_pod_or_namespace_counts_as_privileged() {
        for source in [
            "{{ pod.metadata.annotations.cap }}",
            "{{ namespace.labels.cap }}",
        ] {
            let ps = judge_container(
                serde_json::json!({"capabilities": {"add": [source]}}),
                serde_json::json!({}),
            );
            assert_eq!(ps.level, L::Privileged, "{source}");
            assert_eq!(
                ps.findings[0].field,
                "spec.template.initContainers[0].securityContext.capabilities.add[0]"
            );
        }
        // The image from the pod is no security setting.
        let ps = judge_container(
            serde_json::json!({}),
            serde_json::json!({"image": "{{ pod.metadata.annotations.image }}"}),
        );
        assert_eq!(ps.level, L::Restricted);
    }
}
