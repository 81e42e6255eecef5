#!/usr/bin/env bash
# The alert rules' checks (`make rules-test`): the rule file is valid, its unit tests pass, every
# alert has a test where it fires and one where it stays silent, every runbook link names a
# section of docs/runbooks.md, and the generated PrometheusRule is current.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
command -v promtool >/dev/null || { echo "promtool is required (Debian package prometheus)" >&2; exit 1; }
cd "$here"
promtool check rules splice-rules.yaml
promtool test rules splice-rules.test.yaml

failed=0
fail() { echo "FAIL: $*" >&2; failed=1; }
for alert in $(sed -n 's/^ *- alert: *//p' splice-rules.yaml); do
  # Each `alertname:` line is followed by its `exp_alerts:` line.
  cases=$(grep -A1 -E "alertname: $alert\$" splice-rules.test.yaml | grep 'exp_alerts:' || true)
  grep -q 'exp_alerts: \[\]' <<<"$cases" || fail "$alert has no test where it stays silent"
  grep -q 'exp_alerts:$' <<<"$cases" || fail "$alert has no test where it fires"
done
for anchor in $(sed -n 's/.*runbook_url: *docs\/runbooks.md#//p' splice-rules.yaml); do
  # GitHub's anchor of a `## Name` heading is the lower-cased name.
  grep -qiE "^## $anchor\$" "$root/docs/runbooks.md" || fail "docs/runbooks.md has no section for #$anchor"
done
if ! diff -u prometheus-rule.yaml <(./gen-prometheus-rule.sh); then
  fail "prometheus-rule.yaml is stale: run deploy/alerts/gen-prometheus-rule.sh > deploy/alerts/prometheus-rule.yaml"
fi
[ "$failed" = 0 ] && echo "alert rules: all checks passed"
exit "$failed"
