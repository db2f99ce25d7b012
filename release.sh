#!/usr/bin/env bash
# A release of ewma-lb, everything a platform team pins, in dist/release/VERSION/:
#
#   ewma_lb.wasm, ewma_lb.wasm.sha256   the module (./wasm-build.sh) and its sha256
#   oci/                                 an OCI image layout in the Wasm image "compat" format
#                                        Istio's WasmPlugin and Envoy Gateway's EnvoyExtensionPolicy
#                                        pull: one gzip layer holding plugin.wasm, the manifest
#                                        annotation module.wasm.image/variant=compat, tag VERSION
#   ewma-lb-VERSION.tar.gz               the manifests (envoy-config/istio, envoy-config/envoy-gateway,
#                                        their kustomize overlays in envoy-config/kustomize,
#                                        envoy-config/envoy.yaml, the module, LICENSE) with the image
#                                        reference and its digest stamped in
#   release.json, SHA256SUMS             what was built, for scripts and for people
#
#   ./release.sh VERSION [OUT_DIR]
#
# VERSION must be Cargo.toml's version and have a CHANGELOG.md section; the tag is vVERSION.
# Environment:
#   EWMA_LB_IMAGE      the image repository stamped into the manifests (default the example
#                      ghcr.io/ewma-lb/ewma-lb); the image's digest does not depend on it.
#   EWMA_LB_MODULE     package this module instead of building one: tests/release.rs passes the
#                      module it has just checked, since a nested cargo build would wait for the
#                      build lock of the `cargo test` that runs it.
#   SOURCE_DATE_EPOCH  the time of every file in the layer and the bundle (default: HEAD's commit
#                      time, so a rebuild of one commit gives the same bytes).
#
# No Docker engine: the layout is written here with tar, gzip and sha256sum. Same inputs, same
# bytes: fixed timestamps, owners and modes, entries sorted, gzip without name or time, JSON
# written byte for byte. GZIP_VERSION is pinned like wasm-build.sh pins wasm-opt, because another
# gzip may compress the same layer differently and so change the image digest. Publishing is
# `skopeo copy oci:OUT_DIR/oci:VERSION docker://IMAGE:VERSION` (docs/release.md).
set -euo pipefail
cd "$(dirname "$0")"

GZIP_VERSION=1.12
EXAMPLE_IMAGE=ghcr.io/ewma-lb/ewma-lb
# The placeholder digest the shipped manifests carry until a release stamps them.
ZEROS=0000000000000000000000000000000000000000000000000000000000000000

die() { echo "release.sh: $*" >&2; exit 1; }

[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: ./release.sh VERSION [OUT_DIR]"
version=$1
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || die "VERSION must be semver (0.3.0), got $version"
cargo_version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
[ "$version" = "$cargo_version" ] || die "Cargo.toml's version is $cargo_version, not $version: bump it first (the module reports Cargo's version)"
grep -q "^## $version\b" CHANGELOG.md || die "CHANGELOG.md has no '## $version' section"
out=${2:-dist/release/$version}
image=${EWMA_LB_IMAGE:-$EXAMPLE_IMAGE}
[[ $image =~ ^[a-z0-9]([a-z0-9._:/-]*[a-z0-9])?$ ]] || die "EWMA_LB_IMAGE must be a repository without tag (registry/path), got $image"

gzip_version=$(gzip --version | head -n 1 | awk '{print $2}')
if [ "$gzip_version" != "$GZIP_VERSION" ]; then
  echo "warning: gzip $gzip_version, not $GZIP_VERSION: the image digest may differ from the release's" >&2
fi

# The commit, by wasm-build.sh's rule, so the image's revision annotation names what the module
# reports.
if [ -z "${EWMA_LB_GIT_COMMIT:-}" ]; then
  if commit=$(git rev-parse --short=12 HEAD 2>/dev/null); then
    git diff --quiet HEAD -- 2>/dev/null || commit="$commit-dirty"
  else
    commit=unknown
  fi
  export EWMA_LB_GIT_COMMIT="$commit"
fi
case $EWMA_LB_GIT_COMMIT in
  *-dirty|unknown) echo "warning: commit $EWMA_LB_GIT_COMMIT: a release should come from a clean, tagged tree" >&2 ;;
esac
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}

if [ -n "${EWMA_LB_MODULE:-}" ]; then
  module=$EWMA_LB_MODULE
  [ -f "$module" ] || die "EWMA_LB_MODULE=$module is not a file"
else
  ./wasm-build.sh
  module=dist/ewma_lb.wasm
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$out"
mkdir -p "$out"

sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }
# Deterministic tar: the same names, bytes and modes give the same archive.
det_tar() {
  tar --sort=name --format=ustar --mtime="@$epoch" --owner=0 --group=0 --numeric-owner "$@"
}

cp "$module" "$out/ewma_lb.wasm"
module_sha=$(sha "$out/ewma_lb.wasm")
echo "$module_sha  ewma_lb.wasm" > "$out/ewma_lb.wasm.sha256"

# === the OCI image layout ===
layout=$out/oci
blobs=$layout/blobs/sha256
mkdir -p "$blobs"
# Moves FILE into the blobs, named by its digest; prints the digest.
blob() {
  local d
  d=$(sha "$1")
  mv "$1" "$blobs/$d"
  echo "$d"
}

mkdir "$work/layer"
cp "$out/ewma_lb.wasm" "$work/layer/plugin.wasm"
det_tar --mode=0644 -C "$work/layer" -cf "$work/layer.tar" plugin.wasm
diff_id=$(sha "$work/layer.tar")
gzip -n -9 -c "$work/layer.tar" > "$work/layer.tar.gz"
layer_size=$(size "$work/layer.tar.gz")
layer=$(blob "$work/layer.tar.gz")

# linux/amd64 although a module has no platform: Istio and Envoy Gateway resolve an image index
# to its linux/amd64 child (go-containerregistry's default), so an image that a registry or a
# tool puts into an index is still found; V8 runs the module on any machine.
printf '{"architecture":"amd64","os":"linux","config":{"Labels":{"module.wasm.image/variant":"compat"}},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
  "$diff_id" > "$work/config.json"
config_size=$(size "$work/config.json")
config=$(blob "$work/config.json")

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}],"annotations":{"module.wasm.image/variant":"compat","org.opencontainers.image.revision":"%s","org.opencontainers.image.title":"ewma-lb","org.opencontainers.image.version":"%s"}}' \
  "$config" "$config_size" "$layer" "$layer_size" "$EWMA_LB_GIT_COMMIT" "$version" > "$work/manifest.json"
manifest_size=$(size "$work/manifest.json")
digest=$(blob "$work/manifest.json")

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"org.opencontainers.image.ref.name":"%s"}}]}' \
  "$digest" "$manifest_size" "$version" > "$layout/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' > "$layout/oci-layout"

# === the bundle: the manifests, stamped ===
top=ewma-lb-$version
stage=$work/bundle/$top
shipped=(envoy-config/istio envoy-config/envoy-gateway envoy-config/kustomize envoy-config/envoy.yaml LICENSE)
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  files=$(git ls-files -co --exclude-standard -- "${shipped[@]}")
else
  files=$(find "${shipped[@]}" -type f)
fi
for f in $files; do
  [ -f "$f" ] || continue
  mkdir -p "$stage/$(dirname "$f")"
  cp "$f" "$stage/$f"
done
# envoy.yaml loads dist/ewma_lb.wasm relative to Envoy's working directory: the bundle's root.
mkdir -p "$stage/dist"
cp "$out/ewma_lb.wasm" "$stage/dist/ewma_lb.wasm"

# The example image at any tag becomes this release's, and the placeholder digest its digest.
# An oci:// url and Envoy Gateway's image url both name the repository the same way.
find "$stage/envoy-config" -type f \( -name '*.yaml' -o -name '*.yml' \) -print0 | sort -z |
  xargs -0 sed -i -E \
    -e "s#${EXAMPLE_IMAGE//./\\.}:[A-Za-z0-9_.-]+#$image:$version#g" \
    -e "s#\"$ZEROS\"#\"$digest\"#g"
if grep -rl "$ZEROS" "$stage" >/dev/null; then
  die "placeholder digest left in: $(grep -rl "$ZEROS" "$stage" | tr '\n' ' ')"
fi
stamped=$(grep -rl "sha256: \"$digest\"" "$stage/envoy-config" | wc -l)
[ "$stamped" -ge 2 ] || die "the digest was stamped into $stamped manifests, expected the Istio and Envoy Gateway ones"

bundle=$top.tar.gz
det_tar --mode=a+rX,u+w,go-w -C "$work/bundle" -cf "$work/bundle.tar" "$top"
gzip -n -9 -c "$work/bundle.tar" > "$out/$bundle"

# === what was built ===
cat > "$out/release.json" <<EOF
{
  "version": "$version",
  "commit": "$EWMA_LB_GIT_COMMIT",
  "module": "ewma_lb.wasm",
  "module_sha256": "$module_sha",
  "image": "$image:$version",
  "image_digest": "sha256:$digest",
  "oci_layout": "oci",
  "bundle": "$bundle"
}
EOF
(cd "$out" && sha256sum ewma_lb.wasm "$bundle" release.json > SHA256SUMS)

echo "release: $out"
echo "module:  ewma_lb.wasm sha256 $module_sha"
echo "image:   $image:$version"
echo "digest:  sha256:$digest (the WasmPlugin's and the EnvoyExtensionPolicy's sha256)"
echo "bundle:  $bundle"
echo "publish: skopeo copy --preserve-digests oci:$out/oci:$version docker://$image:$version"
echo "tag:     git tag -a v$version -m 'ewma-lb $version'"
