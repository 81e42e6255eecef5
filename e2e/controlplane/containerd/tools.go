//go:build tools

// Package tools pins containerd 2 (the real node's container runtime: the daemon, its ctr client
// and the runc shim). It has a module of its own because its dependency versions differ from
// Kubernetes'; `make controlplane` builds each import path below into the binary cache.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
