#!/usr/bin/env bash
# Builds the plugin for wasm32-wasip1 and leaves it at dist/ewma_lb.wasm, the path every config
# and doc in this repository uses; prints its size and sha256.
#
#   ./wasm-build.sh                  the plugin
#   ./wasm-build.sh --timing         the plugin with the `callback-timing` feature (it logs where
#                                    a request's time goes inside the VM; `ewma-bench overhead`
#                                    keeps those lines), at dist/ewma_lb-timing.wasm
#   ./wasm-build.sh CRATE_DIR OUT    another proxy-wasm crate of its own workspace, built the
#                                    same way (profile `wasm`, the same wasm-opt flags), at OUT:
#                                    the benchmark's reference filters (bench/noop-filter,
#                                    bench/header-filter, bench/hostcall-filter)
#
# The build is reproducible: the same commit built with the same toolchain gives the same bytes,
# wherever the tree sits (tests/release.rs builds a fresh copy and compares). What goes in:
#   - rustc RUST_VERSION (the Dockerfile's build stage pins the same one);
#   - wasm-opt from Debian's binaryen BINARYEN_VERSION, always (installed here when missing): a
#     build with and one without it would differ, and so would two wasm-opt versions;
#   - Cargo.lock as it is (--locked);
#   - no absolute paths: the cargo home (dependency sources) is remapped to /cargo, std's
#     sources to /rustc/COMMIT whether or not rust-src is installed; the workspace's own paths
#     are relative already;
#   - the git commit (EWMA_LB_GIT_COMMIT, from git when unset; "-dirty" when tracked files have
#     uncommitted changes), compiled in for the status page, the startup log line and the
#     ewma_lb_build_info metric.
set -euo pipefail
cd "$(dirname "$0")"

RUST_VERSION=1.95.0
BINARYEN_VERSION=108

target=wasm32-wasip1
if ! rustup target list --installed | grep -x "$target" >/dev/null; then
  rustup target add "$target"
fi

rustc_version=$(rustc --version | cut -d' ' -f2)
if [ "$rustc_version" != "$RUST_VERSION" ]; then
  echo "warning: rustc $rustc_version, not $RUST_VERSION: the module will not match the release's sha256" >&2
fi

if ! command -v wasm-opt >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends binaryen >/dev/null
fi
wasm_opt_version=$(wasm-opt --version | awk '{print $3}')
if [ "$wasm_opt_version" != "$BINARYEN_VERSION" ]; then
  echo "warning: wasm-opt $wasm_opt_version, not $BINARYEN_VERSION: the module will not match the release's sha256" >&2
fi

if [ -z "${EWMA_LB_GIT_COMMIT:-}" ]; then
  if commit=$(git rev-parse --short=12 HEAD 2>/dev/null); then
    git diff --quiet HEAD -- 2>/dev/null || commit="$commit-dirty"
  else
    commit=unknown
  fi
  export EWMA_LB_GIT_COMMIT="$commit"
fi

cargo_home=${CARGO_HOME:-$HOME/.cargo}
# std's sources: rustc names them /rustc/COMMIT in the std it ships, but where the rust-src
# component is installed (rust-analyzer needs it) it names them by their path on this machine,
# and the panic locations of std's generic code built into the module carry that path, so the
# sha256 would depend on the machine (CHANGELOG). Mapped back, the module is the same either way.
rustc_commit=$(rustc -vV | sed -n 's/^commit-hash: //p')
rust_src="$(rustc --print sysroot)/lib/rustlib/src/rust"
export CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS="--remap-path-prefix=$cargo_home=/cargo --remap-path-prefix=$rust_src=/rustc/$rustc_commit"
if [ $# -eq 0 ]; then
  cargo build --locked --profile wasm --target "$target" -p ewma-lb
  built="${CARGO_TARGET_DIR:-target}/$target/wasm/ewma_lb.wasm"
  out=dist/ewma_lb.wasm
elif [ "$1" = --timing ]; then
  # A target directory of its own: a cdylib's file names carry no hash (cargo#6313), so in the
  # shared one the two builds would write the same files.
  timing_target="${CARGO_TARGET_DIR:-target}/timing"
  cargo build --locked --profile wasm --target "$target" -p ewma-lb --features callback-timing \
    --target-dir "$timing_target"
  built="$timing_target/$target/wasm/ewma_lb.wasm"
  out=dist/ewma_lb-timing.wasm
else
  crate_dir=$1
  out=$2
  cargo build --profile wasm --target "$target" --manifest-path "$crate_dir/Cargo.toml"
  lib=$(sed -n 's/^name = "\(.*\)"$/\1/p' "$crate_dir/Cargo.toml" | head -n 1 | tr - _)
  # Where cargo put it: its CARGO_TARGET_DIR when set (a shared target directory), else the
  # crate's own.
  built="${CARGO_TARGET_DIR:-$crate_dir/target}/$target/wasm/$lib.wasm"
fi

mkdir -p "$(dirname "$out")"
# -Oz repeated until nothing shrinks (--converge: 0.2 %, a few seconds more). --low-memory-unused
# (0.8 %) lets wasm-opt fold a small constant added to an address into the access's offset; the
# two differ only for a sum that wraps around 4 GiB into the lowest 1 KB, which no Rust program
# computes (those bytes are the far end of the 1 MB stack Rust's layout puts first).
wasm-opt -Oz --converge --low-memory-unused --enable-bulk-memory --enable-sign-ext \
  --enable-nontrapping-float-to-int --enable-mutable-globals "$built" -o "$out.tmp"
mv "$out.tmp" "$out"
echo "plugin:  $out"
echo "build:   ewma-lb $(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1) ($EWMA_LB_GIT_COMMIT), rustc $rustc_version, wasm-opt $wasm_opt_version"
echo "size:    $(stat -c %s "$out") bytes"
echo "sha256:  $(sha256sum "$out" | cut -d' ' -f1)"
