//! A release a platform team can pin:
//!
//! - the module is reproducible: a fresh copy of the tree, built by ./wasm-build.sh in another
//!   directory with its own target directory, gives the very bytes of dist/ewma_lb.wasm (one extra
//!   plugin build, about 30 s);
//! - the OCI image is built by that same script, on the toolchain and wasm-opt it pins, and
//!   holds only /plugin.wasm in one layer, with the compat variant annotation;
//! - the running plugin says which build it is: in its status page, its startup log line and
//!   `ewma_lb_build_info`;
//! - LICENSE is the Apache-2.0 text Cargo.toml declares, and CHANGELOG.md names this version.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking
#![cfg(not(target_arch = "wasm32"))] // real processes: native only

use std::path::Path;
use std::process::Command;

use harness::{repo_root, within, BackendSpec, Latency, Stack};

fn read(rel: &str) -> String {
    let path = repo_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("sha256sum: {e}"));
    assert!(
        out.status.success(),
        "sha256sum {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(repo_root())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The commit ./wasm-build.sh compiles in for the tree as it is now (its own rule: the short
/// hash, `-dirty` when tracked files differ from it).
fn tree_commit() -> String {
    let Some(commit) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return "unknown".into();
    };
    let clean = Command::new("git")
        .args(["diff", "--quiet", "HEAD", "--"])
        .current_dir(repo_root())
        .status()
        .is_ok_and(|s| s.success());
    if clean {
        commit
    } else {
        format!("{commit}-dirty")
    }
}

/// `NAME=VALUE` of a shell variable assignment at the start of a line of wasm-build.sh.
fn pinned(name: &str) -> String {
    read("wasm-build.sh")
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("wasm-build.sh does not pin {name}"))
        .to_string()
}

#[test]
fn a_fresh_copy_of_the_tree_builds_the_same_module() {
    let dist = harness::plugin_wasm().unwrap_or_else(|e| panic!("{e}"));
    let copy = tempfile::tempdir().unwrap();
    // The files a clone would have, as they are now (tracked, plus new ones not ignored).
    let files = git(&["ls-files", "-co", "--exclude-standard"])
        .unwrap_or_else(|| panic!("git ls-files failed: the test needs the git tree"));
    for file in files.lines().filter(|f| repo_root().join(f).is_file()) {
        let to = copy.path().join(file);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(repo_root().join(file), &to)
            .unwrap_or_else(|e| panic!("copying {file}: {e}"));
    }
    let commit = tree_commit();
    let out = Command::new("bash")
        .arg("./wasm-build.sh")
        .current_dir(copy.path())
        .env("EWMA_LB_GIT_COMMIT", &commit)
        .env("CARGO_TARGET_DIR", copy.path().join("target"))
        .output()
        .unwrap_or_else(|e| panic!("wasm-build.sh: {e}"));
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the copy does not build:\n{log}");
    let (ours, theirs) = (
        sha256(&dist),
        sha256(&copy.path().join("dist/ewma_lb.wasm")),
    );
    assert_eq!(
        ours,
        theirs,
        "dist/ewma_lb.wasm ({ours}) differs from a fresh build of the same tree in {} ({theirs}); \
         if dist/ is older than the sources (commit {commit}), run ./wasm-build.sh first.\n{log}",
        copy.path().display()
    );
}

/// The Dockerfile's instructions, per stage: `(FROM line words, [instruction words])`.
fn dockerfile_stages() -> Vec<(Vec<String>, Vec<Vec<String>>)> {
    let text = read("Dockerfile").replace("\\\n", " ");
    let mut stages: Vec<(Vec<String>, Vec<Vec<String>>)> = Vec::new();
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        if words[0].eq_ignore_ascii_case("FROM") {
            stages.push((words, Vec::new()));
        } else {
            stages
                .last_mut()
                .unwrap_or_else(|| panic!("Dockerfile: {line} before FROM"))
                .1
                .push(words);
        }
    }
    stages
}

#[test]
fn the_image_is_built_by_wasm_build_sh_on_the_pinned_toolchain() {
    let stages = dockerfile_stages();
    assert_eq!(stages.len(), 2, "a build stage and the image");
    let (build_from, build) = &stages[0];
    let rust = pinned("RUST_VERSION");
    let binaryen = pinned("BINARYEN_VERSION");
    assert_eq!(
        build_from[1],
        format!("rust:{rust}-slim-bookworm"),
        "the build stage's toolchain is wasm-build.sh's RUST_VERSION"
    );
    assert_eq!(
        build_from.get(2).map(|w| w.to_ascii_uppercase()),
        Some("AS".into())
    );
    let stage = &build_from[3];
    let runs: Vec<String> = build
        .iter()
        .filter(|i| i[0] == "RUN")
        .map(|i| i[1..].join(" "))
        .collect();
    assert!(
        runs.iter().any(|r| r.contains(&format!("binaryen={binaryen}-"))),
        "the build stage installs Debian's binaryen {binaryen} (wasm-build.sh's BINARYEN_VERSION): {runs:?}"
    );
    assert!(
        runs.iter().any(|r| r.contains("./wasm-build.sh")),
        "the build stage runs ./wasm-build.sh: {runs:?}"
    );
    assert!(
        build
            .iter()
            .any(|i| i[0] == "ARG" && i[1].starts_with("EWMA_LB_GIT_COMMIT")),
        "the commit comes in as a build argument"
    );

    let (image_from, image) = &stages[1];
    assert_eq!(image_from[1], "scratch");
    let layers: Vec<&Vec<String>> = image
        .iter()
        .filter(|i| ["COPY", "ADD", "RUN"].contains(&i[0].as_str()))
        .collect();
    assert_eq!(layers.len(), 1, "Istio and Envoy Gateway read the last layer: exactly one layer-making instruction, got {layers:?}");
    let copy = layers[0];
    assert_eq!(copy[1], format!("--from={stage}"));
    assert!(
        copy[2].ends_with("/dist/ewma_lb.wasm"),
        "the image holds what wasm-build.sh leaves in dist/: {copy:?}"
    );
    assert!(read("wasm-build.sh").contains("out=dist/ewma_lb.wasm"));
    assert_eq!(
        copy.last().map(String::as_str),
        Some("/plugin.wasm"),
        "Istio and Envoy Gateway look for a file named plugin.wasm"
    );
    assert!(
        image.iter().any(|i| i[0] == "LABEL"
            && i[1..]
                .join(" ")
                .contains("module.wasm.image/variant=compat")),
        "the compat variant label"
    );
    // The annotation the compat spec asks for lives in the manifest, which only the build
    // command sets: every documented build command sets it.
    for doc in ["docs/istio.md", "docs/envoy-gateway.md"] {
        let text = read(doc);
        let builds: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("docker buildx build"))
            .collect();
        assert!(!builds.is_empty(), "{doc}: no build command");
        for b in builds {
            assert!(
                b.contains("--annotation manifest:module.wasm.image/variant=compat"),
                "{doc}: {b}"
            );
        }
    }
    // Only what the build needs is sent to the builder.
    let ignore = read(".dockerignore");
    for needed in ["!Cargo.toml", "!Cargo.lock", "!src", "!wasm-build.sh"] {
        assert!(
            ignore.lines().any(|l| l.trim() == needed),
            ".dockerignore must let {needed} through"
        );
    }
}

#[test]
fn the_running_plugin_says_which_build_it_is() {
    let stack = Stack::start(vec![BackendSpec::new("a", Latency::Fixed(0))])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let version = env!("CARGO_PKG_VERSION");
    let commit = tree_commit();
    let status = stack.status().unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(
        status["build"],
        serde_json::json!({"version": version, "commit": commit}),
        "status page: {status}"
    );
    let series = format!("ewma_lb_build_info{{version=\"{version}\",commit=\"{commit}\"}}");
    let seen = within(std::time::Duration::from_secs(10), || {
        stack.prometheus(&series) == Some(1.0)
    });
    assert!(seen.is_some(), "{series} is not 1 in /stats/prometheus");
    let line = format!("ewma-lb {version} ({commit}): configured:");
    assert!(
        stack.envoy.log().contains(&line),
        "no startup line {line:?} in the log:\n{}",
        stack.envoy.log()
    );
}

#[test]
fn license_and_changelog() {
    let license = read("LICENSE");
    let system = std::fs::read_to_string("/usr/share/common-licenses/Apache-2.0").ok();
    if let Some(system) = system {
        assert_eq!(
            license, system,
            "LICENSE must be the Apache-2.0 text verbatim"
        );
    }
    assert!(
        license.contains("Apache License\n                           Version 2.0, January 2004")
    );
    assert!(read("Cargo.toml").contains("license = \"Apache-2.0\""));
    let changelog = read("CHANGELOG.md");
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        changelog
            .lines()
            .any(|l| l.starts_with(&format!("## {version}"))),
        "CHANGELOG.md has no section for {version}"
    );
}
