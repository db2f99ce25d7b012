//! Root context: configuration, the tick, and creation of per-request contexts.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use log::{debug, error, info, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};

use super::host::{self, SharedData};
use super::http::Http;
use crate::config::Config;
use crate::worker::Worker;

#[derive(Default)]
pub struct Root {
    worker: Option<Rc<RefCell<Worker>>>,
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
            "ewma-lb: configured: smoothing {:?}, pick {:?}, refresh every {} ms",
            config.smoothing, config.pick, config.refresh_interval_ms
        );
        self.worker = Some(Rc::new(RefCell::new(Worker::new(config, random_seed()))));
        true
    }

    fn on_tick(&mut self) {
        let Some(worker) = &self.worker else { return };
        let Ok(mut worker) = worker.try_borrow_mut() else { return };
        let report = worker.tick(host::now_ns(), &mut SharedData);
        for (cluster, version) in &report.adopted {
            if log::log_enabled!(log::Level::Debug) {
                let shares = worker
                    .snapshots()
                    .find(|(name, _)| name == cluster)
                    .map(|(_, s)| {
                        s.hosts.iter().map(|h| format!("{}={:.4}", h.address, h.share)).collect::<Vec<_>>().join(" ")
                    })
                    .unwrap_or_default();
                debug!("ewma-lb: adopted table v{version} for cluster {cluster}: {shares}");
            }
        }
        for (cluster, e) in &report.errors {
            warn!("ewma-lb: samples for cluster {cluster} kept for the next tick: {e:?}");
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let worker = self.worker.clone()?;
        Some(Box::new(Http::new(worker)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
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
