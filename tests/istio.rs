//! Istio: the shipped manifests (envoy-config/istio/ for sidecars, envoy-config/istio/gateway/ for
//! the ingress gateway) as istiod would turn them into Envoy configuration, run by a real Envoy.
//!
//! istiod cannot run here, so this file emulates the two parts of pilot that decide whether the
//! patched cluster is one Envoy accepts, from the istio/istio sources (HEAD 86c9f01, 2026-08-22;
//! the same logic in 1.27.0 unless said):
//! - how a cluster's locality fields come to be: `pilot/pkg/networking/core/cluster_builder.go`
//!   (`applyDestinationRule`, subsets through `util.MergeSubsetTrafficPolicy` and
//!   `model.MergeTrafficPolicy`), `cluster_traffic_policy.go` (`applyLoadBalancer`,
//!   `applyDefaultTrafficPolicy`), `loadbalancer/loadbalancer.go` (`GetEffectiveLbSetting`,
//!   `LocalityLBSettings.ApplyToCluster`, `ZoneAwareLBSettings.ApplyToCluster`), and how two
//!   DestinationRules of one host merge (`pilot/pkg/model/destination_rule.go`,
//!   `mergeDestinationRule`);
//! - how an EnvoyFilter patches a cluster and an HTTP filter chain:
//!   `pilot/pkg/networking/core/envoyfilter/cluster_patch.go` (`ApplyClusterMerge`,
//!   `clusterMatch`), `envoyfilter/util.go` (`mergePatchValue`), `pkg/proto/merge/merge.go` (the
//!   MERGE itself), `envoyfilter/listener_patch.go` (`INSERT_FIRST`), and `proxyVersion` as Go's
//!   `regexp.MatchString` on ISTIO_VERSION (`pilot/pkg/model/envoyfilter.go`).
//!
//! What the Envoy runs observe is Envoy's own verdict (`--mode validate`, then a running Envoy
//! that routes by the header or not), never the emulation's opinion of itself.

#![allow(
    clippy::panic,
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used
)] // tests fail by panicking
#![cfg(not(target_arch = "wasm32"))] // real processes: native only

mod shipped;

use std::collections::BTreeMap;
use std::time::Duration;

use ewma_lb::config::Config;
use harness::{free_port, Backend, BackendSpec, Envoy, EnvoyOptions, Latency};
use serde_json::{json, Map, Value};
use shipped::{manifests, of_kind, read, Manifest};

// === The shipped variants =====================================================================

/// One way to deploy: the manifests of one directory.
struct Variant {
    dir: &'static str,
    /// The EnvoyFilter patch context of its proxies.
    context: &'static str,
    manifests: Vec<Manifest>,
}

fn variants() -> Vec<Variant> {
    let all = manifests("envoy-config/istio");
    [
        ("envoy-config/istio", "SIDECAR_OUTBOUND"),
        ("envoy-config/istio/gateway", "GATEWAY"),
    ]
    .into_iter()
    .map(|(dir, context)| Variant {
        dir,
        context,
        manifests: all.iter().filter(|m| m.dir() == dir).cloned().collect(),
    })
    .collect()
}

impl Variant {
    fn one(&self, kind: &str) -> &Manifest {
        let found = of_kind(&self.manifests, kind);
        assert!(!found.is_empty(), "{}: no {kind}", self.dir);
        found[0]
    }

    fn envoyfilter(&self) -> &Value {
        self.one("EnvoyFilter").spec()
    }

    fn patches(&self, apply_to: &str) -> Vec<&Value> {
        self.envoyfilter()["configPatches"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["applyTo"] == apply_to)
            .collect()
    }

    /// The service, port and subset the cluster patch matches.
    fn patched(&self) -> (String, u16, String) {
        let patch = self.patches("CLUSTER");
        assert_eq!(patch.len(), 1, "{}: one CLUSTER patch", self.dir);
        let m = &patch[0]["match"]["cluster"];
        let port = u16::try_from(m["portNumber"].as_u64().unwrap()).unwrap();
        (
            m["service"].as_str().unwrap().to_string(),
            port,
            m["subset"].as_str().unwrap_or_default().to_string(),
        )
    }

    /// Every WasmPlugin of the variant (the sidecar one ships an oci:// and a file:// one).
    fn plugin_configs(&self) -> Vec<(String, Config)> {
        of_kind(&self.manifests, "WasmPlugin")
            .into_iter()
            .map(|m| {
                let json = m
                    .spec()
                    .get("pluginConfig")
                    .cloned()
                    .unwrap_or_else(|| json!({}));
                (
                    m.file.clone(),
                    Config::from_json(json.to_string().as_bytes())
                        .unwrap_or_else(|e| panic!("{}: {e}", m.file)),
                )
            })
            .collect()
    }
}

fn header_of_cluster_patch(patch: &Value) -> String {
    let policy =
        &patch["patch"]["value"]["load_balancing_policy"]["policies"][0]["typed_extension_config"];
    policy["typed_config"]["override_host_sources"][0]["header"]
        .as_str()
        .unwrap_or_else(|| panic!("no header in {policy}"))
        .to_string()
}

fn header_removed_by(patch: &Value) -> String {
    patch["patch"]["value"]["typed_config"]["mutations"]["request_mutations"][0]["remove"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

// === proxyVersion ==============================================================================

/// The minimum Istio whose proxy ships `override_host` and whose istiod knows its type.
const MINIMUM_ISTIO: (u32, u32) = (1, 27);

#[test]
fn the_proxy_version_guard_admits_istio_1_27_and_every_later_release() {
    let cases: &[(&str, bool)] = &[
        ("1.27.0", true),
        ("1.27.3", true),
        ("1.27.0-beta.1", true),
        ("1.28-dev", true),
        ("1.28-alpha.4f2c9e0d", true),
        ("1.29.2", true),
        ("1.30.0", true),
        ("1.31.0-alpha.0", true),
        ("1.39.9", true),
        ("1.99.0", true),
        ("1.100.0", true),
        ("1.270.1", true),
        ("2.0.0", true),
        ("2.1-dev", true),
        ("10.0.0", true),
        ("1.26.4", false),
        ("1.26-dev", false),
        ("1.2.7", false),
        ("1.2", false),
        ("1.9.0", false),
        ("1.20.0", false),
        ("1.3.0", false),
        ("0.27.0", false),
        ("", false),
    ];
    for variant in variants() {
        let patches: Vec<&Value> = variant.envoyfilter()["configPatches"]
            .as_array()
            .unwrap()
            .iter()
            .collect();
        assert_eq!(
            patches.len(),
            3,
            "{}: the cluster patch, the header removal and the management guard",
            variant.dir
        );
        for patch in patches {
            let pattern = patch["match"]["proxy"]["proxyVersion"]
                .as_str()
                .unwrap_or_else(|| panic!("{}: a patch without proxyVersion", variant.dir));
            // Go's regexp is RE2; the regex crate reads the same syntax. MatchString is unanchored.
            let re = regex::Regex::new(pattern).unwrap_or_else(|e| panic!("{pattern}: {e}"));
            assert!(
                pattern.len() < 1024,
                "istiod fails a proxyVersion longer than 1024 characters closed"
            );
            for (version, want) in cases {
                assert_eq!(
                    re.is_match(version),
                    *want,
                    "{}: proxyVersion {pattern} on ISTIO_VERSION {version:?}",
                    variant.dir
                );
            }
        }
    }
    // The table's boundary is the documented minimum.
    let docs = read("docs/istio.md");
    assert!(
        docs.contains(&format!(
            "Istio {}.{} or newer",
            MINIMUM_ISTIO.0, MINIMUM_ISTIO.1
        )),
        "docs/istio.md must state the minimum Istio"
    );
}

// === Consistency of each variant ==============================================================

#[test]
fn each_variant_steers_exactly_the_cluster_it_patches_with_the_header_it_strips() {
    for variant in variants() {
        let (service, port, subset) = variant.patched();
        assert!(
            !subset.is_empty(),
            "{}: the cluster patch must be limited to the ewma-lb subset",
            variant.dir
        );
        let patched_cluster = format!("outbound|{port}|{subset}|{service}");
        let header = header_of_cluster_patch(variant.patches("CLUSTER")[0]);
        let strip: Vec<&Value> = variant
            .patches("HTTP_FILTER")
            .into_iter()
            .filter(|p| p["patch"]["value"]["name"] == "ewma-lb.remove-client-override-header")
            .collect();
        assert_eq!(strip.len(), 1, "{}: one header removal", variant.dir);
        assert_eq!(
            strip[0]["patch"]["operation"], "INSERT_FIRST",
            "{}: the removal must come before every other filter",
            variant.dir
        );
        assert_eq!(
            header_removed_by(strip[0]),
            header,
            "{}: the native filter must remove the header override_host reads",
            variant.dir
        );
        for patch in variant.envoyfilter()["configPatches"].as_array().unwrap() {
            assert_eq!(
                patch["match"]["context"], variant.context,
                "{}",
                variant.dir
            );
        }

        let plugins = variant.plugin_configs();
        assert!(!plugins.is_empty(), "{}: no WasmPlugin", variant.dir);
        for (file, config) in &plugins {
            assert_eq!(
                config.override_header(),
                header,
                "{file}: the plugin writes the header the cluster reads"
            );
            assert!(
                config.steers(&patched_cluster),
                "{file}: steered_clusters must name {patched_cluster}"
            );
            // ...and nothing else: not the service's default cluster, not another subset or port.
            for other in [
                format!("outbound|{port}||{service}"),
                format!("outbound|{port}|v1|{service}"),
                format!("outbound|{}|{subset}|{service}", port + 1),
                "outbound|9080||details.default.svc.cluster.local".to_string(),
            ] {
                assert!(!config.steers(&other), "{file}: steered_clusters must not name {other}, which the patch does not reach");
            }
        }
        // The plugin runs where the header is removed: the same workloads, and on sidecars the
        // called port is the listener's.
        let ef_selector = &variant.one("EnvoyFilter").spec()["workloadSelector"]["labels"];
        for plugin in of_kind(&variant.manifests, "WasmPlugin") {
            assert_eq!(
                &plugin.spec()["selector"]["matchLabels"],
                ef_selector,
                "{}: the WasmPlugin and the EnvoyFilter select the same workloads",
                plugin.file
            );
            assert_eq!(
                plugin.doc["metadata"]["namespace"],
                variant.one("EnvoyFilter").doc["metadata"]["namespace"],
                "{}",
                plugin.file
            );
            let ports: Vec<u64> = plugin.spec()["match"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|m| m["ports"].as_array().cloned().unwrap_or_default())
                .filter_map(|p| p["number"].as_u64())
                .collect();
            assert_eq!(
                ports,
                vec![strip[0]["match"]["listener"]["portNumber"]
                    .as_u64()
                    .unwrap()],
                "{}: the plugin's port is the listener the header is removed on",
                plugin.file
            );
            let modes: Vec<&str> = plugin.spec()["match"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|m| m["mode"].as_str())
                .collect();
            assert_eq!(
                modes,
                vec!["CLIENT"],
                "{}: outbound traffic (on a gateway, CLIENT is the only mode that matches)",
                plugin.file
            );
            assert_eq!(
                plugin.spec()["failStrategy"],
                "FAIL_OPEN",
                "{}: Istio installs allow-all only for FAIL_OPEN when the module cannot be fetched",
                plugin.file
            );
        }
        // The subset exists, turns locality off, and the route goes to it.
        let dr = variant.one("DestinationRule").spec();
        assert_eq!(dr["host"], service.as_str(), "{}", variant.dir);
        assert!(
            dr.get("trafficPolicy").is_none(),
            "{}: the shipped rule holds only the subset, so it merges into the user's rule",
            variant.dir
        );
        let ours = dr["subsets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == subset.as_str())
            .unwrap_or_else(|| panic!("{}: no subset {subset}", variant.dir));
        assert_eq!(
            ours["trafficPolicy"]["loadBalancer"]["localityLbSetting"]["enabled"], false,
            "{}",
            variant.dir
        );
        assert!(
            ours.get("labels").is_none(),
            "{}: the subset is every endpoint of the service",
            variant.dir
        );
        let vs = variant.one("VirtualService").spec();
        let destinations: Vec<&Value> = vs["http"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["route"].as_array().unwrap())
            .map(|r| &r["destination"])
            .collect();
        assert!(
            destinations.iter().any(|d| d["host"] == service.as_str()
                && d["subset"] == subset.as_str()
                && d["port"]["number"] == port),
            "{}: the VirtualService must route to {service}:{port} subset {subset}",
            variant.dir
        );
    }
}

// === The pilot emulation =======================================================================

/// Mesh-wide settings (MeshConfig) and istiod's environment.
#[derive(Clone, Default)]
struct Mesh {
    locality_lb_setting: Option<Value>,
    zone_aware_lb_setting: Option<Value>,
    default_outlier_detection: Option<Value>,
    /// istiod's ENABLE_LOCALITY_WEIGHTED_LB_CONFIG.
    env_locality_weighted: bool,
}

/// One situation a mesh can be in for the steered service.
#[derive(Clone)]
struct Case {
    name: &'static str,
    mesh: Mesh,
    /// The Service's `spec.trafficDistribution`.
    traffic_distribution: Option<&'static str>,
    /// The user's own DestinationRule for the service (its spec without `host`).
    user_rule: Option<Value>,
    /// Whether our subset's cluster can still get locality fields: only istiod's env flag.
    residual: bool,
}

fn outlier() -> Value {
    json!({"consecutive5xxErrors": 5, "interval": "10s", "baseEjectionTime": "30s"})
}

fn cases() -> Vec<Case> {
    let case = |name, mesh: Mesh, traffic_distribution, user_rule: Option<Value>| Case {
        name,
        mesh,
        traffic_distribution,
        user_rule,
        residual: false,
    };
    let default_mesh = Mesh {
        locality_lb_setting: Some(json!({"enabled": true})),
        ..Mesh::default()
    };
    vec![
        case("mesh default, no rule", default_mesh.clone(), None, None),
        case(
            "outlier detection (default failover: EDS priorities only)",
            default_mesh.clone(),
            None,
            Some(json!({"trafficPolicy": {"outlierDetection": outlier()}})),
        ),
        case(
            "locality distribute",
            default_mesh.clone(),
            None,
            Some(
                json!({"trafficPolicy": {"loadBalancer": {"localityLbSetting": {"distribute": [{"from": "r1/*", "to": {"r1/*": 80, "r2/*": 20}}]}}}}),
            ),
        ),
        case(
            "locality failover with outlier detection",
            default_mesh.clone(),
            None,
            Some(
                json!({"trafficPolicy": {"outlierDetection": outlier(), "loadBalancer": {"localityLbSetting": {"failover": [{"from": "r1", "to": "r2"}]}}}}),
            ),
        ),
        case(
            "failoverPriority with outlier detection",
            default_mesh.clone(),
            None,
            Some(
                json!({"trafficPolicy": {"outlierDetection": outlier(), "loadBalancer": {"localityLbSetting": {"failoverPriority": ["topology.kubernetes.io/region", "topology.kubernetes.io/zone"]}}}}),
            ),
        ),
        case(
            "Service trafficDistribution PreferClose",
            default_mesh.clone(),
            Some("PreferClose"),
            None,
        ),
        case(
            "Service trafficDistribution PreferSameNode",
            default_mesh.clone(),
            Some("PreferSameNode"),
            None,
        ),
        case(
            "mesh failover and mesh default outlier detection",
            Mesh {
                locality_lb_setting: Some(json!({"failover": [{"from": "r1", "to": "r2"}]})),
                default_outlier_detection: Some(outlier()),
                ..Mesh::default()
            },
            None,
            None,
        ),
        case(
            "rule zoneAwareLbSetting (1.31)",
            default_mesh.clone(),
            None,
            Some(
                json!({"trafficPolicy": {"loadBalancer": {"zoneAwareLbSetting": {"minClusterSize": 3}}}}),
            ),
        ),
        case(
            "rule zoneAwareLbSetting disabled (routing 0 %)",
            default_mesh.clone(),
            None,
            Some(
                json!({"trafficPolicy": {"loadBalancer": {"zoneAwareLbSetting": {"enabled": false}}}}),
            ),
        ),
        case(
            "mesh zoneAwareLbSetting",
            Mesh {
                zone_aware_lb_setting: Some(json!({})),
                ..default_mesh.clone()
            },
            None,
            None,
        ),
        case(
            "port-level failover, version subsets with their own distribute",
            default_mesh.clone(),
            None,
            Some(json!({
                "trafficPolicy": {"portLevelSettings": [{"port": {"number": 0}, "outlierDetection": outlier(), "loadBalancer": {"localityLbSetting": {"failover": [{"from": "r1", "to": "r2"}]}}}]},
                "subsets": [
                    {"name": "v1", "labels": {"version": "v1"}, "trafficPolicy": {"loadBalancer": {"localityLbSetting": {"distribute": [{"from": "*", "to": {"r1/*": 100}}]}}}},
                    {"name": "v2", "labels": {"version": "v2"}},
                ],
            })),
        ),
        Case {
            residual: true,
            ..case(
                "istiod ENABLE_LOCALITY_WEIGHTED_LB_CONFIG=true",
                Mesh {
                    env_locality_weighted: true,
                    ..default_mesh
                },
                None,
                None,
            )
        },
    ]
}

/// `util.GetPortLevelTrafficPolicy`: a port's own settings replace the whole policy.
fn port_level(policy: &Value, port: u16) -> (Value, bool) {
    let found = policy["portLevelSettings"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["port"]["number"] == port);
    match found {
        Some(p) => {
            let mut copy = Map::new();
            for k in ["connectionPool", "loadBalancer", "outlierDetection", "tls"] {
                if let Some(v) = p.get(k) {
                    copy.insert(k.into(), v.clone());
                }
            }
            (Value::Object(copy), true)
        }
        None => (policy.clone(), false),
    }
}

/// The traffic policy pilot applies to the cluster of `subset` (None: the service's default
/// cluster): `applyDestinationRule`, `applyDefaultTrafficPolicy`, `MergeSubsetTrafficPolicy`.
fn effective_policy(rule: &Value, subset: Option<&Value>, port: u16, mesh: &Mesh) -> Value {
    let (mut policy, _) = port_level(&rule["trafficPolicy"], port);
    if let Some(outlier) = &mesh.default_outlier_detection {
        if policy.get("outlierDetection").is_none() {
            if !policy.is_object() {
                policy = json!({});
            }
            policy["outlierDetection"] = outlier.clone();
        }
    }
    let Some(subset_policy) = subset.and_then(|s| s.get("trafficPolicy")) else {
        return policy;
    };
    let (subset_policy, has_port_level) = port_level(subset_policy, port);
    if policy.is_null() {
        return subset_policy;
    }
    for k in ["connectionPool", "outlierDetection", "loadBalancer", "tls"] {
        match subset_policy.get(k) {
            Some(v) => policy[k] = v.clone(),
            None if has_port_level => {
                if let Some(o) = policy.as_object_mut() {
                    o.remove(k);
                }
            }
            None => {}
        }
    }
    policy
}

/// What `GetEffectiveLbSetting` resolves to.
enum LbSetting {
    Locality { setting: Value, force: bool },
    ZoneAware(Value),
}

fn effective_lb_setting(
    mesh: &Mesh,
    lb: &Value,
    traffic_distribution: Option<&str>,
) -> Option<LbSetting> {
    if let Some(za) = lb.get("zoneAwareLbSetting") {
        return Some(LbSetting::ZoneAware(za.clone()));
    }
    if let Some(l) = lb.get("localityLbSetting") {
        if l["enabled"] == false {
            return None;
        }
        return Some(LbSetting::Locality {
            setting: l.clone(),
            force: false,
        });
    }
    if let Some(td) = traffic_distribution {
        let mut priority = vec![
            "topology.istio.io/network",
            "topology.kubernetes.io/region",
            "topology.kubernetes.io/zone",
        ];
        if td == "PreferSameNode" {
            priority.extend(["topology.istio.io/subzone", "kubernetes.io/hostname"]);
        }
        return Some(LbSetting::Locality {
            setting: json!({"enabled": true, "failoverPriority": priority}),
            force: true,
        });
    }
    if let Some(za) = &mesh.zone_aware_lb_setting {
        return Some(LbSetting::ZoneAware(za.clone()));
    }
    match &mesh.locality_lb_setting {
        Some(l) if l["enabled"] == false => None,
        Some(l) => Some(LbSetting::Locality {
            setting: l.clone(),
            force: false,
        }),
        None => None,
    }
}

/// The three endpoints every emulated cluster has, in three localities; the proxy is in r1/z1.
const LOCALITIES: [(&str, &str); 3] = [("r1", "z1"), ("r1", "z2"), ("r2", "z3")];

/// A cluster as pilot builds it for `subset` of the service, before any EnvoyFilter: the fields
/// that decide whether Envoy accepts `load_balancing_policy`, with the EDS answer inlined (a
/// STATIC cluster with the same localities, weights and priorities stands in for EDS).
fn build_cluster(
    case: &Case,
    rule: &Value,
    subset: Option<&Value>,
    service: &str,
    port: u16,
    backends: &[Backend],
) -> Value {
    let subset_name = subset.map_or("", |s| s["name"].as_str().unwrap());
    let name = format!("outbound|{port}|{subset_name}|{service}");
    let policy = effective_policy(rule, subset, port, &case.mesh);
    let lb = policy.get("loadBalancer").cloned().unwrap_or(Value::Null);
    let outlier = policy.get("outlierDetection").is_some();
    let mut cluster = json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "10s",
        "lb_policy": match lb["simple"].as_str() { Some("ROUND_ROBIN") => "ROUND_ROBIN", Some("RANDOM") => "RANDOM", _ => "LEAST_REQUEST" },
        "common_lb_config": {},
        "circuit_breakers": {"thresholds": [{"max_connections": 4_294_967_295_u64, "max_pending_requests": 4_294_967_295_u64, "max_requests": 4_294_967_295_u64, "max_retries": 4_294_967_295_u64}]},
    });
    if outlier {
        cluster["outlier_detection"] = json!({"consecutive_5xx": 5, "interval": "10s", "base_ejection_time": "30s", "max_ejection_percent": 100});
    }
    // ApplyToCluster (HEAD: a nil setting applies LocalityLBSettings{}).
    let failover = match effective_lb_setting(&case.mesh, &lb, case.traffic_distribution) {
        Some(LbSetting::ZoneAware(za)) => {
            cluster["common_lb_config"]["zone_aware_lb_config"] = if za["enabled"] == false {
                json!({"routing_enabled": {"value": 0}})
            } else {
                json!({})
            };
            za["enabled"] != false
        }
        setting => {
            let (l, force) = match setting {
                Some(LbSetting::Locality { setting, force }) => (setting, force),
                _ => (Value::Null, false),
            };
            let enable_failover = force || outlier;
            let has_failover = l.get("failover").is_some() || l.get("failoverPriority").is_some();
            if case.mesh.env_locality_weighted
                || (enable_failover && has_failover)
                || l.get("distribute").is_some()
            {
                cluster["common_lb_config"]["locality_weighted_lb_config"] = json!({});
            }
            enable_failover && l.get("distribute").is_none()
        }
    };
    // EDS: one group per locality, weighted; with failover on, priorities by distance from the
    // proxy's locality, compacted to 0..N (endpoints/endpoint_builder.go, applyLocalityFailover).
    let endpoints: Vec<Value> = LOCALITIES
        .iter()
        .zip(backends)
        .enumerate()
        .map(|(i, ((region, zone), b))| {
            let mut group = json!({
                "locality": {"region": region, "zone": zone},
                "load_balancing_weight": 1,
                "lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": b.addr().port()}}}}],
            });
            if failover {
                group["priority"] = json!(i);
            }
            group
        })
        .collect();
    cluster["load_assignment"] = json!({"cluster_name": name, "endpoints": endpoints});
    cluster
}

/// The user's rule and ours for the same host, merged as `mergeDestinationRule` does: the older
/// (the user's) keeps its traffic policy, subsets are added unless a name is taken.
fn merged_rule(user: Option<&Value>, ours: &Value) -> Value {
    let mut merged = user.cloned().unwrap_or_else(|| json!({}));
    if merged.get("trafficPolicy").is_none() {
        if let Some(tp) = ours.get("trafficPolicy") {
            merged["trafficPolicy"] = tp.clone();
        }
    }
    let mut subsets = merged["subsets"].as_array().cloned().unwrap_or_default();
    for s in ours["subsets"].as_array().into_iter().flatten() {
        if !subsets.iter().any(|have| have["name"] == s["name"]) {
            subsets.push(s.clone());
        }
    }
    merged["subsets"] = Value::Array(subsets);
    merged
}

// === The EnvoyFilter emulation =================================================================

/// Members of the oneofs of the messages a cluster patch reaches, by the path of the message
/// (protobuf-go's `Mutable` on one member clears the others; JSON cannot tell).
const ONEOFS: &[(&str, &[&str])] = &[
    ("", &["type", "cluster_type"]),
    (
        "",
        &[
            "ring_hash_lb_config",
            "maglev_lb_config",
            "original_dst_lb_config",
            "least_request_lb_config",
            "round_robin_lb_config",
        ],
    ),
    (
        "common_lb_config",
        &["zone_aware_lb_config", "locality_weighted_lb_config"],
    ),
];

/// `merge.Merge` (pkg/proto/merge/merge.go) on the JSON form: fields set in `src` are visited;
/// lists append; messages merge field by field; an `Any` (an object with `@type`) is replaced
/// whole, as merging its type URL and bytes amounts to; scalars and Durations are replaced;
/// setting one member of a oneof drops the others. A `null` in the patch is an unset field and
/// changes nothing: MERGE cannot clear.
fn proto_merge(dst: &mut Value, src: &Value, path: &str) {
    let Value::Object(src_fields) = src else {
        return;
    };
    if !dst.is_object() {
        *dst = json!({});
    }
    for (k, v) in src_fields {
        if v.is_null() {
            continue;
        }
        let dst_fields = dst.as_object_mut().unwrap();
        for (at, members) in ONEOFS {
            if *at == path && members.contains(&k.as_str()) {
                for other in members.iter().filter(|m| **m != k) {
                    dst_fields.remove(*other);
                }
            }
        }
        let child = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        match v {
            Value::Array(items) => match dst_fields.entry(k.clone()).or_insert_with(|| json!([])) {
                Value::Array(have) => have.extend(items.iter().cloned()),
                other => *other = v.clone(),
            },
            Value::Object(o) if o.contains_key("@type") => {
                dst_fields.insert(k.clone(), v.clone());
            }
            Value::Object(_) => proto_merge(
                dst_fields.entry(k.clone()).or_insert_with(|| json!({})),
                v,
                &child,
            ),
            _ => {
                dst_fields.insert(k.clone(), v.clone());
            }
        }
    }
}

/// `proxyVersion` as istiod matches it: unanchored RE2 on ISTIO_VERSION; an empty version never
/// matches a pattern.
fn proxy_matches(patch: &Value, version: &str) -> bool {
    match patch["match"]["proxy"]["proxyVersion"].as_str() {
        Some(pattern) => {
            !version.is_empty() && regex::Regex::new(pattern).unwrap().is_match(version)
        }
        None => true,
    }
}

fn context_matches(patch: &Value, context: &str) -> bool {
    matches!(patch["match"]["context"].as_str(), None | Some("ANY"))
        || patch["match"]["context"] == context
}

/// `ApplyClusterMerge` with `clusterMatch`: the cluster after every CLUSTER patch, `None` when
/// one removed it.
fn apply_cluster_patches(
    envoyfilter: &Value,
    context: &str,
    version: &str,
    mut cluster: Value,
) -> Option<Value> {
    let name = cluster["name"].as_str().unwrap().to_string();
    let parts: Vec<&str> = name.split('|').collect();
    for patch in envoyfilter["configPatches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["applyTo"] == "CLUSTER")
    {
        let m = &patch["match"]["cluster"];
        let cluster_matches = match m["name"].as_str() {
            Some(n) if !n.is_empty() => n == name,
            _ => {
                parts.len() == 4
                    && m["subset"]
                        .as_str()
                        .is_none_or(|s| s.is_empty() || s == parts[2])
                    && m["service"]
                        .as_str()
                        .is_none_or(|s| s.is_empty() || s == parts[3])
                    && m["portNumber"]
                        .as_u64()
                        .is_none_or(|p| p == 0 || Some(p) == parts[1].parse().ok())
            }
        };
        if !(cluster_matches && context_matches(patch, context) && proxy_matches(patch, version)) {
            continue;
        }
        match patch["patch"]["operation"].as_str() {
            Some("REMOVE") => return None,
            Some("MERGE") => proto_merge(&mut cluster, &patch["patch"]["value"], ""),
            other => {
                panic!("{other:?} on CLUSTER is not emulated (and REPLACE does nothing there)")
            }
        }
    }
    Some(cluster)
}

/// `INSERT_FIRST` and `INSERT_BEFORE` of the HTTP_FILTER patches that match an HCM of a listener on `port`.
fn apply_http_filter_patches(
    envoyfilter: &Value,
    context: &str,
    version: &str,
    port: u16,
    filters: &mut Vec<Value>,
) {
    for patch in envoyfilter["configPatches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["applyTo"] == "HTTP_FILTER")
    {
        let l = &patch["match"]["listener"];
        let listener_matches = l["portNumber"]
            .as_u64()
            .is_none_or(|p| p == u64::from(port))
            && l["filterChain"]["filter"]["name"]
                .as_str()
                .is_none_or(|n| n == "envoy.filters.network.http_connection_manager");
        if !(listener_matches && context_matches(patch, context) && proxy_matches(patch, version)) {
            continue;
        }
        let value = patch["patch"]["value"].clone();
        match patch["patch"]["operation"].as_str() {
            Some("INSERT_FIRST") => filters.insert(0, value),
            Some("INSERT_BEFORE") => {
                let before = &l["filterChain"]["filter"]["subFilter"]["name"];
                let at = filters
                    .iter()
                    .position(|f| &f["name"] == before)
                    .unwrap_or_else(|| panic!("INSERT_BEFORE {before}: not in the chain"));
                filters.insert(at, value);
            }
            other => panic!("{other:?} on HTTP_FILTER is not emulated"),
        }
    }
}

// === Envoy bootstraps ==========================================================================

fn has_locality_fields(cluster: &Value) -> bool {
    let c = &cluster["common_lb_config"];
    c.get("locality_weighted_lb_config").is_some() || c.get("zone_aware_lb_config").is_some()
}

fn is_patched(cluster: &Value) -> bool {
    cluster.get("load_balancing_policy").is_some()
}

fn router() -> Value {
    json!({"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}})
}

/// The clusters of `case` the variant's EnvoyFilter patches, as an Istio 1.27 sidecar gets them.
fn patched_clusters(variant: &Variant, case: &Case, backends: &[Backend]) -> Vec<Value> {
    clusters_of(
        variant,
        &variant.envoyfilter().clone(),
        case,
        "1.27.0",
        backends,
    )
    .into_iter()
    .filter(is_patched)
    .collect()
}

/// The variant's WasmPlugin for sidecars (envoy-config/istio/wasmplugin.yaml).
fn sidecar_plugin(variant: &Variant) -> Manifest {
    of_kind(&variant.manifests, "WasmPlugin")
        .into_iter()
        .find(|m| m.file.ends_with("istio/wasmplugin.yaml"))
        .unwrap()
        .clone()
}

/// The HTTP filters Istio gives a sidecar of Istio 1.27 for `plugin` (the WasmPlugin manifest)
/// with `plugin_config`, patched by the variant's EnvoyFilter, the router last.
fn plugin_chain(variant: &Variant, plugin: &Manifest, plugin_config: &Value) -> Vec<Value> {
    let wasm = json!({
        "name": "extensions.istio.io/wasmplugin/default.ewma-lb",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": "default.ewma-lb",
                "root_id": plugin.spec()["pluginName"],
                "failure_policy": "FAIL_OPEN",
                "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": plugin_config.to_string()},
                "vm_config": {"runtime": "envoy.wasm.runtime.v8", "code": {"local": {"filename": harness::plugin_wasm().unwrap_or_else(|e| panic!("{e}"))}}},
            }
        }
    });
    let mut chain = vec![wasm, router()];
    apply_http_filter_patches(
        variant.envoyfilter(),
        variant.context,
        "1.27.0",
        9080,
        &mut chain,
    );
    chain
}

/// A listener whose route `/c{i}/` goes to `clusters[i]`, under that cluster's own name.
/// The listener's port is left to Envoy ([`outbound_port`] reads it back), so no other process
/// can take it between a pick and the bind.
fn bootstrap(clusters: &[Value], http_filters: Vec<Value>) -> Value {
    let routes: Vec<Value> = clusters
        .iter()
        .enumerate()
        .map(|(i, c)| json!({"match": {"prefix": format!("/c{i}/")}, "route": {"cluster": c["name"]}}))
        .collect();
    json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [{
                "name": "outbound",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "outbound",
                        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}]},
                        "http_filters": http_filters,
                    }
                }]}]
            }],
            "clusters": clusters,
        }
    })
}

fn backends(n: usize) -> Vec<Backend> {
    (0..n)
        .map(|i| {
            Backend::start_local(BackendSpec::new(format!("b{i}"), Latency::Fixed(0)))
                .unwrap_or_else(|e| panic!("backend: {e}"))
        })
        .collect()
}

fn served(backends: &[Backend]) -> Vec<u64> {
    backends.iter().map(Backend::served).collect()
}

/// Every cluster pilot would build for the service in `case`, patched by the variant's
/// EnvoyFilter as a proxy of `version` receives it: `(cluster, patched)`.
fn clusters_of(
    variant: &Variant,
    envoyfilter: &Value,
    case: &Case,
    version: &str,
    backends: &[Backend],
) -> Vec<Value> {
    let (service, port, _) = variant.patched();
    let ours = variant.one("DestinationRule").spec();
    let mut user = case.user_rule.clone();
    // The port-level case names the service's port.
    if let Some(pls) = user
        .as_mut()
        .and_then(|u| u.pointer_mut("/trafficPolicy/portLevelSettings"))
    {
        for p in pls.as_array_mut().unwrap() {
            p["port"]["number"] = json!(port);
        }
    }
    let rule = merged_rule(user.as_ref(), ours);
    let mut built = vec![build_cluster(case, &rule, None, &service, port, backends)];
    for subset in rule["subsets"].as_array().into_iter().flatten() {
        built.push(build_cluster(
            case,
            &rule,
            Some(subset),
            &service,
            port,
            backends,
        ));
    }
    built
        .into_iter()
        .filter_map(|c| apply_cluster_patches(envoyfilter, variant.context, version, c))
        .collect()
}

/// The same clusters under names unique across cases (a bootstrap holds each name once).
fn uniquely_named(case: usize, clusters: Vec<Value>) -> Vec<Value> {
    clusters
        .into_iter()
        .map(|mut c| {
            let name = format!("{}#{case}", c["name"].as_str().unwrap());
            c["name"] = json!(name);
            c["load_assignment"]["cluster_name"] = json!(name);
            c
        })
        .collect()
}

/// The verdict of `envoy --mode validate` on a listener in front of `clusters`.
fn envoy_validates(clusters: &[Value]) -> Result<(), String> {
    let config = serde_json::to_string_pretty(&bootstrap(clusters, vec![router()])).unwrap();
    Envoy::validate(&config).map_err(|e| format!("{e:#}"))
}

/// The port Envoy bound for [`bootstrap`]'s listener.
fn outbound_port(envoy: &Envoy) -> u16 {
    envoy
        .listener_addr("outbound")
        .unwrap_or_else(|e| panic!("{e:#}"))
        .port()
}

/// `/c{i}/x` with the header naming `target`, `n` times; every answer must be 200.
fn send(listen: u16, route: usize, header: &str, target: &str, n: usize) {
    let url = format!("http://127.0.0.1:{listen}/c{route}/x");
    for _ in 0..n {
        let r =
            harness::http::get(&url, &[(header, target)]).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(r.status, 200, "{url}: {r:?}");
    }
}

/// Whatever locality settings the mesh, the Service or the user's own DestinationRule carry,
/// the one cluster the shipped EnvoyFilter patches (the ewma-lb subset's) never has the fields
/// Envoy cannot combine with `load_balancing_policy`: `envoy --mode validate` accepts every
/// cluster of every case, and a running Envoy sends every request that names a host to that host
/// on each patched cluster. The control: the same patch without its `subset` match (what shipped
/// before) is refused by Envoy ("cannot be combined with partial fields") in the cases that set
/// them, so the matrix does reach what breaks a patch. The one setting the subset cannot undo,
/// istiod's ENABLE_LOCALITY_WEIGHTED_LB_CONFIG, is shown refused and is in docs/istio.md.
#[test]
fn the_cluster_patch_leaves_a_cluster_envoy_accepts_whatever_the_mesh_sets() {
    let backends = backends(3);
    let header = "x-ewma-lb-host";
    for variant in variants() {
        let envoyfilter = variant.envoyfilter().clone();
        assert_eq!(
            header_of_cluster_patch(variant.patches("CLUSTER")[0]),
            header
        );
        let mut accepted = Vec::new();
        let mut patched_routes = Vec::new();
        let mut conflicts_without_subset = Vec::new();
        for (i, case) in cases().iter().enumerate() {
            for version in ["1.27.0", "1.31.0-alpha.0"] {
                let clusters = clusters_of(&variant, &envoyfilter, case, version, &backends);
                let patched: Vec<&Value> = clusters.iter().filter(|c| is_patched(c)).collect();
                assert_eq!(
                    patched.len(),
                    1,
                    "{} / {}: exactly the subset's cluster is patched, got {:?}",
                    variant.dir,
                    case.name,
                    patched.iter().map(|c| &c["name"]).collect::<Vec<_>>()
                );
                assert!(
                    patched[0]["name"].as_str().unwrap().contains("|ewma-lb|"),
                    "{}",
                    patched[0]["name"]
                );
                if case.residual {
                    assert!(
                        has_locality_fields(patched[0]),
                        "{}: the emulation must show the residual",
                        case.name
                    );
                    if version == "1.27.0" {
                        let refused = envoy_validates(&uniquely_named(i, clusters.clone()))
                            .expect_err("the residual case must be refused");
                        assert!(
                            refused.contains("cannot be combined with partial fields"),
                            "{refused}"
                        );
                    }
                    continue;
                }
                assert!(
                    !has_locality_fields(patched[0]),
                    "{} / {}: {}",
                    variant.dir,
                    case.name,
                    patched[0]
                );
                if version == "1.27.0" {
                    for c in uniquely_named(i, clusters) {
                        if is_patched(&c) {
                            patched_routes.push(accepted.len());
                        }
                        accepted.push(c);
                    }
                }
            }
            // A proxy older than the guard gets no patch at all.
            let old = clusters_of(&variant, &envoyfilter, case, "1.26.3", &backends);
            assert!(
                old.iter().all(|c| !is_patched(c)),
                "{}: 1.26 must be left alone",
                case.name
            );
            // The control: the patch as it shipped before, on every cluster of the service.
            let mut unguarded = envoyfilter.clone();
            for p in unguarded["configPatches"].as_array_mut().unwrap() {
                if let Some(m) = p["match"]["cluster"].as_object_mut() {
                    m.remove("subset");
                }
            }
            let all = clusters_of(&variant, &unguarded, case, "1.27.0", &backends);
            if all.iter().any(|c| is_patched(c) && has_locality_fields(c)) {
                conflicts_without_subset.push((i, all));
            }
        }
        let names: Vec<&str> = conflicts_without_subset
            .iter()
            .map(|(i, _)| cases()[*i].name)
            .collect();
        assert!(names.len() >= 8, "{}: the matrix should reach the settings that break an unguarded patch, reached {names:?}", variant.dir);
        let (i, clusters) = &conflicts_without_subset[0];
        let refused = envoy_validates(&uniquely_named(*i, clusters.clone()))
            .expect_err("Envoy must refuse the unguarded patch");
        assert!(
            refused.contains("cannot be combined with partial fields"),
            "{refused}"
        );

        // Envoy's verdict on every cluster of every case, with the shipped patch.
        envoy_validates(&accepted)
            .unwrap_or_else(|e| panic!("{}: envoy refuses the patched clusters: {e}", variant.dir));

        // And on a running Envoy, each patched cluster obeys the header: every request naming a
        // host (a different one per cluster, so no cluster's count hides another's) reaches it.
        let config = serde_json::to_string_pretty(&bootstrap(&accepted, vec![router()])).unwrap();
        let envoy =
            Envoy::start(EnvoyOptions::new(config)).unwrap_or_else(|e| panic!("envoy: {e:#}"));
        let listen = outbound_port(&envoy);
        for (n, route) in patched_routes.iter().enumerate() {
            let target = &backends[n % backends.len()];
            let before = served(&backends);
            send(listen, *route, header, &target.addr().to_string(), 8);
            let after = served(&backends);
            let delta: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
            let want: Vec<u64> = (0..backends.len())
                .map(|j| if j == n % backends.len() { 8 } else { 0 })
                .collect();
            assert_eq!(
                delta,
                want,
                "{}: {} did not obey the header naming {}",
                variant.dir,
                accepted[*route]["name"],
                target.addr()
            );
        }
        drop(envoy);
    }
}

// === The header removal ========================================================================

/// The HTTP filter chain of the client's outbound listener as Istio 1.27+ builds it when the
/// WasmPlugin failed open and its module could not be fetched: pilot-agent puts an allow-all RBAC
/// filter where the wasm filter was (istio/istio pkg/wasm/convert.go); the EnvoyFilter's
/// removal is inserted first, as `INSERT_FIRST` does, and its management guard before the router.
fn failed_open_chain(variant: &Variant, port: u16) -> Vec<Value> {
    let mut chain = vec![
        json!({"name": "extensions.istio.io/wasmplugin/default.ewma-lb", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"}}),
        json!({"name": "envoy.filters.http.fault", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"}}),
        json!({"name": "envoy.filters.http.cors", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"}}),
        router(),
    ];
    apply_http_filter_patches(
        variant.envoyfilter(),
        variant.context,
        "1.27.0",
        port,
        &mut chain,
    );
    chain
}

/// With the plugin absent (failed open), a client's forged `x-ewma-lb-host` must not choose the
/// host: through the chain Istio builds with the shipped removal first, 300 forged requests
/// naming one of three hosts spread like least_request's fallback (the named host gets at most
/// 50 %, where a fair share is 33 %: 6 standard deviations of a binomial, so a correct run never
/// fails), while the same cluster behind a chain without the removal obeys all 300 (the control:
/// the header would choose the host if it reached the cluster).
#[test]
fn a_forged_header_is_removed_before_the_plugin_even_when_it_failed_open() {
    let backends = backends(3);
    for variant in variants() {
        let port = variant.patches("HTTP_FILTER")[0]["match"]["listener"]["portNumber"]
            .as_u64()
            .unwrap();
        let chain = failed_open_chain(&variant, u16::try_from(port).unwrap());
        assert_eq!(
            chain[0]["typed_config"]["@type"],
            "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
            "{}",
            variant.dir
        );
        let case = &cases()[0];
        let clusters = clusters_of(
            &variant,
            &variant.envoyfilter().clone(),
            case,
            "1.27.0",
            &backends,
        );
        let steered: Vec<Value> = clusters.into_iter().filter(is_patched).collect();
        for (strip, n) in [(true, 300u64), (false, 300u64)] {
            let chain = if strip {
                chain.clone()
            } else {
                chain[1..].to_vec()
            };
            let config = serde_json::to_string_pretty(&bootstrap(&steered, chain)).unwrap();
            let envoy =
                Envoy::start(EnvoyOptions::new(config)).unwrap_or_else(|e| panic!("envoy: {e:#}"));
            let listen = outbound_port(&envoy);
            let named = &backends[1];
            let before = served(&backends);
            send(
                listen,
                0,
                "x-ewma-lb-host",
                &named.addr().to_string(),
                usize::try_from(n).unwrap(),
            );
            let got: Vec<u64> = served(&backends)
                .iter()
                .zip(&before)
                .map(|(a, b)| a - b)
                .collect();
            eprintln!(
                "{}: removal {strip}: served of {n} forged to name b1: {got:?}",
                variant.dir
            );
            drop(envoy);
            if strip {
                assert!(
                    got[1] <= n / 2,
                    "{}: the forged header chose the host: {got:?}",
                    variant.dir
                );
                assert!(
                    got.iter().all(|g| *g >= n / 6),
                    "{}: the fallback should spread over every host: {got:?}",
                    variant.dir
                );
            } else {
                assert_eq!(
                    got,
                    vec![0, n, 0],
                    "{}: without the removal the forged header is obeyed (the control)",
                    variant.dir
                );
            }
        }
    }
}

// === The whole chain with the real plugin ======================================================

/// The sidecar as the shipped manifests make it, with the real plugin and the WasmPlugin's own
/// configuration: header removal first, the plugin, the router; the steered subset's cluster
/// patched, and another cluster on the same port (a service the client also calls, with
/// backends of its own) left as Istio builds it. The plugin steers the subset's requests: its
/// counter moves, and after a warm-up, of 150 requests whose forged header names the one slow
/// host (100 ms against instant ones) that host serves at most 10 % (least_request alone, one
/// request at a time, would give it a third; obeying the forged header, all). It leaves the other
/// cluster to Envoy: never steered, each of its 200 requests counted as `unlisted_cluster`.
#[test]
fn the_plugin_steers_only_the_patched_cluster() {
    let variant = variants().into_iter().next().unwrap();
    // The host a forged header names answers in 100 ms, the others at once: the plugin's own
    // picks avoid it, so it serves few requests unless the forged header is obeyed.
    let backends: Vec<Backend> = [0, 100, 0]
        .iter()
        .enumerate()
        .map(|(i, ms)| {
            Backend::start_local(BackendSpec::new(format!("b{i}"), Latency::Fixed(*ms)))
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let details = self::backends(3);
    let plugin = sidecar_plugin(&variant);
    let mut plugin_config = plugin.spec()["pluginConfig"].clone();
    // The test client is on loopback, not in a pod network.
    plugin_config["management"]["allowed_cidrs"] = json!(["127.0.0.0/8"]);
    let case = &cases()[0];
    let mut clusters = patched_clusters(&variant, case, &backends);
    let steered = clusters[0]["name"].as_str().unwrap().to_string();
    let mut other = build_cluster(
        case,
        &json!({}),
        None,
        "details.default.svc.cluster.local",
        9080,
        &details,
    );
    other["name"] = json!("outbound|9080||details.default.svc.cluster.local");
    clusters.push(other);
    let chain = plugin_chain(&variant, &plugin, &plugin_config);
    let mut config = bootstrap(&clusters, chain);
    config["stats_config"] =
        harness::EnvoyConfig::shipped().unwrap().value()["stats_config"].clone();
    let envoy = Envoy::start(EnvoyOptions::new(
        serde_json::to_string_pretty(&config).unwrap(),
    ))
    .unwrap_or_else(|e| panic!("envoy: {e:#}"));
    let listen = outbound_port(&envoy);
    let named = backends[1].addr().to_string();
    // Warm-up: the plugin learns the hosts and their latency.
    send(listen, 0, "x-ewma-lb-host", &named, 60);
    send(listen, 1, "x-ewma-lb-host", &named, 50);
    std::thread::sleep(Duration::from_millis(600));
    let before = served(&backends);
    send(listen, 0, "x-ewma-lb-host", &named, 150);
    send(listen, 1, "x-ewma-lb-host", &named, 150);
    let metric = |series: &str| -> f64 {
        let text = envoy.admin_get("/stats/prometheus").unwrap();
        text.lines()
            .find_map(|l| {
                l.strip_prefix(series)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    let seen = harness::within(Duration::from_secs(5), || {
        metric(&format!("ewma_lb_steered_requests_total{{cluster_name=\"{steered}\"}}")) > 0.0
            && metric("ewma_lb_fallback_requests_total{cluster_name=\"outbound|9080||details.default.svc.cluster.local\",reason=\"unlisted_cluster\"}") >= 200.0
    });
    let steered_total = metric(&format!(
        "ewma_lb_steered_requests_total{{cluster_name=\"{steered}\"}}"
    ));
    let unlisted = metric("ewma_lb_fallback_requests_total{cluster_name=\"outbound|9080||details.default.svc.cluster.local\",reason=\"unlisted_cluster\"}");
    let other_steered = metric("ewma_lb_steered_requests_total{cluster_name=\"outbound|9080||details.default.svc.cluster.local\"}");
    assert!(
        seen.is_some(),
        "steered {steered_total} on {steered}, unlisted {unlisted} on details"
    );
    assert_eq!(
        other_steered, 0.0,
        "the plugin must never steer a cluster outside steered_clusters"
    );
    assert_eq!(
        unlisted, 200.0,
        "every request to details is counted as unlisted_cluster"
    );
    let got: Vec<u64> = served(&backends)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();
    eprintln!("subset served of 150 forged to name the slow b1: {got:?}; steered {steered_total}, unlisted {unlisted}");
    assert_eq!(got.iter().sum::<u64>(), 150, "{got:?}");
    assert!(got[1] <= 15, "150 requests to the subset named the slow {named} by a forged header: {got:?}; least_request alone would give it a third, obeying the header all");
    assert_eq!(served(&details).iter().sum::<u64>(), 200);
    drop(envoy);
}

/// What docs/istio.md offers for reading Envoy's `/clusters` in a sidecar: the one line of
/// plugin configuration naming `prometheus_stats`, the static cluster every sidecar's bootstrap
/// holds to its own admin port (istio/istio `tools/packaging/common/envoy_bootstrap.json`,
/// 86c9f01: STATIC, ROUND_ROBIN, 0.25 s connect timeout, 127.0.0.1 and the proxy's admin port).
/// Here the same cluster beside the patched one, in a real Envoy: the plugin's polls go through
/// it and the admin answers them (Envoy's own counters of that cluster), and the steered cluster
/// is still steered.
#[test]
fn the_documented_line_reads_envoys_admin_through_the_sidecars_prometheus_stats_cluster() {
    let docs = read("docs/istio.md");
    let snippet = "    envoy_health:\n      admin_cluster: prometheus_stats\n";
    assert!(
        docs.contains(snippet),
        "docs/istio.md should give the line: {snippet}"
    );
    let variant = variants().into_iter().next().unwrap();
    let backends = backends(3);
    let plugin = sidecar_plugin(&variant);
    let mut plugin_config = plugin.spec()["pluginConfig"].clone();
    plugin_config["envoy_health"]["admin_cluster"] = json!("prometheus_stats");
    let clusters = patched_clusters(&variant, &cases()[0], &backends);
    let steered = clusters[0]["name"].as_str().unwrap().to_string();
    let chain = plugin_chain(&variant, &plugin, &plugin_config);
    // The admin port is picked beforehand (the cluster names it): a start that finds it taken
    // is tried again with another.
    let envoy = Envoy::start_retrying_taken_ports(|| {
        let admin_port = free_port()?;
        let mut with_admin = clusters.clone();
        with_admin.push(json!({
            "name": "prometheus_stats",
            "type": "STATIC",
            "connect_timeout": "0.250s",
            "lb_policy": "ROUND_ROBIN",
            "load_assignment": {
                "cluster_name": "prometheus_stats",
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                    "protocol": "TCP", "address": "127.0.0.1", "port_value": admin_port
                }}}}]}]
            }
        }));
        let mut config = bootstrap(&with_admin, chain.clone());
        config["admin"]["address"]["socket_address"]["port_value"] = json!(admin_port);
        config["stats_config"] = harness::EnvoyConfig::shipped()?.value()["stats_config"].clone();
        Ok(EnvoyOptions::new(serde_json::to_string_pretty(&config)?))
    })
    .unwrap_or_else(|e| panic!("envoy: {e:#}"));
    let listen = outbound_port(&envoy);
    let counter = |name: &str| -> u64 {
        let text = envoy.admin_get("/stats?filter=prometheus_stats").unwrap();
        let prefix = format!("cluster.prometheus_stats.{name}: ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
            .unwrap_or(0)
    };
    // Requests give the VMs a table; a VM with one asks once a second.
    let answered = harness::within(Duration::from_secs(10), || {
        send(listen, 0, "x-client", "1", 20);
        counter("upstream_rq_200") >= 2
    });
    assert!(
        answered.is_some(),
        "the admin answered {} of {} polls through prometheus_stats",
        counter("upstream_rq_200"),
        counter("upstream_rq_total")
    );
    // The backends echo the override header they received: the plugin still steers.
    let url = format!("http://127.0.0.1:{listen}/c0/x");
    let steering = harness::within(Duration::from_secs(5), || {
        harness::http::get(&url, &[])
            .is_ok_and(|r| r.status == 200 && r.header("x-seen-override").is_some())
    });
    assert!(steering.is_some(), "no request to {steered} was steered");
    drop(envoy);
}

/// Istio's tag names and the plugin's: what docs/istio.md tells operators to set.
#[test]
fn docs_say_what_the_mesh_needs() {
    let docs = read("docs/istio.md");
    for needed in [
        "ENABLE_LOCALITY_WEIGHTED_LB_CONFIG",
        "istioctl proxy-config cluster",
        "istioctl proxy-status",
        "extraStatTags",
        "unlisted_cluster",
        "## Roll back",
        "not run here",
    ] {
        assert!(
            docs.contains(needed),
            "docs/istio.md should mention {needed}"
        );
    }
    assert!(
        !docs.contains("proxyStatsMatcher:\n        inclusionPrefixes:\n        - wasmcustom"),
        "Istio always includes wasm stats: no proxyStatsMatcher for them"
    );
    let tags: BTreeMap<&str, ()> = ewma_lb::worker::telemetry::Metric::ALL
        .iter()
        .flat_map(|m| m.labels().iter().map(|l| (*l, ())))
        .collect();
    for tag in tags.keys() {
        assert!(
            docs.contains(&format!("- {tag}\n")),
            "docs/istio.md's extraStatTags must list {tag}"
        );
    }
}

// === The management guard ======================================================================

/// With the plugin absent (failed open: an allow-all RBAC filter in its place), management paths
/// from outside the allowlist are still refused, by the EnvoyFilter's native RBAC filter, in a
/// real Envoy running the chain Istio builds: none reaches a backend, while the health path and
/// others do. The guard's allowlist is set to 10.0.0.0/8 so that the test's 127.0.0.1 is outside
/// it, as a client would be. The control: the same chain without the guard passes them all.
#[test]
fn the_management_guard_holds_when_the_plugin_failed_open() {
    let backends = backends(1);
    for variant in variants() {
        let port = variant.patches("HTTP_FILTER")[0]["match"]["listener"]["portNumber"]
            .as_u64()
            .unwrap();
        let mut chain = failed_open_chain(&variant, u16::try_from(port).unwrap());
        let guard = chain
            .iter()
            .position(|f| f["name"] == "ewma-lb.management-guard")
            .unwrap_or_else(|| panic!("{}: no management guard in the chain", variant.dir));
        assert_eq!(
            chain[guard + 1]["name"],
            "envoy.filters.http.router",
            "{}: the guard runs right before the router, after the plugin",
            variant.dir
        );
        chain[guard]["typed_config"]["rules"]["policies"]["management-outside-allowlist"]
            ["principals"][0]["not_id"]["or_ids"]["ids"] =
            json!([{"remote_ip": {"address_prefix": "10.0.0.0", "prefix_len": 8}}]);
        let cluster = json!({
            "name": "service",
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": {"cluster_name": "service", "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {
                    "address": "127.0.0.1", "port_value": backends[0].addr().port()}}}}
            ]}]}
        });
        for with_guard in [true, false] {
            let chain: Vec<Value> = chain
                .iter()
                .filter(|f| with_guard || f["name"] != "ewma-lb.management-guard")
                .cloned()
                .collect();
            let mut config = bootstrap(&[], chain);
            config["static_resources"]["clusters"] = json!([cluster]);
            config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
                ["typed_config"]["route_config"]["virtual_hosts"][0]["routes"] =
                json!([{"match": {"prefix": "/"}, "route": {"cluster": "service"}}]);
            let envoy = Envoy::start(EnvoyOptions::new(
                serde_json::to_string_pretty(&config).unwrap(),
            ))
            .unwrap_or_else(|e| panic!("envoy: {e:#}"));
            let listen = outbound_port(&envoy);
            let get = |path: &str| {
                harness::http::get(&format!("http://127.0.0.1:{listen}{path}"), &[])
                    .unwrap()
                    .status
            };
            let before = backends[0].served();
            let guarded = [
                "/actuator/env",
                "/ACTUATOR/env",
                "/actuator",
                "/ewma-lb/status",
                "/actuator/env/..%2F..%2Fhealth",
            ];
            let answers: Vec<u16> = guarded.iter().map(|p| get(p)).collect();
            let passed = backends[0].served() - before;
            eprintln!(
                "{}: guard {with_guard}: {answers:?}, {passed} reached the backend",
                variant.dir
            );
            if with_guard {
                assert_eq!(answers, vec![403; guarded.len()], "{}", variant.dir);
                assert_eq!(passed, 0, "{}", variant.dir);
                for open in ["/actuator/health", "/reviews/1"] {
                    assert_eq!(get(open), 200, "{}: {open}", variant.dir);
                }
            } else {
                assert_eq!(
                    passed,
                    guarded.len() as u64,
                    "{}: without the guard they pass (the control)",
                    variant.dir
                );
            }
            drop(envoy);
        }
    }
}
