//! Named behaviours of the injection engine.

mod engine_common;

use engine_common::*;
use serde_json::{Value, json};
use splice_crds::Operation;
use splice_engine::{Decision, EngineError, PolicyError, SkipReason, provenance};

fn bare_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": "web:1"}]}
    })
}

#[test]
fn a_pod_without_annotations_init_containers_or_volumes_gets_every_parent_created() {
    let (injection, out) = create(&sidecar(), &bare_pod());
    assert!(injection.changed);
    assert_eq!(
        names(&out["spec"]["initContainers"]),
        ["mesh-init", "mesh-proxy"]
    );
    assert_eq!(out["spec"]["initContainers"][1]["restartPolicy"], "Always");
    assert_eq!(
        out["spec"]["initContainers"][1]["image"],
        "registry.example/mesh/proxy:1.4.2"
    );
    assert_eq!(
        out["spec"]["initContainers"][1]["args"][2],
        "--domain=shop.svc.cluster.local"
    );
    assert_eq!(names(&out["spec"]["volumes"]), ["mesh-certs"]);
    assert_eq!(
        names(&out["spec"]["containers"][0]["env"]),
        ["MESH_ENABLED", "MESH_PROXY_ADDR"]
    );
    assert_eq!(
        out["spec"]["containers"][0]["volumeMounts"][0]["mountPath"],
        "/var/run/mesh"
    );
    assert_eq!(out["metadata"]["labels"]["mesh.example/injected"], "true");
    assert_eq!(
        out["metadata"]["annotations"]["mesh.example/proxy-image"],
        "registry.example/mesh/proxy:1.4.2"
    );
    let st = status(&out);
    let entry = &st["mesh-proxy"];
    assert_eq!(entry["hash"], sidecar().template_hash());
    assert_eq!(entry["initContainers"], json!(["mesh-init", "mesh-proxy"]));
    assert_eq!(entry["volumes"], json!(["mesh-certs"]));
    assert_eq!(
        entry["env"]["app"],
        json!(["MESH_ENABLED", "MESH_PROXY_ADDR"])
    );
    assert!(
        injection.warnings[0].contains("injected")
            && injection.warnings[0].contains("mesh-proxy")
            && injection.warnings[0].contains("mesh-certs"),
        "{:?}",
        injection.warnings
    );
}

#[test]
fn running_on_its_own_output_gives_an_empty_patch() {
    let policy = sidecar();
    let (_, once) = create(&policy, &bare_pod());
    let (again, twice) = create(&policy, &once);
    assert_eq!(&again.patch[..], b"[]");
    assert!(!again.changed);
    assert_eq!(once, twice);
}

#[test]
fn injected_init_containers_go_before_the_pods_own_and_containers_after() {
    let policy = policy(
        r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: order}
spec:
  template:
    initContainers:
      - {name: first, image: a}
      - {name: second, image: b, restartPolicy: Always}
    containers:
      - {name: tail, image: c}
    env:
      - {name: INJECTED, value: "1"}
"#,
    );
    let mut pod = bare_pod();
    pod["spec"]["initContainers"] = json!([{"name": "own-init", "image": "x"}]);
    pod["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "other", "image": "y", "env": []}));
    let (_, out) = create(&policy, &pod);
    assert_eq!(
        names(&out["spec"]["initContainers"]),
        ["first", "second", "own-init"]
    );
    assert_eq!(names(&out["spec"]["containers"]), ["app", "other", "tail"]);
    // Env goes to application containers only: not to injected ones, not to init containers.
    assert_eq!(names(&out["spec"]["containers"][0]["env"]), ["INJECTED"]);
    assert_eq!(names(&out["spec"]["containers"][1]["env"]), ["INJECTED"]);
    assert!(out["spec"]["containers"][2].get("env").is_none());
    assert!(out["spec"]["initContainers"][2].get("env").is_none());
}

#[test]
fn an_author_item_with_an_injected_name_is_kept_and_named_in_a_warning() {
    let mut pod = bare_pod();
    pod["spec"]["initContainers"] = json!([{"name": "mesh-proxy", "image": "mine:1"}]);
    pod["spec"]["volumes"] = json!([{"name": "mesh-certs", "secret": {"secretName": "mine"}}]);
    pod["spec"]["containers"][0]["env"] = json!([{"name": "MESH_ENABLED", "value": "no"}]);
    pod["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "other", "mountPath": "/var/run/mesh"}]);
    pod["metadata"]["labels"]["mesh.example/injected"] = json!("manual");
    let policy = sidecar();
    let (injection, out) = create(&policy, &pod);

    assert_eq!(
        names(&out["spec"]["initContainers"]),
        ["mesh-init", "mesh-proxy"]
    );
    assert_eq!(out["spec"]["initContainers"][1]["image"], "mine:1");
    assert_eq!(out["spec"]["volumes"], pod["spec"]["volumes"]);
    assert_eq!(
        out["spec"]["containers"][0]["env"],
        json!([{"name": "MESH_ENABLED", "value": "no"}, {"name": "MESH_PROXY_ADDR", "value": "127.0.0.1:15001"}])
    );
    assert_eq!(
        out["spec"]["containers"][0]["volumeMounts"],
        pod["spec"]["containers"][0]["volumeMounts"]
    );
    assert_eq!(out["metadata"]["labels"]["mesh.example/injected"], "manual");
    let all = injection.warnings.join("\n");
    for needle in [
        "container \"mesh-proxy\"",
        "volume \"mesh-certs\"",
        "env MESH_ENABLED in container \"app\"",
        "/var/run/mesh",
        "label \"mesh.example/injected\"",
    ] {
        assert!(all.contains(needle), "missing {needle:?} in {all}");
    }
    // The author's items are not recorded as injected, so a policy change never removes them.
    let st = status(&out);
    assert_eq!(st["mesh-proxy"]["initContainers"], json!(["mesh-init"]));
    assert!(st["mesh-proxy"].get("volumes").is_none());
    assert_eq!(st["mesh-proxy"]["env"]["app"], json!(["MESH_PROXY_ADDR"]));
    assert!(st["mesh-proxy"].get("labels").is_none());
    let (again, _) = create(&policy, &out);
    assert!(!again.changed, "{}", String::from_utf8_lossy(&again.patch));
}

#[test]
fn a_pod_injected_with_an_older_template_hash_is_re_injected_without_duplicates() {
    let old = sidecar();
    let (_, injected) = create(&old, &bare_pod());
    let newer = policy(
        &SIDECAR_POLICY
            .replace("proxy:1.4.2", "proxy:1.5.0")
            .replace(
                "- {name: MESH_PROXY_ADDR, value: \"127.0.0.1:15001\"}",
                "- {name: MESH_MODE, value: strict}",
            ),
    );
    assert_ne!(old.template_hash(), newer.template_hash());
    let (injection, out) = create(&newer, &injected);
    assert!(injection.changed);
    assert!(
        injection.warnings[0].contains("re-injected (policy changed)"),
        "{:?}",
        injection.warnings
    );
    assert_eq!(
        names(&out["spec"]["initContainers"]),
        ["mesh-init", "mesh-proxy"]
    );
    assert_eq!(
        out["spec"]["initContainers"][1]["image"],
        "registry.example/mesh/proxy:1.5.0"
    );
    assert_eq!(names(&out["spec"]["volumes"]), ["mesh-certs"]);
    assert_eq!(
        names(&out["spec"]["containers"][0]["env"]),
        ["MESH_ENABLED", "MESH_MODE"]
    );
    assert_eq!(status(&out)["mesh-proxy"]["hash"], newer.template_hash());
    let (again, _) = create(&newer, &out);
    assert!(!again.changed);
}

#[test]
fn reinvocation_after_a_foreign_webhook_added_a_container_and_a_label() {
    let policy = sidecar();
    let (_, mut pod) = create(&policy, &bare_pod());
    // Another webhook appends a container and a label after Splice ran.
    pod["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "foreign", "image": "f:1"}));
    pod["metadata"]["labels"]["foreign/added"] = json!("yes");
    let (injection, out) = create(&policy, &pod);
    assert!(injection.changed);
    // The new application container gets the env and mount; nothing is duplicated and the
    // foreign label survives.
    assert_eq!(
        names(&out["spec"]["containers"][1]["env"]),
        ["MESH_ENABLED", "MESH_PROXY_ADDR"]
    );
    assert_eq!(
        names(&out["spec"]["containers"][0]["env"]),
        ["MESH_ENABLED", "MESH_PROXY_ADDR"]
    );
    assert_eq!(
        names(&out["spec"]["initContainers"]),
        ["mesh-init", "mesh-proxy"]
    );
    assert_eq!(out["metadata"]["labels"]["foreign/added"], "yes");
    let (again, _) = create(&policy, &out);
    assert!(!again.changed);
}

#[test]
fn a_foreign_webhook_removing_an_injected_container_triggers_a_clean_reinjection() {
    let policy = sidecar();
    let (_, mut pod) = create(&policy, &bare_pod());
    pod["spec"]["initContainers"]
        .as_array_mut()
        .unwrap()
        .remove(0);
    let (injection, out) = create(&policy, &pod);
    assert!(
        injection.warnings[0].contains("no longer matched"),
        "{:?}",
        injection.warnings
    );
    assert_eq!(
        names(&out["spec"]["initContainers"]),
        ["mesh-init", "mesh-proxy"]
    );
}

#[test]
fn fields_the_api_server_defaults_on_injected_items_do_not_cause_a_reinjection() {
    let policy = sidecar();
    let (_, mut pod) = create(&policy, &bare_pod());
    for c in pod["spec"]["initContainers"].as_array_mut().unwrap() {
        c["terminationMessagePath"] = json!("/dev/termination-log");
        c["imagePullPolicy"] = json!("IfNotPresent");
    }
    pod["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] = json!(null);
    let (again, _) = create(&policy, &pod);
    assert!(!again.changed, "{}", String::from_utf8_lossy(&again.patch));
}

#[test]
fn a_pod_in_kube_system_is_never_injected() {
    let pod = bare_pod().to_string();
    for namespace in ["kube-system", "kube-node-lease", "splice-system"] {
        let d = decide(&sidecar(), Operation::Create, &pod, &ns(namespace));
        assert!(
            matches!(d, Decision::Skip(SkipReason::ExcludedNamespace)),
            "{namespace}: {d:?}"
        );
    }
}

#[test]
fn a_pod_labelled_splice_inject_false_is_never_injected() {
    let mut pod = bare_pod();
    pod["metadata"]["labels"]["splice.dev/inject"] = json!("false");
    let d = decide(&sidecar(), Operation::Create, &pod.to_string(), &ns("shop"));
    assert!(matches!(d, Decision::Skip(SkipReason::OptedOut)));
    assert_eq!(SkipReason::OptedOut.label(), "opted_out");
}

#[test]
fn selectors_use_full_label_selector_semantics() {
    let policy = policy(
        r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: sel}
spec:
  namespaceSelector:
    matchLabels: {mesh: enabled}
    matchExpressions: [{key: kubernetes.io/metadata.name, operator: NotIn, values: [legacy]}]
  objectSelector:
    matchExpressions: [{key: app, operator: In, values: [web, api]}]
  template:
    labels: {injected: "yes"}
"#,
    );
    let pod = bare_pod().to_string();
    let mut mesh = ns("shop");
    mesh.labels.insert("mesh".into(), "enabled".into());
    assert!(matches!(
        decide(&policy, Operation::Create, &pod, &mesh),
        Decision::Inject(_)
    ));
    assert!(matches!(
        decide(&policy, Operation::Create, &pod, &ns("shop")),
        Decision::Skip(SkipReason::NamespaceNotSelected)
    ));
    let mut legacy = ns("legacy");
    legacy.labels.insert("mesh".into(), "enabled".into());
    assert!(matches!(
        decide(&policy, Operation::Create, &pod, &legacy),
        Decision::Skip(SkipReason::NamespaceNotSelected)
    ));
    let other = bare_pod()
        .to_string()
        .replace("\"app\":\"web\"", "\"app\":\"batch\"");
    assert!(matches!(
        decide(&policy, Operation::Create, &other, &mesh),
        Decision::Skip(SkipReason::ObjectNotSelected)
    ));
}

#[test]
fn operations_and_kinds_outside_the_policy_are_skipped() {
    let pod = bare_pod().to_string();
    assert!(matches!(
        decide(&sidecar(), Operation::Update, &pod, &ns("shop")),
        Decision::Skip(SkipReason::OperationNotConfigured)
    ));
    let cm = r#"{"kind":"ConfigMap","metadata":{"name":"x"}}"#;
    assert!(matches!(
        decide(&sidecar(), Operation::Create, cm, &ns("shop")),
        Decision::Skip(SkipReason::NotAPod)
    ));
}

#[test]
fn update_only_touches_labels_and_annotations() {
    let policy =
        policy(&SIDECAR_POLICY.replace("operations: [CREATE]", "operations: [CREATE, UPDATE]"));
    let pod = bare_pod();
    let (injection, out) = apply(&policy, Operation::Update, &pod, &ns("shop"));
    assert!(injection.changed);
    assert_eq!(out["spec"], pod["spec"]);
    assert_eq!(out["metadata"]["labels"]["mesh.example/injected"], "true");
    let (again, _) = apply(&policy, Operation::Update, &out, &ns("shop"));
    assert!(!again.changed);
}

#[test]
fn label_and_annotation_keys_with_slash_and_tilde_are_escaped() {
    let policy = policy(
        r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: keys}
spec:
  template:
    labels: {"example.com/a": "1"}
    annotations: {"example.com/b": "2"}
"#,
    );
    let mut pod = bare_pod();
    pod["metadata"]["annotations"] = json!({"x~y/z": "author"});
    let (injection, out) = create(&policy, &pod);
    let patch = String::from_utf8(injection.patch.to_vec()).unwrap();
    assert!(patch.contains("/metadata/labels/example.com~1a"), "{patch}");
    assert!(
        patch.contains("/metadata/annotations/example.com~1b"),
        "{patch}"
    );
    assert_eq!(out["metadata"]["labels"]["example.com/a"], "1");
    assert_eq!(out["metadata"]["annotations"]["x~y/z"], "author");

    // A key with "~" recorded as injected earlier is removed through an escaped path.
    let mut earlier = out.clone();
    earlier["metadata"]["labels"]["a~b/c"] = json!("old");
    let st = json!({"keys": {"hash": "0000", "labels": ["example.com/a", "a~b/c"]}});
    earlier["metadata"]["annotations"]["splice.dev/status"] = json!(st.to_string());
    let (injection, out) = create(&policy, &earlier);
    let patch = String::from_utf8(injection.patch.to_vec()).unwrap();
    assert!(patch.contains("\"/metadata/labels/a~0b~1c\""), "{patch}");
    assert!(out["metadata"]["labels"].get("a~b/c").is_none());
    assert_eq!(out["metadata"]["annotations"]["x~y/z"], "author");
}

#[test]
fn a_pod_with_2000_env_vars_gets_the_injected_env_exactly_once() {
    let mut pod: Value = serde_json::from_str(POD_2000_ENV).unwrap();
    // An author var in the middle with an injected name is kept.
    pod["spec"]["containers"][0]["env"][1000] = json!({"name": "MESH_ENABLED", "value": "author"});
    let policy = sidecar();
    let (injection, out) = create(&policy, &pod);
    let env = out["spec"]["containers"][0]["env"].as_array().unwrap();
    assert_eq!(env.len(), 2001);
    assert_eq!(env[1000]["value"], "author");
    assert_eq!(env[2000]["name"], "MESH_PROXY_ADDR");
    assert!(
        injection
            .warnings
            .iter()
            .any(|w| w.contains("MESH_ENABLED"))
    );
    let (again, _) = create(&policy, &out);
    assert!(!again.changed);
}

#[test]
fn an_undefined_template_variable_is_an_error_naming_the_policy_and_field() {
    let err = try_policy(&SIDECAR_POLICY.replace(
        "{{ values.proxyImage }}\"\n        restartPolicy",
        "{{ values.proxyImg }}\"\n        restartPolicy",
    ))
    .unwrap_err();
    assert!(matches!(err, PolicyError::Template { .. }));
    assert_eq!(
        err.to_string(),
        "policy mesh-proxy: spec.template.initContainers[1].image: undefined value 'values.proxyImg'"
    );
    assert_eq!(err.label(), "template");

    // A name that only the request can resolve fails at render time, naming the field.
    let policy = policy(
        r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: per-pod}
spec:
  template:
    containers:
      - name: side
        image: "img:{{ pod.metadata.labels.version }}"
"#,
    );
    let ex = exclusions();
    let pod = bare_pod().to_string();
    let err = splice_engine::inject(
        &policy,
        &splice_engine::PodRequest {
            operation: Operation::Create,
            object: &splice_engine::Pod::parse(&pod).unwrap(),
            namespace: &ns("shop"),
            exclusions: &ex,
            trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN,
            selection: splice_engine::Selection::Evaluate,
        },
    )
    .unwrap_err();
    assert!(matches!(err, EngineError::Render { .. }));
    assert_eq!(
        err.to_string(),
        "policy per-pod: spec.template.containers[0].image: undefined value 'pod.metadata.labels.version'"
    );
}

#[test]
fn unknown_variables_and_syntax_errors_are_rejected_at_compile_time() {
    let base = r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: bad}
spec:
  template:
    annotations: {"example.com/x": "TEMPLATE"}
"#;
    let err = try_policy(&base.replace("TEMPLATE", "{{ secrets.token }}")).unwrap_err();
    assert!(
        err.to_string()
            .contains("spec.template.annotations[\\\"example.com/x\\\"]")
            || err
                .to_string()
                .contains("spec.template.annotations[\"example.com/x\"]"),
        "{err}"
    );
    assert!(
        err.to_string().contains("unknown variable 'secrets'"),
        "{err}"
    );
    let err = try_policy(&base.replace("TEMPLATE", "{{ values.x ")).unwrap_err();
    assert!(err.to_string().contains("syntax error"), "{err}");
}

#[test]
fn an_infinite_or_huge_template_loop_is_stopped() {
    let base = r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: loop}
spec:
  template:
    annotations: {"example.com/x": 'TEMPLATE'}
"#;
    let err = try_policy(&base.replace(
        "TEMPLATE",
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
    ))
    .unwrap_err();
    assert!(err.to_string().contains("out of fuel"), "{err}");
    let err = try_policy(&base.replace("TEMPLATE", "{{ \"x\" * 10000000 }}")).unwrap_err();
    assert!(err.to_string().contains("exceeds"), "{err}");
    // A loop that only depends on the pod is stopped at request time.
    let policy = policy(&base.replace(
        "TEMPLATE",
        "{% for a in range(100000) %}{{ pod.metadata.name }}{% endfor %}",
    ));
    let ex = exclusions();
    let pod = bare_pod().to_string();
    let err = splice_engine::inject(
        &policy,
        &splice_engine::PodRequest {
            operation: Operation::Create,
            object: &splice_engine::Pod::parse(&pod).unwrap(),
            namespace: &ns("shop"),
            exclusions: &ex,
            trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN,
            selection: splice_engine::Selection::Evaluate,
        },
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("out of fuel") || err.to_string().contains("exceeds"),
        "{err}"
    );
}

#[test]
fn duplicate_injected_names_are_rejected_at_compile_time() {
    let err = try_policy(
        r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: dup}
spec:
  template:
    initContainers: [{name: side, image: a}]
    containers: [{name: side, image: b}]
"#,
    )
    .unwrap_err();
    assert!(matches!(err, PolicyError::DuplicateName { .. }));
    assert_eq!(
        err.to_string(),
        "policy dup: spec.template.containers[0].name: duplicate name \"side\""
    );
}

#[test]
fn a_template_reading_the_pod_renders_the_same_on_its_own_output() {
    let policy = policy(
        r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: reads-pod}
spec:
  template:
    containers:
      - name: side
        image: img
        args: ["--containers={{ pod.spec.containers | length }}", "--app={{ pod.metadata.labels.app }}"]
    labels: {"count": "c{{ pod.metadata.labels | length }}"}
"#,
    );
    let (_, out) = create(&policy, &bare_pod());
    assert_eq!(out["spec"]["containers"][1]["args"][0], "--containers=1");
    assert_eq!(out["metadata"]["labels"]["count"], "c1");
    let (again, _) = create(&policy, &out);
    assert!(!again.changed, "{}", String::from_utf8_lossy(&again.patch));
}

#[test]
fn chained_policies_keep_each_others_entries_and_containers() {
    let mesh = sidecar();
    let logs = policy(
        r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: logs}
spec:
  template:
    containers: [{name: log-shipper, image: shipper:1}]
    env: [{name: LOG_FORMAT, value: json}]
"#,
    );
    let (_, a) = create(&logs, &bare_pod());
    let (_, b) = create(&mesh, &a);
    // The mesh env does not go into the logs policy's container.
    assert_eq!(names(&b["spec"]["containers"]), ["app", "log-shipper"]);
    assert!(b["spec"]["containers"][1].get("env").is_none());
    let st = status(&b);
    assert!(st.get("logs").is_some() && st.get("mesh-proxy").is_some());
    let (again_logs, _) = create(&logs, &b);
    let (again_mesh, _) = create(&mesh, &b);
    assert!(!again_logs.changed && !again_mesh.changed);
    let prov = provenance(&b.to_string()).unwrap();
    assert_eq!(prov["logs"].containers, ["log-shipper"]);
    assert_eq!(prov["mesh-proxy"].volumes, ["mesh-certs"]);
}

#[test]
fn a_pod_template_without_metadata_gets_metadata_created() {
    let template = json!({"spec": {"containers": [{"name": "app", "image": "x"}]}});
    let policy = policy(&SIDECAR_POLICY.replace("      - {key: app, operator: Exists}\n", ""));
    let (_, out) = create(&policy, &template);
    assert_eq!(out["metadata"]["labels"]["mesh.example/injected"], "true");
    assert!(out["metadata"]["annotations"]["splice.dev/status"].is_string());
}

#[test]
fn malformed_objects_are_errors_not_panics() {
    for bad in [
        "",
        "[]",
        "[{}, {}]",
        "{\"spec\": []}",
        "{\"metadata\": {\"labels\": {\"a\": 1}}}",
        "{\"spec\": {\"containers\": {}}}",
        "nul",
    ] {
        let ex = exclusions();
        // Text that is not JSON is refused when read, JSON not shaped like a pod when injected.
        let r = splice_engine::Pod::parse(bad).and_then(|pod| {
            splice_engine::inject(
                &sidecar(),
                &splice_engine::PodRequest {
                    operation: Operation::Create,
                    object: &pod,
                    namespace: &ns("shop"),
                    exclusions: &ex,
                    trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN,
                    selection: splice_engine::Selection::Evaluate,
                },
            )
        });
        let err = r.expect_err(bad);
        assert_eq!(err.label(), "invalid_object", "{bad}: {err}");
    }
}

#[test]
fn every_list_the_engine_reads_must_be_an_array_or_null() {
    let ex = exclusions();
    let run = |object: &str| {
        splice_engine::Pod::parse(object).and_then(|pod| {
            splice_engine::inject(
                &sidecar(),
                &splice_engine::PodRequest {
                    operation: Operation::Create,
                    object: &pod,
                    namespace: &ns("shop"),
                    exclusions: &ex,
                    trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN,
                    selection: splice_engine::Selection::Evaluate,
                },
            )
        })
    };
    for bad in [
        r#"{"spec": {"initContainers": {"name": "a"}}}"#,
        r#"{"spec": {"volumes": "v"}}"#,
        r#"{"spec": {"containers": [{"name": "app", "env": {"name": "A"}}]}}"#,
        r#"{"spec": {"containers": [{"name": "app", "volumeMounts": 1}]}}"#,
        r#"{"spec": {"containers": [{"name": "app"},]}}"#,
        r#"{"spec": {"containers": [{"name": "app"}}}"#,
        r#"{"spec": {"containers": [{"name": "app", "env": [1]}]}}"#,
    ] {
        let err = run(bad).expect_err(bad);
        assert_eq!(err.label(), "invalid_object", "{bad}: {err}");
    }
    let nulls = r#"{"metadata": {"labels": {"app": "web"}},
        "spec": {"initContainers": null, "volumes": null,
        "containers": [{"name": "app", "env": null, "volumeMounts": null}]}}"#;
    let r = run(nulls);
    assert!(
        matches!(r, Ok(Decision::Inject(ref i)) if i.changed),
        "{r:?}"
    );
}

#[test]
fn the_template_hash_is_stable_across_processes() {
    let yaml = r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: pinned}
spec:
  values: {b: "2", a: "1"}
  template:
    containers: [{name: side, image: "img:{{ values.a }}", args: [x, y]}]
    env: [{name: A, value: "1"}]
    labels: {z: "1", y: "2"}
"#;
    let first = policy(yaml);
    // Key order in the manifest and the generation do not matter.
    let reordered = policy(
        &yaml
            .replace("{b: \"2\", a: \"1\"}", "{a: \"1\", b: \"2\"}")
            .replace("{name: pinned}", "{name: pinned, generation: 9}"),
    );
    assert_eq!(first.template_hash(), reordered.template_hash());
    // Pinned: a change here re-injects every pod already injected in every cluster. It is
    // sha256 over the canonical JSON (sorted keys, no spaces) of {name, template, values}, so
    // any language reproduces it (Python: json.dumps(doc, sort_keys=True, separators=(",", ":"))).
    assert_eq!(first.template_hash(), "8efdb20cb17601ff");
    let renamed = policy(&yaml.replace("{name: pinned}", "{name: other}"));
    assert_ne!(first.template_hash(), renamed.template_hash());
}

#[test]
fn a_compiled_policy_is_shared_across_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<splice_engine::CompiledPolicy>();
}

#[test]
fn a_label_rendered_invalid_for_this_pod_is_an_error_not_a_rejected_patch() {
    let policy = policy(
        r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: lbl}
spec:
  template:
    labels: {"example.com/ns": "{{ namespace.name }}-{{ namespace.labels.team }}"}
"#,
    );
    let ex = exclusions();
    let pod = bare_pod().to_string();
    let mut namespace = ns("shop");
    namespace.labels.insert("team".into(), "a b".into());
    let err = splice_engine::inject(
        &policy,
        &splice_engine::PodRequest {
            operation: Operation::Create,
            object: &splice_engine::Pod::parse(&pod).unwrap(),
            namespace: &namespace,
            exclusions: &ex,
            trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN,
            selection: splice_engine::Selection::Evaluate,
        },
    )
    .unwrap_err();
    assert_eq!(err.label(), "invalid_render");
    assert!(
        err.to_string()
            .starts_with("policy lbl: spec.template.labels[\"example.com/ns\"]: rendered label value \"shop-a b\""),
        "{err}"
    );
    namespace.labels.insert("team".into(), "payments".into());
    let (_, out) = apply(&policy, Operation::Create, &bare_pod(), &namespace);
    assert_eq!(out["metadata"]["labels"]["example.com/ns"], "shop-payments");
}

#[test]
fn invalid_selectors_and_reserved_keys_are_rejected_at_compile_time() {
    let err = try_policy(
        r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: sel}
spec:
  objectSelector:
    matchExpressions: [{key: app, operator: In}]
"#,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "policy sel: spec.objectSelector.matchExpressions[0].values: operator In needs at least one value"
    );
    let err = try_policy(
        r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: res}
spec:
  template:
    annotations: {"splice.dev/status": "{}"}
"#,
    )
    .unwrap_err();
    assert!(err.to_string().contains("reserved"), "{err}");
}

#[test]
fn a_rollout_timeout_out_of_bounds_is_refused_naming_the_field() {
    let err = try_policy(
        r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: slow}
spec:
  rollout: {timeout: 25h}
"#,
    )
    .unwrap_err();
    assert!(
        err.to_string().starts_with(
            "policy slow: spec.rollout.timeout: \"25h\" is not a duration between 1s and 24h"
        ),
        "{err}"
    );
    assert!(
        try_policy(
            "apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nmetadata: {name: ok}\nspec: {rollout: {timeout: 45s}}\n"
        )
        .is_ok()
    );
}
