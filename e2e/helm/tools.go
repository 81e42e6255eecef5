//go:build tools

// Package tools pins helm, used by the chart tests (lint, template, server-side dry run). It is a
// module of its own so its k8s.io dependency versions never move the control plane's.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
