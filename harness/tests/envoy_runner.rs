//! A real Envoy starts from the shipped config, proxies to a backend, reports stats, and dies on
//! drop; endpoints read from a watched file change under it. Without an Envoy binary these tests
//! fail: they never skip.

use std::time::Duration;

use harness::config::{EnvoyLb, CLUSTER, LISTENER};
use harness::http::get;
use harness::{free_port, poll, Backend, BackendSpec, Envoy, EnvoyConfig, EnvoyOptions, Latency};

/// The shipped config in front of one backend, balanced by Envoy alone (no plugin needed), on
/// a port Envoy chooses ([`listen`] reads it back).
fn config(backend: &Backend) -> EnvoyConfig {
    let mut config = EnvoyConfig::shipped().unwrap();
    config.set_admin_port(0).unwrap();
    config.listener(LISTENER).unwrap().set_port(0).unwrap();
    config
        .cluster(CLUSTER)
        .unwrap()
        .set_endpoints(&[backend.addr()])
        .unwrap();
    config.use_envoy_lb(CLUSTER, EnvoyLb::RoundRobin).unwrap();
    config
}

fn listen(envoy: &Envoy) -> u16 {
    envoy.listener_addr(LISTENER).unwrap().port()
}

fn process_alive(pid: u32) -> bool {
    // A reaped process has no /proc entry; a zombie would still have one, so this also checks the wait.
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

fn every_100ms(limit_s: u64, check: impl FnMut() -> bool) -> bool {
    poll(
        Duration::from_secs(limit_s),
        Duration::from_millis(100),
        check,
    )
    .is_some()
}

#[test]
fn proxies_a_request_reports_stats_and_is_killed_on_drop() {
    let b = Backend::start_local(BackendSpec::new("only", Latency::Fixed(0))).unwrap();
    let yaml = config(&b).to_yaml().unwrap();
    Envoy::validate(&yaml).unwrap();
    let envoy = Envoy::start(EnvoyOptions::new(yaml)).unwrap();
    let listen = listen(&envoy);
    assert_ne!(listen, 0);
    let pid = envoy.pid();
    assert!(process_alive(pid));

    let r = get(&format!("http://127.0.0.1:{listen}/hello"), &[]).unwrap();
    assert_eq!(r.status, 200, "{}", envoy.log());
    assert_eq!(r.header("x-backend"), Some("only"));
    assert_eq!(b.served_path("/hello"), 1);
    assert!(every_100ms(5, || envoy
        .stat("cluster.backend.upstream_rq_200")
        == Some(1)));
    assert!(envoy
        .admin_get("/clusters")
        .unwrap()
        .contains("backend::127.0.0.1"));
    assert!(envoy.stat("no.such.stat").is_none());
    assert!(!envoy.log().is_empty());

    drop(envoy);
    assert!(!process_alive(pid), "envoy {pid} still alive after drop");
    assert!(get(&format!("http://127.0.0.1:{listen}/"), &[]).is_err());
}

#[test]
fn a_stopped_backend_gives_503_through_envoy() {
    let b = Backend::start_local(BackendSpec::new("gone", Latency::Fixed(0))).unwrap();
    let envoy = Envoy::start(EnvoyOptions {
        concurrency: 1,
        ..EnvoyOptions::new(config(&b).to_yaml().unwrap())
    })
    .unwrap();
    let url = format!("http://127.0.0.1:{}/", listen(&envoy));
    assert_eq!(get(&url, &[]).unwrap().status, 200);
    b.stop();
    let r = get(&url, &[]).unwrap();
    assert_eq!(r.status, 503, "{r:?}");
    b.restart().unwrap();
    assert!(every_100ms(5, || get(&url, &[])
        .map(|r| r.status == 200)
        .unwrap_or(false)));
    drop(envoy);
}

#[test]
fn bad_configs_are_refused_with_envoys_reason() {
    let bad = "static_resources: { clusters: [ { name: x, type: NOPE } ] }";
    let err = Envoy::validate(bad).unwrap_err();
    assert!(format!("{err:#}").contains("NOPE"), "{err:#}");

    let (code, log) = Envoy::start_expect_failure(EnvoyOptions::new(bad)).unwrap();
    assert_ne!(code, 0);
    assert!(log.contains("NOPE"), "{log}");

    let err = Envoy::start(EnvoyOptions::new(bad)).err().unwrap();
    assert!(format!("{err:#}").contains("exited early"), "{err:#}");

    let b = Backend::start_local(BackendSpec::new("x", Latency::Fixed(0))).unwrap();
    let mut open = config(&b);
    open.listener(LISTENER)
        .unwrap()
        .set("address.socket_address.address", "0.0.0.0")
        .unwrap();
    let err = Envoy::start(EnvoyOptions::new(open.to_yaml().unwrap()))
        .err()
        .unwrap();
    assert!(format!("{err:#}").contains("all interfaces"), "{err:#}");
}

/// A port taken between its pick and Envoy's bind costs a second start, with fresh options; a
/// config Envoy refuses for any other reason is not tried again.
#[test]
fn a_start_that_finds_its_port_taken_is_tried_again_and_no_other_is() {
    let b = Backend::start_local(BackendSpec::new("x", Latency::Fixed(0))).unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut attempts = 0;
    let envoy = Envoy::start_retrying_taken_ports(|| {
        attempts += 1;
        let port = if attempts == 1 {
            taken.local_addr()?.port()
        } else {
            free_port()?
        };
        let mut c = config(&b);
        c.set_admin_port(port)?;
        Ok(EnvoyOptions::new(c.to_yaml()?))
    })
    .unwrap();
    assert_eq!(attempts, 2, "the taken port's start is tried once more");
    assert_eq!(
        get(&format!("http://127.0.0.1:{}/", listen(&envoy)), &[])
            .unwrap()
            .status,
        200
    );
    drop(envoy);

    let mut attempts = 0;
    let err = Envoy::start_retrying_taken_ports(|| {
        attempts += 1;
        Ok(EnvoyOptions::new(
            "static_resources: { clusters: [ { name: x, type: NOPE } ] }",
        ))
    })
    .err()
    .unwrap();
    assert_eq!(attempts, 1, "{err:#}");
    let text = format!("{err:#}");
    assert!(
        text.lines().next().unwrap().contains("exited early"),
        "the cause comes before the log: {err:#}"
    );
}

#[test]
fn endpoints_from_a_watched_file_change_while_envoy_runs_and_carry_their_zones() {
    use harness::{BackendPool, EdsFile, Endpoint};
    let pool = BackendPool::new().unwrap();
    let backends = pool
        .start_all(["a", "b", "c"].map(|n| BackendSpec::new(n, Latency::Fixed(0))))
        .unwrap();
    let mut config = config(&backends[0]);
    let mut eds = EdsFile::create(
        CLUSTER,
        vec![Endpoint::new(backends[0].addr(), Some("zone-a"))],
    )
    .unwrap();
    config.use_eds_file(CLUSTER, &eds).unwrap();
    config.set_node_zone("zone-a").unwrap();
    let yaml = config.to_yaml().unwrap();
    Envoy::validate(&yaml).unwrap();
    let envoy = Envoy::start(EnvoyOptions {
        concurrency: 1,
        ..EnvoyOptions::new(yaml)
    })
    .unwrap();
    let listen = listen(&envoy);
    let hosts = |want: &[&Backend]| {
        let mut want: Vec<_> = want.iter().map(|b| b.addr()).collect();
        want.sort();
        every_100ms(5, || envoy.cluster_hosts(CLUSTER).unwrap() == want)
    };
    assert!(hosts(&[&backends[0]]), "{:?}", envoy.cluster_hosts(CLUSTER));
    // A scale-out to another zone, then a scale-in, each one rename of the file.
    eds.add([
        Endpoint::new(backends[1].addr(), Some("zone-b")),
        Endpoint::new(backends[2].addr(), Some("zone-b")),
    ])
    .unwrap();
    assert!(
        hosts(&[&backends[0], &backends[1], &backends[2]]),
        "{:?}",
        envoy.cluster_hosts(CLUSTER)
    );
    let clusters = envoy.admin_get("/clusters").unwrap();
    assert!(
        clusters.contains(&format!("backend::{}::zone::zone-b", backends[2].addr())),
        "{clusters}"
    );
    eds.remove(&[backends[0].addr()]).unwrap();
    assert!(hosts(&[&backends[1], &backends[2]]));
    for _ in 0..20 {
        let r = get(&format!("http://127.0.0.1:{listen}/"), &[]).unwrap();
        assert_eq!(r.status, 200);
    }
    assert_eq!(backends[0].served(), 0, "a removed endpoint got traffic");
    assert_eq!(backends[1].served() + backends[2].served(), 20);
}
