//! A system to test end to end: real backends on 127.0.0.1, the shipped Envoy config pointed at
//! them, a real Envoy running the real plugin. Every process is owned by a value whose `Drop`
//! stops it, so a failing test cleans up too.
//!
//! The cluster's endpoints are in the config ([`Stack::start`]) or in a file Envoy watches
//! ([`Stack::start_eds`], [`Stack::start_zoned`]): then backends join, leave and are replaced
//! while load runs, as pods do in a rollout, and each may have a zone.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::backend::{Backend, BackendPool, BackendSpec};
use crate::config::{EnvoyConfig, CLUSTER, LISTENER};
use crate::eds::{EdsFile, Endpoint};
use crate::envoy::{Envoy, EnvoyOptions};
use crate::load::{self, LoadSpec, Record};
use crate::{http, paths, poll};

/// The plugin's status page (its default `status_path`).
pub const STATUS_PATH: &str = "/ewma-lb/status";

/// How long a start waits for Envoy to hold every backend healthy: a first check that failed
/// is made good by `healthy_threshold` (2) more, 3 s apart in the shipped config.
const HEALTHY_LIMIT: Duration = Duration::from_secs(20);

/// Backends behind a real Envoy running the shipped config.
pub struct Stack {
    pub envoy: Envoy,
    /// The backends in the cluster now (those that left are handed back by [`Stack::leave`]).
    pub backends: Vec<Backend>,
    /// `http://127.0.0.1:PORT`, the listener.
    pub url: String,
    pool: BackendPool,
    /// The endpoints' file, when the cluster reads them from one.
    eds: Option<EdsFile>,
    /// Envoy's worker threads (`--concurrency`).
    workers: u32,
}

impl Stack {
    /// The shipped config as it is, in front of `specs`.
    pub fn start(specs: Vec<BackendSpec>) -> Result<Stack> {
        Stack::start_with(specs, |_| Ok(()))
    }

    /// The shipped config with the plugin configuration `json` instead of its own.
    pub fn with_plugin_config(specs: Vec<BackendSpec>, json: &str) -> Result<Stack> {
        Stack::start_with(specs, |config| {
            config.plugin()?.set_plugin_config(json)?;
            Ok(())
        })
    }

    /// The shipped config pointed at `specs`' backends, then `edit` applied to it.
    pub fn start_with(
        specs: Vec<BackendSpec>,
        edit: impl FnOnce(&mut EnvoyConfig) -> Result<()>,
    ) -> Result<Stack> {
        Stack::start_with_options(specs, edit, |_| {})
    }

    /// As [`Stack::start_with`], with Envoy's command line changed by `options` (e.g. its
    /// `concurrency`).
    pub fn start_with_options(
        specs: Vec<BackendSpec>,
        edit: impl FnOnce(&mut EnvoyConfig) -> Result<()>,
        options: impl FnOnce(&mut EnvoyOptions),
    ) -> Result<Stack> {
        let pool = BackendPool::new()?;
        let backends = pool.start_all(specs)?;
        let mut config = EnvoyConfig::local(0, &paths::plugin_wasm()?)?;
        config
            .cluster(CLUSTER)?
            .set_endpoints(&backends.iter().map(Backend::addr).collect::<Vec<_>>())?;
        edit(&mut config)?;
        Stack::run(config, pool, backends, None, options)
    }

    /// The shipped config with the cluster's endpoints in a file Envoy watches (EDS), so
    /// backends can [`join`](Stack::join) and [`leave`](Stack::leave) under load; then `edit`.
    pub fn start_eds(
        specs: Vec<BackendSpec>,
        edit: impl FnOnce(&mut EnvoyConfig) -> Result<()>,
    ) -> Result<Stack> {
        Stack::start_zoned(None, vec![(None, specs)], edit)
    }

    /// [`Stack::start_eds`] with zones: the proxy's own zone in the bootstrap's `node.locality`
    /// (`local_zone`), and each group of backends in its zone's locality.
    pub fn start_zoned(
        local_zone: Option<&str>,
        groups: Vec<(Option<&str>, Vec<BackendSpec>)>,
        edit: impl FnOnce(&mut EnvoyConfig) -> Result<()>,
    ) -> Result<Stack> {
        let pool = BackendPool::new()?;
        let (mut backends, mut endpoints) = (Vec::new(), Vec::new());
        for (zone, specs) in groups {
            for b in pool.start_all(specs)? {
                endpoints.push(Endpoint::new(b.addr(), zone));
                backends.push(b);
            }
        }
        let eds = EdsFile::create(CLUSTER, endpoints)?;
        let mut config = EnvoyConfig::local(0, &paths::plugin_wasm()?)?;
        config.use_eds_file(CLUSTER, &eds)?;
        if let Some(zone) = local_zone {
            config.set_node_zone(zone)?;
        }
        edit(&mut config)?;
        Stack::run(config, pool, backends, Some(eds), |_| {})
    }

    fn run(
        mut config: EnvoyConfig,
        pool: BackendPool,
        backends: Vec<Backend>,
        eds: Option<EdsFile>,
        options: impl FnOnce(&mut EnvoyOptions),
    ) -> Result<Stack> {
        // Flush Envoy's log often: some tests read what the plugin logged moments ago.
        let mut opts = EnvoyOptions {
            extra_args: vec!["--file-flush-interval-msec".into(), "100".into()],
            ..EnvoyOptions::default()
        };
        options(&mut opts);
        // The config as edited; a start that found its admin port taken picks another.
        let mut retry = false;
        let envoy = Envoy::start_retrying_taken_ports(|| {
            if std::mem::replace(&mut retry, true) {
                config.pick_admin_port()?;
            }
            Ok(EnvoyOptions {
                config_yaml: config.to_yaml()?,
                ..opts.clone()
            })
        })?;
        // The listener's port: Envoy's choice when the config left it at 0.
        let url = format!("http://{}", envoy.listener_addr(LISTENER)?);
        let stack = Stack {
            envoy,
            backends,
            url,
            pool,
            eds,
            workers: opts.concurrency,
        };
        // Every backend answers its health checks when it starts; one whose first check still
        // failed (Envoy's main thread compiling the module on a loaded machine while the check
        // timed out) would get nothing, from Envoy or the plugin, for `healthy_threshold` checks:
        // seconds that no test here is about.
        stack.wait_all_healthy(HEALTHY_LIMIT)?;
        Ok(stack)
    }

    fn eds(&mut self) -> Result<&mut EdsFile> {
        self.eds.as_mut().context("this stack's endpoints are in the config: start it with Stack::start_eds to change them")
    }

    /// Starts backends and adds them to the cluster in `zone` (one EDS update); returns their
    /// addresses. Envoy takes a moment to read the file: see [`Stack::wait_for_endpoints`].
    pub fn join(&mut self, specs: Vec<BackendSpec>, zone: Option<&str>) -> Result<Vec<SocketAddr>> {
        let started = self.pool.start_all(specs)?;
        let addrs: Vec<SocketAddr> = started.iter().map(Backend::addr).collect();
        self.eds()?
            .add(addrs.iter().map(|a| Endpoint::new(*a, zone)))?;
        self.backends.extend(started);
        Ok(addrs)
    }

    /// Takes the named backends out of the cluster (one EDS update) and hands them back still
    /// running: the caller decides when they stop (after Envoy let go of them, a pod that
    /// drains; at once, a pod that dies).
    pub fn leave(&mut self, names: &[&str]) -> Result<Vec<Backend>> {
        for name in names {
            self.backend(name)?;
        }
        let (gone, kept): (Vec<Backend>, Vec<Backend>) = std::mem::take(&mut self.backends)
            .into_iter()
            .partition(|b| names.contains(&b.name()));
        self.backends = kept;
        let addrs: Vec<SocketAddr> = gone.iter().map(Backend::addr).collect();
        self.eds()?.remove(&addrs)?;
        Ok(gone)
    }

    /// A rolling restart's step: a new backend takes the place (and the zone) of `name` in one
    /// EDS update; the old one is handed back still running, as [`Stack::leave`] does.
    pub fn replace(&mut self, name: &str, spec: BackendSpec) -> Result<Backend> {
        let old_addr = self.backend(name)?.addr();
        let new = self.pool.start(spec)?;
        let eds = self.eds()?;
        let endpoints: Vec<Endpoint> = eds
            .endpoints()
            .iter()
            .map(|e| {
                if e.addr == old_addr {
                    Endpoint {
                        addr: new.addr(),
                        zone: e.zone.clone(),
                    }
                } else {
                    e.clone()
                }
            })
            .collect();
        eds.set(endpoints)?;
        let at = self
            .backends
            .iter()
            .position(|b| b.addr() == old_addr)
            .context("replaced backend vanished")?;
        Ok(std::mem::replace(&mut self.backends[at], new))
    }

    /// Waits until Envoy's cluster has exactly the endpoints of the file's last version; how
    /// long that took.
    pub fn wait_for_endpoints(&self, limit: Duration) -> Result<Duration> {
        let eds = self.eds.as_ref().context("this stack has no EDS file")?;
        let mut want: Vec<SocketAddr> = eds.endpoints().iter().map(|e| e.addr).collect();
        want.sort();
        let mut have = Vec::new();
        let took = poll::poll(limit, Duration::from_millis(20), || {
            have = self.envoy.cluster_hosts(CLUSTER).unwrap_or_default();
            have == want
        });
        took.ok_or_else(|| anyhow!("Envoy's cluster {CLUSTER} did not match the EDS file within {limit:?}: has {have:?}, file has {want:?}"))
    }

    pub fn backend(&self, name: &str) -> Result<&Backend> {
        self.backends
            .iter()
            .find(|b| b.name() == name)
            .ok_or_else(|| anyhow!("no backend {name}"))
    }

    /// Requests each backend served since the last [`Stack::reset_counts`].
    pub fn served(&self) -> Vec<(String, u64)> {
        self.backends
            .iter()
            .map(|b| (b.name().to_string(), b.served()))
            .collect()
    }

    pub fn reset_counts(&self) {
        self.backends.iter().for_each(Backend::reset_counts);
    }

    /// Open-loop load on `/work` at `rate` requests/s for `secs`, on this thread.
    pub fn load(&self, rate: f64, secs: u64) -> Result<Vec<Record>> {
        load::run(&self.load_spec(rate, secs))
    }

    /// Sends bursts of concurrent requests until every Envoy worker has adopted a pick table for
    /// the cluster (the plugin's debug line `adopted table v...`, which carries the worker's
    /// thread), within 10 s. Envoy hands each connection to one worker; a worker that meets the
    /// cluster for the first time has no table until the tick its first request asks for, and
    /// leaves the requests before it to Envoy's own balancer (`fallback:table_not_ready` in the
    /// access log). A test that judges where the plugin sends requests calls this first, so that
    /// a later connection landing on a worker the warm-up missed cannot pass that fallback off as
    /// the plugin's pick.
    pub fn warm_every_worker(&self) -> Result<()> {
        let workers = self.workers as usize;
        for _ in 0..20 {
            if self.workers_with_table() >= workers {
                return Ok(());
            }
            // Sixteen connections at once: each lands on a worker of the kernel's or Envoy's
            // choosing, so every worker gets some, whichever way it chooses.
            load::run(&LoadSpec {
                closed_loop_workers: Some(16),
                duration: Duration::from_millis(300),
                ..self.load_spec(0.0, 0)
            })?;
            // A tick or more (100 ms) for each worker to adopt the table, and Envoy's log
            // flush (100 ms) for the line to be read.
            thread::sleep(Duration::from_millis(300));
        }
        bail!(
            "{} of {workers} workers adopted a table for {CLUSTER} after 20 bursts",
            self.workers_with_table()
        )
    }

    /// How many of Envoy's threads have adopted a pick table for the cluster so far (the
    /// plugin's debug line `adopted table v...`, which carries the thread; read from the log,
    /// which Envoy flushes every 100 ms).
    pub fn workers_with_table(&self) -> usize {
        let cluster = format!("for cluster {CLUSTER}:");
        let log = self.envoy.log();
        let threads: BTreeSet<&str> = log
            .lines()
            .filter(|l| l.contains("adopted table v") && l.contains(&cluster))
            .filter_map(crate::envoy::log_thread)
            .collect();
        threads.len()
    }

    /// The same load on a background thread; join it to get the records.
    pub fn load_in_background(
        &self,
        rate: f64,
        secs: u64,
    ) -> thread::JoinHandle<Result<Vec<Record>>> {
        let spec = self.load_spec(rate, secs);
        thread::spawn(move || load::run(&spec))
    }

    /// [`Stack::load_in_background`] whose records count `sent_at` from `epoch` (an instant of
    /// the caller's, taken before this call), so they can be compared with the caller's clock
    /// to the millisecond.
    pub fn load_in_background_from(
        &self,
        epoch: std::time::Instant,
        rate: f64,
        secs: u64,
    ) -> thread::JoinHandle<Result<Vec<Record>>> {
        let spec = LoadSpec {
            epoch: Some(epoch),
            ..self.load_spec(rate, secs)
        };
        thread::spawn(move || load::run(&spec))
    }

    fn load_spec(&self, rate: f64, secs: u64) -> LoadSpec {
        LoadSpec::new(
            format!("{}/work", self.url),
            rate,
            Duration::from_secs(secs),
        )
    }

    /// The plugin's status document, fetched through Envoy from 127.0.0.1.
    pub fn status(&self) -> Result<Value> {
        let r = http::get(&format!("{}{STATUS_PATH}", self.url), &[])?;
        if r.status != 200 {
            bail!("status page answered {}: {}", r.status, r.body);
        }
        serde_json::from_str(&r.body).with_context(|| format!("status JSON: {}", r.body))
    }

    /// Waits until Envoy's active health checks hold every backend healthy (its `/clusters`
    /// page); every start does. A host whose first check fails (a slow health endpoint while a
    /// loaded machine starts several Envoys) stays out of Envoy's balancing, and out of the
    /// plugin's table (`envoy_health`), until `healthy_threshold` checks pass, seconds later: a
    /// test about what the plugin does with a host needs the host in the cluster first. An error
    /// names the hosts still not healthy after `limit`.
    pub fn wait_all_healthy(&self, limit: Duration) -> Result<()> {
        let unhealthy = || -> Vec<String> {
            let page = self.envoy.admin_get("/clusters").unwrap_or_default();
            self.backends
                .iter()
                .map(|b| b.addr().to_string())
                .filter(|addr| {
                    let line = format!("{CLUSTER}::{addr}::health_flags::healthy");
                    !page.lines().any(|l| l == line)
                })
                .collect()
        };
        if crate::within(limit, || unhealthy().is_empty()).is_none() {
            bail!(
                "Envoy's health checks did not pass for {:?} within {limit:?}",
                unhealthy()
            );
        }
        Ok(())
    }

    /// One backend's entry of the status document, `Null` when the plugin does not know it.
    pub fn host_status(&self, backend: &str) -> Result<Value> {
        let addr = self.backend(backend)?.addr().to_string();
        let status = self.status()?;
        let hosts = status["clusters"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["hosts"].as_array().cloned().unwrap_or_default());
        Ok(hosts
            .into_iter()
            .find(|h| h["host"] == addr.as_str())
            .unwrap_or(Value::Null))
    }

    /// A sample from Envoy's `/stats/prometheus`: `metric{labels}` exactly as printed, e.g.
    /// `ewma_lb_steered_requests_total{cluster_name="backend"}`. `None` when absent.
    pub fn prometheus(&self, series: &str) -> Option<f64> {
        let text = self.envoy.admin_get("/stats/prometheus").ok()?;
        text.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
    }
}
