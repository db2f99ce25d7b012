//! Where things are in the repository: its root, the shipped Envoy config, the built plugin.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

/// The Envoy config that ships (README, docker-compose, the end-to-end tests and the benchmark
/// all run it), relative to the repository root.
pub const SHIPPED_CONFIG: &str = "envoy-config/envoy.yaml";
/// Where ./wasm-build.sh leaves the plugin, relative to the repository root.
pub const PLUGIN_WASM: &str = "dist/ewma_lb.wasm";

/// The repository this crate was built from.
pub fn repo_root() -> PathBuf {
    let harness = Path::new(env!("CARGO_MANIFEST_DIR"));
    harness.parent().unwrap_or(harness).to_path_buf()
}

/// The shipped Envoy config's path.
pub fn shipped_config() -> PathBuf {
    repo_root().join(SHIPPED_CONFIG)
}

/// The plugin module; an error that says how to build it when it is missing.
pub fn plugin_wasm() -> Result<PathBuf> {
    let path = repo_root().join(PLUGIN_WASM);
    if !path.is_file() {
        bail!("{} is missing: run ./wasm-build.sh first", path.display());
    }
    Ok(path)
}
