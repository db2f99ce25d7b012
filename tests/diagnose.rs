//! Misconfigurations that say so (issue 21): picks Envoy does not honour are counted and, when
//! they are most of a window's, warned of at most once a minute per cluster; a name in
//! `steered_clusters` no request carries is warned of after 30 s, then every 5 minutes.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

mod store;

use ewma_lb::balance::outcome::Outcome;
use ewma_lb::worker::diagnose::{
    HonourWatch, SteeredWatch, Unhonoured, Warning, MAX_WINDOW_NS, MIN_PICKS,
    NOT_HONOURED_EVERY_NS, UNSEEN_AFTER_NS, UNSEEN_EVERY_NS, WINDOW_NS,
};
use ewma_lb::worker::telemetry::{Change, Metric};
use ewma_lb::worker::{Decision, Finished, Request, TickReport, Worker};
use store::{config, Shared, CLUSTER, MS, SEC};

// === HonourWatch: the threshold and the rate limit ===

/// A watch whose window opened at 0 and holds `picks` picks, `not_honoured` of them unhonoured.
fn window(picks: u32, not_honoured: u32) -> HonourWatch {
    let mut watch = HonourWatch::default();
    assert_eq!(
        watch.check(0),
        None,
        "the first check only opens the window"
    );
    for i in 0..picks {
        watch.record(i >= not_honoured);
    }
    watch
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn most_of_at_least_twenty_picks_in_five_seconds_warns() {
    // (picks, not honoured, checked at, warns)
    let cases: [(u32, u32, u64, bool); 12] = [
        (0, 0, WINDOW_NS, false),
        (MIN_PICKS - 1, MIN_PICKS - 1, WINDOW_NS, false), // too few picks to judge
        (MIN_PICKS, MIN_PICKS / 2, WINDOW_NS, false),     // half is not most
        (MIN_PICKS, MIN_PICKS / 2 + 1, WINDOW_NS, true),
        (MIN_PICKS, MIN_PICKS, WINDOW_NS, true),
        (1000, 500, WINDOW_NS, false),
        (1000, 501, WINDOW_NS, true),
        (1000, 0, WINDOW_NS, false),
        // An endpoint that left: its picks went unhonoured for a tick or two.
        (2500, 75, WINDOW_NS, false),
        (1000, 1000, WINDOW_NS - 1, false), // the window is not over yet
        (1000, 1000, 3 * WINDOW_NS, true),  // a longer window (ticks came late)
        (MIN_PICKS - 1, MIN_PICKS - 1, MAX_WINDOW_NS, false),
    ];
    for (picks, not_honoured, at, warns) in cases {
        let mut watch = window(picks, not_honoured);
        let got = watch.check(at);
        let want = warns.then_some(Unhonoured {
            picks,
            not_honoured,
            window_ns: at,
        });
        assert_eq!(
            got, want,
            "{not_honoured} of {picks} picks, checked at {at} ns"
        );
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_window_too_thin_to_judge_grows_then_starts_over() {
    // 10 unhonoured picks by 5 s: too few, the window stays open; 10 more by 20 s: judged.
    let mut watch = window(10, 10);
    assert_eq!(watch.check(WINDOW_NS), None);
    (0..10).for_each(|_| watch.record(false));
    assert_eq!(
        watch.check(20 * SEC),
        Some(Unhonoured {
            picks: 20,
            not_honoured: 20,
            window_ns: 20 * SEC
        })
    );
    // 19 by the longest window: dropped, and the next window starts empty.
    let mut watch = window(19, 19);
    assert_eq!(watch.check(MAX_WINDOW_NS), None);
    watch.record(false);
    assert_eq!(watch.check(MAX_WINDOW_NS + WINDOW_NS), None, "1 pick");
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn at_most_one_warning_a_minute_and_each_about_a_recent_window() {
    // A check every 5 s over 200 s. Each row: from when on (ms) every pick is unhonoured (before
    // it, every pick is honoured), and when (s) warnings come.
    let cases: [(u64, &[u64]); 3] = [
        (0, &[5, 65, 125, 185]),
        // Misconfigured from 62.5 s on: the window 60-65 s is half bad (20 of 40), not most.
        (62_500, &[70, 130, 190]),
        // Never: a window of honoured picks warns of nothing, however long it runs.
        (u64::MAX, &[]),
    ];
    for (bad_from_ms, want) in cases {
        let mut watch = HonourWatch::default();
        watch.check(0);
        let mut warned = Vec::new();
        for t in (1..=40).map(|i| i * 5) {
            // 8 picks a second, the last 5 s of them.
            for i in 0..40 {
                let at_ms = (t - 5) * 1000 + i * 125;
                watch.record(at_ms < bad_from_ms);
            }
            if watch.check(t * SEC).is_some() {
                warned.push(t);
            }
        }
        assert_eq!(warned, want, "unhonoured from {bad_from_ms} ms");
    }
    assert_eq!(NOT_HONOURED_EVERY_NS, 60 * SEC);
}

// === The worker: what counts, what warns ===

/// Steered requests to `cluster`: Envoy's first attempt goes where `serve` says (given the
/// plugin's pick), and `attempts` says how many the request took. Returns the picks Envoy served
/// elsewhere on the first attempt.
fn requests(
    w: &mut Worker,
    cluster: &str,
    n: usize,
    attempts: u32,
    mut serve: impl FnMut(&str) -> String,
) -> u64 {
    let mut unhonoured = 0;
    for _ in 0..n {
        let decision = w.route(
            &Request {
                path: b"/work",
                cluster: Some(cluster),
                ..Request::default()
            },
            || None,
        );
        let Decision::Override(pick) = decision else {
            panic!("not steered: {decision}")
        };
        let served = serve(&pick.host);
        unhonoured += u64::from(served != *pick.host && attempts == 1);
        w.finish(
            cluster,
            &Finished {
                picked: Some(&pick.host),
                in_flight: true,
                served_by: Some(&served),
                attempts,
                latency_ms: 10.0,
                outcome: Some(Outcome::Success),
                ..Finished::default()
            },
        );
    }
    unhonoured
}

/// What a tick added to `ewma_lb_picks_not_honoured_total` of `cluster`.
fn not_honoured(report: &TickReport, cluster: &str) -> u64 {
    report
        .metrics
        .iter()
        .filter(|u| u.metric == Metric::PicksNotHonoured && &*u.cluster == cluster)
        .map(|u| match u.change {
            Change::Add(n) => u64::try_from(n).unwrap(),
            Change::Set(_) => panic!("a counter set: {u:?}"),
        })
        .sum()
}

fn not_honoured_warnings(report: &TickReport) -> Vec<(String, Unhonoured, String)> {
    report
        .warnings
        .iter()
        .filter_map(|w| match w {
            Warning::NotHonoured {
                cluster,
                window,
                header,
            } => Some((cluster.clone(), *window, header.clone())),
            Warning::UnseenClusters { .. } | Warning::HealthUnanswered { .. } => None,
        })
        .collect()
}

const HOSTS: [&str; 3] = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"];

/// A worker with `cfg` that has ticked once, at 0.1 s, so its static endpoints form a table.
fn started(cfg: &str, seed: u64) -> (Shared, Worker) {
    let store = Shared::default();
    let mut w = Worker::new(config(cfg), seed);
    w.tick(100 * MS, &mut store.clone());
    (store, w)
}

/// Envoy's own policy, deaf to the header: round robin over `hosts`, whatever the pick (with as
/// many requests a tick as hosts, each host serves in every tick and stays in the table).
fn round_robin<'a>(hosts: &'a [&'a str]) -> impl FnMut(&str) -> String + 'a {
    let mut next = 0;
    move |_| {
        next = (next + 1) % hosts.len();
        hosts[next].to_owned()
    }
}

fn static_config(extra: &str, hosts: &[&str]) -> String {
    format!(
        r#"{{"exploration_share": 0, {extra} "clusters": {{"{CLUSTER}": {{"endpoints": {hosts:?}}}}}}}"#
    )
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_pick_served_elsewhere_on_the_first_attempt_is_not_honoured() {
    // (Envoy serves, attempts, counted): a pick that failed over to another host on a retry was
    // honoured (the pick failed); one served elsewhere on the first attempt was not.
    let cases: [(&str, u32, bool); 3] = [
        ("the pick", 1, false),
        ("another host", 1, true),
        ("another host", 2, false),
    ];
    for (serves, attempts, counted) in cases {
        let store = Shared::default();
        let mut w = Worker::new(config(&static_config("", &HOSTS[..2])), 1);
        w.tick(SEC, &mut store.clone());
        let other = |pick: &str| {
            if serves == "the pick" {
                pick.to_owned()
            } else {
                HOSTS[..2].iter().find(|h| **h != pick).unwrap().to_string()
            }
        };
        let mut total = 0;
        let mut warnings = Vec::new();
        for t in 2..=8 {
            requests(&mut w, CLUSTER, 20, attempts, other);
            let report = w.tick(t * SEC, &mut store.clone());
            total += not_honoured(&report, CLUSTER);
            warnings.extend(not_honoured_warnings(&report));
        }
        let want = if counted { 7 * 20 } else { 0 };
        assert_eq!(total, want, "{serves}, {attempts} attempts: counted");
        assert_eq!(
            warnings.len(),
            usize::from(counted),
            "{serves}, {attempts} attempts: {warnings:?}"
        );
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn picks_the_cluster_ignores_are_counted_and_warned_of_once_a_minute() {
    // The cluster does not read the header: Envoy's fallback chooses, whatever the pick.
    let cfg = static_config(r#""override_header": "x-lb-pick","#, &HOSTS);
    let (store, mut w) = started(&cfg, 7);
    let mut fallback = round_robin(&HOSTS);
    let (mut sent, mut counted) = (0, 0);
    let mut warned_at = Vec::new();
    for t in (2..=1300u64).map(|i| i * 100 * MS) {
        sent += requests(&mut w, CLUSTER, 6, 1, &mut fallback);
        let report = w.tick(t, &mut store.clone());
        counted += not_honoured(&report, CLUSTER);
        for (cluster, window, header) in not_honoured_warnings(&report) {
            assert_eq!((cluster.as_str(), header.as_str()), (CLUSTER, "x-lb-pick"));
            assert!(
                window.not_honoured * 2 > window.picks && window.picks >= MIN_PICKS,
                "{window:?}"
            );
            warned_at.push(t / (100 * MS));
        }
    }
    assert!(
        (4_500..6_000).contains(&sent),
        "about two thirds of 7,794 picks: {sent}"
    );
    assert_eq!(counted, sent, "ewma_lb_picks_not_honoured_total");
    // The window opens at the first tick (0.1 s) and is judged at 5.1 s; then once a minute.
    assert_eq!(warned_at, [51, 651, 1251], "tick numbers of the warnings");
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn each_cluster_is_warned_of_on_its_own() {
    let hosts =
        |net: u8| -> Vec<String> { (1..=3).map(|i| format!("10.0.{net}.{i}:80")).collect() };
    let (a, b, c) = (hosts(0), hosts(1), hosts(2));
    let cfg = format!(
        r#"{{"exploration_share": 0, "steered_clusters": ["a", "b", "c"], "clusters": {{"a": {{"endpoints": {a:?}}}, "b": {{"endpoints": {b:?}}}, "c": {{"endpoints": {c:?}}}}}}}"#
    );
    let (a, c): (Vec<&str>, Vec<&str>) = (
        a.iter().map(String::as_str).collect(),
        c.iter().map(String::as_str).collect(),
    );
    let (store, mut w) = started(&cfg, 2);
    let (mut deaf_a, mut deaf_c) = (round_robin(&a), round_robin(&c));
    let mut warned: Vec<(u64, String)> = Vec::new();
    for t in (2..=130u64).map(|i| i * 100 * MS) {
        // a: every pick ignored; b: every pick honoured; c: honoured until 3 s, then ignored.
        requests(&mut w, "a", 3, 1, &mut deaf_a);
        requests(&mut w, "b", 3, 1, str::to_owned);
        requests(&mut w, "c", 3, 1, |p| {
            if t < 3 * SEC {
                p.to_owned()
            } else {
                deaf_c(p)
            }
        });
        let report = w.tick(t, &mut store.clone());
        warned.extend(
            not_honoured_warnings(&report)
                .into_iter()
                .map(|(c, ..)| (t / (100 * MS), c)),
        );
    }
    // a's first window (0.1-5.1 s) is judged at tick 51; c's first is under half ignored (from
    // 3 s on, two thirds of the picks), its second (5.1-10.1 s) warns.
    assert_eq!(warned, [(51, "a".to_owned()), (101, "c".to_owned())]);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn an_endpoint_leaving_the_cluster_is_counted_but_not_warned_of() {
    // The worst case: two hosts, one leaves, and its picks (half of them) go unhonoured until
    // the table drops it, a tick later.
    let (store, mut w) = started(&static_config("", &HOSTS[..2]), 5);
    let (gone, stays) = (HOSTS[1], HOSTS[0]);
    let (mut counted, mut unhonoured, mut warnings) = (0, 0, Vec::new());
    for t in (2..=300u64).map(|i| i * 100 * MS) {
        let left = t > 10 * SEC;
        unhonoured += requests(&mut w, CLUSTER, 25, 1, |p| {
            if left && p == gone { stays } else { p }.to_owned()
        });
        let report = w.tick(t, &mut store.clone());
        counted += not_honoured(&report, CLUSTER);
        warnings.extend(not_honoured_warnings(&report));
    }
    assert!(
        (1..=50).contains(&unhonoured),
        "the departed host's picks until the table dropped it: {unhonoured}"
    );
    assert_eq!(counted, unhonoured);
    assert_eq!(warnings, [], "an endpoint leaving is no misconfiguration");
    let status: serde_json::Value = serde_json::from_str(&w.status_json(&store.clone())).unwrap();
    let host = |a: &str| {
        status["clusters"][0]["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["host"] == a)
            .cloned()
            .unwrap()
    };
    assert_eq!(host(gone)["state"], "absent", "{status}");
}

// === steered_clusters no request carries ===

/// A request of `cluster` through `w` (any decision), finished on `host` when it was sampled.
fn request_to(w: &mut Worker, cluster: Option<&str>, host: &str) {
    let decision = w.route(
        &Request {
            path: b"/work",
            cluster,
            ..Request::default()
        },
        || None,
    );
    if let (true, Some(cluster)) = (decision.is_sampled(), cluster) {
        let picked = match &decision {
            Decision::Override(pick) => Some(pick.host.to_string()),
            _ => None,
        };
        w.finish(
            cluster,
            &Finished {
                picked: picked.as_deref(),
                in_flight: picked.is_some(),
                served_by: Some(host),
                attempts: 1,
                latency_ms: 10.0,
                outcome: Some(Outcome::Success),
                ..Finished::default()
            },
        );
    }
}

/// Unseen-cluster warnings as `(second, names, clusters seen)`.
type Unseen = Vec<(u64, Vec<String>, Vec<String>)>;

/// The unseen-cluster warnings of one worker over `until_s` seconds, a tick a second, as
/// `(second, names, clusters seen)`. Each second it gets a request of each of `here`; another
/// worker over the same store gets a request of each of `elsewhere`.
fn unseen_warnings(cfg: &str, here: &[Option<&str>], elsewhere: &[&str], until_s: u64) -> Unseen {
    let store = Shared::default();
    let mut w = Worker::new(config(cfg), 1);
    let mut other = Worker::new(config(cfg), 2);
    let mut out = Vec::new();
    for s in 1..=until_s {
        for cluster in here {
            request_to(&mut w, *cluster, "10.0.0.1:80");
        }
        for cluster in elsewhere {
            request_to(&mut other, Some(cluster), "10.0.0.1:80");
        }
        other.tick(s * SEC, &mut store.clone());
        for warning in w.tick(s * SEC, &mut store.clone()).warnings {
            if let Warning::UnseenClusters {
                names,
                after_ns,
                seen,
                more,
            } = warning
            {
                assert_eq!(after_ns, (s - 1) * SEC, "the time since the first tick");
                assert_eq!(more, 0);
                out.push((s, names, seen));
            }
        }
    }
    out
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_steered_cluster_no_request_carries_is_named_after_thirty_seconds() {
    let backend = Some("backend");
    let typo = vec![(31, strings(&["bakend"]), strings(&["backend"]))];
    // (configuration, requests here, requests to another worker, warnings in 60 s)
    let cases = vec![
        // The issue's typo: the real cluster is unlisted, the listed one never comes.
        (
            r#"{"steered_clusters": ["bakend"]}"#,
            vec![backend],
            vec![],
            typo.clone(),
        ),
        (
            r#"{"steered_clusters": ["backend"]}"#,
            vec![backend],
            vec![],
            vec![],
        ),
        (r#"{}"#, vec![backend], vec![], vec![]), // "*": nothing to mistype
        // Prefixes are not checked; every cluster seen is listed, sorted; `none` is no cluster.
        (
            r#"{"steered_clusters": ["backend", "bakend", "api-*"]}"#,
            vec![Some("zeta"), backend, None],
            vec![],
            vec![(31, strings(&["bakend"]), strings(&["backend", "zeta"]))],
        ),
        // Two typos, one line.
        (
            r#"{"steered_clusters": ["bakend", "backedn"]}"#,
            vec![backend],
            vec![],
            vec![(31, strings(&["bakend", "backedn"]), strings(&["backend"]))],
        ),
        // No request with a cluster here (the main thread's VM): nothing to compare with.
        (
            r#"{"steered_clusters": ["bakend"]}"#,
            vec![],
            vec!["backend"],
            vec![],
        ),
        (
            r#"{"steered_clusters": ["bakend"]}"#,
            vec![None],
            vec![],
            vec![],
        ),
        // Another worker served the listed cluster: its record shows the traffic.
        (
            r#"{"steered_clusters": ["backend", "other"]}"#,
            vec![backend],
            vec!["other"],
            vec![],
        ),
        // Static endpoints make a record, but no traffic.
        (
            r#"{"steered_clusters": ["backend", "bakend"], "clusters": {"bakend": {"endpoints": ["10.0.0.9:80"]}}}"#,
            vec![backend],
            vec![],
            vec![(31, strings(&["bakend"]), strings(&["backend"]))],
        ),
    ];
    for (cfg, here, elsewhere, want) in cases {
        assert_eq!(
            unseen_warnings(cfg, &here, &elsewhere, 60),
            want,
            "{cfg}, requests here {here:?}, elsewhere {elsewhere:?}"
        );
    }
    assert_eq!(UNSEEN_AFTER_NS, 30 * SEC);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_unseen_cluster_warning_repeats_every_five_minutes_until_it_is_seen() {
    let got = unseen_warnings(
        r#"{"steered_clusters": ["backend", "late"]}"#,
        &[Some("backend")],
        &[],
        700,
    );
    let when: Vec<u64> = got.iter().map(|(s, ..)| *s).collect();
    assert_eq!(when, [31, 331, 631]);
    assert_eq!(UNSEEN_EVERY_NS, 300 * SEC);

    // Seen once, never named again.
    let store = Shared::default();
    let mut w = Worker::new(config(r#"{"steered_clusters": ["backend", "late"]}"#), 1);
    let mut warned = Vec::new();
    for s in 1..=1000 {
        request_to(&mut w, Some("backend"), "10.0.0.1:80");
        if s == 400 {
            request_to(&mut w, Some("late"), "10.0.0.1:80");
        }
        if !w.tick(s * SEC, &mut store.clone()).warnings.is_empty() {
            warned.push(s);
        }
    }
    assert_eq!(warned, [31, 331]);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_watch_starts_at_its_first_check_and_forgets_seen_names() {
    let mut watch = SteeredWatch::new(["a", "b"]);
    assert!(!watch.due(1000 * SEC), "the first check starts the clock");
    assert!(!watch.due(1000 * SEC + UNSEEN_AFTER_NS - 1));
    assert!(watch.due(1000 * SEC + UNSEEN_AFTER_NS));
    watch.observe(|n| n == "a");
    assert_eq!(watch.unseen(), ["b"]);
    watch.observe(|_| true);
    assert!(!watch.due(2000 * SEC), "nothing left to warn of");
    let mut none = SteeredWatch::new([] as [&str; 0]);
    assert!(!none.due(0) && !none.due(1000 * SEC));
}

// === Envoy's admin bringing no page ===

/// The polls each warning of `report` about Envoy's admin counted.
fn health_warnings(report: &TickReport) -> Vec<u64> {
    report
        .warnings
        .iter()
        .filter_map(|w| match w {
            Warning::HealthUnanswered { polls, .. } => Some(*polls),
            _ => None,
        })
        .collect()
}

/// More than five polls of Envoy's admin in a row without a page are warned of, once per run of
/// them; a page ends the run, and a later run is warned of again. A VM whose polls bring pages
/// says nothing.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn polls_of_envoys_admin_that_bring_no_page_are_warned_of_once_a_run() {
    let cfg = static_config(
        r#""envoy_health": {"admin_cluster": "envoy_admin"},"#,
        &HOSTS,
    );
    let (store, mut w) = started(&cfg, 1);
    let page: String = HOSTS
        .iter()
        .map(|h| format!("{CLUSTER}::{h}::health_flags::healthy\n"))
        .collect();
    let mut t = 100 * MS;
    // Ten seconds of ticks, a poll a second (the default), each answered with the page or not.
    let mut ten_seconds = |w: &mut Worker, answered: bool| -> Vec<u64> {
        let mut warned = Vec::new();
        for _ in 0..100 {
            t += 100 * MS;
            if w.envoy_health_due(t) && answered {
                w.envoy_health(t, page.as_bytes());
            }
            warned.extend(health_warnings(&w.tick(t, &mut store.clone())));
        }
        warned
    };
    assert_eq!(ten_seconds(&mut w, true), Vec::<u64>::new(), "answered");
    assert_eq!(ten_seconds(&mut w, false), [6], "said once, at the sixth");
    assert_eq!(
        ten_seconds(&mut w, true),
        Vec::<u64>::new(),
        "answered again"
    );
    assert_eq!(ten_seconds(&mut w, false), [6], "a new run is said again");
    // A worker without envoy_health asks nothing and says nothing.
    let (store, mut w) = started(&static_config("", &HOSTS), 1);
    for i in 2..200 {
        assert!(!w.envoy_health_due(i * 100 * MS));
        assert!(health_warnings(&w.tick(i * 100 * MS, &mut store.clone())).is_empty());
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_warnings_name_the_likely_causes() {
    let not_honoured = Warning::NotHonoured {
        cluster: "backend".into(),
        window: Unhonoured {
            picks: 40,
            not_honoured: 30,
            window_ns: 5 * SEC + 100 * MS,
        },
        header: "x-lb-pick".into(),
    }
    .to_string();
    for needle in [
        "did not honour 30 of 40 picks for cluster backend in the last 5 s",
        "ewma_lb_picks_not_honoured_total",
        "override_host policy reads another header than the plugin's override_header \"x-lb-pick\"",
        "no override_host load_balancing_policy",
    ] {
        assert!(
            not_honoured.contains(needle),
            "{needle:?} in {not_honoured}"
        );
    }
    let many: Vec<String> = (0..25).map(|i| format!("c{i:02}")).collect();
    let unseen = Warning::unseen_clusters(
        &strings(&["bakend"]),
        31 * SEC,
        many.iter().map(String::as_str),
    )
    .to_string();
    for needle in [
        "steered_clusters names \"bakend\" but no request went to such a cluster in 31 s: a typo?",
        "reason=\"unlisted_cluster\"",
        "saw requests for: c00, c01,",
        "c19 and 5 more",
    ] {
        assert!(unseen.contains(needle), "{needle:?} in {unseen}");
    }
    let no_page = Warning::HealthUnanswered {
        admin_cluster: "envoy_admin".into(),
        polls: 6,
    }
    .to_string();
    for needle in [
        "none of the last 6 polls of Envoy's admin (/clusters through cluster envoy_admin)",
        "refused, timed out, cut off, not 200 or empty",
        "envoy_health.admin_cluster must lead to Envoy's admin address",
        "envoy_health.poll_interval_ms",
    ] {
        assert!(no_page.contains(needle), "{needle:?} in {no_page}");
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_status_document_lists_the_steered_clusters_as_configured() {
    let cases: [(&str, &[&str]); 3] = [
        ("{}", &["*"]),
        (
            r#"{"steered_clusters": ["backend", "outbound|9080||*", "backend"]}"#,
            &["backend", "outbound|9080||*"],
        ),
        (r#"{"steered_clusters": []}"#, &[]),
    ];
    for (cfg, want) in cases {
        let w = Worker::new(config(cfg), 1);
        let status: serde_json::Value =
            serde_json::from_str(&w.status_json(&ewma_lb::testing::MemoryStore::default()))
                .unwrap();
        assert_eq!(
            status["steered_clusters"],
            serde_json::json!(want),
            "{cfg}: {status}"
        );
        assert_eq!(w.config().steered_clusters(), want);
    }
}
