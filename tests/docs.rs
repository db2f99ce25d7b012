//! The documents say what the repository has:
//!
//! - every relative link of every Markdown file leads to a file that exists, and to a heading of
//!   it when it names one;
//! - the Envoy configuration README.md shows is the one the tests run (excerpts of
//!   envoy-config/envoy.yaml, not a copy that could drift);
//! - every test docs/threat-model.md cites as showing a guarantee exists, and every long name
//!   (a test, a function, a metric) README.md, docs/, bench/README.md and CHANGELOG.md cite in
//!   code is still in the code.
//!
//! The tables of docs/configuration.md and docs/observability.md are checked against the code in
//! tests/packaging.rs.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking
#![cfg(not(target_arch = "wasm32"))]

mod shipped;

use std::collections::BTreeSet;

use harness::repo_root;
use serde_json::Value;
use shipped::{read, repo_files, yaml, yaml_text_docs};

/// The lines of a Markdown text outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .into_iter()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

/// The targets of the inline links (`[text](target)`, images too) of a Markdown text.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        for (i, _) in line.match_indices("](") {
            let rest = &line[i + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_string());
            }
        }
    }
    out
}

#[test]
fn every_relative_link_leads_somewhere() {
    let root = repo_root();
    let docs = repo_files(".md");
    let mut checked = 0;
    let mut broken = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        let name = doc.strip_prefix(&root).unwrap().display().to_string();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap().join(path)
            };
            if !target.exists() {
                broken.push(format!("{name}: {link} (no such file)"));
            } else if !fragment.is_empty()
                && target.extension().is_some_and(|e| e == "md")
                && !anchors(&std::fs::read_to_string(&target).unwrap()).contains(fragment)
            {
                broken.push(format!("{name}: {link} (no such heading)"));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} relative links found: is the reader broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Whether `small` is a part of `big`: its keys with their values, or its items in order.
fn contains(big: &Value, small: &Value) -> bool {
    match (big, small) {
        (Value::Object(b), Value::Object(s)) => s
            .iter()
            .all(|(k, v)| b.get(k).is_some_and(|w| contains(w, v))),
        (Value::Array(b), Value::Array(s)) => {
            let mut rest = b.iter();
            s.iter().all(|v| rest.any(|w| contains(w, v)))
        }
        _ => big == small,
    }
}

/// Whether `part` is a part of `node` or of anything inside it.
fn found_in(node: &Value, part: &Value) -> bool {
    contains(node, part)
        || match node {
            Value::Object(m) => m.values().any(|v| found_in(v, part)),
            Value::Array(a) => a.iter().any(|v| found_in(v, part)),
            _ => false,
        }
}

#[test]
fn the_envoy_configuration_in_the_readme_is_the_shipped_one() {
    let readme = read("README.md");
    let (_, section) = readme
        .split_once("\n## How it sits in Envoy\n")
        .unwrap_or_else(|| panic!("README.md has no section \"How it sits in Envoy\""));
    let section = section.split("\n## ").next().unwrap();
    let blocks: Vec<&str> = section
        .split("```yaml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert!(
        blocks.len() >= 2,
        "README.md shows the plugin's filter and the cluster's policy"
    );
    let envoy = yaml("envoy-config/envoy.yaml");
    for block in blocks {
        let docs = yaml_text_docs("README.md", block);
        assert_eq!(docs.len(), 1, "README.md: one YAML document a block");
        assert!(
            found_in(&envoy, &docs[0]),
            "README.md shows what envoy-config/envoy.yaml does not have:\n{block}"
        );
    }
}

#[test]
fn every_test_the_threat_model_cites_exists() {
    let tests_dir = repo_root().join("tests");
    let tests: BTreeSet<String> = repo_files(".rs")
        .iter()
        .filter(|f| f.starts_with(&tests_dir))
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.split("fn ")
                .skip(1)
                .filter_map(|s| s.split_once('(').map(|(name, _)| name.trim().to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    let doc = read("docs/threat-model.md");
    // Test names are code spans of five words or more in snake case (host calls such as
    // `get_map_value_bytes` are shorter).
    let cited: Vec<&str> = doc
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.matches('_').count() >= 4
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
        .collect();
    assert!(
        cited.len() >= 10,
        "docs/threat-model.md cites {cited:?}: is the reader broken?"
    );
    for name in cited {
        assert!(
            tests.contains(name),
            "docs/threat-model.md cites {name}, which no test under tests/ defines"
        );
    }
}

/// A name the docs cite in code (a test, a function, a metric, a setting: snake case of five
/// words or more) is one the repository's code still has: a test renamed or removed must not
/// leave a doc pointing at nothing. Envoy's own statistics (`envoy_...`) are Envoy's.
#[test]
fn every_long_name_the_docs_cite_is_in_the_code() {
    let code: String = repo_files(".rs")
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    let mut docs = vec![
        "README.md".to_string(),
        "bench/README.md".to_string(),
        "CHANGELOG.md".to_string(),
    ];
    docs.extend(
        repo_files(".md")
            .iter()
            .filter(|f| f.starts_with(repo_root().join("docs")))
            .map(|f| f.strip_prefix(repo_root()).unwrap().display().to_string()),
    );
    let mut cited = 0;
    for doc in &docs {
        let text = read(doc);
        for name in text.split('`').skip(1).step_by(2).filter(|s| {
            s.matches('_').count() >= 4
                && !s.starts_with("envoy_")
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        }) {
            cited += 1;
            assert!(
                code.contains(name),
                "{doc} cites {name}, which no code in the repository has"
            );
        }
    }
    assert!(
        cited >= 50,
        "the docs cite {cited} names: is the reader broken?"
    );
}

/// The plugin's start-up warning about a wide allowlist sends operators to README, "Threat
/// model": README keeps that section.
#[test]
fn the_readme_has_the_sections_the_plugin_points_to() {
    let readme = read("README.md");
    assert!(
        anchors(&readme).contains("threat-model"),
        "README.md has no section \"Threat model\""
    );
}
