# The ewma-lb plugin as an OCI image in the layout Istio's WasmPlugin pulls (the "compat" variant
# of the Wasm image spec): an image FROM scratch with exactly one layer holding /plugin.wasm.
# Istio takes the last layer and extracts the file named plugin.wasm from it.
#
# The build context is dist/, so only the module is sent to the builder:
#   ./wasm-build.sh
#   docker build -f Dockerfile -t ghcr.io/ewma-lb/ewma-lb:0.1.0 dist
#   docker push ghcr.io/ewma-lb/ewma-lb:0.1.0
# The digest docker push prints (sha256:<64 hex>) is WasmPlugin.spec.sha256, without "sha256:".
# See docs/istio.md.
FROM scratch
# Keep this the only instruction that creates a layer: Istio reads the image's last layer.
COPY ewma_lb.wasm /plugin.wasm
