//go:build tools

// Package tools pins kwok, which fakes kubelets for the local control plane. It lives in a module
// of its own because its k8s.io dependency versions differ from the control plane's.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
