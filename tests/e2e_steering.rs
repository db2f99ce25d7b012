//! End to end, issue 2: the real plugin in a real Envoy (`--concurrency 2`) moves traffic away
//! from a slow backend, gives it back when it recovers, and never lets a client choose the host.
//! Every assertion counts what the backends served or what came back on the wire.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking
#![cfg(not(target_arch = "wasm32"))] // real processes: native only

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::share;
use harness::backend::{OVERRIDE_HEADER, SEEN_OVERRIDE_HEADER};
use harness::config::LISTENER;
use harness::{http, within, BackendSpec, Stack};

/// Seed 002's cluster: two backends at 50-100 ms and one at 500-2000 ms.
fn seed_backends() -> Vec<BackendSpec> {
    vec![
        BackendSpec::new("fast1", "uniform:50-100".parse().unwrap()),
        BackendSpec::new("fast2", "uniform:50-100".parse().unwrap()),
        BackendSpec::new("slow", "uniform:500-2000".parse().unwrap()),
    ]
}

#[test]
fn traffic_leaves_the_slow_backend_but_keeps_probing_it() {
    let stack = Stack::start(seed_backends()).unwrap();
    stack.load(100.0, 5).unwrap(); // warm-up: the table forms from the first seconds of traffic
    stack.reset_counts();
    // 3,000 requests. A host this much slower than the rest is probed by time, every 3 probe
    // intervals per worker VM: 3 to 5 probes in 15 s, none would mean probing stopped. After a
    // few times the others' latency a probe goes to a fast host as well, which answers first,
    // so the slow backend receives it without answering it.
    let records = stack.load(200.0, 15).unwrap();
    let counts = stack.served();
    let slow = share(&counts, "slow");
    assert!(
        slow <= 0.05,
        "at least 95 % must reach the fast two, served: {counts:?}"
    );
    let probes = stack.backend("slow").unwrap().received();
    assert!(
        probes > 0,
        "the slow backend must still be probed: {counts:?}"
    );
    let errors = records.iter().filter(|r| r.is_error()).count();
    assert_eq!(errors, 0, "no request may fail");
}

/// A probe of a host that answers in 3 s goes to another host as well after a few times the
/// others' latency (hedged: its own attempt keeps running), and that host's answer wins: the
/// slow backend receives probes (it never answers them), and no client waits for it. Without
/// that each probe would come back from the slow backend after 3 s.
#[test]
fn a_probe_waits_a_few_times_the_others_latency_not_the_slow_hosts() {
    let stack = Stack::start(vec![
        BackendSpec::new("fast1", "uniform:5-15".parse().unwrap()),
        BackendSpec::new("fast2", "uniform:5-15".parse().unwrap()),
        BackendSpec::new("slow", "fixed:3000".parse().unwrap()),
    ])
    .unwrap();
    // Warm-up: the slow backend's first answers come back after 3 s and put it at the floor.
    // Then every worker gets a table: a connection of the run landing on a worker the warm-up
    // missed would meet that worker's first tick without one, and Envoy's own balancer (the
    // fallback) may send a request of that tick to the slow backend, which is not a probe.
    stack.load(100.0, 8).unwrap();
    stack.warm_every_worker().unwrap();
    let slow = stack.backend("slow").unwrap();
    std::thread::sleep(Duration::from_secs(3)); // the warm-up's requests to it end
    stack.reset_counts();
    let stat = |name: &str| {
        stack
            .envoy
            .stat(&format!("cluster.backend.{name}"))
            .unwrap_or(0)
    };
    let (sent_on_before, cancelled_before) = (
        stat("upstream_rq_retry"),
        stat("upstream_rq_per_try_timeout"),
    );
    // 15 s: a host far slower than the rest is probed every 3 probe intervals per worker VM
    // (`probe_interval_ms` 1 s, two VMs), 3 to 5 probes in all; fewer than 2 would mean probing
    // stopped.
    let records = stack.load(100.0, 15).unwrap();
    let received = slow.received();
    assert!(received >= 2, "the slow backend was not probed: {received}");
    let from_slow: Vec<_> = records
        .iter()
        .filter(|r| r.backend.as_deref() == Some("slow"))
        .collect();
    assert!(
        from_slow.is_empty(),
        "answered by the slow backend: {from_slow:?}"
    );
    let errors = records.iter().filter(|r| r.is_error()).count();
    assert_eq!(errors, 0, "no request may fail");
    let longest = records.iter().map(|r| r.latency).max().unwrap_or_default();
    assert!(
        longest < Duration::from_millis(1500),
        "a request waited {longest:?} (the slow backend answers in 3 s)"
    );
    // Envoy's own counts: each probe the slow backend received was sent on to another host,
    // and hedged: Envoy counts a per-try timeout only when it cancels the attempt, which would
    // give the second attempt the same short wait.
    let sent_on = stat("upstream_rq_retry") - sent_on_before;
    assert!(
        sent_on >= received,
        "{sent_on} probes sent on to another host for {received} probes"
    );
    let cancelled = stat("upstream_rq_per_try_timeout") - cancelled_before;
    assert_eq!(cancelled, 0, "probes whose own attempt was cancelled");
}

#[test]
fn a_recovered_backend_earns_its_share_back() {
    // Stated bound: once the slow backend turns fast, its share of a 2 s window reaches 20 %
    // (fair is 33 %) within 30 s.
    const BOUND: Duration = Duration::from_secs(30);
    let stack = Stack::start(seed_backends()).unwrap();
    stack.load(100.0, 8).unwrap();
    let slow = stack.backend("slow").unwrap();
    stack.reset_counts();
    let load = stack.load_in_background(100.0, BOUND.as_secs() + 5);
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        share(&stack.served(), "slow") < 0.05,
        "still avoided before it recovers: {:?}",
        stack.served()
    );
    slow.set_latency("uniform:50-100".parse().unwrap());
    let mut last = stack.served();
    let took = within(BOUND, || {
        std::thread::sleep(Duration::from_millis(1750));
        let now = stack.served();
        let window: Vec<(String, u64)> = now
            .iter()
            .zip(&last)
            .map(|((n, a), (_, b))| (n.clone(), a - b))
            .collect();
        last = now;
        share(&window, "slow") >= 0.20
    });
    load.join().unwrap().unwrap();
    assert!(
        took.is_some(),
        "the recovered backend did not reach 20 % within {BOUND:?}: {:?}",
        stack.served()
    );
    eprintln!(
        "recovered backend back to >= 20 % after {:?}",
        took.unwrap_or_default()
    );
}

/// What it observes: for every request carrying a forged override header, the override header the
/// serving backend received (it echoes it) and which backend that was. The forged value names the
/// slow backend (or Envoy's admin port) twice, `A,A`: Envoy would obey it like any list, but the
/// plugin never writes it (its second address is always another host), so a backend seeing it can
/// only mean the client's header got through. Envoy's override_host sends a request to the first
/// address of the header it sees (a hedged probe of the slow backend also to the second, which
/// answers first), so "every request was served by the first address of the header that reached the
/// backend, or a probe of the slow one by the second, and that header was never the client's" holds
/// only if the header Envoy obeyed was the plugin's, whatever its table says (even when it names
/// the host the client named). Requests the plugin leaves to the fallback (before its first table,
/// exploration) reach a backend with no header at all: the client's copy was removed.
#[test]
fn a_client_supplied_override_header_never_decides_the_host() {
    client_override_never_decides(&Stack::start(seed_backends()).unwrap());
}

/// The same with the native filter that strips the client's copy before the plugin taken out of
/// the chain (an install whose own chain lacks it): the plugin's own replacement or removal of
/// the header is all that stands between the client and the host. The shipped chain's removal
/// would hide a plugin that forgot to do either.
#[test]
fn a_client_supplied_override_header_never_decides_the_host_without_the_native_removal() {
    let stack = Stack::start_with(seed_backends(), |config| {
        config
            .listener(LISTENER)?
            .http()?
            .remove_http_filter("envoy.filters.http.header_mutation")?;
        Ok(())
    })
    .unwrap();
    client_override_never_decides(&stack);
}

fn client_override_never_decides(stack: &Stack) {
    let address_of: BTreeMap<String, String> = stack
        .backends
        .iter()
        .map(|b| (b.name().to_string(), b.addr().to_string()))
        .collect();
    let twice = |address: &str| format!("{address},{address}");
    let slow = twice(&address_of["slow"]);
    let admin = twice(&stack.envoy.admin_addr().to_string());
    let forged = |value: &str| {
        let r = http::get(&format!("{}/work", stack.url), &[(OVERRIDE_HEADER, value)])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status, 200, "forged {value}: {r:?}");
        (
            r.header("x-backend").unwrap_or_default().to_string(),
            r.header(SEEN_OVERRIDE_HEADER).map(str::to_string),
        )
    };
    let check = |value: &str| -> bool {
        let (backend, seen) = forged(value);
        let Some(seen) = seen else { return false }; // left to the fallback: no header at all
        assert_ne!(
            seen, value,
            "the client's value reached {backend} unchanged"
        );
        // Envoy sends a request to the first address; a probe of the slow backend also goes to
        // the second once it has waited its wait (hedging), and that one answers first.
        let mut addresses = seen.split(',');
        let (first, second) = (addresses.next().unwrap_or_default(), addresses.next());
        let served = address_of[&backend].as_str();
        assert!(
            first == served || (first == address_of["slow"] && second == Some(served)),
            "{backend} served a request whose header named {seen}"
        );
        true
    };
    // From the very first request (no table yet) ...
    for _ in 0..30 {
        check(&slow);
    }
    // ... and once the table has formed, when most requests are steered.
    stack.load(100.0, 6).unwrap();
    let steered = std::iter::repeat_n(slow.as_str(), 100)
        .chain([admin.as_str()])
        .filter(|v| check(v))
        .count();
    assert!(
        steered >= 90,
        "the plugin steered only {steered} of 101 requests"
    );
}

#[test]
fn both_workers_steer_from_one_shared_table() {
    let stack = Stack::start(seed_backends()).unwrap();
    // Many connections so both workers take requests.
    stack.load(150.0, 8).unwrap();
    let log = stack.envoy.log();
    // "[time][thread][debug][wasm] ... adopted table v7 for cluster backend: a=0.49 b=0.49 c=0.005"
    let mut threads_by_table: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in log.lines().filter(|l| l.contains("adopted table v")) {
        let thread = harness::envoy::log_thread(line)
            .unwrap_or_default()
            .to_string();
        let table = line
            .split("adopted table ")
            .nth(1)
            .unwrap_or_default()
            .to_string();
        threads_by_table.entry(table).or_default().insert(thread);
    }
    let shared = threads_by_table
        .values()
        .filter(|threads| threads.len() >= 2)
        .count();
    assert!(
        shared >= 3,
        "no table (version and shares) was adopted by two workers: {threads_by_table:#?}"
    );
    // And the load both workers steered avoided the slow backend alike.
    stack.reset_counts();
    stack.load(150.0, 5).unwrap();
    assert!(
        share(&stack.served(), "slow") <= 0.05,
        "{:?}",
        stack.served()
    );
}

/// A worker that meets the cluster for the first time has no table: the plugin asks Envoy for a
/// tick at once, so about one request goes to Envoy's own balancer, not a tick period of them.
/// One good backend and four that answer 503, which the plugin ejects while one worker warms up
/// over one connection; then a second connection, which Envoy's exact balance hands to the
/// other worker, sends a request every 5 ms. Envoy's balancer sends about half of what it is
/// left to a failing backend; the plugin sends none there. So the test passes while the new
/// worker's first tick comes within about 90 ms (16 requests). The tick period is 2 s (the
/// refresh interval may not be shorter), so that the two causes stay apart: a build without the
/// early tick waits 0-2 s for it and failed 45-52 of the 100 requests in each of 4 runs (it
/// would pass about one run in twenty); with it, a tick as late as one CI saw (4 requests
/// failed, about 25 ms) passes.
#[test]
fn a_worker_new_to_the_cluster_steers_from_its_second_request() {
    let mut specs = vec![BackendSpec::new("good", "fixed:1".parse().unwrap())];
    for i in 0..4 {
        specs.push(BackendSpec::new(format!("bad{i}"), "fixed:1".parse().unwrap()).fail_rate(1.0));
    }
    let stack = Stack::start_with(specs, |config| {
        config.plugin()?.set_plugin_config(
            r#"{"tick_period_ms": 2000, "refresh_interval_ms": 2000,
                "outlier_detection": {"consecutive_failures": 3, "base_ejection_ms": 120000,
                "max_ejection_share": 0.8}}"#,
        )?;
        // Each new connection to the worker with the fewest: the second one to the other worker.
        let mut listener = config.listener(LISTENER)?;
        listener.upsert("enable_reuse_port", false)?;
        listener.upsert(
            "connection_balance_config",
            serde_json::json!({"exact_balance": {}}),
        )?;
        Ok(())
    })
    .unwrap();
    let addr = stack.url.trim_start_matches("http://").to_string();
    let mut first = KeepAlive::connect(&addr);
    // Warm-up on one connection, so one worker: the table learns the five hosts and ejects the
    // failing four; its learning share of Envoy's picks lasts 5 s after the last host it meets.
    let warmed = within(Duration::from_secs(30), || {
        for _ in 0..200 {
            first.get("/");
            std::thread::sleep(Duration::from_millis(5));
        }
        steady(&mut first)
    });
    assert!(
        warmed.is_some(),
        "the first worker never steered 100 requests in a row clear of the failing backends: {:?}",
        stack.served()
    );
    assert_eq!(
        stack.workers_with_table(),
        1,
        "the warm-up reached both workers, so no worker is new to the cluster"
    );
    stack.reset_counts();
    let mut second = KeepAlive::connect(&addr);
    let mut ok = 0;
    for _ in 0..100 {
        ok += u32::from(second.get("/") == 200);
        std::thread::sleep(Duration::from_millis(5));
    }
    let served = stack.served();
    let failing: u64 = served
        .iter()
        .filter(|(name, _)| name.starts_with("bad"))
        .map(|(_, n)| n)
        .sum();
    eprintln!(
        "the new worker: {failing} of 100 requests reached a failing backend, served: {served:?}"
    );
    assert_eq!(
        stack.workers_with_table(),
        2,
        "the second connection did not reach the other worker"
    );
    assert!(
        failing <= 8,
        "the new worker left {failing} requests to Envoy's balancer that reached a failing \
         backend ({ok} of 100 succeeded), served: {served:?}"
    );
    drop(first);
}

/// Whether 100 requests on `conn` all succeed: the plugin has ejected the failing backends and
/// leaves nothing to Envoy's balancer any more.
fn steady(conn: &mut KeepAlive) -> bool {
    (0..100).all(|_| conn.get("/") == 200)
}

/// One HTTP/1.1 connection kept open, so that Envoy keeps it on one worker.
struct KeepAlive(TcpStream);

impl KeepAlive {
    fn connect(addr: &str) -> KeepAlive {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        KeepAlive(stream)
    }

    /// The response's status; its body is read (by `content-length`) and dropped.
    fn get(&mut self, path: &str) -> u16 {
        let request = format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n");
        self.0.write_all(request.as_bytes()).unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let n = self.0.read(&mut byte).unwrap();
            assert!(n == 1, "the connection closed mid-response");
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        let mut body = vec![0u8; length];
        self.0.read_exact(&mut body).unwrap();
        head.split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0)
    }
}
