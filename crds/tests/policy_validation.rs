//! The offline validator against the fixture table in `tests/fixtures/policies/`: a file named
//! `accept-*` is a policy the API server accepts, `refuse-*` one it refuses, naming the field its
//! `# field:` line gives. e2e/tests/policy_fixtures.rs runs the same files through a real API
//! server with the CRD applied, so the two agree.

// Test helpers outside #[test] functions: a broken fixture should stop the test loudly.
#![allow(clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;
use splice_crds::{KNOWN_FORMATS, KNOWN_KEYWORDS, policy_schema, validate_policy};

struct Fixture {
    name: String,
    accept: bool,
    field: Option<String>,
    object: Value,
}

fn fixtures() -> Vec<Fixture> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/policies");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the fixture folder is readable")
        .map(|e| e.expect("a fixture entry").path())
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .expect("a UTF-8 file name")
                .to_owned();
            let text = std::fs::read_to_string(&path).expect("a readable fixture");
            let field = text
                .lines()
                .find_map(|l| l.strip_prefix("# field: "))
                .map(str::to_owned);
            let object: Value = serde_yaml::from_str(&text)
                .unwrap_or_else(|e| panic!("{name} is not one YAML document: {e}"));
            let accept = name.starts_with("accept-");
            assert!(
                accept || name.starts_with("refuse-"),
                "{name}: a fixture is named accept-* or refuse-*"
            );
            assert_eq!(
                field.is_some(),
                !accept,
                "{name}: a refused fixture names its field, an accepted one none"
            );
            Fixture {
                name,
                accept,
                field,
                object,
            }
        })
        .collect()
}

#[test]
fn every_fixture_is_accepted_or_refused_as_its_name_says_naming_its_field() {
    let fixtures = fixtures();
    assert!(fixtures.iter().filter(|f| f.accept).count() >= 3);
    assert!(fixtures.iter().filter(|f| !f.accept).count() >= 10);
    for f in fixtures {
        let violations = validate_policy(&f.object);
        match &f.field {
            None => assert!(violations.is_empty(), "{}: refused: {violations:?}", f.name),
            Some(field) => assert!(
                violations.iter().any(|v| &v.field == field),
                "{}: expected a violation at {field}, got {violations:?}",
                f.name
            ),
        }
    }
}

#[test]
fn the_crd_uses_only_schema_keywords_and_formats_the_offline_validator_knows() {
    fn walk(schema: &Value, keywords: &mut BTreeSet<String>, formats: &mut BTreeSet<String>) {
        let Some(map) = schema.as_object() else {
            return;
        };
        for (key, value) in map {
            keywords.insert(key.clone());
            match key.as_str() {
                "properties" => value
                    .as_object()
                    .into_iter()
                    .flat_map(|p| p.values())
                    .for_each(|s| walk(s, keywords, formats)),
                "items" | "additionalProperties" => walk(value, keywords, formats),
                "format" => {
                    formats.insert(value.as_str().unwrap_or_default().to_owned());
                }
                _ => {}
            }
        }
    }
    let (mut keywords, mut formats) = (BTreeSet::new(), BTreeSet::new());
    walk(
        policy_schema().expect("the schema renders"),
        &mut keywords,
        &mut formats,
    );
    let unknown: Vec<_> = keywords
        .iter()
        .filter(|k| !KNOWN_KEYWORDS.contains(&k.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "keywords validate_policy ignores: {unknown:?}"
    );
    let unknown: Vec<_> = formats
        .iter()
        .filter(|f| !KNOWN_FORMATS.contains(&f.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "formats validate_policy ignores: {unknown:?}"
    );
    // The CEL rules are there to be evaluated (the fixtures show kube-cel evaluates them): on
    // operations, on the template, on rollout.timeout, on rollout.canary (its size) and on each
    // of its two selectors (operators), the four on each valuesFrom entry, the two paths of
    // spec.identity, and the three of spec.overrides (distinct annotations, an override's name,
    // its sources).
    let rules = policy_schema()
        .expect("the schema renders")
        .to_string()
        .matches("x-kubernetes-validations")
        .count();
    assert_eq!(rules, 12);
}
