//! What the repository ships, read the way the tests of packaging, Istio and Envoy Gateway need
//! it: files, YAML documents as JSON values, the Kubernetes manifests of a directory.

#![allow(dead_code)] // each test binary uses its own part

pub mod crds;

use std::path::{Path, PathBuf};

use harness::repo_root;
use serde::Deserialize;
use serde_json::Value;

/// A file of the repository, by its path from the root.
pub fn read(rel: &str) -> String {
    let path = repo_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every file of the repository whose name ends with `suffix`, but in hidden folders and `target`.
pub fn repo_files(suffix: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with('.') || name == "target" {
                continue;
            }
            if path.is_dir() {
                walk(&path, suffix, out);
            } else if name.ends_with(suffix) {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo_root(), suffix, &mut out);
    out.sort();
    out
}

/// Every YAML document of a text, as JSON values (empty documents left out).
pub fn yaml_text_docs(origin: &str, text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{origin}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// Every YAML document of a file of the repository.
pub fn yaml_docs(rel: &str) -> Vec<Value> {
    yaml_text_docs(rel, &read(rel))
}

/// The one YAML document of a file.
pub fn yaml(rel: &str) -> Value {
    let mut docs = yaml_docs(rel);
    assert_eq!(docs.len(), 1, "{rel}: expected one YAML document");
    docs.remove(0)
}

/// A Kubernetes object shipped in a file.
#[derive(Clone, Debug)]
pub struct Manifest {
    /// Path from the repository root.
    pub file: String,
    pub doc: Value,
}

impl Manifest {
    pub fn kind(&self) -> &str {
        self.doc["kind"].as_str().unwrap_or_default()
    }

    pub fn spec(&self) -> &Value {
        &self.doc["spec"]
    }

    /// The directory it ships in: one variant of a deployment (sidecar, gateway, ...).
    pub fn dir(&self) -> &str {
        self.file.rsplit_once('/').map_or("", |(d, _)| d)
    }
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for path in entries.flatten().map(|e| e.path()) {
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

/// kustomize's own files (kustomization.yaml) and objects it reads but never renders
/// (`config.kubernetes.io/local-config`): nothing a cluster is given.
fn is_kustomize_input(path: &Path, doc: &Value) -> bool {
    path.file_name().is_some_and(|n| n == "kustomization.yaml")
        || doc["metadata"]["annotations"]["config.kubernetes.io/local-config"] == "true"
}

/// Every object in the YAML files under `dir` (a path from the repository root), recursively, in
/// path order; kustomize's own files are not objects of a cluster and are left out.
pub fn manifests(dir: &str) -> Vec<Manifest> {
    let mut files = Vec::new();
    yaml_files(&repo_root().join(dir), &mut files);
    files.sort();
    files
        .iter()
        .flat_map(|p| {
            let rel = p
                .strip_prefix(repo_root())
                .unwrap_or(p)
                .to_string_lossy()
                .to_string();
            yaml_docs(&rel)
                .into_iter()
                .filter(|doc| !is_kustomize_input(p, doc))
                .map(move |doc| Manifest {
                    file: rel.clone(),
                    doc,
                })
        })
        .collect()
}

/// The manifests of `dir` of one kind.
pub fn of_kind<'a>(all: &'a [Manifest], kind: &str) -> Vec<&'a Manifest> {
    all.iter().filter(|m| m.kind() == kind).collect()
}
