//! A system to test end to end: real backends on 127.0.0.1, the shipped Envoy config pointed at
//! them, a real Envoy running the real plugin. Every process is owned by a value whose `Drop`
//! stops it, so a failing test cleans up too.

use std::thread;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::backend::{Backend, BackendSpec};
use crate::config::{EnvoyConfig, CLUSTER, LISTENER};
use crate::envoy::{Envoy, EnvoyOptions};
use crate::load::{self, LoadSpec, Record};
use crate::{http, paths, ports};

/// The plugin's status page (its default `status_path`).
pub const STATUS_PATH: &str = "/ewma-lb/status";

/// Backends behind a real Envoy running the shipped config.
pub struct Stack {
    pub envoy: Envoy,
    pub backends: Vec<Backend>,
    /// `http://127.0.0.1:PORT`, the listener.
    pub url: String,
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
    pub fn start_with(specs: Vec<BackendSpec>, edit: impl FnOnce(&mut EnvoyConfig) -> Result<()>) -> Result<Stack> {
        Stack::start_with_options(specs, edit, |_| {})
    }

    /// As [`Stack::start_with`], with Envoy's command line changed by `options` (e.g. its
    /// `concurrency`).
    pub fn start_with_options(
        specs: Vec<BackendSpec>,
        edit: impl FnOnce(&mut EnvoyConfig) -> Result<()>,
        options: impl FnOnce(&mut EnvoyOptions),
    ) -> Result<Stack> {
        let backends: Vec<Backend> = specs.into_iter().map(Backend::start_local).collect::<Result<_>>()?;
        let mut config = EnvoyConfig::local(ports::free_port()?, &paths::plugin_wasm()?)?;
        config.cluster(CLUSTER)?.set_endpoints(&backends.iter().map(Backend::addr).collect::<Vec<_>>())?;
        edit(&mut config)?;
        let port = config.listener(LISTENER)?.port()?;
        // Flush Envoy's log often: some tests read what the plugin logged moments ago.
        let mut opts = EnvoyOptions {
            extra_args: vec!["--file-flush-interval-msec".into(), "100".into()],
            ..EnvoyOptions::new(config.to_yaml()?)
        };
        options(&mut opts);
        let envoy = Envoy::start(opts)?;
        Ok(Stack { envoy, backends, url: format!("http://127.0.0.1:{port}") })
    }

    pub fn backend(&self, name: &str) -> Result<&Backend> {
        self.backends.iter().find(|b| b.name() == name).ok_or_else(|| anyhow!("no backend {name}"))
    }

    /// Requests each backend served since the last [`Stack::reset_counts`].
    pub fn served(&self) -> Vec<(String, u64)> {
        self.backends.iter().map(|b| (b.name().to_string(), b.served())).collect()
    }

    pub fn reset_counts(&self) {
        self.backends.iter().for_each(Backend::reset_counts);
    }

    /// Open-loop load on `/work` at `rate` requests/s for `secs`, on this thread.
    pub fn load(&self, rate: f64, secs: u64) -> Result<Vec<Record>> {
        load::run(&self.load_spec(rate, secs))
    }

    /// The same load on a background thread; join it to get the records.
    pub fn load_in_background(&self, rate: f64, secs: u64) -> thread::JoinHandle<Result<Vec<Record>>> {
        let spec = self.load_spec(rate, secs);
        thread::spawn(move || load::run(&spec))
    }

    fn load_spec(&self, rate: f64, secs: u64) -> LoadSpec {
        LoadSpec::new(format!("{}/work", self.url), rate, Duration::from_secs(secs))
    }

    /// The plugin's status document, fetched through Envoy from 127.0.0.1.
    pub fn status(&self) -> Result<Value> {
        let r = http::get(&format!("{}{STATUS_PATH}", self.url), &[])?;
        if r.status != 200 {
            bail!("status page answered {}: {}", r.status, r.body);
        }
        serde_json::from_str(&r.body).with_context(|| format!("status JSON: {}", r.body))
    }

    /// One backend's entry of the status document, `Null` when the plugin does not know it.
    pub fn host_status(&self, backend: &str) -> Result<Value> {
        let addr = self.backend(backend)?.addr().to_string();
        let status = self.status()?;
        let hosts = status["clusters"].as_array().into_iter().flatten().flat_map(|c| c["hosts"].as_array().cloned().unwrap_or_default());
        Ok(hosts.into_iter().find(|h| h["host"] == addr.as_str()).unwrap_or(Value::Null))
    }

    /// A sample from Envoy's `/stats/prometheus`: `metric{labels}` exactly as printed, e.g.
    /// `ewma_lb_steered_requests_total{cluster_name="backend"}`. `None` when absent.
    pub fn prometheus(&self, series: &str) -> Option<f64> {
        let text = self.envoy.admin_get("/stats/prometheus").ok()?;
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
    }
}
