//! The /metrics text keeps the families, types, HELP texts and series (names with their label
//! sets) that Splice exported before it moved to `prometheus-client`: dashboards and alerts keep
//! working. `fixtures/metrics-before.prom` is the hand-written registry's output for the same
//! observations, captured before the change.

use std::collections::HashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use splice_engine::SkipReason;
use splice_server::metrics::{Outcome, Registry, render};
use strum::IntoEnumIterator;

const BEFORE: &str = include_str!("fixtures/metrics-before.prom");
/// Families added since the fixture was captured that print even when nothing was observed (a
/// plain gauge or histogram; an empty family prints nothing): not part of the comparison.
const ADDED_SINCE: &[&str] = &[
    "splice_identity_issuance_duration_seconds",
    "splice_identity_requests_total",
    "splice_identity_signer_available",
    "splice_admission_over_timeout_total",
];

/// What a scrape promises: HELP and TYPE per family, and every series without its value.
#[derive(Debug, PartialEq, Eq)]
struct Exposition {
    families: BTreeMap<String, (String, String)>,
    series: BTreeSet<String>,
}

fn exposition(text: &str) -> Exposition {
    let mut help = BTreeMap::new();
    let mut kind = BTreeMap::new();
    let mut series = BTreeSet::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help.insert(name.to_owned(), text.to_owned());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            kind.insert(name.to_owned(), text.to_owned());
        } else {
            // The value follows the last space; label values here hold none.
            let (id, _value) = line.rsplit_once(' ').unwrap_or((line, ""));
            series.insert(id.to_owned());
        }
    }
    let families = kind
        .into_iter()
        .map(|(name, kind)| {
            let help = help.get(&name).cloned().unwrap_or_default();
            (name, (kind, help))
        })
        .collect();
    Exposition { families, series }
}

#[test]
fn the_exposition_keeps_every_family_type_help_text_and_series_of_the_hand_written_registry() {
    let mut registry = Registry::default();
    let admission = splice_server::metrics::Metrics::register(&mut registry);
    let controller = splice_controller::metrics::Metrics::register(&mut registry);

    // The observations the fixture was captured with.
    let m = admission.admission("mesh");
    for outcome in Outcome::iter() {
        m.observe(outcome, Duration::from_micros(80));
    }
    m.injected();
    for reason in SkipReason::iter() {
        m.skipped(reason);
    }
    controller.observe_reconcile("success", Duration::from_millis(3));
    controller.set_certificate_expiry("serving", 1_900_000_000);
    controller.set_leader(true);
    controller.set_availability_guard("available");
    controller.set_coverage(HashMap::from([("mesh".to_owned(), [3, 2, 1, 0])]));
    controller.observe_probe("mesh", "Verified", Some(Duration::from_millis(20)));

    let before = exposition(BEFORE);
    let mut now = exposition(&render(&registry));
    now.families
        .retain(|name, _| !ADDED_SINCE.contains(&name.as_str()));
    now.series
        .retain(|series| !ADDED_SINCE.iter().any(|family| series.starts_with(family)));
    assert_eq!(now.families, before.families);
    assert_eq!(now.series, before.series);
    assert_eq!(before.families.len(), 12);
}
