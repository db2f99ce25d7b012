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

/// A proxy-wasm module of the tests (`tests/modules/NAME`, a crate of its own workspace), built
/// as the plugin is built (./wasm-build.sh) into `target/test-modules/NAME.wasm`, once per
/// process: the tests of one binary run in parallel, and two builds would write the same file.
pub fn test_module(name: &str) -> Result<PathBuf> {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, path)) = built.iter().find(|(n, _)| n == name) {
        return Ok(path.clone());
    }
    let root = repo_root();
    let out = root
        .join("target/test-modules")
        .join(format!("{}.wasm", name.replace('-', "_")));
    let status = std::process::Command::new(root.join("wasm-build.sh"))
        .arg(root.join("tests/modules").join(name))
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .status()?;
    if !status.success() || !out.is_file() {
        bail!("building tests/modules/{name} failed (./wasm-build.sh; is the wasm32-wasip1 target installed?)");
    }
    built.push((name.to_string(), out.clone()));
    Ok(out)
}

/// A command-line tool the tests run: the one ./test.sh installed into the repository's `.venv`
/// (a pinned version) when it is there, else the first on `PATH`; an error that says how to get
/// it when neither has it.
pub fn tool(name: &str, install: &str) -> Result<PathBuf> {
    let local = repo_root().join(".venv/bin").join(name);
    if local.is_file() {
        return Ok(local);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    match on_path {
        Some(path) => Ok(path),
        None => bail!("{name} is not installed: {install} (./test.sh does)"),
    }
}
