#!/usr/bin/env bash
# Builds the plugin for wasm32-wasip1 and leaves it at dist/ewma_lb.wasm, the path every config
# and doc in this repository uses. Installs the Rust target when missing; shrinks the module with
# binaryen's wasm-opt when it is on PATH.
set -euo pipefail
cd "$(dirname "$0")"

target=wasm32-wasip1
if ! rustup target list --installed | grep -qx "$target"; then
  rustup target add "$target"
fi

cargo build --profile wasm --target "$target" -p ewma-lb
mkdir -p dist
out=dist/ewma_lb.wasm
if command -v wasm-opt >/dev/null 2>&1; then
  wasm-opt -Oz --enable-bulk-memory --enable-sign-ext --enable-nontrapping-float-to-int \
    --enable-mutable-globals "target/$target/wasm/ewma_lb.wasm" -o "$out.tmp"
  mv "$out.tmp" "$out"
else
  cp "target/$target/wasm/ewma_lb.wasm" "$out"
  echo "wasm-opt not found: copied the module unoptimised (apt-get install binaryen to shrink it)" >&2
fi
echo "plugin: $out"
echo "size:   $(stat -c %s "$out") bytes"
echo "sha256: $(sha256sum "$out" | cut -d' ' -f1)"
