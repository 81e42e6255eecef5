#!/usr/bin/env bash
# Regenerates the replace block of go.mod from the pinned Kubernetes go.mod, so the staging-module
# list is derived from upstream rather than typed by hand. Run after changing K8S_VERSION.
set -euo pipefail
cd "$(dirname "$0")"
K8S_VERSION=${K8S_VERSION:-$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\).*/\1/p; s/^\tk8s.io\/kubernetes \(v[0-9.]*\).*/\1/p' go.mod | head -1)}
STAGING_VERSION="v0.${K8S_VERSION#v1.}"
mod=$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
{
  echo "replace ("
  sed -n '/^replace (/,/^)/p' "$mod" | awk '/=> .\/staging/ {print "\t" $1 " => " $1 " '"$STAGING_VERSION"'"}'
  echo ")"
} > replace.tmp
# Drop the old block and append the fresh one.
awk 'BEGIN{skip=0} /^replace \(/{skip=1} skip==0{print} /^\)/{if(skip){skip=0}}' go.mod > go.mod.tmp
cat replace.tmp >> go.mod.tmp && mv go.mod.tmp go.mod && rm replace.tmp
