# The ewma-lb plugin as an OCI image in the layout Istio's WasmPlugin and Envoy Gateway's
# EnvoyExtensionPolicy pull (the "compat" variant of the Wasm image spec): FROM scratch, one layer
# holding /plugin.wasm. The module is built here, by ./wasm-build.sh, on the toolchain and the
# wasm-opt that script pins (tests/release.rs keeps the two in step), so the image's module has
# the sha256 a local ./wasm-build.sh of the same commit prints.
#
# Build from the repository root (.dockerignore sends only what the build needs):
#   docker buildx build --annotation manifest:module.wasm.image/variant=compat \
#     --build-arg EWMA_LB_GIT_COMMIT=$(git rev-parse --short=12 HEAD) \
#     -t ghcr.io/ewma-lb/ewma-lb:0.2.0 --push .
# The compat spec asks for the annotation on the manifest, which only the build command can set;
# the LABEL below carries the same fact in the image config. See docs/istio.md.

FROM rust:1.95.0-slim-bookworm AS build
# Debian bookworm's binaryen 108, the wasm-opt of wasm-build.sh's BINARYEN_VERSION.
RUN apt-get update \
 && apt-get install -y --no-install-recommends binaryen=108-1 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# No .git in the context: the commit comes in as an argument ("unknown" without one).
ARG EWMA_LB_GIT_COMMIT=unknown
RUN EWMA_LB_GIT_COMMIT="$EWMA_LB_GIT_COMMIT" ./wasm-build.sh

FROM scratch
LABEL module.wasm.image/variant=compat
# Keep this the only instruction that creates a layer: Istio reads the image's last layer.
COPY --from=build /src/dist/ewma_lb.wasm /plugin.wasm
