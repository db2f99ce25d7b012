//! Root context: configuration, the tick, and creation of per-request contexts.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use log::{debug, error, info, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, MetricType};

use super::host::{self, SharedData};
use super::http::Http;
use super::metrics::{Key, Metrics};
use crate::config::Config;
use crate::state::ClusterState;
use crate::status::HostPhase;
use crate::worker::Worker;

/// Everything one VM keeps: its balancer and its metric ids. Shared by the root context and the
/// VM's request contexts (one thread, so `Rc<RefCell>`).
pub struct Vm {
    pub worker: Worker,
    pub metrics: Metrics,
}

#[derive(Default)]
pub struct Root {
    vm: Option<Rc<RefCell<Vm>>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        if let Ok(level) = hostcalls::get_log_level() {
            proxy_wasm::set_log_level(level);
        }
        let bytes = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, plugin_configuration_size)
            .ok()
            .flatten()
            .unwrap_or_default();
        let config = match Config::from_json(&bytes) {
            Ok(config) => config,
            Err(e) => {
                // Envoy only says "Failed to configure base Wasm plugin"; this line says why.
                error!("ewma-lb: invalid plugin configuration: {e}");
                return false;
            }
        };
        if hostcalls::set_tick_period(Duration::from_millis(config.tick_period_ms)).is_err() {
            error!("ewma-lb: the host refused tick_period_ms {}", config.tick_period_ms);
            return false;
        }
        info!(
            "ewma-lb: configured: smoothing {}, pick {:?}, refresh every {} ms{}",
            config.smoothing.name(),
            config.pick,
            config.refresh_interval_ms,
            if config.shadow { ", shadow mode (never overrides)" } else { "" }
        );
        let worker = Worker::new(config, random_seed());
        self.vm = Some(Rc::new(RefCell::new(Vm { worker, metrics: Metrics::default() })));
        true
    }

    fn on_tick(&mut self) {
        let Some(vm) = &self.vm else { return };
        let Ok(mut vm) = vm.try_borrow_mut() else { return };
        let Vm { worker, metrics } = &mut *vm;
        let now_ns = host::now_ns();
        let report = worker.tick(now_ns, &mut SharedData);
        for (cluster, count) in &report.ejections {
            let key = Key { name: "ewma_lb_ejections_total", kind: MetricType::Counter, cluster, label: None };
            metrics.add(key, *count as i64);
        }
        let slow_start_ns = worker.config().weights.slow_start_ms.saturating_mul(1_000_000);
        for (cluster, version) in &report.adopted {
            let Some(state) = worker.snapshots().find(|(name, _)| name == cluster).map(|(_, s)| s) else {
                continue;
            };
            export_table(metrics, cluster, state, now_ns, slow_start_ns);
            if log::log_enabled!(log::Level::Debug) {
                let shares: Vec<String> = state.hosts.iter().map(|h| format!("{}={:.4}", h.address, h.share)).collect();
                debug!("ewma-lb: adopted table v{version} for cluster {cluster}: {}", shares.join(" "));
            }
        }
        for (cluster, e) in &report.errors {
            warn!("ewma-lb: samples for cluster {cluster} kept for the next tick: {e:?}");
        }
        metrics.flush();
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let vm = self.vm.clone()?;
        Some(Box::new(Http::new(vm)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Per-host gauges from a weight table. Every VM adopts the same table, so they all set the
/// same values.
fn export_table(metrics: &mut Metrics, cluster: &str, state: &ClusterState, now_ns: u64, slow_start_ns: u64) {
    for h in &state.hosts {
        let gauge = |name| Key { name, kind: MetricType::Gauge, cluster, label: Some(("host", h.address.as_str())) };
        metrics.set(gauge("ewma_lb_host_weight_ppm"), (h.share * 1e6).round() as u64);
        let latency_us = h.latency.value_ms().map_or(0, |ms| (ms * 1e3).round() as u64);
        metrics.set(gauge("ewma_lb_host_latency_microseconds"), latency_us);
        let ejected = HostPhase::of(h, now_ns, slow_start_ns) == HostPhase::Ejected;
        metrics.set(gauge("ewma_lb_host_ejected"), u64::from(ejected));
    }
}

/// Seed of this VM's picker: the WASI random source, with the clock as a last resort (picks only
/// need to differ between VMs, not to be secret).
fn random_seed() -> u64 {
    let mut bytes = [0u8; 8];
    match getrandom::fill(&mut bytes) {
        Ok(()) => u64::from_le_bytes(bytes),
        Err(_) => host::now_ns(),
    }
}
