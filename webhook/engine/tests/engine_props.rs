//! Property tests of the engine over generated pods and policies.

// Generators and assertion helpers are test code outside #[test] functions.
#![allow(clippy::unwrap_used, clippy::panic)]

mod engine_common;

use std::collections::HashSet;

use engine_common::*;
use proptest::prelude::*;
use proptest::sample::subsequence;
use serde_json::{Map, Value, json};
use splice_crds::{InjectionPolicySpec, Operation};
use splice_engine::{
    CompiledPolicy, Decision, Pod, PodRequest, Selection, inject, inject_and_apply,
};

const CONTAINER_NAMES: [&str; 6] = ["app", "web", "side", "mesh-proxy", "mesh-init", "worker"];
const VOLUME_NAMES: [&str; 4] = ["data", "mesh-certs", "extra", "tmp"];
const ENV_NAMES: [&str; 5] = ["A", "MESH_ENABLED", "B", "MODE", "Z"];
const MOUNT_PATHS: [&str; 3] = ["/data", "/var/run/mesh", "/tmp"];
const LABEL_KEYS: [&str; 4] = ["app", "mesh.example/injected", "x~y/z", "tier"];

fn unknown() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        Just(None),
        any::<i32>().prop_map(|n| Some(json!(n))),
        "[a-z~/]{0,6}".prop_map(|s| Some(json!({"nested": s, "list": [1, {"k": null}]}))),
    ]
}

fn with_unknown(mut obj: Map<String, Value>, u: Option<Value>, key: &str) -> Value {
    if let Some(u) = u {
        obj.insert(key.to_owned(), u);
    }
    Value::Object(obj)
}

fn container(name: String) -> impl Strategy<Value = Value> {
    (
        prop::option::of(subsequence(ENV_NAMES.to_vec(), 0..=ENV_NAMES.len())),
        prop::option::of(subsequence(MOUNT_PATHS.to_vec(), 0..=MOUNT_PATHS.len())),
        unknown(),
    )
        .prop_map(move |(env, mounts, u)| {
            let mut c = Map::new();
            c.insert("name".into(), json!(name));
            c.insert("image".into(), json!(format!("{name}:1")));
            if let Some(env) = env {
                c.insert(
                    "env".into(),
                    Value::Array(
                        env.iter()
                            .map(|e| json!({"name": e, "value": "author"}))
                            .collect(),
                    ),
                );
            }
            if let Some(mounts) = mounts {
                c.insert(
                    "volumeMounts".into(),
                    Value::Array(
                        mounts
                            .iter()
                            .map(|m| json!({"name": "data", "mountPath": m}))
                            .collect(),
                    ),
                );
            }
            with_unknown(c, u, "x-container-extra")
        })
}

fn containers(names: Vec<&'static str>) -> impl Strategy<Value = Vec<Value>> {
    names
        .into_iter()
        .map(|n| container(n.to_owned()).boxed())
        .collect::<Vec<_>>()
}

fn pod() -> impl Strategy<Value = Value> {
    // Container and init container names are unique across both lists, as in a valid pod.
    (
        subsequence(CONTAINER_NAMES.to_vec(), 1..=4),
        any::<prop::sample::Index>(),
    )
        .prop_flat_map(|(names, split)| {
            let k = split.index(names.len());
            let (init, main) = names.split_at(k);
            let main = if main.is_empty() {
                vec!["app"]
            } else {
                main.to_vec()
            };
            let init = init
                .iter()
                .copied()
                .filter(|n| !main.contains(n))
                .collect::<Vec<_>>();
            (
                containers(main),
                prop::option::of(Just(init)),
                prop::option::of(subsequence(VOLUME_NAMES.to_vec(), 0..=VOLUME_NAMES.len())),
                prop::option::of(subsequence(LABEL_KEYS.to_vec(), 0..=LABEL_KEYS.len())),
                prop::option::of(subsequence(LABEL_KEYS.to_vec(), 0..=LABEL_KEYS.len())),
                any::<bool>(),
                (unknown(), unknown(), unknown()),
            )
                .prop_map(
                    |(main, init, volumes, labels, annotations, kind, (u1, u2, u3))| {
                        let mut spec = Map::new();
                        if let Some(init) = init {
                            spec.insert(
                                "initContainers".into(),
                                Value::Array(
                                    init.iter()
                                        .map(|n| json!({"name": n, "image": "i"}))
                                        .collect(),
                                ),
                            );
                        }
                        spec.insert("containers".into(), Value::Array(main));
                        if let Some(v) = volumes {
                            spec.insert(
                                "volumes".into(),
                                Value::Array(
                                    v.iter()
                                        .map(|n| json!({"name": n, "emptyDir": {}}))
                                        .collect(),
                                ),
                            );
                        }
                        let mut meta = Map::new();
                        meta.insert("name".into(), json!("p"));
                        if let Some(l) = labels {
                            meta.insert(
                                "labels".into(),
                                l.iter().map(|k| (k.to_string(), json!("author"))).collect(),
                            );
                        }
                        if let Some(a) = annotations {
                            meta.insert(
                                "annotations".into(),
                                a.iter()
                                    .map(|k| (k.to_string(), json!("author note")))
                                    .collect(),
                            );
                        }
                        let mut pod = Map::new();
                        if kind {
                            pod.insert("kind".into(), json!("Pod"));
                        }
                        pod.insert("metadata".into(), with_unknown(meta, u1, "x-meta-extra"));
                        pod.insert("spec".into(), with_unknown(spec, u2, "x-spec-extra"));
                        with_unknown(pod, u3, "x-top-extra")
                    },
                )
        })
}

fn image() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just("proxy:1"),
        Just("proxy:{{ values.tag }}"),
        Just("proxy:{{ namespace.name }}"),
        Just("proxy:{{ pod.spec.containers | length }}"),
    ]
}

fn policy_spec() -> impl Strategy<Value = InjectionPolicySpec> {
    (
        subsequence(vec!["mesh-init", "mesh-proxy"], 0..=2),
        subsequence(vec!["side", "worker"], 0..=2),
        subsequence(vec!["mesh-certs", "extra"], 0..=2),
        subsequence(vec!["MESH_ENABLED", "B", "NEW"], 0..=3),
        subsequence(vec!["/var/run/mesh", "/new"], 0..=2),
        subsequence(vec!["mesh.example/injected", "x.example/other"], 0..=2),
        subsequence(vec!["x.example/note", "app"], 0..=2),
        image(),
        "[a-z]{1,3}",
    )
        .prop_map(|(init, cont, vols, env, mounts, labels, annotations, image, tag)| {
            let init: Vec<Value> = init
                .iter()
                .map(|n| {
                    if *n == "mesh-proxy" {
                        json!({"name": n, "image": image, "restartPolicy": "Always"})
                    } else {
                        json!({"name": n, "image": "init:1"})
                    }
                })
                .collect();
            // Injected containers must not share a name with injected init containers.
            let cont: Vec<Value> = cont.iter().map(|n| json!({"name": n, "image": image})).collect();
            let spec = json!({
                "values": {"tag": tag},
                "template": {
                    "initContainers": init,
                    "containers": cont,
                    "volumes": vols.iter().map(|n| json!({"name": n, "emptyDir": {"medium": "Memory"}})).collect::<Vec<_>>(),
                    "env": env.iter().map(|n| json!({"name": n, "value": "{{ values.tag }}"})).collect::<Vec<_>>(),
                    "volumeMounts": mounts.iter().map(|m| json!({"name": "mesh-certs", "mountPath": m})).collect::<Vec<_>>(),
                    "labels": labels.iter().map(|k| (k.to_string(), json!("v-{{ values.tag }}"))).collect::<Map<_, _>>(),
                    "annotations": annotations.iter().map(|k| (k.to_string(), json!("injected"))).collect::<Map<_, _>>(),
                }
            });
            serde_json::from_value(spec).unwrap()
        })
}

fn compile(name: &str, spec: &InjectionPolicySpec) -> CompiledPolicy {
    CompiledPolicy::compile(name, 1, spec).unwrap()
}

/// (d): no duplicate container, init container or volume name.
fn assert_no_duplicates(pod: &Value) {
    let spec = &pod["spec"];
    let mut seen = HashSet::new();
    for n in names(&spec["initContainers"])
        .into_iter()
        .chain(names(&spec["containers"]))
    {
        assert!(seen.insert(n.clone()), "duplicate container {n} in {pod}");
    }
    let mut seen = HashSet::new();
    for n in names(&spec["volumes"]) {
        assert!(seen.insert(n.clone()), "duplicate volume {n} in {pod}");
    }
}

/// (c): what the author wrote survives: unknown fields, every other key, author labels and
/// annotations, author list items (unchanged, in order), and author env / mounts as a prefix.
fn assert_author_content_survives(input: &Value, out: &Value) {
    let obj = |v: &Value| v.as_object().cloned().unwrap_or_default();
    for (k, v) in obj(input) {
        if k != "metadata" && k != "spec" {
            assert_eq!(out.get(&k), Some(&v), "top-level {k}");
        }
    }
    for (k, v) in obj(&input["metadata"]) {
        match k.as_str() {
            "labels" | "annotations" => {
                for (lk, lv) in obj(&v) {
                    assert_eq!(out["metadata"][&k].get(&lk), Some(&lv), "{k} {lk}");
                }
            }
            _ => assert_eq!(out["metadata"].get(&k), Some(&v), "metadata.{k}"),
        }
    }
    for (k, v) in obj(&input["spec"]) {
        match k.as_str() {
            "initContainers" | "volumes" => {
                let kept: Vec<&Value> = out["spec"][&k]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|i| v.as_array().unwrap().contains(i))
                    .collect();
                assert_eq!(
                    kept,
                    v.as_array().unwrap().iter().collect::<Vec<_>>(),
                    "spec.{k}"
                );
            }
            "containers" => {
                let outs = out["spec"]["containers"].as_array().unwrap();
                for c in v.as_array().unwrap() {
                    let o = outs
                        .iter()
                        .find(|o| o["name"] == c["name"])
                        .unwrap_or_else(|| panic!("author container {} lost", c["name"]));
                    for (ck, cv) in obj(c) {
                        if ck == "env" || ck == "volumeMounts" {
                            let ol = o[&ck].as_array().unwrap();
                            assert_eq!(
                                &ol[..cv.as_array().unwrap().len()],
                                cv.as_array().unwrap().as_slice(),
                                "{ck}"
                            );
                        } else {
                            assert_eq!(o.get(&ck), Some(&cv), "container {ck}");
                        }
                    }
                }
            }
            _ => assert_eq!(out["spec"].get(&k), Some(&v), "spec.{k}"),
        }
    }
}

/// One change to a pod, for the kept-patch property: mostly one thing a patch depends on (a name
/// the policy injects, taken by the pod; a list, map or object present or absent; a label's value;
/// a container's name), or nothing a patch depends on (a replica's name, image or own env var).
fn edit_pod(pod: &mut Value, policy: &CompiledPolicy, edit: u8, pick: usize) {
    let env_names = ["MESH_ENABLED", "B", "NEW"];
    let mounts = ["/var/run/mesh", "/new", "/own"];
    let app = |pod: &mut Value| -> Value {
        let containers = &mut pod["spec"]["containers"];
        let n = containers.as_array().map_or(0, Vec::len);
        if n == 0 {
            *containers = json!([{"name": "app"}]);
        }
        containers[pick % n.max(1)].take()
    };
    let put_app = |pod: &mut Value, c: Value| {
        let containers = &mut pod["spec"]["containers"];
        let n = containers.as_array().map_or(1, Vec::len);
        containers[pick % n.max(1)] = c;
    };
    let push = |list: &mut Value, item: Value| match list.as_array_mut() {
        Some(items) => items.push(item),
        None => *list = json!([item]),
    };
    match edit {
        0 => {}
        1 => {
            pod["metadata"]["name"] = json!(format!("replica-{pick}"));
            let mut c = app(pod);
            c["image"] = json!(format!("img:{pick}"));
            push(&mut c["env"], json!({"name": "OWN", "value": "x"}));
            put_app(pod, c);
        }
        2 => {
            let mut c = app(pod);
            push(
                &mut c["env"],
                json!({"name": env_names[pick], "value": "author"}),
            );
            put_app(pod, c);
        }
        3 => {
            let mut c = app(pod);
            push(
                &mut c["volumeMounts"],
                json!({"name": "data", "mountPath": mounts[pick]}),
            );
            put_app(pod, c);
        }
        4 => {
            let mut c = app(pod);
            let gone = ["env", "volumeMounts", "env"][pick];
            if let Some(o) = c.as_object_mut() {
                o.remove(gone);
            }
            put_app(pod, c);
        }
        5 => {
            let mut c = app(pod);
            c[["env", "volumeMounts", "env"][pick]] = json!([]);
            put_app(pod, c);
        }
        6 => push(
            &mut pod["spec"]["volumes"],
            json!({"name": (["mesh-certs", "extra", "own"][pick]), "emptyDir": {}}),
        ),
        7 => push(
            &mut pod["spec"]["initContainers"],
            json!({"name": (["mesh-init", "side", "own-init"][pick]), "image": "i"}),
        ),
        // A label or annotation the policy sets, with the author's value or with the policy's own.
        8 | 9 => {
            let map = if edit == 8 { "labels" } else { "annotations" };
            match pick {
                0 => {
                    let key = if edit == 8 {
                        "mesh.example/injected"
                    } else {
                        "x.example/note"
                    };
                    pod["metadata"][map][key] = json!("author");
                }
                1 => {
                    let injected = run(policy, pod).1;
                    if let Some(m) = injected["metadata"][map].as_object() {
                        for (k, v) in m {
                            if k != "splice.dev/status" {
                                pod["metadata"][map][k] = v.clone();
                            }
                        }
                    }
                }
                _ => pod["metadata"][map]["own"] = json!("x"),
            }
        }
        10 => {
            let gone = ["labels", "annotations", "labels"][pick];
            if let Some(m) = pod["metadata"].as_object_mut() {
                m.remove(gone);
            }
        }
        // Injected by this policy: as it left it, without its status annotation (an author removed
        // it), or with one that is not the policy's.
        // A pod without containers, without a spec, or without metadata.
        12 => {
            let (parent, gone) = [("spec", "containers"), ("", "spec"), ("", "metadata")][pick];
            let at = if parent.is_empty() {
                &mut *pod
            } else {
                &mut pod[parent]
            };
            if let Some(o) = at.as_object_mut() {
                o.remove(gone);
            }
        }
        11 => {
            *pod = run(policy, pod).1;
            let status = &mut pod["metadata"]["annotations"];
            match pick {
                0 => {}
                1 => {
                    if let Some(m) = status.as_object_mut() {
                        m.remove("splice.dev/status");
                    }
                }
                _ => status["splice.dev/status"] = json!("{}"),
            }
        }
        _ => {
            let mut c = app(pod);
            c["name"] = json!(format!("renamed-{pick}"));
            put_app(pod, c);
        }
    }
}

fn run(policy: &CompiledPolicy, pod: &Value) -> (bool, Value) {
    let (injection, out) = apply(policy, Operation::Create, pod, &ns("shop"));
    (injection.changed, out)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn injection_is_applicable_idempotent_preserving_and_duplicate_free(
        input in pod(),
        spec in policy_spec(),
        spec2 in policy_spec(),
        foreign in 0u8..4,
    ) {
        let p = compile("p", &spec);
        // (a) inside `run`: json-patch applies the patch to the engine's object.
        let (_, out) = run(&p, &input);
        assert_no_duplicates(&out);
        assert_author_content_survives(&input, &out);
        // (b) idempotent.
        let (changed, again) = run(&p, &out);
        prop_assert!(!changed);
        prop_assert_eq!(&again, &out);

        // Another webhook changes the pod before a reinvocation.
        let mut changed_pod = out.clone();
        match foreign {
            0 => changed_pod["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "foreign", "image": "f"})),
            1 => {
                if let Some(init) = changed_pod["spec"]["initContainers"].as_array_mut()
                    && !init.is_empty()
                {
                    init.remove(0);
                }
            }
            2 => { changed_pod["metadata"]["labels"] = json!({"foreign": "yes"}); }
            _ => {}
        }
        let (_, re) = run(&p, &changed_pod);
        assert_no_duplicates(&re);
        let (changed, _) = run(&p, &re);
        prop_assert!(!changed);

        // The policy changes: the earlier injection is replaced, the author's content survives.
        let p2 = compile("p", &spec2);
        let (_, out2) = run(&p2, &out);
        assert_no_duplicates(&out2);
        assert_author_content_survives(&input, &out2);
        let (changed, _) = run(&p2, &out2);
        prop_assert!(!changed);

        // A second policy chained after the first keeps both injections.
        let q = compile("q", &spec2);
        let (_, chained) = run(&q, &out);
        assert_no_duplicates(&chained);
        assert_author_content_survives(&input, &chained);
        let (changed_p, _) = run(&p, &chained);
        let (changed_q, _) = run(&q, &chained);
        prop_assert!(!changed_q);
        // q's containers are injected ones, so p's env never goes into them; only a template that
        // reads the pod can see what q added (chain order matters then, as for any webhook).
        if !p.reads_pod() {
            prop_assert!(!changed_p);
        }
    }

    #[test]
    fn arbitrary_json_never_panics(text in any::<String>(), json_like in pod().prop_map(|p| p.to_string())) {
        let policy = sidecar();
        let ex = exclusions();
        let shop = ns("shop");
        for object in [text.as_str(), json_like.as_str()] {
            let Ok(pod) = Pod::parse(object) else { continue };
            let req = PodRequest { operation: Operation::Create, object: &pod, namespace: &shop, exclusions: &ex, trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN, selection: Selection::Evaluate };
            if let Ok((Decision::Inject(i), out)) = inject_and_apply(&policy, &req) {
                let ops: json_patch::Patch = serde_json::from_slice(&i.patch).unwrap();
                let mut doc: Value = serde_json::from_str(object).unwrap();
                json_patch::patch(&mut doc, &ops).unwrap();
                prop_assert_eq!(doc, out);
            }
        }
    }
}

proptest! {
    // Pods that differ in one thing meet only by chance: more cases than the other properties.
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// The patch path keeps the patch planned for a pod's shape and answers later pods of that shape
    /// with it. Whatever pods a policy saw before (replicas of one template, pods that differ from
    /// them in one thing the patch depends on, pods it injected already, UPDATEs), its answer is
    /// the one a freshly compiled policy plans.
    #[test]
    fn a_kept_patch_is_the_patch_planned_afresh_whatever_pods_came_before(
        spec in policy_spec(),
        base in pod(),
        edits in proptest::collection::vec((0u8..14, 0usize..3, any::<bool>()), 1..16),
    ) {
        let warm = compile("p", &spec);
        let shop = ns("shop");
        let ex = exclusions();
        // Each pod is the base with one change: pods that differ in one thing are the ones a key
        // missing that thing would mix up.
        for (edit, pick, update) in &edits {
            let mut pod = base.clone();
            edit_pod(&mut pod, &warm, *edit, *pick);
            let op = if *update { Operation::Update } else { Operation::Create };
            let text = pod.to_string();
            let pod = Pod::parse(&text).unwrap();
            let req = PodRequest { operation: op, object: &pod, namespace: &shop, exclusions: &ex, trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN, selection: Selection::Evaluate };
            let fresh = compile("p", &spec);
            let expected = format!("{:?}", inject(&fresh, &req));
            // Twice: planned (or kept from an earlier pod), then surely kept.
            prop_assert_eq!(&format!("{:?}", inject(&warm, &req)), &expected, "pod {}", text);
            prop_assert_eq!(&format!("{:?}", inject(&warm, &req)), &expected, "pod {}", text);
        }
    }
}
