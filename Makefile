# Splice: see README.md. Every target works from a fresh clone.
SHELL := /bin/bash
CP := e2e/controlplane
RUN_DIR ?= $(or $(SPLICE_RUN_DIR),$(HOME)/.cache/splice/run)
export KUBECONFIG := $(RUN_DIR)/kubeconfig
BIN_DIR = $(shell $(CP)/build.sh --print-bin-dir)

.PHONY: all build install deps deps-demo deps-image image image-test image-load controlplane helm up down test lint unit rules-test e2e demo demo-clean bench-webhook bench-engine bench-controller bench-admission bench-rollout bench-identity bench-profile

all: build

build:
	cargo build -p splice

## `splice` and the `kubectl-splice` link kubectl finds as the plugin `kubectl splice`, into
## $(DESTDIR)$(PREFIX)/bin.
PREFIX ?= /usr/local
install:
	cargo build --release --locked -p splice
	install -D -m 0755 target/release/splice $(DESTDIR)$(PREFIX)/bin/splice
	ln -sf splice $(DESTDIR)$(PREFIX)/bin/kubectl-splice

## What test and demo need beyond Rust and Go (Debian packages, rustup pieces): checked, and
## installed when missing if run as root with apt-get (e2e/deps.sh).
deps:
	e2e/deps.sh test

deps-demo:
	e2e/deps.sh demo

## What building and testing the image needs (musl-tools, umoci, the musl target, ...): every
## target that builds the image goes through `image`, which depends on this.
deps-image:
	e2e/deps.sh image

## The OCI image (static musl binary, scratch, UID 65532) in target/image/, without a daemon or a
## registry (umoci, musl-tools and the Rust target x86_64-unknown-linux-musl: deps-image).
image: deps-image
	deploy/image/build.sh

## The image's config and layer, then the image run under runc: --version, and the webhook
## answering an AdmissionReview over TLS.
image-test: image
	deploy/image/test.sh

## Splice's image (make image), the pause image and the tests' images, imported into the real
## node's containerd (no registry): honours SPLICE_RUN_DIR and SPLICE_PORT_BASE like `make up`.
image-load: image
	$(CP)/image-load.sh

## Build the control-plane programs (cached outside the repo; a warm build does nothing).
controlplane:
	$(CP)/build.sh

## helm, pinned in e2e/helm/go.mod, for the chart tests (cached like the control plane).
helm:
	e2e/helm/build.sh

up: deps-demo controlplane
	$(CP)/up.sh

down:
	$(CP)/down.sh

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --all-features -- -D warnings

unit:
	cargo test --workspace --exclude splice-e2e --all-features
	cd e2e/images && GOTOOLCHAIN=local go test ./testapp/

## The alert rules: promtool check + unit tests, runbook links, the generated PrometheusRule.
rules-test:
	deploy/alerts/check.sh

## The e2e suite against a control plane it starts and always stops (with the real node, which
## gets Splice's image and the tests' images imported).
e2e: controlplane helm image
	cargo build -p splice
	cargo test -p splice-e2e --no-run
	e2e/run-e2e.sh

## Everything CI runs.
test: deps lint unit rules-test image-test e2e

demo: deps-demo controlplane
	e2e/demo.sh

bench-engine:
	cargo bench -p splice-engine --bench engine

## Splice's webhook vs agnhost's vs a null baseline, side by side (needs wrk; see e2e/bench/).
bench-webhook: controlplane
	e2e/bench/webhook.sh

## The controller at scale (1,000 policies, 10,000 pods on kwok nodes) on a control plane of its own.
bench-controller: controlplane
	e2e/bench/controller.sh

## spec.rollout at scale on kwok nodes, on a control plane of its own: a restart row (1,000 outdated
## Deployments) and an in-place row (1,000 pods, an image-only change; the bench's own kwok Stage).
bench-rollout: controlplane
	e2e/bench/rollout.sh

## The pod identity signer: 1,000 PodCertificateRequests made as the kubelets of kwok nodes would
## make them; issuance p50/p99, the signer's CPU per 1,000 and RSS, on a control plane of its own.
bench-identity: controlplane
	e2e/bench/identity.sh

## What a pod create pays for mutating admission, through the API server: nothing, Splice, agnhost
## and an in-tree MutatingAdmissionPolicy side by side, on a control plane of its own.
bench-admission: controlplane helm image
	e2e/bench/admission.sh

## Where Splice's CPU goes per pod create under 32 clients (perf), on a control plane of its own.
bench-profile: controlplane
	e2e/bench/profile.sh
