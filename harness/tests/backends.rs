//! The test backends behave as their spec says: headers, latency, queueing, failures, stop/restart.

use std::time::{Duration, Instant};

use harness::backend::{OVERRIDE_HEADER, SEEN_OVERRIDE_HEADER};
use harness::http::{get, request};
use harness::{Backend, BackendSpec, Latency};

fn timed_get(url: &str) -> (u16, Duration) {
    let t = Instant::now();
    let r = get(url, &[]).unwrap();
    (r.status, t.elapsed())
}

#[test]
fn answers_with_its_name_and_echoes_the_override_header() {
    let b = Backend::start_local(BackendSpec::new("alpha", Latency::Fixed(0))).unwrap();
    let r = get(&format!("{}/x?y=1", b.url()), &[]).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-backend"), Some("alpha"));
    assert_eq!(r.body, "alpha\n");
    assert_eq!(r.header(SEEN_OVERRIDE_HEADER), None);

    let r = get(
        &format!("{}/x", b.url()),
        &[(OVERRIDE_HEADER, "127.0.0.1:9")],
    )
    .unwrap();
    assert_eq!(r.header(SEEN_OVERRIDE_HEADER), Some("127.0.0.1:9"));
    assert_eq!(b.served(), 2);
    assert_eq!(b.served_path("/x"), 2);
    assert_eq!(b.path_counts().get("/x"), Some(&2));
}

#[test]
fn fixed_latency_is_respected() {
    let b = Backend::start_local(BackendSpec::new("f", Latency::Fixed(100))).unwrap();
    let (status, took) = timed_get(&b.url());
    assert_eq!(status, 200);
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_millis(1000),
        "{took:?}"
    );
}

#[test]
fn health_paths_are_counted_apart_and_use_their_own_latency() {
    let b = Backend::start_local(BackendSpec::new("h", Latency::Fixed(400)).capacity(1)).unwrap();
    for path in ["/health", "/actuator/health", "/actuator/health/readiness"] {
        let (status, took) = timed_get(&format!("{}{path}", b.url()));
        assert_eq!(status, 200);
        assert!(took < Duration::from_millis(300), "{path} took {took:?}");
    }
    assert_eq!(b.health_served(), 3);
    assert_eq!(b.served(), 0);
    b.reset_counts();
    assert_eq!(b.health_served(), 0);
    assert!(b.path_counts().is_empty());
}

#[test]
fn capacity_one_makes_the_second_concurrent_request_wait() {
    let b = Backend::start_local(BackendSpec::new("q", Latency::Fixed(200)).capacity(1)).unwrap();
    let url = b.url();
    let t = Instant::now();
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || timed_get(&url))
        })
        .collect();
    let mut took: Vec<Duration> = handles.into_iter().map(|h| h.join().unwrap().1).collect();
    took.sort();
    assert!(took[0] >= Duration::from_millis(200), "{took:?}");
    assert!(
        took[1] >= Duration::from_millis(390),
        "second request did not queue: {took:?}"
    );
    assert!(t.elapsed() < Duration::from_millis(1500));
}

#[test]
fn fail_rate_one_answers_503() {
    let b =
        Backend::start_local(BackendSpec::new("bad", Latency::Fixed(0)).fail_rate(1.0)).unwrap();
    let r = get(&b.url(), &[]).unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.header("x-backend"), Some("bad"));
    assert_eq!((b.served(), b.failed()), (1, 1));
    // Health probes never fail: they say whether the process is up.
    assert_eq!(
        get(&format!("{}/health", b.url()), &[]).unwrap().status,
        200
    );
}

#[test]
fn set_latency_and_schedule_change_the_profile() {
    let b = Backend::start_local(BackendSpec::new("s", Latency::Fixed(300)).phase(
        0.0,
        0.6,
        Latency::Fixed(0),
    ))
    .unwrap();
    let (_, early) = timed_get(&b.url());
    assert!(
        early < Duration::from_millis(250),
        "phase not applied: {early:?}"
    );
    std::thread::sleep(Duration::from_millis(700));
    let (_, late) = timed_get(&b.url());
    assert!(
        late >= Duration::from_millis(300),
        "base not applied after the phase: {late:?}"
    );
    b.set_latency(Latency::Fixed(0));
    assert_eq!(b.latency(), Latency::Fixed(0));
    let (_, fast) = timed_get(&b.url());
    assert!(
        fast < Duration::from_millis(250),
        "set_latency not applied: {fast:?}"
    );
}

#[test]
fn stop_refuses_connects_and_cuts_open_requests_then_restart_serves_again() {
    let b = Backend::start_local(BackendSpec::new("r", Latency::Fixed(0))).unwrap();
    let addr = b.addr();
    assert_eq!(get(&b.url(), &[]).unwrap().status, 200);

    b.set_latency(Latency::Fixed(3000));
    let url = b.url();
    let pending = std::thread::spawn(move || {
        let t = Instant::now();
        (
            request("GET", &url, &[], "", Duration::from_secs(10)),
            t.elapsed(),
        )
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(b.open_connections(), 1);
    b.stop();
    assert!(!b.is_running());
    let (cut, took) = pending.join().unwrap();
    assert!(cut.is_err(), "in-flight request should be cut, got {cut:?}");
    assert!(took < Duration::from_millis(2000), "cut took {took:?}");
    assert!(std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err());
    assert!(get(&b.url(), &[]).is_err());

    b.set_latency(Latency::Fixed(0));
    b.restart().unwrap();
    assert_eq!(b.addr(), addr);
    assert_eq!(get(&b.url(), &[]).unwrap().status, 200);
}

#[test]
fn rejects_non_loopback_addresses_and_bad_specs() {
    assert!(Backend::start(BackendSpec::new("x", Latency::Fixed(0)), "0.0.0.0:0").is_err());
    assert!(Backend::start(
        BackendSpec::new("x", Latency::Fixed(0)).fail_rate(1.5),
        "127.0.0.1:0"
    )
    .is_err());
    assert!(Backend::start(BackendSpec::new("", Latency::Fixed(0)), "127.0.0.1:0").is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn can_be_used_and_dropped_inside_an_async_test() {
    let b = Backend::start_local(BackendSpec::new("a", Latency::Fixed(0))).unwrap();
    let r = get(&b.url(), &[]).unwrap();
    assert_eq!(r.status, 200);
    b.stop();
    drop(b);
}

#[test]
fn a_pool_runs_many_backends_on_two_threads_each_stopping_on_its_own() {
    use harness::BackendPool;
    let pool = BackendPool::new().unwrap();
    let backends = pool
        .start_all((0..50).map(|i| BackendSpec::new(format!("e{i:02}"), Latency::Fixed(50))))
        .unwrap();
    // 50 requests at 50 ms each at once: served side by side, not one after another.
    let t = Instant::now();
    let handles: Vec<_> = backends
        .iter()
        .map(|b| b.url())
        .map(|url| std::thread::spawn(move || get(&url, &[]).unwrap()))
        .collect();
    for (h, b) in handles.into_iter().zip(&backends) {
        assert_eq!(h.join().unwrap().header("x-backend"), Some(b.name()));
    }
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    // Stopping or dropping one leaves the others, and the pool outlives its handle.
    backends[0].stop();
    assert!(get(&backends[0].url(), &[]).is_err());
    drop(pool);
    let mut backends = backends;
    backends.remove(1);
    assert_eq!(get(&backends[1].url(), &[]).unwrap().status, 200);
}
