//! The load generator sends what it was asked, records what came back, and summarises it.

use std::time::Duration;

use harness::load::{run, LoadSpec, Record};
use harness::summary::shares_per_second;
use harness::{Backend, BackendSpec, Latency, Summary};

#[test]
fn open_loop_sends_rate_times_duration_and_summarises() {
    let b = Backend::start_local(BackendSpec::new("one", Latency::Fixed(10))).unwrap();
    let records = run(&LoadSpec::new(b.url(), 100.0, Duration::from_secs(1))).unwrap();
    assert_eq!(records.len(), 100);
    assert_eq!(b.served(), 100);
    let s = Summary::of(&records);
    assert_eq!((s.count, s.errors, s.dropped), (100, 0, 0));
    assert!(s.p50_ms >= 10.0 && s.p50_ms < 200.0, "{s}");
    assert!(s.p99_ms >= s.p50_ms && s.p999_ms >= s.p99_ms && s.max_ms >= s.p999_ms);
    assert_eq!(s.share("one"), 1.0);
    // Arrivals follow the schedule: the last is due at 0.99 s.
    let last = records.last().unwrap().sent_at;
    assert!(
        last >= Duration::from_millis(980) && last < Duration::from_millis(1100),
        "{last:?}"
    );
}

#[test]
fn open_loop_drops_arrivals_over_the_in_flight_bound() {
    let b = Backend::start_local(BackendSpec::new("slow", Latency::Fixed(500))).unwrap();
    let spec = LoadSpec {
        max_in_flight: 5,
        ..LoadSpec::new(b.url(), 100.0, Duration::from_secs(1))
    };
    let records = run(&spec).unwrap();
    let s = Summary::of(&records);
    assert_eq!(s.count + s.dropped, 100);
    assert!(s.dropped >= 80, "{s}");
    assert_eq!(s.errors, 0);
    assert!(records
        .iter()
        .filter(|r| r.dropped)
        .all(|r| r.status == 0 && !r.is_error()));
}

#[test]
fn closed_loop_workers_send_back_to_back() {
    let b = Backend::start_local(BackendSpec::new("c", Latency::Fixed(50))).unwrap();
    let spec = LoadSpec {
        closed_loop_workers: Some(2),
        ..LoadSpec::new(b.url(), 0.0, Duration::from_secs(1))
    };
    let records = run(&spec).unwrap();
    // 2 workers x ~1 s / ~52 ms each.
    assert!(
        (15..=42).contains(&records.len()),
        "{} records",
        records.len()
    );
    assert!(records.iter().all(|r| r.status == 200));
}

#[test]
fn transport_errors_and_timeouts_are_status_zero() {
    let b = Backend::start_local(BackendSpec::new("t", Latency::Fixed(2000))).unwrap();
    let spec = LoadSpec {
        timeout: Duration::from_millis(200),
        ..LoadSpec::new(b.url(), 10.0, Duration::from_millis(300))
    };
    let records = run(&spec).unwrap();
    assert_eq!(records.len(), 3);
    for r in &records {
        assert_eq!(r.status, 0);
        assert!(
            r.latency >= Duration::from_millis(200) && r.latency < Duration::from_millis(1000),
            "{r:?}"
        );
    }

    b.stop();
    let records = run(&LoadSpec::new(b.url(), 20.0, Duration::from_millis(250))).unwrap();
    let s = Summary::of(&records);
    assert_eq!((s.count, s.errors, s.transport_errors), (5, 5, 5));
    assert_eq!(s.share("(none)"), 1.0);
}

#[test]
fn refuses_targets_off_this_machine_and_silly_specs() {
    assert!(run(&LoadSpec::new(
        "http://10.0.0.1/",
        1.0,
        Duration::from_millis(10)
    ))
    .is_err());
    assert!(run(&LoadSpec::new(
        "https://127.0.0.1/",
        1.0,
        Duration::from_millis(10)
    ))
    .is_err());
    assert!(run(&LoadSpec::new(
        "http://127.0.0.1:9/",
        0.0,
        Duration::from_secs(1)
    ))
    .is_err());
    assert!(run(&LoadSpec::new(
        "http://127.0.0.1:9/",
        1e9,
        Duration::from_secs(60)
    ))
    .is_err());
    assert!(run(
        &LoadSpec::new("http://127.0.0.1:9/", 1.0, Duration::from_millis(10))
            .header("bad name", "v")
    )
    .is_err());
}

fn rec(ms_at: u64, ms_lat: u64, status: u16, backend: &str) -> Record {
    Record {
        sent_at: Duration::from_millis(ms_at),
        latency: Duration::from_millis(ms_lat),
        status,
        backend: Some(backend.to_string()),
        dropped: false,
        grpc_status: None,
    }
}

#[test]
fn summary_percentiles_errors_and_shares() {
    let mut records: Vec<Record> = (1..=100)
        .map(|i| rec(i * 10, i, 200, if i <= 75 { "a" } else { "b" }))
        .collect();
    records[0].status = 503;
    records[1].status = 0;
    records.push(Record {
        dropped: true,
        status: 0,
        backend: None,
        ..rec(0, 0, 0, "")
    });
    let s = Summary::of(&records);
    assert_eq!(
        (s.count, s.errors, s.transport_errors, s.dropped),
        (100, 2, 1, 1)
    );
    assert!((s.avg_ms - 50.5).abs() < 0.1, "{s}");
    assert!(
        (s.p50_ms - 50.0).abs() < 0.5
            && (s.p95_ms - 95.0).abs() < 0.5
            && (s.p99_ms - 99.0).abs() < 0.5,
        "{s}"
    );
    assert!((s.max_ms - 100.0).abs() < 0.2);
    assert_eq!(
        (s.share("a"), s.share("b"), s.share("c")),
        (0.75, 0.25, 0.0)
    );
    assert!((s.error_rate() - 0.02).abs() < 1e-9);
    assert_eq!(Summary::of(&[]).count, 0);
}

#[test]
fn shares_per_second_splits_by_send_time() {
    let records = vec![
        rec(100, 1, 200, "a"),
        rec(900, 1, 200, "b"),
        rec(2500, 1, 200, "b"),
    ];
    let per = shares_per_second(&records);
    assert_eq!(per.len(), 3);
    assert_eq!(
        (per[0].count, per[0].shares["a"], per[0].shares["b"]),
        (2, 0.5, 0.5)
    );
    assert_eq!(per[1].count, 0);
    assert_eq!(per[2].shares["b"], 1.0);
}
