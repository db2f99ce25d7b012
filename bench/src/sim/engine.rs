//! The event loop of one simulated run: one policy over the whole fleet, in virtual time.
//!
//! Events: an arrival (the next one is scheduled when one is handled), a host finishing a
//! request, a request's route timeout, a worker's tick, a host joining the cluster, and the end of
//! the warm-up (when utilisation starts to count). Ties in time go by scheduling order, so a run
//! is a function of its seed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::rc::Rc;
use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use ewma_lb::balance::outcome::Outcome;
use ewma_lb::config::Config;
use ewma_lb::worker::{Decision, Finished, Request, Worker};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{host_address, Arrivals, SimSpec};
use crate::policy::{merge, Balancer, Policy};
use ewma_lb::testing::MemoryStore;

/// The cluster every simulated proxy routes to.
pub const CLUSTER: &str = "backend";
const NS_PER_SEC: u64 = 1_000_000_000;
/// Added to virtual time for the VMs' clock readings, so no reading is 0.
const CLOCK_OFFSET_NS: u64 = NS_PER_SEC;
/// Service time of a request that fails fast.
const FAST_FAILURE_NS: u64 = 1_000_000;
/// Latencies are recorded up to this (µs); longer ones are clamped.
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// What one run measured.
pub struct RunOutput {
    pub policy: String,
    /// Latency of the measured window's requests, µs.
    pub latency_us: Histogram<u64>,
    pub count: u64,
    pub errors: u64,
    pub sum_latency_us: u128,
    /// Requests sent per second (index) per host (index), over the whole run.
    pub per_second: Vec<Vec<u32>>,
    /// Server-time each host was busy within the measured window, ns.
    pub busy_ns: Vec<f64>,
    /// Requests the plugin steered, and those it left to the fallback (plugin policies).
    pub steered: u64,
    pub fallback: u64,
    /// Wall-clock time of the run.
    pub wall_s: f64,
}

/// One answered request as an access log line would tell it ([`run_logged`]).
#[derive(Clone, Debug, PartialEq)]
pub struct LoggedRequest {
    pub arrival_ns: u64,
    /// Index of the host in `SimSpec::hosts`.
    pub host: u32,
    pub latency_ns: u64,
    pub outcome: Outcome,
    /// The plugin's decision as the access log's `ewma_lb` field has it; `None` for Envoy's own
    /// balancers.
    pub decision: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrival,
    Done {
        req: u32,
        generation: u32,
    },
    Timeout {
        req: u32,
        generation: u32,
    },
    Tick {
        proxy: u32,
        worker: u32,
    },
    Join {
        host: u32,
    },
    /// The end of the warm-up: utilisation counts from here ...
    Measure,
    /// ... to here, the end of the arrivals.
    MeasureEnd,
}

struct Req {
    /// Bumped every time the slot is reused, so an event of an earlier request in the same slot
    /// is recognised and ignored.
    generation: u32,
    arrival_ns: u64,
    proxy: u32,
    worker: u32,
    host: u32,
    /// The plugin's pick, when it made one.
    picked: Option<Rc<str>>,
    /// Whether the plugin takes a sample of it.
    sampled: bool,
    failed: bool,
    timeout_scheduled: bool,
    /// The client has its answer (or its timeout).
    answered: bool,
    /// The host is done with it (served it, or dropped it when Envoy gave up).
    served: bool,
    /// In service now (a server of its host is busy with it).
    in_service: bool,
    /// Its class's factor on the host's service time (`SimSpec::costs`).
    cost: f64,
    /// The decision's access log value, kept only by [`run_logged`].
    decision: Option<String>,
}

struct Host {
    addr: String,
    capacity: usize,
    busy: usize,
    queue: VecDeque<u32>,
    present: bool,
    /// ∫ busy dt since the start, server-ns, up to `last_ns`.
    busy_integral: f64,
    last_ns: u64,
    /// `busy_integral` at the end of the warm-up and at the end of the arrivals.
    busy_at_measure: f64,
    busy_at_end: Option<f64>,
}

impl Host {
    fn account(&mut self, now_ns: u64) {
        self.busy_integral += self.busy as f64 * now_ns.saturating_sub(self.last_ns) as f64;
        self.last_ns = now_ns;
    }
}

struct Proxy {
    workers: Vec<Worker>,
    store: MemoryStore,
    /// Requests in flight per host, over all workers: what Envoy's least request compares
    /// (`rq_active` is a host's, shared by the process's workers).
    active: Vec<u32>,
    /// Next index of each worker's round robin.
    rr: Vec<usize>,
}

/// Runs `policy` over `spec` and returns what it measured.
pub fn run(spec: &SimSpec, policy: &Policy) -> Result<RunOutput> {
    let started = Instant::now();
    let mut engine = Engine::new(spec, policy)?;
    engine.run();
    let mut out = engine.out;
    out.wall_s = started.elapsed().as_secs_f64();
    Ok(out)
}

/// [`run`], also returning every answered request in the order of their answers, as an access
/// log has them (synthetic logs for `ewma-lb-tune`'s tests).
pub fn run_logged(spec: &SimSpec, policy: &Policy) -> Result<(RunOutput, Vec<LoggedRequest>)> {
    let started = Instant::now();
    let mut engine = Engine::new(spec, policy)?;
    engine.log = Some(Vec::new());
    engine.run();
    let log = engine.log.take().unwrap_or_default();
    let mut out = engine.out;
    out.wall_s = started.elapsed().as_secs_f64();
    Ok((out, log))
}

/// The plugin configuration a plugin policy runs with in the simulation: the policy's, plus
/// the first hosts as static endpoints when the spec says so.
pub fn plugin_config(spec: &SimSpec, policy: &Policy) -> Result<Option<Config>> {
    let Some(mut json) = policy.plugin_config(&spec.plugin_config) else {
        return Ok(None);
    };
    if spec.static_endpoints {
        let endpoints: Vec<String> = spec
            .hosts
            .iter()
            .enumerate()
            .filter(|(_, h)| h.join_s <= 0.0)
            .map(|(i, _)| host_address(i))
            .collect();
        merge(
            &mut json,
            &serde_json::json!({"clusters": {CLUSTER: {"endpoints": endpoints}}}),
        );
    }
    let text = serde_json::to_string(&json)?;
    Config::from_json(text.as_bytes())
        .map(Some)
        .map_err(|e| anyhow!("plugin_config for {policy}: {e}"))
}

struct Engine<'a> {
    spec: &'a SimSpec,
    balancer: Balancer,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    now_ns: u64,
    hosts: Vec<Host>,
    /// Indices of the hosts in the cluster now.
    present: Vec<u32>,
    by_addr: HashMap<String, u32>,
    proxies: Vec<Proxy>,
    reqs: Vec<Req>,
    free: Vec<u32>,
    arrival_rng: StdRng,
    lb_rng: StdRng,
    service_rng: StdRng,
    next_arrival: u64,
    tick_ns: u64,
    measure_from_ns: u64,
    arrivals_end_ns: u64,
    end_ns: u64,
    out: RunOutput,
    log: Option<Vec<LoggedRequest>>,
    decision_buf: String,
    /// `/clusters` as Envoy would print it now; empty until asked and after a host joined.
    clusters_page: String,
}

impl<'a> Engine<'a> {
    fn new(spec: &'a SimSpec, policy: &'a Policy) -> Result<Engine<'a>> {
        if policy.balancer() == Balancer::ClientSideWrr {
            bail!(
                "policy {policy}: the simulator has no model of client_side_weighted_round_robin (it needs ORCA reports): compare it through a real Envoy"
            );
        }
        if spec.hosts.is_empty() || spec.proxies == 0 || spec.workers == 0 {
            bail!("a simulation needs hosts, proxies and workers");
        }
        let config = plugin_config(spec, policy)?;
        let tick_ns = config.as_ref().map_or(0, |c| {
            u64::try_from(c.tick_period().as_nanos()).unwrap_or(u64::MAX)
        });
        let hosts: Vec<Host> = spec
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| Host {
                addr: host_address(i),
                capacity: h.capacity.unwrap_or(usize::MAX),
                busy: 0,
                queue: VecDeque::new(),
                present: h.join_s <= 0.0,
                busy_integral: 0.0,
                last_ns: 0,
                busy_at_measure: 0.0,
                busy_at_end: None,
            })
            .collect();
        let present = (0..hosts.len() as u32)
            .filter(|i| hosts[*i as usize].present)
            .collect();
        let by_addr = hosts
            .iter()
            .enumerate()
            .map(|(i, h)| (h.addr.clone(), i as u32))
            .collect();
        let proxies = (0..spec.proxies)
            .map(|p| Proxy {
                workers: match &config {
                    Some(c) => (0..spec.workers)
                        .map(|w| Worker::new(c.clone(), worker_seed(spec.seed, p, w)))
                        .collect(),
                    None => Vec::new(),
                },
                store: MemoryStore::default(),
                active: vec![0; spec.hosts.len()],
                rr: vec![0; spec.workers],
            })
            .collect();
        let seconds = spec.duration.as_secs() as usize + 1;
        let duration_ns = u64::try_from(spec.duration.as_nanos()).unwrap_or(u64::MAX);
        let timeout_ns = u64::try_from(spec.route_timeout.as_nanos()).unwrap_or(u64::MAX);
        let mut engine = Engine {
            spec,
            balancer: policy.balancer(),
            events: BinaryHeap::new(),
            seq: 0,
            now_ns: 0,
            hosts,
            present,
            by_addr,
            proxies,
            reqs: Vec::new(),
            free: Vec::new(),
            arrival_rng: StdRng::seed_from_u64(spec.seed ^ 0x0a11_7a1e),
            lb_rng: StdRng::seed_from_u64(spec.seed ^ 0x1b),
            service_rng: StdRng::seed_from_u64(spec.seed ^ 0x05e4_11ce),
            next_arrival: 0,
            tick_ns,
            measure_from_ns: u64::try_from(spec.warmup.as_nanos()).unwrap_or(0),
            arrivals_end_ns: duration_ns,
            end_ns: duration_ns
                .saturating_add(timeout_ns)
                .saturating_add(NS_PER_SEC),
            out: RunOutput {
                policy: policy.name().to_owned(),
                latency_us: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
                    .map_err(|e| anyhow!("histogram: {e}"))?,
                count: 0,
                errors: 0,
                sum_latency_us: 0,
                per_second: vec![vec![0; spec.hosts.len()]; seconds],
                busy_ns: vec![0.0; spec.hosts.len()],
                steered: 0,
                fallback: 0,
                wall_s: 0.0,
            },
            log: None,
            decision_buf: String::new(),
            clusters_page: String::new(),
        };
        for (p, proxy) in engine.proxies.iter().enumerate() {
            for w in 0..proxy.workers.len() {
                // Random phases: VMs start and tick independently.
                let phase = engine.lb_rng.random_range(0..tick_ns.max(1));
                let ev = Event::Tick {
                    proxy: p as u32,
                    worker: w as u32,
                };
                engine.seq += 1;
                engine.events.push(Reverse((phase, engine.seq, ev)));
            }
        }
        // Each worker's round robin starts at a random host, as Envoy's does.
        let n = engine.present.len().max(1);
        for proxy in &mut engine.proxies {
            for rr in &mut proxy.rr {
                *rr = engine.lb_rng.random_range(0..n);
            }
        }
        for (i, h) in spec
            .hosts
            .iter()
            .enumerate()
            .filter(|(_, h)| h.join_s > 0.0)
        {
            engine.schedule(
                (h.join_s * NS_PER_SEC as f64) as u64,
                Event::Join { host: i as u32 },
            );
        }
        engine.schedule(engine.measure_from_ns, Event::Measure);
        engine.schedule(engine.arrivals_end_ns, Event::MeasureEnd);
        match &spec.arrivals {
            Arrivals::Closed { clients } => {
                for _ in 0..*clients {
                    engine.schedule(0, Event::Arrival);
                }
            }
            Arrivals::Uniform | Arrivals::Poisson => engine.schedule(0, Event::Arrival),
            Arrivals::Trace(times) => {
                if let Some(first) = times.first().copied() {
                    engine.schedule(first, Event::Arrival);
                }
            }
        }
        Ok(engine)
    }
}

impl Engine<'_> {
    fn schedule(&mut self, at_ns: u64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((at_ns, self.seq, event)));
    }

    fn run(&mut self) {
        while let Some(Reverse((at_ns, _, event))) = self.events.pop() {
            if at_ns > self.end_ns {
                break;
            }
            self.now_ns = at_ns;
            match event {
                Event::Arrival => self.arrival(),
                Event::Done { req, generation } if self.current(req, generation) => self.done(req),
                Event::Timeout { req, generation } if self.current(req, generation) => {
                    self.timeout(req)
                }
                Event::Done { .. } | Event::Timeout { .. } => {}
                Event::Tick { proxy, worker } => self.tick(proxy, worker),
                Event::Join { host } => self.join(host),
                Event::Measure => {
                    for h in &mut self.hosts {
                        h.account(at_ns);
                        h.busy_at_measure = h.busy_integral;
                    }
                }
                Event::MeasureEnd => {
                    for h in &mut self.hosts {
                        h.account(at_ns);
                        h.busy_at_end = Some(h.busy_integral);
                    }
                }
            }
        }
        let end = self.end_ns;
        for (h, busy) in self.hosts.iter_mut().zip(&mut self.out.busy_ns) {
            h.account(end);
            *busy = h.busy_at_end.unwrap_or(h.busy_integral) - h.busy_at_measure;
        }
    }

    fn arrival(&mut self) {
        let spec = self.spec;
        let proxy = if spec.proxies > 1 {
            self.arrival_rng.random_range(0..spec.proxies)
        } else {
            0
        };
        let worker = if spec.workers > 1 {
            self.arrival_rng.random_range(0..spec.workers)
        } else {
            0
        };
        self.next_arrival += 1;
        let next_ns = match &spec.arrivals {
            Arrivals::Trace(times) => times.get(self.next_arrival as usize).copied(),
            Arrivals::Uniform => {
                Some((self.next_arrival as f64 * NS_PER_SEC as f64 / spec.rate) as u64)
            }
            Arrivals::Poisson => {
                let u: f64 = self.arrival_rng.random();
                Some(self.now_ns + (-(1.0 - u).ln() / spec.rate * NS_PER_SEC as f64) as u64)
            }
            // The client's next request follows its answer (`answer`).
            Arrivals::Closed { .. } => None,
        };
        if let Some(next_ns) = next_ns.filter(|t| *t < self.arrivals_end_ns) {
            self.schedule(next_ns, Event::Arrival);
        }
        self.dispatch(proxy as u32, worker as u32);
    }

    /// Envoy's least request: two random hosts (with replacement), the one with fewer active
    /// requests in this process wins, the first on a tie.
    fn least_request(&mut self, proxy: usize) -> u32 {
        let n = self.present.len();
        let a = self.present[self.lb_rng.random_range(0..n)];
        let b = self.present[self.lb_rng.random_range(0..n)];
        let active = &self.proxies[proxy].active;
        if active[b as usize] < active[a as usize] {
            b
        } else {
            a
        }
    }

    fn dispatch(&mut self, proxy: u32, worker: u32) {
        let (p, w) = (proxy as usize, worker as usize);
        if self.present.is_empty() {
            return;
        }
        let (mut picked, mut sampled) = (None, false);
        let host = match self.balancer {
            Balancer::RoundRobin => {
                let rr = &mut self.proxies[p].rr[w];
                *rr = (*rr + 1) % self.present.len();
                self.present[*rr]
            }
            Balancer::Random => self.present[self.lb_rng.random_range(0..self.present.len())],
            // Refused in `Engine::new`; least request is the nearest model should one get here.
            Balancer::LeastRequest | Balancer::ClientSideWrr => self.least_request(p),
            Balancer::Plugin => {
                let vm = &mut self.proxies[p].workers[w];
                let request = Request {
                    path: b"/",
                    cluster: Some(CLUSTER),
                    now_ns: vm.clock(self.now_ns + CLOCK_OFFSET_NS),
                    body_pending: false,
                };
                let decision = vm.route(&request, || None);
                sampled = decision.is_sampled();
                if self.log.is_some() {
                    let version = vm.table_version(CLUSTER);
                    decision.write_log_value(version, &mut self.decision_buf);
                }
                match decision {
                    Decision::Override(pick) => {
                        self.out.steered += 1;
                        let chosen = self
                            .by_addr
                            .get(&*pick.host)
                            .copied()
                            .filter(|h| self.hosts[*h as usize].present);
                        picked = Some(pick.host);
                        // Envoy serves an override it does not have through the fallback.
                        match chosen {
                            Some(h) => h,
                            None => self.least_request(p),
                        }
                    }
                    _ => {
                        self.out.fallback += 1;
                        self.least_request(p)
                    }
                }
            }
        };
        self.proxies[p].active[host as usize] += 1;
        let second = (self.now_ns / NS_PER_SEC) as usize;
        if let Some(row) = self.out.per_second.get_mut(second) {
            row[host as usize] += 1;
        }
        let cost = self.draw_cost();
        let mut req = Req {
            cost,
            generation: 0,
            arrival_ns: self.now_ns,
            proxy,
            worker,
            host,
            picked,
            sampled,
            failed: false,
            timeout_scheduled: false,
            answered: false,
            served: false,
            in_service: false,
            decision: match (&self.log, self.balancer) {
                (Some(_), Balancer::Plugin) => Some(self.decision_buf.clone()),
                _ => None,
            },
        };
        let id = match self.free.pop() {
            Some(id) => {
                req.generation = self.reqs[id as usize].generation.wrapping_add(1);
                self.reqs[id as usize] = req;
                id
            }
            None => {
                self.reqs.push(req);
                (self.reqs.len() - 1) as u32
            }
        };
        let h = &mut self.hosts[host as usize];
        if h.busy < h.capacity {
            self.start(id);
        } else {
            h.queue.push_back(id);
            self.schedule_timeout(id);
        }
    }

    /// The cost factor of a new request, drawn by the classes' shares (1 outside every class).
    fn draw_cost(&mut self) -> f64 {
        if self.spec.costs.is_empty() {
            return 1.0;
        }
        let mut r: f64 = self.arrival_rng.random();
        for c in &self.spec.costs {
            if r < c.share {
                return c.factor;
            }
            r -= c.share;
        }
        1.0
    }

    fn current(&self, id: u32, generation: u32) -> bool {
        self.reqs
            .get(id as usize)
            .is_some_and(|r| r.generation == generation)
    }

    fn schedule_timeout(&mut self, id: u32) {
        let r = &mut self.reqs[id as usize];
        if !r.timeout_scheduled {
            r.timeout_scheduled = true;
            let at = r.arrival_ns.saturating_add(
                u64::try_from(self.spec.route_timeout.as_nanos()).unwrap_or(u64::MAX),
            );
            let generation = r.generation;
            self.schedule(
                at,
                Event::Timeout {
                    req: id,
                    generation,
                },
            );
        }
    }

    /// The host starts serving request `id` now.
    fn start(&mut self, id: u32) {
        let host = self.reqs[id as usize].host as usize;
        let spec = &self.spec.hosts[host];
        let h = &mut self.hosts[host];
        h.account(self.now_ns);
        h.busy += 1;
        let t_s = self.now_ns as f64 / NS_PER_SEC as f64;
        let failing = spec.failing_at(t_s);
        let cost = self.reqs[id as usize].cost;
        let (service_ns, failed) = if let Some(model) = &spec.model {
            let (d, failed) = model.sample(t_s, &mut self.service_rng);
            ((d.as_nanos() as f64 * cost) as u64, failed)
        } else if failing > 0.0 && self.service_rng.random_bool(failing.min(1.0)) {
            (FAST_FAILURE_NS, true)
        } else {
            let d = spec.latency_at(t_s).sample(&mut self.service_rng);
            let failed =
                spec.fail_rate > 0.0 && self.service_rng.random_bool(spec.fail_rate.min(1.0));
            ((d.as_nanos() as f64 * cost) as u64, failed)
        };
        self.reqs[id as usize].failed = failed;
        self.reqs[id as usize].in_service = true;
        let done_ns = self.now_ns.saturating_add(service_ns);
        let generation = self.reqs[id as usize].generation;
        self.schedule(
            done_ns,
            Event::Done {
                req: id,
                generation,
            },
        );
        let r = &self.reqs[id as usize];
        if done_ns.saturating_sub(r.arrival_ns)
            > u64::try_from(self.spec.route_timeout.as_nanos()).unwrap_or(u64::MAX)
        {
            self.schedule_timeout(id);
        }
    }

    fn done(&mut self, id: u32) {
        let r = &self.reqs[id as usize];
        if !r.in_service {
            // Dropped at its timeout: the server moved on then.
            return;
        }
        let host = r.host as usize;
        self.finish_service(id);
        if !self.reqs[id as usize].answered {
            let r = &self.reqs[id as usize];
            let outcome = if r.failed {
                Outcome::ServerError
            } else {
                Outcome::Success
            };
            let latency_ns = self.now_ns - r.arrival_ns;
            self.answer(id, outcome, latency_ns);
        }
        self.release(id);
        self.start_next(host);
    }

    /// A server of the request's host is free again.
    fn finish_service(&mut self, id: u32) {
        let r = &mut self.reqs[id as usize];
        r.in_service = false;
        r.served = true;
        let h = &mut self.hosts[r.host as usize];
        h.account(self.now_ns);
        h.busy -= 1;
    }

    /// The host takes the next queued request that Envoy still waits for.
    fn start_next(&mut self, host: usize) {
        while let Some(next) = self.hosts[host].queue.pop_front() {
            if self.reqs[next as usize].answered {
                self.reqs[next as usize].served = true;
                self.release(next);
                continue;
            }
            self.start(next);
            break;
        }
    }

    /// Envoy gives up on a request at the route timeout and resets the upstream stream; the
    /// backend drops it (a hyper server cancels the handler of a closed connection), queued or in
    /// service.
    fn timeout(&mut self, id: u32) {
        if self.reqs[id as usize].answered {
            return;
        }
        let latency_ns = self.now_ns - self.reqs[id as usize].arrival_ns;
        self.answer(id, Outcome::Timeout, latency_ns);
        let r = &self.reqs[id as usize];
        if r.in_service {
            let host = r.host as usize;
            self.finish_service(id);
            self.release(id);
            self.start_next(host);
        }
        // Still queued: it is skipped (and released) when its turn comes.
    }

    fn release(&mut self, id: u32) {
        let r = &mut self.reqs[id as usize];
        if r.answered && r.served {
            r.picked = None;
            self.free.push(id);
        }
    }

    /// The client gets its answer: count it, and hand it to the plugin as Envoy's `on_log` would.
    fn answer(&mut self, id: u32, outcome: Outcome, latency_ns: u64) {
        if matches!(self.spec.arrivals, Arrivals::Closed { .. })
            && self.now_ns < self.arrivals_end_ns
        {
            self.schedule(self.now_ns, Event::Arrival);
        }
        let r = &mut self.reqs[id as usize];
        r.answered = true;
        if let Some(log) = &mut self.log {
            log.push(LoggedRequest {
                arrival_ns: r.arrival_ns,
                host: r.host,
                latency_ns,
                outcome,
                decision: r.decision.take(),
            });
        }
        let (p, w, host) = (r.proxy as usize, r.worker as usize, r.host as usize);
        let proxy = &mut self.proxies[p];
        proxy.active[host] = proxy.active[host].saturating_sub(1);
        if r.arrival_ns >= self.measure_from_ns {
            let us = (latency_ns / 1000).clamp(1, MAX_LATENCY_US);
            let _ = self.out.latency_us.record(us);
            self.out.sum_latency_us += u128::from(us);
            self.out.count += 1;
            self.out.errors += u64::from(outcome.is_failure());
        }
        if r.sampled {
            let worker = &mut proxy.workers[w];
            let num_endpoints = worker
                .wants_endpoint_count(CLUSTER)
                .then_some(self.present.len() as u32);
            let done = Finished {
                picked: r.picked.as_deref(),
                in_flight: r.picked.is_some(),
                served_by: Some(&self.hosts[host].addr),
                attempts: 1,
                latency_ms: latency_ns as f64 / 1e6,
                ended_ns: self.now_ns + CLOCK_OFFSET_NS,
                outcome: Some(outcome),
                num_endpoints,
                ..Finished::default()
            };
            worker.finish(CLUSTER, &done);
        }
    }

    fn tick(&mut self, proxy: u32, worker: u32) {
        let now = self.now_ns + CLOCK_OFFSET_NS;
        let p = &mut self.proxies[proxy as usize];
        if let Some(w) = p.workers.get_mut(worker as usize) {
            // As the filter does: ask `/clusters` when due, take the answer in after the tick
            // (it arrives between ticks). The page lists the hosts present, all healthy: the
            // simulated Envoy runs no health checks of its own.
            let ask = w.envoy_health_due(now);
            w.tick(now, &mut p.store);
            if ask {
                if self.clusters_page.is_empty() {
                    self.clusters_page = clusters_page(&self.hosts, &self.present);
                }
                w.envoy_health(now, self.clusters_page.as_bytes());
            }
        }
        let next = self.now_ns + self.tick_ns;
        if next <= self.end_ns {
            self.schedule(next, Event::Tick { proxy, worker });
        }
    }

    fn join(&mut self, host: u32) {
        let h = &mut self.hosts[host as usize];
        if !h.present {
            h.present = true;
            h.account(self.now_ns);
            self.present.push(host);
            self.clusters_page.clear();
        }
    }
}

/// Envoy's admin `/clusters` for the cluster's `present` hosts, the lines the plugin reads.
fn clusters_page(hosts: &[Host], present: &[u32]) -> String {
    use std::fmt::Write as _;
    let mut page = String::new();
    for &i in present {
        let _ = writeln!(
            page,
            "{CLUSTER}::{}::health_flags::healthy",
            hosts[i as usize].addr
        );
    }
    page
}

fn worker_seed(seed: u64, proxy: usize, worker: usize) -> u64 {
    seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ((proxy as u64) << 16 | worker as u64)
}
