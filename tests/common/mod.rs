//! End-to-end harness: the shipped envoy-config/envoy.yaml, with its ports and plugin
//! configuration swapped for a test's, in front of real backends on 127.0.0.1.
//!
//! Every process is owned by a value whose Drop stops it, so a failing test cleans up too.

#![allow(dead_code)] // each test binary uses its own part of the harness

use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use ewma_bench::backend::{Backend, BackendSpec};
use ewma_bench::envoy::{Envoy, EnvoyOptions};
use ewma_bench::latency::Latency;
use ewma_bench::load::{self, LoadSpec, Record};
use ewma_bench::ports::free_port;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The plugin that ./wasm-build.sh leaves for every config to load.
pub fn plugin() -> PathBuf {
    let path = repo().join("dist/ewma_lb.wasm");
    assert!(path.exists(), "{} is missing: run ./wasm-build.sh first", path.display());
    path
}

pub fn latency(spec: &str) -> Latency {
    spec.parse().unwrap_or_else(|e| panic!("latency {spec}: {e}"))
}

/// The shipped Envoy config with `replacements` applied; each `from` must occur in it.
pub fn shipped_config(replacements: &[(&str, String)]) -> String {
    let path = repo().join("envoy-config/envoy.yaml");
    let mut yaml = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for (from, to) in replacements {
        assert!(yaml.contains(from), "{from:?} not found in {}", path.display());
        yaml = yaml.replace(from, to);
    }
    yaml
}

/// The plugin configuration line of the shipped envoy.yaml.
pub const SHIPPED_PLUGIN_CONFIG: &str = r#"{"override_header": "x-ewma-lb-host"}"#;

/// Three backends behind a real Envoy running the real plugin.
pub struct Stack {
    pub envoy: Envoy,
    pub backends: Vec<Backend>,
    pub url: String,
}

impl Stack {
    /// `plugin_config`: the JSON for the plugin (`None`: the shipped one).
    pub fn start(specs: Vec<BackendSpec>, plugin_config: Option<&str>) -> Stack {
        Self::start_with(specs, plugin_config, &[])
    }

    /// As `start`, with more replacements in the shipped Envoy config.
    pub fn start_with(specs: Vec<BackendSpec>, plugin_config: Option<&str>, edits: &[(&str, String)]) -> Stack {
        assert_eq!(specs.len(), 3, "the shipped config has three endpoints");
        let backends: Vec<Backend> = specs
            .into_iter()
            .map(|s| Backend::start_local(s).unwrap_or_else(|e| panic!("backend: {e}")))
            .collect();
        let mut yaml = Self::config(&backends, plugin_config);
        for (from, to) in edits {
            assert!(yaml.contains(from), "{from:?} not in the shipped config");
            yaml = yaml.replace(from, to);
        }
        // Flush Envoy's log often: some tests read what the plugin logged moments ago.
        let options = EnvoyOptions { extra_args: vec!["--file-flush-interval-msec".into(), "100".into()], ..EnvoyOptions::new(yaml) };
        let envoy = Envoy::start(options).unwrap_or_else(|e| panic!("envoy: {e:#}"));
        let url = envoy_url(&envoy);
        Stack { envoy, backends, url }
    }

    pub fn config(backends: &[Backend], plugin_config: Option<&str>) -> String {
        let listen = free_port().unwrap_or_else(|e| panic!("{e}"));
        let mut replacements = vec![
            ("port_value: 10000", format!("port_value: {listen}")),
            ("port_value: 9901", "port_value: 0".to_string()),
            ("filename: dist/ewma_lb.wasm", format!("filename: {}", plugin().display())),
            (SHIPPED_PLUGIN_CONFIG, plugin_config.unwrap_or(SHIPPED_PLUGIN_CONFIG).to_string()),
        ];
        for (i, b) in backends.iter().enumerate() {
            replacements.push((["port_value: 8081", "port_value: 8082", "port_value: 8083"][i], format!("port_value: {}", b.addr().port())));
        }
        shipped_config(&replacements)
    }

    pub fn backend(&self, name: &str) -> &Backend {
        self.backends.iter().find(|b| b.name() == name).unwrap_or_else(|| panic!("no backend {name}"))
    }

    /// Requests each backend served since the last `reset_counts`.
    pub fn served(&self) -> Vec<(String, u64)> {
        self.backends.iter().map(|b| (b.name().to_string(), b.served())).collect()
    }

    pub fn reset_counts(&self) {
        self.backends.iter().for_each(Backend::reset_counts);
    }

    /// Open-loop load at `rate` requests/s for `secs`, on this thread.
    pub fn load(&self, rate: f64, secs: u64) -> Vec<Record> {
        load::run(&LoadSpec::new(format!("{}/work", self.url), rate, Duration::from_secs(secs)))
            .unwrap_or_else(|e| panic!("load: {e:#}"))
    }

    /// The same load on a background thread; join it to get the records.
    pub fn load_in_background(&self, rate: f64, secs: u64) -> thread::JoinHandle<Vec<Record>> {
        let spec = LoadSpec::new(format!("{}/work", self.url), rate, Duration::from_secs(secs));
        thread::spawn(move || load::run(&spec).unwrap_or_default())
    }
}

/// The listener's URL, read back from the config Envoy runs.
pub fn envoy_url(envoy: &Envoy) -> String {
    let listeners = envoy.admin_get("/listeners").unwrap_or_default();
    let addr = listeners.lines().find_map(|l| l.split("::").nth(1)).unwrap_or_default().trim().to_string();
    assert!(!addr.is_empty(), "no listener in {listeners:?}");
    format!("http://{addr}")
}

/// Share of `name` among all counts.
pub fn share(counts: &[(String, u64)], name: &str) -> f64 {
    let total: u64 = counts.iter().map(|(_, c)| c).sum();
    let mine = counts.iter().find(|(n, _)| n == name).map_or(0, |(_, c)| *c);
    if total == 0 { 0.0 } else { mine as f64 / total as f64 }
}

/// Polls `check` every 250 ms until it holds or `limit` passes; returns the time it took.
pub fn within(limit: Duration, mut check: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return Some(start.elapsed());
        }
        thread::sleep(Duration::from_millis(250));
    }
    None
}

impl Stack {
    /// The plugin's status document, fetched through Envoy from 127.0.0.1.
    pub fn status(&self) -> serde_json::Value {
        let r = ewma_bench::http::get(&format!("{}/ewma-lb/status", self.url), &[]).unwrap_or_else(|e| panic!("status: {e}"));
        assert_eq!(r.status, 200, "status endpoint: {r:?}");
        serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("status JSON: {e}: {}", r.body))
    }

    /// One host's entry of the status document.
    pub fn host_status(&self, backend: &str) -> serde_json::Value {
        let addr = self.backend(backend).addr().to_string();
        let status = self.status();
        status["clusters"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["hosts"].as_array().cloned().unwrap_or_default())
            .find(|h| h["host"] == addr.as_str())
            .unwrap_or(serde_json::Value::Null)
    }

    /// A sample from Envoy's `/stats/prometheus`: `metric{labels}` exactly as printed, e.g.
    /// `ewma_lb_steered_requests_total{cluster_name="backend"}`. `None` when absent.
    pub fn prometheus(&self, series: &str) -> Option<f64> {
        let text = self.envoy.admin_get("/stats/prometheus").unwrap_or_default();
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
    }
}
