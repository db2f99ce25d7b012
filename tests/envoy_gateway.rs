//! Envoy Gateway: the shipped policies (envoy-config/envoy-gateway/) as the Envoy configuration
//! Envoy Gateway translates them into, run by a real Envoy with the real plugin.
//!
//! No Envoy Gateway controller runs here, so the translation is written out from its sources
//! (envoyproxy/gateway HEAD d32f282, 2026-08-21; the same since v1.5.0 unless said):
//! - ClientTrafficPolicy `headers.earlyRequestHeaders.remove` becomes the connection manager's
//!   `early_header_mutation_extensions` (internal/xds/translator/listener.go,
//!   `buildEarlyHeaderMutation`): it runs before routing and before every HTTP filter;
//! - EnvoyExtensionPolicy `wasm[i]` becomes an HTTP filter named
//!   `envoy.filters.http.wasm/envoyextensionpolicy/NS/NAME/wasm/i`, placed at order 200+i (after
//!   header_mutation at 5, before the router at 310: internal/xds/translator/httpfilters.go),
//!   `disabled: true` in the chain and enabled on the targeted route through
//!   `typed_per_filter_config` (wasm.go, `patchRoute`); `config` arrives as a StringValue of its
//!   JSON, `failOpen` as `fail_open`, `rootID` as `root_id`; Envoy Gateway serves the module to
//!   Envoy over HTTP, which a local file stands in for here;
//! - BackendTrafficPolicy `loadBalancer.endpointOverride` becomes the cluster's
//!   `load_balancing_policy` override_host with a header source, the policy's `type` as the
//!   fallback (LeastRequest: `least_request{}`), and the locality fields cleared
//!   (internal/xds/translator/cluster.go, `buildXdsCluster`,
//!   `buildEndpointOverrideLoadBalancingPolicy`); clusters are named
//!   `httproute/NS/NAME/rule/INDEX` and each backendRef is one locality whose region is its
//!   name (`buildWeightedLocalities`).

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking
#![cfg(not(target_arch = "wasm32"))] // real processes: native only

mod shipped;

use ewma_lb::config::Config;
use harness::{Backend, BackendSpec, Envoy, EnvoyOptions, Latency};
use serde_json::{json, Value};
use shipped::{manifests, of_kind, Manifest};

const DIR: &str = "envoy-config/envoy-gateway";

fn policy(kind: &str) -> Manifest {
    let all = manifests(DIR);
    let found = of_kind(&all, kind);
    assert_eq!(found.len(), 1, "{DIR}: one {kind}");
    found[0].clone()
}

/// The HTTPRoute the policies attach to: `(namespace, name)`; every policy targets it (or, for
/// the ClientTrafficPolicy, a Gateway).
fn route() -> (String, String) {
    let eep = policy("EnvoyExtensionPolicy");
    let target = &eep.spec()["targetRefs"][0];
    assert_eq!(target["kind"], "HTTPRoute");
    (
        eep.doc["metadata"]["namespace"]
            .as_str()
            .unwrap()
            .to_string(),
        target["name"].as_str().unwrap().to_string(),
    )
}

/// The plugin's configuration and the wasm filter EnvoyExtensionPolicy's first module becomes.
fn wasm_filter() -> (String, Value) {
    let eep = policy("EnvoyExtensionPolicy");
    let (ns, name) = (
        eep.doc["metadata"]["namespace"].as_str().unwrap(),
        eep.doc["metadata"]["name"].as_str().unwrap(),
    );
    let wasm = &eep.spec()["wasm"][0];
    let filter_name = format!("envoy.filters.http.wasm/envoyextensionpolicy/{ns}/{name}/wasm/0");
    let filter = json!({
        "name": filter_name,
        "disabled": true,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": filter_name,
                "root_id": wasm["rootID"],
                "fail_open": wasm["failOpen"],
                "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": wasm["config"].to_string()},
                "vm_config": {
                    "vm_id": filter_name,
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": {"local": {"filename": harness::plugin_wasm().unwrap_or_else(|e| panic!("{e}"))}},
                },
            }
        }
    });
    (filter_name, filter)
}

/// What the ClientTrafficPolicy's `earlyRequestHeaders.remove` becomes.
fn early_header_mutation() -> Value {
    let ctp = policy("ClientTrafficPolicy");
    let removals: Vec<Value> = ctp.spec()["headers"]["earlyRequestHeaders"]["remove"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| json!({"remove": h}))
        .collect();
    json!([{
        "name": "envoy.http.early_header_mutation.header_mutation",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation", "mutations": removals},
    }])
}

/// The route's cluster with what the BackendTrafficPolicy's `loadBalancer` becomes.
fn cluster(name: &str, backends: &[Backend]) -> Value {
    let lb = policy("BackendTrafficPolicy").spec()["loadBalancer"].clone();
    let fallback = match lb["type"].as_str() {
        Some("LeastRequest") | None => ("envoy.load_balancing_policies.least_request", "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest"),
        Some("RoundRobin") => ("envoy.load_balancing_policies.round_robin", "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"),
        Some("Random") => ("envoy.load_balancing_policies.random", "type.googleapis.com/envoy.extensions.load_balancing_policies.random.v3.Random"),
        other => panic!("fallback {other:?} is not translated here"),
    };
    let sources: Vec<Value> = lb["endpointOverride"]["extractFrom"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| json!({"header": s["header"]}))
        .collect();
    json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "10s",
        "common_lb_config": {},
        "load_balancing_policy": {"policies": [{"typed_extension_config": {
            "name": "envoy.load_balancing_policies.override_host",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
                "override_host_sources": sources,
                "fallback_policy": {"policies": [{"typed_extension_config": {"name": fallback.0, "typed_config": {"@type": fallback.1}}}]},
            }
        }}]},
        "load_assignment": {"cluster_name": name, "endpoints": [{
            "locality": {"region": format!("{name}/backend/0")},
            "load_balancing_weight": 1,
            "lb_endpoints": backends.iter().map(|b| json!({"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": b.addr().port()}}}})).collect::<Vec<_>>(),
        }]},
    })
}

/// The Gateway's listener and the route's cluster, with or without the ClientTrafficPolicy and
/// the plugin (without it: the route as Envoy Gateway leaves it when the module failed open).
fn gateway(backends: &[Backend], with_client_policy: bool, with_plugin: bool) -> String {
    let (ns, name) = route();
    let cluster_name = format!("httproute/{ns}/{name}/rule/0");
    let mut filters = Vec::new();
    let mut route = json!({"match": {"prefix": "/"}, "route": {"cluster": cluster_name}});
    if with_plugin {
        let (filter_name, filter) = wasm_filter();
        filters.push(filter);
        route["typed_per_filter_config"] = json!({filter_name: {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}}});
    }
    filters.push(json!({"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}));
    let mut hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "http-10080",
        "route_config": {"name": "default/eg/http", "virtual_hosts": [{"name": "default/eg/http/*", "domains": ["*"], "routes": [route]}]},
        "http_filters": filters,
    });
    if with_client_policy {
        hcm["early_header_mutation_extensions"] = early_header_mutation();
    }
    let config = json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "stats_config": harness::EnvoyConfig::shipped().unwrap().value()["stats_config"].clone(),
        "static_resources": {
            "listeners": [{
                "name": "default/eg/http",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}],
            }],
            "clusters": [cluster(&cluster_name, backends)],
        }
    });
    serde_json::to_string_pretty(&config).unwrap()
}

/// The port Envoy bound for the Gateway's listener (port 0 in the config: no port picked
/// beforehand that another process could take first).
fn listen_port(envoy: &Envoy) -> u16 {
    envoy
        .listener_addr("default/eg/http")
        .unwrap_or_else(|e| panic!("{e:#}"))
        .port()
}

fn served(backends: &[Backend]) -> Vec<u64> {
    backends.iter().map(Backend::served).collect()
}

/// `n` sequential requests, each naming `forged` in the header; what each backend served.
fn forged_requests(
    listen: u16,
    backends: &[Backend],
    header: &str,
    forged: &str,
    n: u64,
) -> Vec<u64> {
    let before = served(backends);
    let url = format!("http://127.0.0.1:{listen}/work");
    for _ in 0..n {
        let r =
            harness::http::get(&url, &[(header, forged)]).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(r.status, 200, "{r:?}");
    }
    served(backends)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect()
}

#[test]
fn the_policies_agree_with_each_other() {
    let (ns, name) = route();
    let config = {
        let eep = policy("EnvoyExtensionPolicy");
        Config::from_json(eep.spec()["wasm"][0]["config"].to_string().as_bytes())
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let btp = policy("BackendTrafficPolicy");
    assert_eq!(
        btp.spec()["targetRefs"],
        policy("EnvoyExtensionPolicy").spec()["targetRefs"],
        "the plugin runs on the route whose clusters obey it"
    );
    assert_eq!(
        btp.spec()["loadBalancer"]["endpointOverride"]["extractFrom"],
        json!([{"header": config.override_header()}])
    );
    let removed =
        policy("ClientTrafficPolicy").spec()["headers"]["earlyRequestHeaders"]["remove"].clone();
    assert_eq!(
        removed,
        json!([config.override_header()]),
        "the client's copy of the plugin's header is removed"
    );
    // The plugin steers every rule of the route, and nothing else.
    for (cluster, want) in [
        (format!("httproute/{ns}/{name}/rule/0"), true),
        (format!("httproute/{ns}/{name}/rule/3"), true),
        (format!("httproute/{ns}/{name}x/rule/0"), false),
        (format!("httproute/{ns}/other/rule/0"), false),
        (format!("grpcroute/{ns}/{name}/rule/0"), false),
    ] {
        assert_eq!(
            config.steers(&cluster),
            want,
            "steered_clusters on {cluster}"
        );
    }
    assert_eq!(
        policy("EnvoyExtensionPolicy").spec()["wasm"][0]["failOpen"],
        true,
        "a balancing hint must not take the route down"
    );
}

/// The header the plugin sets is obeyed and a forged one is not. Backends `a` and `b` answer at
/// once, `c` after 100 ms. After a warm-up, 150 sequential requests each forge a header naming
/// `c`: `c` serves at most 10 % of them. Least request alone (requests one at a time, every host
/// idle) gives `c` a third (50 ± 6); obeying the forged header would give it all. Only the
/// plugin's own header, obeyed by the cluster, keeps it that low.
#[test]
fn through_envoy_gateways_translation_the_plugin_steers_and_a_forged_header_does_not() {
    let backends: Vec<Backend> = [("a", 0), ("b", 0), ("c", 100)]
        .iter()
        .map(|(n, ms)| {
            Backend::start_local(BackendSpec::new(*n, Latency::Fixed(*ms)))
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let envoy = Envoy::start(EnvoyOptions::new(gateway(&backends, true, true)))
        .unwrap_or_else(|e| panic!("envoy: {e:#}"));
    let listen = listen_port(&envoy);
    let header = "x-ewma-lb-host";
    let slow = backends[2].addr().to_string();
    forged_requests(listen, &backends, header, &slow, 60);
    std::thread::sleep(std::time::Duration::from_millis(600));
    let got = forged_requests(listen, &backends, header, &slow, 150);
    eprintln!("served of 150 forged to name the slow host (a, b, c): {got:?}");
    let (ns, name) = route();
    let steered = envoy.admin_get("/stats/prometheus").unwrap();
    assert!(
        got[2] <= 15,
        "the slow host served {got:?} of 150 requests forged to name it"
    );
    assert!(
        steered.lines().any(|l| l.starts_with(&format!(
            "ewma_lb_steered_requests_total{{cluster_name=\"httproute/{ns}/{name}/rule/0\"}}"
        ))),
        "the plugin steered nothing on the route's cluster:\n{}",
        steered
            .lines()
            .filter(|l| l.starts_with("ewma_lb"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// While the plugin is not running (its module failed open, so Envoy Gateway leaves the route
/// without it), the ClientTrafficPolicy's early removal still keeps a forged header from choosing
/// the host: 300 requests naming one of three idle hosts give it at most half (a fair share is a
/// third; 6 standard deviations), while without that policy the same cluster obeys all 300 (the
/// control).
#[test]
fn without_the_plugin_the_early_removal_still_keeps_clients_from_choosing_the_host() {
    let backends: Vec<Backend> = ["a", "b", "c"]
        .iter()
        .map(|n| Backend::start_local(BackendSpec::new(*n, Latency::Fixed(0))).unwrap())
        .collect();
    let named = backends[1].addr().to_string();
    for with_client_policy in [true, false] {
        let envoy = Envoy::start(EnvoyOptions::new(gateway(
            &backends,
            with_client_policy,
            false,
        )))
        .unwrap_or_else(|e| panic!("envoy: {e:#}"));
        let listen = listen_port(&envoy);
        let got = forged_requests(listen, &backends, "x-ewma-lb-host", &named, 300);
        eprintln!("early removal {with_client_policy}: served of 300 forged to name b: {got:?}");
        drop(envoy);
        if with_client_policy {
            assert!(
                got[1] <= 150 && got.iter().all(|g| *g >= 50),
                "the forged header chose the host: {got:?}"
            );
        } else {
            assert_eq!(
                got,
                vec![0, 300, 0],
                "without the early removal the header is obeyed (the control)"
            );
        }
    }
}

/// The translated configuration is one Envoy accepts, with the plugin and without.
#[test]
fn the_translation_validates() {
    let backends: Vec<Backend> = ["a"]
        .iter()
        .map(|n| Backend::start_local(BackendSpec::new(*n, Latency::Fixed(0))).unwrap())
        .collect();
    for with_plugin in [true, false] {
        Envoy::validate(&gateway(&backends, true, with_plugin)).unwrap_or_else(|e| panic!("{e:#}"));
    }
}

// === check-header-removal.sh =================================================================

/// A ClientTrafficPolicy as the API server returns it: `removes` in its early header removal,
/// targeting Gateway `eg` (or one of its listeners), with the Accepted condition Envoy Gateway
/// wrote (`None`: no status yet). The status has the shape Envoy Gateway gives it
/// (internal/gatewayapi/status/policy.go: one ancestor per targeted Gateway or section).
fn client_policy(
    name: &str,
    section: Option<&str>,
    removes: &[&str],
    accepted: Option<(bool, &str)>,
) -> Value {
    let mut target = json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "eg"});
    let mut ancestor = json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "eg", "namespace": "default"});
    if let Some(s) = section {
        target["sectionName"] = s.into();
        ancestor["sectionName"] = s.into();
    }
    let mut policy = json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "ClientTrafficPolicy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"targetRefs": [target], "headers": {"earlyRequestHeaders": {"remove": removes}}},
    });
    if let Some((ok, reason)) = accepted {
        policy["status"] = json!({"ancestors": [{
            "ancestorRef": ancestor,
            "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
            "conditions": [{"type": "Accepted", "status": if ok { "True" } else { "False" },
                            "reason": reason, "message": format!("{reason} (test)")}],
        }]});
    }
    policy
}

/// Runs the shipped script against a stand-in kubectl that answers with `policies` and a
/// Gateway `eg` with listeners `http` and `https`: its exit code and report.
fn check_header_removal(policies: Vec<Value>) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let gateway = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "eg", "namespace": "default"},
        "spec": {"gatewayClassName": "eg", "listeners": [
            {"name": "http", "protocol": "HTTP", "port": 80},
            {"name": "https", "protocol": "HTTPS", "port": 443}]},
    });
    std::fs::write(dir.path().join("gateway.json"), gateway.to_string()).unwrap();
    std::fs::write(
        dir.path().join("policies.json"),
        json!({"apiVersion": "v1", "kind": "List", "items": policies}).to_string(),
    )
    .unwrap();
    // Answers exactly the two reads the script makes, and fails on anything else.
    let kubectl = dir.path().join("kubectl");
    std::fs::write(
        &kubectl,
        format!(
            "#!/bin/sh\ncase \"$*\" in\n  'get gateways.gateway.networking.k8s.io eg -n default -o json') cat {0}/gateway.json ;;\n  'get clienttrafficpolicies.gateway.envoyproxy.io -n default -o json') cat {0}/policies.json ;;\n  *) echo \"unexpected: kubectl $*\" >&2; exit 1 ;;\nesac\n",
            dir.path().display()
        ),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&kubectl)
        .status()
        .unwrap();
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new("bash")
        .arg(harness::repo_root().join(format!("{DIR}/check-header-removal.sh")))
        .env("PATH", path)
        .output()
        .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), report)
}

/// The check a user runs on a real cluster: it reads what Envoy Gateway accepted and fails when
/// the header removal was dropped (a Conflicted policy, a listener's own policy without it, no
/// status), and passes when it is in force, ours or merged into an existing policy.
#[test]
fn the_header_removal_check_says_when_the_gateway_does_not_remove_the_header() {
    let shipped = policy("ClientTrafficPolicy");
    let header = shipped.spec()["headers"]["earlyRequestHeaders"]["remove"][0]
        .as_str()
        .unwrap()
        .to_string();
    let ours = |accepted| {
        let mut p = client_policy("ewma-lb", None, &[&header], accepted);
        p["spec"] = shipped.spec().clone();
        p
    };
    let upper = header.to_uppercase();
    let cases: Vec<(&str, Vec<Value>, i32, Vec<&str>)> = vec![
        (
            "ours, accepted",
            vec![ours(Some((true, "Accepted")))],
            0,
            vec!["ok      listener http", "ok      listener https"],
        ),
        (
            "ours conflicted by an older policy without the removal",
            vec![
                client_policy("corp", None, &["x-debug"], Some((true, "Accepted"))),
                ours(Some((false, "Conflicted"))),
            ],
            1,
            vec![
                "MISSING listener http: ClientTrafficPolicy corp is in force and does not remove",
                "note    ClientTrafficPolicy ewma-lb is not applied: Conflicted",
            ],
        ),
        (
            "merged into the existing policy, in any case",
            vec![client_policy(
                "corp",
                None,
                &["x-debug", &upper],
                Some((true, "Accepted")),
            )],
            0,
            vec!["ok      listener https: ClientTrafficPolicy corp removes"],
        ),
        (
            "a listener's own policy overrides ours there",
            vec![
                ours(Some((true, "Accepted"))),
                client_policy("tls", Some("https"), &[], Some((true, "Accepted"))),
            ],
            1,
            vec![
                "ok      listener http: ClientTrafficPolicy ewma-lb removes",
                "MISSING listener https: ClientTrafficPolicy tls is in force",
            ],
        ),
        (
            "not reconciled yet",
            vec![ours(None)],
            1,
            vec![
                "no status from Envoy Gateway yet",
                "MISSING listener http: no accepted",
            ],
        ),
        ("no policy", vec![], 1, vec!["MISSING listener https"]),
        (
            "a policy selecting Gateways by labels",
            vec![{
                let mut p = ours(Some((true, "Accepted")));
                p["spec"]["targetSelectors"] =
                    json!([{"kind": "Gateway", "matchLabels": {"team": "a"}}]);
                p
            }],
            2,
            vec!["UNKNOWN ClientTrafficPolicy ewma-lb selects Gateways by labels"],
        ),
    ];
    for (what, policies, code, lines) in cases {
        let (got, report) = check_header_removal(policies);
        assert_eq!(got, code, "{what}: exit code\n{report}");
        for line in lines {
            assert!(report.contains(line), "{what}: no {line:?} in\n{report}");
        }
    }
}
