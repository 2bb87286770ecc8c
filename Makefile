# nodeipam: build the component, run the sample cluster, test, bench.
# `make run` and `make test` set up everything they need on a fresh machine with Rust.

CARGO      ?= cargo
JOBS       ?= 2
WASM_TARGET = wasm32-wasip2
COMPONENT   = target/nodeipam.wasm

.PHONY: all build component bench-component target run test test-guest test-host lint bench clean-cache

all: build

## Install the wasm target when missing.
target:
	@rustup target list --installed 2>/dev/null | grep -qx $(WASM_TARGET) \
		|| rustup target add $(WASM_TARGET)

## The component, at target/nodeipam.wasm.
component: target
	$(CARGO) build -j$(JOBS) -p nodeipam-guest --target $(WASM_TARGET) --profile guest
	@cp target/$(WASM_TARGET)/guest/nodeipam_guest.wasm $(COMPONENT)
	@echo "component: $(COMPONENT) ($$(wc -c < $(COMPONENT)) bytes)"

## The component and the host (release: the profile tests and benches share).
build: component
	$(CARGO) build -j$(JOBS) --release -p nodeipam-host

## The main job: reconcile the sample cluster (examples/) in the embedded store, once.
## A second `make run` finds everything in sync and says so.
run: build
	target/release/nodeipam --config examples/sync-from-cluster.toml import --if-empty examples/cluster.yaml
	target/release/nodeipam --config examples/sync-from-cluster.toml run --once

## Every test: the core natively, then the host and the component tests on the real .wasm.
test: component test-guest test-host

test-guest:
	$(CARGO) test -j$(JOBS) -p nodeipam-guest

test-host: component
	$(CARGO) test -j$(JOBS) --release -p nodeipam-host -p nodeipam-tests

lint: target
	$(CARGO) clippy -j$(JOBS) -p nodeipam-guest --all-targets
	$(CARGO) clippy -j$(JOBS) -p nodeipam-guest --target $(WASM_TARGET) --profile guest
	$(CARGO) clippy -j$(JOBS) --release -p nodeipam-host -p nodeipam-tests --all-targets

## The benchmark component (allocator workloads), at target/nodeipam-bench.wasm. Its own
## target dir: the plugin and the bench component are one crate with different features.
bench-component: target
	$(CARGO) build -j$(JOBS) -p nodeipam-guest --target $(WASM_TARGET) --profile guest --features bench \
		--target-dir target/bench-guest
	@cp target/bench-guest/$(WASM_TARGET)/guest/nodeipam_guest.wasm target/nodeipam-bench.wasm

## Benchmarks: the allocator natively, then through the component.
bench: bench-component component
	$(CARGO) bench -j$(JOBS) -p nodeipam-guest --bench alloc
	$(CARGO) bench -j$(JOBS) -p nodeipam-tests --bench component

clean-cache:
	rm -rf "$${XDG_CACHE_HOME:-$$HOME/.cache}/nodeipam"
