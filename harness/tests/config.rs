//! The typed edits of the shipped envoy-config/envoy.yaml: each finds what it expects, changes
//! only that, and fails naming the file and the path when the shape is not there. The rendered
//! configs are checked by a real Envoy (`--mode validate`).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use harness::config::{EnvoyLb, LbPolicy, CLUSTER, LISTENER, WASM_FILTER};
use harness::{Envoy, EnvoyConfig};
use serde_json::{json, Value};

fn shipped() -> EnvoyConfig {
    EnvoyConfig::shipped().unwrap()
}

fn addrs(list: &[&str]) -> Vec<SocketAddr> {
    list.iter().map(|a| a.parse().unwrap()).collect()
}

fn error_of<T>(r: anyhow::Result<T>) -> String {
    format!("{:#}", r.err().expect("an error"))
}

#[test]
fn reads_what_the_shipped_config_says() {
    let mut c = shipped();
    assert_eq!(c.listener(LISTENER).unwrap().port().unwrap(), 10000);
    assert_eq!(
        c.get("admin.address.socket_address.port_value").unwrap(),
        &json!(9901)
    );
    assert_eq!(
        c.cluster(CLUSTER).unwrap().endpoints().unwrap(),
        addrs(&["127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083"])
    );
    assert_eq!(
        c.cluster(CLUSTER).unwrap().lb_policy().unwrap(),
        LbPolicy::OverrideHost {
            header: "x-ewma-lb-host".into(),
            fallback: EnvoyLb::LeastRequest
        }
    );
    let plugin: Value = serde_json::from_str(c.plugin().unwrap().plugin_config().unwrap()).unwrap();
    assert_eq!(
        plugin,
        json!({
            "override_header": "x-ewma-lb-host",
            "steered_clusters": ["backend"],
            "envoy_health": {"admin_cluster": "envoy_admin"}
        })
    );
    assert_eq!(
        c.plugin().unwrap().module_file().unwrap(),
        "dist/ewma_lb.wasm"
    );
}

#[test]
fn rendering_changes_nothing_but_the_edits() {
    let c = shipped();
    let again = EnvoyConfig::from_yaml("rendered", &c.to_yaml().unwrap()).unwrap();
    assert_eq!(again.value(), c.value());

    let mut edited = shipped();
    edited.set_admin_port(0).unwrap();
    edited.listener(LISTENER).unwrap().set_port(1234).unwrap();
    edited
        .cluster(CLUSTER)
        .unwrap()
        .set_endpoints(&addrs(&["127.0.0.1:1", "[::1]:2"]))
        .unwrap();
    edited
        .plugin()
        .unwrap()
        .set_plugin_config(r#"{"shadow": true}"#)
        .unwrap();
    edited
        .plugin()
        .unwrap()
        .set_module_file(Path::new("/abs/ewma_lb.wasm"))
        .unwrap();
    let mut route = edited
        .listener(LISTENER)
        .unwrap()
        .http()
        .unwrap()
        .route_to(CLUSTER)
        .unwrap();
    route.set_timeout(Duration::from_millis(1640)).unwrap();
    route
        .add_response_header("x-upstream-host", "%UPSTREAM_HOST%")
        .unwrap();
    edited
        .listener(LISTENER)
        .unwrap()
        .http()
        .unwrap()
        .set_xff_num_trusted_hops(1)
        .unwrap();

    // The same edits by hand on the parsed file: nothing else may differ.
    let mut want = c.value().clone();
    want["admin"]["address"]["socket_address"]["port_value"] = json!(0);
    let listener = &mut want["static_resources"]["listeners"][0];
    listener["address"]["socket_address"]["port_value"] = json!(1234);
    let hcm = &mut listener["filter_chains"][0]["filters"][0]["typed_config"];
    hcm["xff_num_trusted_hops"] = json!(1);
    let route = &mut hcm["route_config"]["virtual_hosts"][0]["routes"][0];
    route["route"]["timeout"] = json!("1.64s");
    route["response_headers_to_add"] =
        json!([{"header": {"key": "x-upstream-host", "value": "%UPSTREAM_HOST%"}}]);
    let filters = hcm["http_filters"].as_array_mut().unwrap();
    let wasm = filters
        .iter_mut()
        .find(|f| f["name"] == WASM_FILTER)
        .unwrap();
    let wasm = &mut wasm["typed_config"]["config"];
    wasm["configuration"]["value"] = json!(r#"{"shadow": true}"#);
    wasm["vm_config"]["code"]["local"]["filename"] = json!("/abs/ewma_lb.wasm");
    let endpoint = |ip: &str, port: u16| json!({"endpoint": {"address": {"socket_address": {"address": ip, "port_value": port}}}});
    want["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"] =
        json!([endpoint("127.0.0.1", 1), endpoint("::1", 2)]);
    assert_eq!(edited.value(), &want);
    assert_eq!(
        edited.cluster(CLUSTER).unwrap().endpoints().unwrap(),
        addrs(&["127.0.0.1:1", "[::1]:2"])
    );
}

#[test]
fn the_policy_swap_leaves_envoy_alone_to_choose() {
    let mut c = shipped();
    c.use_envoy_lb(CLUSTER, EnvoyLb::Random).unwrap();
    assert_eq!(
        c.cluster(CLUSTER).unwrap().lb_policy().unwrap(),
        LbPolicy::Envoy(EnvoyLb::Random)
    );
    assert!(c
        .get("static_resources.clusters[name=backend].load_balancing_policy")
        .is_err());
    let filters = c
        .listener(LISTENER)
        .unwrap()
        .http()
        .unwrap()
        .get("http_filters")
        .unwrap()
        .clone();
    let names: Vec<&str> = filters
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    // The plugin is gone; the native filters around it stay: the one that strips a client's
    // override header (the cluster no longer reads that header) and the RBAC guard of the
    // management paths. Envoy's own policies run with what ships, as the plugin does.
    assert_eq!(
        names,
        [
            "envoy.filters.http.header_mutation",
            "envoy.filters.http.rbac",
            "envoy.filters.http.router"
        ],
        "{filters}"
    );
    // What ships around it stays.
    assert_eq!(
        c.get("static_resources.clusters[name=backend].track_cluster_stats.per_endpoint_stats")
            .unwrap(),
        &json!(true)
    );
    assert!(c.get("stats_config.stats_tags").is_ok());
}

#[test]
fn errors_name_the_file_and_the_path() {
    let mut c = shipped();
    let cases = [
        (error_of(c.cluster("nope").map(drop)), r#"envoy-config/envoy.yaml: static_resources.clusters[name=nope]: no item with name = "nope" (have: backend, envoy_admin)"#),
        (error_of(c.set("admin.address.socket_address.port", 1).map(drop)), "envoy-config/envoy.yaml: admin.address.socket_address.port: no field `port` (fields: address, port_value)"),
        (error_of(c.root().insert("admin.address", json!({})).map(drop)), "envoy-config/envoy.yaml: admin.address: field `address` exists already (set it instead)"),
        (error_of(c.get("static_resources.listeners.name")), "envoy-config/envoy.yaml: static_resources.listeners.name: expected an object, found a list"),
    ];
    for (got, want) in cases {
        assert_eq!(got, want);
    }
    c.use_envoy_lb(CLUSTER, EnvoyLb::RoundRobin).unwrap();
    let err = error_of(c.plugin().map(drop));
    assert!(
        err.contains(&format!(
            "http_filters[name={WASM_FILTER}]: no item with name"
        )),
        "{err}"
    );
    let err = error_of(
        c.cluster(CLUSTER)
            .unwrap()
            .set_override_header("x")
            .map(drop),
    );
    assert!(err.contains("load_balancing_policy"), "{err}");
}

#[test]
fn a_plugin_configuration_that_is_not_json_text_is_refused() {
    let mut c = shipped();
    c.plugin()
        .unwrap()
        .set(
            "typed_config.config.configuration",
            json!({"@type": "type.googleapis.com/google.protobuf.Struct", "value": {}}),
        )
        .unwrap();
    let err = error_of(c.plugin().unwrap().set_plugin_config("{}").map(drop));
    assert!(err.contains("typed_config.config.configuration.@type: expected type.googleapis.com/google.protobuf.StringValue"), "{err}");
}

#[test]
fn endpoints_in_several_locality_groups_are_not_flattened() {
    let mut c = shipped();
    let group = c
        .get("static_resources.clusters[name=backend].load_assignment.endpoints[0]")
        .unwrap()
        .clone();
    c.cluster(CLUSTER)
        .unwrap()
        .node("load_assignment.endpoints")
        .unwrap()
        .push(group)
        .unwrap();
    assert_eq!(c.cluster(CLUSTER).unwrap().endpoints().unwrap().len(), 6);
    let err = error_of(
        c.cluster(CLUSTER)
            .unwrap()
            .set_endpoints(&addrs(&["127.0.0.1:1"]))
            .map(drop),
    );
    assert!(err.contains("2 locality groups"), "{err}");
}

#[test]
fn endpoints_from_a_file_keep_the_rest_of_the_cluster() {
    let eds = harness::EdsFile::create(
        CLUSTER,
        vec![harness::Endpoint::new(
            "127.0.0.1:1".parse().unwrap(),
            Some("z"),
        )],
    )
    .unwrap();
    let mut c = shipped();
    let before = c
        .get("static_resources.clusters[name=backend]")
        .unwrap()
        .clone();
    c.use_eds_file(CLUSTER, &eds).unwrap();
    assert_eq!(
        c.get("node").unwrap(),
        &json!({"id": "ewma-lb", "cluster": "ewma-lb"}),
        "file-based EDS needs a node id"
    );
    c.set_node_zone("zone-a").unwrap();
    let mut want = before;
    want["type"] = json!("EDS");
    want.as_object_mut().unwrap().remove("load_assignment");
    want["eds_cluster_config"] = json!({"eds_config": {"path_config_source": {
        "path": eds.path().to_string_lossy(), "watched_directory": {"path": eds.watched_dir().to_string_lossy()}}}});
    assert_eq!(
        c.get("static_resources.clusters[name=backend]").unwrap(),
        &want,
        "only the endpoints' source changed"
    );
    assert_eq!(c.get("node.locality").unwrap(), &json!({"zone": "zone-a"}));
    let other = harness::EdsFile::create("other", Vec::new()).unwrap();
    let err = error_of(
        shipped()
            .cluster(CLUSTER)
            .unwrap()
            .use_eds_file(&other)
            .map(drop),
    );
    assert!(
        err.contains(
            "static_resources.clusters[name=backend].name: the EDS file is for cluster \"other\""
        ),
        "{err}"
    );
}

#[test]
fn relative_module_paths_resolve_against_a_base() {
    let mut c = shipped();
    assert_eq!(c.resolve_module_paths(Path::new("/repo")), 1);
    assert_eq!(
        c.plugin().unwrap().module_file().unwrap(),
        "/repo/dist/ewma_lb.wasm"
    );
    assert_eq!(
        c.resolve_module_paths(Path::new("/elsewhere")),
        0,
        "absolute paths stay"
    );
}

#[test]
fn envoy_accepts_the_edited_configs() {
    let mut plugin = EnvoyConfig::local(0, &harness::plugin_wasm().unwrap()).unwrap();
    plugin
        .listener(LISTENER)
        .unwrap()
        .http()
        .unwrap()
        .route_to(CLUSTER)
        .unwrap()
        .add_response_header("x-upstream-host", "%UPSTREAM_HOST%")
        .unwrap();
    plugin
        .listener(LISTENER)
        .unwrap()
        .http()
        .unwrap()
        .set_xff_num_trusted_hops(2)
        .unwrap();
    Envoy::validate(&plugin.to_yaml().unwrap()).unwrap();
    for lb in [EnvoyLb::RoundRobin, EnvoyLb::Random, EnvoyLb::LeastRequest] {
        let mut swapped = shipped();
        swapped.use_envoy_lb(CLUSTER, lb).unwrap();
        Envoy::validate(&swapped.to_yaml().unwrap()).unwrap_or_else(|e| panic!("{lb:?}: {e:#}"));
    }
}

#[test]
fn http2_upstream_sets_the_protocol_options_and_envoy_accepts_them() {
    let mut c = shipped();
    c.cluster(CLUSTER).unwrap().use_http2().unwrap();
    let options = c
        .get("static_resources.clusters[name=backend].typed_extension_protocol_options")
        .unwrap()
        .clone();
    let key = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
    assert_eq!(options[key]["@type"], format!("type.googleapis.com/{key}"));
    assert_eq!(
        options[key]["explicit_http_config"],
        json!({"http2_protocol_options": {}})
    );
    // Nothing else moved: the balancing policy is still the plugin's.
    assert!(matches!(
        c.cluster(CLUSTER).unwrap().lb_policy().unwrap(),
        LbPolicy::OverrideHost { .. }
    ));
    let mut runnable = EnvoyConfig::local(0, &harness::plugin_wasm().unwrap()).unwrap();
    runnable.cluster(CLUSTER).unwrap().use_http2().unwrap();
    Envoy::validate(&runnable.to_yaml().unwrap()).unwrap();
}
