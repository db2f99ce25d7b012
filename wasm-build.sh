#!/usr/bin/env bash
# Builds the plugin for wasm32-wasip1 and leaves it at dist/ewma_lb.wasm, the path every config
# and doc in this repository uses. Installs the Rust target when missing; shrinks the module with
# binaryen's wasm-opt when it is on PATH.
#
#   ./wasm-build.sh                  the plugin
#   ./wasm-build.sh CRATE_DIR OUT    another proxy-wasm crate of its own workspace, built the
#                                    same way (profile `wasm`, the same wasm-opt flags), at OUT:
#                                    the benchmark's no-op filter (ewma-bench overhead)
set -euo pipefail
cd "$(dirname "$0")"

target=wasm32-wasip1
if ! rustup target list --installed | grep -qx "$target"; then
  rustup target add "$target"
fi

if [ $# -eq 0 ]; then
  cargo build --profile wasm --target "$target" -p ewma-lb
  built="target/$target/wasm/ewma_lb.wasm"
  out=dist/ewma_lb.wasm
else
  crate_dir=$1
  out=$2
  cargo build --profile wasm --target "$target" --manifest-path "$crate_dir/Cargo.toml"
  lib=$(sed -n 's/^name = "\(.*\)"$/\1/p' "$crate_dir/Cargo.toml" | head -n 1 | tr - _)
  built="$crate_dir/target/$target/wasm/$lib.wasm"
fi
mkdir -p "$(dirname "$out")"
if command -v wasm-opt >/dev/null 2>&1; then
  wasm-opt -Oz --enable-bulk-memory --enable-sign-ext --enable-nontrapping-float-to-int \
    --enable-mutable-globals "$built" -o "$out.tmp"
  mv "$out.tmp" "$out"
else
  cp "$built" "$out"
  echo "wasm-opt not found: copied the module unoptimised (apt-get install binaryen to shrink it)" >&2
fi
echo "plugin: $out"
echo "size:   $(stat -c %s "$out") bytes"
echo "sha256: $(sha256sum "$out" | cut -d' ' -f1)"
