//! Native micro-benchmarks of the plugin's core: the weight recompute and one pick, by host count;
//! path normalisation, on a typical path and on the costliest 64 KB paths we could build.
//! A plain repeated-timing loop (`Instant` around batches, `black_box` on results); build with
//! `--release` for numbers that mean anything.

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use ewma_lb::balance::pick::PickTable;
use ewma_lb::balance::weights::{shares, HostInput, WeightParams};
use ewma_lb::config::Config;
use ewma_lb::record::state::{Accumulator, ClusterBatch, ClusterState};
use ewma_lb::record::sync::{self, Keys, Member, SharedStore, StoreError, SyncContext};
use ewma_lb::record::table::{Table, TableView};
use ewma_lb::rules::normalize_bytes;
use ewma_lb::testing::steered_request_by;
use ewma_lb::worker::{Request, Worker};
use serde::{Deserialize, Serialize};

/// Host counts measured.
pub const HOST_COUNTS: [usize; 4] = [10, 100, 1_000, 10_000];

/// One measurement; `hosts` is 0 for one that does not depend on a host count.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MicroResult {
    pub op: String,
    pub hosts: usize,
    pub ns_per_op: f64,
    pub iterations: u64,
    /// For size measurements (the row's unit is bytes, not ns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

/// Runs `f` in batches until `budget` has passed (at least one batch, at most `max_iters` calls);
/// returns (ns per call, calls).
fn time_it(budget: Duration, max_iters: u64, mut f: impl FnMut()) -> (f64, u64) {
    for _ in 0..3 {
        f();
    }
    let start = Instant::now();
    let mut iters = 0u64;
    let mut batch = 1u64;
    while iters < max_iters {
        for _ in 0..batch {
            f();
        }
        iters += batch;
        let elapsed = start.elapsed();
        if elapsed >= budget {
            break;
        }
        // Grow batches so the clock is read rarely for fast operations.
        if elapsed < budget / 20 {
            batch = (batch * 2).min(max_iters.saturating_sub(iters).max(1));
        }
    }
    (
        start.elapsed().as_nanos() as f64 / iters.max(1) as f64,
        iters,
    )
}

fn address(i: usize) -> String {
    format!("10.{}.{}.{}:8080", (i >> 16) & 255, (i >> 8) & 255, i & 255)
}

/// Latency of host `i`: spread over 20..220 ms, deterministic.
fn latency_ms(i: usize) -> f64 {
    20.0 + ((i * 7919) % 200) as f64
}

/// A cluster state with `n` hosts that each have a few samples.
fn state_with(n: usize) -> (ClusterState, ewma_lb::record::state::Policy) {
    let mut policy = Config::from_json(b"{}")
        .map(|c| c.policy().clone())
        .unwrap_or_else(|e| panic!("defaults: {e}"));
    policy.max_hosts = n;
    policy.host_ttl_ns = u64::MAX;
    let batch = batch_of(n);
    let mut state = ClusterState::default();
    state.merge(&batch, 1_000_000_000, &policy);
    state.refresh(2_000_000_000, &policy, &[], None);
    (state, policy)
}

/// One tick's samples from every one of `n` hosts, four each.
fn batch_of(n: usize) -> ClusterBatch {
    let mut batch = ClusterBatch::default();
    for i in 0..n {
        let mut acc = Accumulator::default();
        for k in 0..4 {
            acc.record(latency_ms(i) + k as f64, false, 1000.0);
        }
        batch.hosts.insert(address(i), acc);
    }
    batch.num_endpoints = u32::try_from(n).ok();
    batch
}

/// proxy-wasm shared data in memory, as the plugin's tick sees it (one VM, no contention).
#[derive(Default)]
struct Memory(std::collections::HashMap<String, (Vec<u8>, u32)>);

impl SharedStore for Memory {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        Ok(self
            .0
            .get(key)
            .map_or((None, None), |(b, v)| (Some(b.clone()), Some(*v))))
    }

    fn set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        let current = self.0.get(key).map(|(_, v)| *v);
        if current.is_some() && cas.is_some() && cas != current {
            return Err(StoreError::CasMismatch);
        }
        self.0
            .insert(key.to_owned(), (value.to_vec(), current.unwrap_or(0) + 1));
        Ok(())
    }
}

/// How many hosts one VM samples in a tick, in the shared-data rows (issue 19's target).
const SAMPLED: usize = 200;

/// One VM's tick over a cluster of `n` hosts when it sampled [`SAMPLED`] of them (read the head,
/// append the batch to its slot), and the refresh that folds one VM's three ticks of such batches
/// into the record (decode, merge, refresh, encode, publish), each timed alone: the refresh runs
/// untimed between ticks, as another VM would, so the slot holds what it does in an Envoy.
fn shared_data(
    n: usize,
    policy: &ewma_lb::record::state::Policy,
    budget: Duration,
) -> ((f64, u64), (f64, u64)) {
    const REFRESHER: u64 = 1;
    const TICKER: u64 = 2;
    let keys = Keys::new("micro", "backend");
    let mut store = Memory::default();
    let mut members = [Member::default(), Member::default()];
    let mut steady = [1_000_000_000u64, 1_000_000_000];
    let mut sync = |store: &mut Memory,
                    who: usize,
                    batch: &ClusterBatch,
                    steady: u64,
                    table: &Table|
     -> sync::Synced {
        let ctx = SyncContext {
            keys: &keys,
            static_hosts: &[],
            policy,
            local_zone: None,
            steady_ns: steady,
            worker: [REFRESHER, TICKER][who],
            tick_ns: 100_000_000,
            urgent: false,
            table,
        };
        sync::sync_cluster(store, &ctx, batch, &mut members[who])
            .unwrap_or_else(|e| panic!("micro: {e}"))
    };
    // The record of n hosts, every one sampled once.
    // Both VMs hold the newest table: the ticks read none.
    let first = sync(&mut store, 0, &batch_of(n), steady[0], &Table::default());
    let mut table = first.table.unwrap_or_else(|| panic!("micro: no table"));
    let mut sampled = batch_of(n.min(SAMPLED));
    sampled.num_endpoints = None;
    let empty = ClusterBatch::default();
    let (mut tick_ns, mut ticks) = (0u128, 0u64);
    let (mut refresh_ns, mut refreshes) = (0u128, 0u64);
    let start = Instant::now();
    while start.elapsed() < budget || refreshes < 3 {
        for _ in 0..3 {
            steady[1] += 1_000;
            let t = Instant::now();
            black_box(sync(&mut store, 1, &sampled, steady[1], &table));
            tick_ns += t.elapsed().as_nanos();
            ticks += 1;
        }
        steady[0] += policy.refresh_interval_ns;
        let t = Instant::now();
        let folded = black_box(sync(&mut store, 0, &empty, steady[0], &table));
        refresh_ns += t.elapsed().as_nanos();
        refreshes += 1;
        if let Some(new) = folded.table {
            table = new;
        }
        if !folded.refreshed {
            panic!("micro: the refresh did not refresh");
        }
    }
    (
        (tick_ns as f64 / ticks as f64, ticks),
        (refresh_ns as f64 / refreshes as f64, refreshes),
    )
}

/// A typical request path, and 64 KB ones built to cost the normaliser most (issue 8: nested `%25`
/// used to cost one pass per level, 13 s of an Envoy worker for 40 KB).
fn paths() -> Vec<(&'static str, Vec<u8>)> {
    const LEN: usize = 64 * 1024;
    let fill = |head: &[u8], unit: &[u8], tail: &[u8]| {
        let mut p = head.to_vec();
        while p.len() + unit.len() + tail.len() <= LEN {
            p.extend_from_slice(unit);
        }
        p.extend_from_slice(tail);
        p
    };
    vec![
        (
            "rules::normalize, typical path",
            b"/api/v1/orders/12345/items?expand=price".to_vec(),
        ),
        (
            "rules::normalize, 64 KB of nested %25",
            fill(b"/%", b"25", b"61"),
        ),
        (
            "rules::normalize, 64 KB, escape at the end",
            fill(b"/", b"a/", b"%2525252561"),
        ),
        (
            "rules::normalize, 64 KB of %2525252561",
            fill(b"/", b"%2525252561", b""),
        ),
        (
            "rules::normalize, 64 KB of %2541",
            fill(b"/", b"%2541", b""),
        ),
        ("rules::normalize, 64 KB of /a/..", fill(b"", b"/a/..", b"")),
        ("rules::normalize, 64 KB of %", fill(b"/", b"%", b"")),
    ]
}

/// Runs every micro-benchmark; `quick` shortens each to a few milliseconds (smoke).
pub fn run(quick: bool) -> Vec<MicroResult> {
    if quick {
        run_with(&HOST_COUNTS[..2], Duration::from_millis(5))
    } else {
        run_with(&HOST_COUNTS, Duration::from_millis(400))
    }
}

/// [`run`] at the given host counts, each row measured for at least `budget`: one count for a
/// long budget is what a profiler wants (`micro --hosts 10000 --budget-ms 20000`).
pub fn run_with(counts: &[usize], budget: Duration) -> Vec<MicroResult> {
    let mut out = Vec::new();
    let mut sizes = Vec::new();
    let mut push = |op: &str, hosts: usize, (ns, iters): (f64, u64)| {
        out.push(MicroResult {
            op: op.to_string(),
            hosts,
            ns_per_op: ns,
            iterations: iters,
            bytes: None,
        });
    };
    for &n in counts {
        let (mut state, policy) = state_with(n);
        let mut now = 3_000_000_000u64;
        push(
            "ClusterState::refresh",
            n,
            time_it(budget, 1_000_000, || {
                state.refresh(now, &policy, &[], None);
                now += policy.refresh_interval_ns;
                black_box(state.table_version);
            }),
        );

        let params = WeightParams::default();
        let inputs: Vec<HostInput> = (0..n)
            .map(|i| HostInput {
                score_ms: Some(latency_ms(i)),
                uncertainty: 0.1,
                active_for_ns: 60_000_000_000,
                ejected: false,
                previous_share: Some(1.0 / n as f64),
                share_on_trust: false,
                share_age_ns: 0,
            })
            .collect();
        push(
            "weights::shares",
            n,
            time_it(budget, 1_000_000, || {
                black_box(shares(black_box(&inputs), &params));
            }),
        );

        push(
            "sync::encode+decode",
            n,
            time_it(budget, 1_000_000, || {
                let bytes = black_box(sync::encode(&state));
                black_box(sync::decode(&bytes, n).ok());
            }),
        );
        sizes.push(MicroResult {
            op: "record size (bytes)".into(),
            hosts: n,
            ns_per_op: 0.0,
            iterations: 0,
            bytes: Some(sync::encode(&state).len() as u64),
        });
        sizes.push(MicroResult {
            op: "table size (bytes)".into(),
            hosts: n,
            ns_per_op: 0.0,
            iterations: 0,
            bytes: Some(sync::encode_table(&TableView::of(&state)).len() as u64),
        });

        // A fold that meets every host at once: a VM's first in front of a cluster, or one that
        // takes in the listing of Envoy's `/clusters` (`envoy_health`). Inserted one at a time,
        // each host shifted the hosts after it (bench/README.md, "Shared state at 10,000
        // endpoints").
        let every_host = batch_of(n);
        push(
            "ClusterState::merge_hosts, every host new",
            n,
            time_it(budget, 1_000, || {
                let mut fresh = ClusterState::default();
                black_box(fresh.merge_hosts(
                    every_host.hosts.iter().map(|(a, acc)| (a.as_str(), acc)),
                    every_host.num_endpoints,
                    1_000_000_000,
                    &policy,
                ));
                black_box(fresh);
            }),
        );
        let (tick, refresh) = shared_data(n, &policy, budget);
        push("sync: one tick, 200 hosts sampled", n, tick);
        push(
            "sync: the refresh (one VM's 3 ticks of 200 hosts)",
            n,
            refresh,
        );
        if let Some((published, adopted)) = refresh_ticks(n, budget) {
            push("Worker::tick refreshing (and publishing)", n, published);
            push("Worker::tick adopting another VM's table", n, adopted);
        }
        if let Some(tick) = met_tick(n, budget) {
            push(
                "Worker::tick, 200 hosts sampled, every host met before",
                n,
                tick,
            );
        }

        // The core's whole per-request work for a steered request (what the adapter adds is host
        // calls): route (path rules, pick, in-flight +1) and finish (in-flight -1, the sample).
        if let Some(mut worker) = hot_worker(n) {
            let now_ns = worker.clock(HOT_NOW_NS);
            push(
                "Worker::route+finish (steered, hot table)",
                n,
                time_it(budget, 10_000_000, || {
                    steer_one(&mut worker, b"/api/v1/items/42?sort=asc", now_ns, |_| 20.0);
                }),
            );
        }

        let table = PickTable::new(state.hosts.iter().map(|h| (h.address.as_str(), h.share)));
        let mut rng = fastrand::Rng::with_seed(7);
        push(
            "PickTable::weighted",
            n,
            time_it(budget, 50_000_000, || {
                black_box(table.weighted(&mut rng));
            }),
        );
        let in_flight: Vec<u32> = (0..n).map(|i| (i % 5) as u32).collect();
        push(
            "PickTable::weighted_p2c",
            n,
            time_it(budget, 50_000_000, || {
                black_box(table.weighted_p2c(&mut rng, |i| in_flight.get(i).copied().unwrap_or(0)));
            }),
        );
    }
    for (op, path) in paths() {
        push(
            op,
            0,
            time_it(budget, 10_000_000, || {
                black_box(normalize_bytes(black_box(&path)).is_ambiguous());
            }),
        );
    }
    out.extend(sizes);
    out
}

/// The time of the requests measured on a hot worker: just after its warm-up's last tick.
const HOT_NOW_NS: u64 = 5_000_000_001;

/// A worker with `n` static endpoints whose table is adopted and whose hosts have all been picked
/// and sampled: the steady state of a busy VM.
fn hot_worker(n: usize) -> Option<Worker> {
    let mut worker = Worker::new(static_config(n)?, 1);
    let mut store = Memory::default();
    for t in 1..=5u64 {
        serve(&mut worker, 4 * n, t * 1_000_000_000, |_| 20.0);
        worker.tick(t * 1_000_000_000, &mut store);
    }
    Some(worker)
}

/// The plugin's configuration with `n` static endpoints in cluster "backend".
fn static_config(n: usize) -> Option<Config> {
    let endpoints: Vec<String> = (0..n).map(address).collect();
    let json = serde_json::json!({
        "exploration_share": 0,
        "max_hosts_per_cluster": n.max(1024),
        "clusters": {"backend": {"endpoints": endpoints}},
    });
    Config::from_json(json.to_string().as_bytes()).ok()
}

/// Routes and finishes `requests` requests at `raw_now_ns`, each taking `latency_ms(host)`.
fn serve(worker: &mut Worker, requests: usize, raw_now_ns: u64, latency_ms: impl Fn(&str) -> f64) {
    for _ in 0..requests {
        let now_ns = worker.clock(raw_now_ns);
        steer_one(worker, b"/", now_ns, &latency_ms);
    }
}

/// One request to "backend": routed, and when steered, finished at its pick in `latency_ms`.
fn steer_one(worker: &mut Worker, path: &[u8], now_ns: u64, latency_ms: impl Fn(&str) -> f64) {
    let request = Request {
        path,
        cluster: Some("backend"),
        now_ns,
        body_pending: false,
    };
    black_box(steered_request_by(worker, "backend", &request, latency_ms));
}

/// What a refresh of `n` hosts costs the VMs of one Envoy, through the worker as the plugin runs
/// it: the tick of the VM that folds the slots, recomputes the weights and publishes the table
/// (with the per-host gauges it sets), and the tick of another VM that reads the record, decodes
/// it and rebuilds its pick table. Two workers on one store; the first serves [`SAMPLED`]
/// requests a refresh, half the hosts at 20 ms and the other half at 60, swapping each second,
/// so its tables keep changing. Returns (refreshing tick, adopting tick), each (ns per tick,
/// ticks): every refresh for the first, the refreshes that published a new table for the second.
fn refresh_ticks(n: usize, budget: Duration) -> Option<((f64, u64), (f64, u64))> {
    const SEC: u64 = 1_000_000_000;
    let (mut store, mut publisher, mut adopter, mut t) = warmed_pair(n)?;
    let interval = publisher.config().policy().refresh_interval_ns;
    let (mut refresh_ns, mut refreshes) = (0u128, 0u64);
    let (mut adopt_ns, mut adoptions) = (0u128, 0u64);
    let start = Instant::now();
    while start.elapsed() < budget || adoptions < 3 {
        if refreshes > 1_000 && adoptions == 0 {
            panic!("micro: {refreshes} refreshes published no table");
        }
        // Half the hosts (by their address) at 60 ms and the rest at 20, swapping each second,
        // so that each refresh has new weights to publish: hosts of one latency, served evenly,
        // would keep one table.
        let slow_half = (t / SEC) % 2;
        serve(&mut publisher, SAMPLED, t, |host| {
            if host.bytes().map(u64::from).sum::<u64>() % 2 == slow_half {
                60.0
            } else {
                20.0
            }
        });
        // With the per-host gauges the filter asks for after such a tick (up to 512 hosts).
        let at = Instant::now();
        let report = black_box(publisher.tick(t, &mut store));
        for cluster in &report.gauges_due {
            publisher.host_gauges(cluster, |update| {
                black_box(update);
            });
        }
        refresh_ns += at.elapsed().as_nanos();
        refreshes += 1;
        if report.refreshed == 0 {
            panic!("micro: the publisher did not refresh");
        }
        if !report.adopted.is_empty() {
            let at = Instant::now();
            let report = black_box(adopter.tick(t + 1_000_000, &mut store));
            adopt_ns += at.elapsed().as_nanos();
            adoptions += 1;
            if report.refreshed > 0 || report.adopted.is_empty() {
                panic!("micro: the other VM refreshed, or adopted no table");
            }
        }
        t += interval;
    }
    Some((
        (refresh_ns as f64 / refreshes as f64, refreshes),
        (adopt_ns as f64 / adoptions as f64, adoptions),
    ))
}

/// Two worker VMs over `n` static endpoints on one store, warmed up for five seconds: the first
/// serves every host a few requests and ticks, the second ticks a millisecond later. Returns the
/// store, the two VMs and the time of the next second.
fn warmed_pair(n: usize) -> Option<(Memory, Worker, Worker, u64)> {
    const SEC: u64 = 1_000_000_000;
    let mut store = Memory::default();
    let mut first = Worker::new(static_config(n)?, 1);
    let mut second = Worker::new(static_config(n)?, 2);
    let mut t = SEC;
    for _ in 0..5 {
        serve(&mut first, 4 * n, t, |_| 20.0);
        first.tick(t, &mut store);
        second.tick(t + 1_000_000, &mut store);
        t += SEC;
    }
    Some((store, first, second, t))
}

/// The tick of a VM that has met every one of `n` hosts (served each a few requests while
/// warming up) and sampled [`SAMPLED`] requests since its last tick, as a VM of a long-running
/// Envoy does: what it keeps per host must not make each tick cost the cluster. Another VM folds
/// just before each measured tick, so the measured one only writes its batch; ticks that adopted
/// a new table are left out (the adopting row has them).
fn met_tick(n: usize, budget: Duration) -> Option<(f64, u64)> {
    let (mut store, mut ticker, mut folder, mut t) = warmed_pair(n)?;
    let interval = folder.config().policy().refresh_interval_ns;
    let (mut tick_ns, mut ticks) = (0u128, 0u64);
    let start = Instant::now();
    while start.elapsed() < budget || ticks < 3 {
        folder.tick(t, &mut store);
        serve(&mut ticker, SAMPLED, t + 1_000_000, |_| 20.0);
        let at = Instant::now();
        let report = black_box(ticker.tick(t + 2_000_000, &mut store));
        let elapsed = at.elapsed().as_nanos();
        if report.refreshed > 0 {
            panic!("micro: the measured VM refreshed");
        }
        // A tick that adopted a new table is the row above's; this one is the batch's cost.
        if report.adopted.is_empty() {
            tick_ns += elapsed;
            ticks += 1;
        } else if start.elapsed() > 20 * budget {
            panic!("micro: every tick adopted a table");
        }
        t += interval;
    }
    Some((tick_ns as f64 / ticks as f64, ticks))
}

/// A markdown table: one row per operation, one column per host count; then one row each for
/// the operations that have no host count.
pub fn markdown(results: &[MicroResult]) -> String {
    let mut counts: Vec<usize> = results.iter().map(|r| r.hosts).filter(|&h| h > 0).collect();
    counts.sort_unstable();
    counts.dedup();
    let mut ops: Vec<&str> = Vec::new();
    for r in results {
        if r.hosts > 0 && !ops.contains(&r.op.as_str()) {
            ops.push(&r.op);
        }
    }
    let mut t = String::from("| operation (ns per op) |");
    for c in &counts {
        let _ = write!(t, " {c} hosts |");
    }
    t.push_str("\n|---|");
    for _ in &counts {
        t.push_str("---|");
    }
    t.push('\n');
    for op in ops {
        let _ = write!(t, "| `{op}` |");
        for c in &counts {
            match results.iter().find(|r| r.op == op && r.hosts == *c) {
                Some(MicroResult { bytes: Some(b), .. }) => {
                    let _ = write!(t, " {b} |");
                }
                Some(r) => {
                    let _ = write!(t, " {} |", human_ns(r.ns_per_op));
                }
                None => t.push_str(" - |"),
            }
        }
        t.push('\n');
    }
    let single: Vec<&MicroResult> = results.iter().filter(|r| r.hosts == 0).collect();
    if !single.is_empty() {
        t.push_str("\n| operation | ns per op |\n|---|---|\n");
        for r in single {
            let _ = writeln!(t, "| {} | {} |", r.op, human_ns(r.ns_per_op));
        }
    }
    t
}

/// "812 ns", "41.2 µs" (as ns with a thousands hint), "1.35 ms".
pub fn human_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.0} ns ({:.2} ms)", ns, ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.0} ns ({:.1} µs)", ns, ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}
