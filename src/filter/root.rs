//! Root context: configuration, the tick, and creation of per-request contexts.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use log::{debug, error, info, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, MapType};

use super::host::{self, SharedData};
use super::http::Http;
use super::timing::{self, Slot};
use super::vm::Vm;
use crate::config::Config;
use crate::units::ns_to_whole_ms;
use crate::worker::telemetry::BUILD;
use crate::worker::Worker;

#[derive(Default)]
pub struct Root {
    vm: Option<Rc<RefCell<Vm>>>,
    /// Said once that the admin cluster could not be called (`envoy_health`).
    warned_admin: bool,
}

impl Context for Root {
    /// Envoy's admin answer to `/clusters` (`health`).
    fn on_http_call_response(
        &mut self,
        _token: u32,
        headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        // A call that failed after its response began (a reset, the timeout once the headers
        // were in, a body over the client's limit) comes with no headers and no response to
        // read: Envoy refuses the read, and the SDK's reader panics on a refusal. An answer
        // always has `:status`. Unanswered, like a poll that never came back (`health`); Envoy
        // counts it in the admin cluster's stats (`upstream_rq_timeout`, `upstream_rq_rx_reset`).
        if headers == 0 {
            return;
        }
        let Some(vm) = &self.vm else { return };
        let Ok(mut vm) = vm.try_borrow_mut() else {
            return;
        };
        let status = hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten();
        if status.as_deref() != Some(b"200".as_slice()) {
            return;
        }
        if let Ok(Some(body)) =
            hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
        {
            vm.worker.envoy_health(host::monotonic_ns(), &body);
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        if let Ok(level) = hostcalls::get_log_level() {
            proxy_wasm::set_log_level(level);
        }
        let bytes = hostcalls::get_buffer(
            BufferType::PluginConfiguration,
            0,
            plugin_configuration_size,
        )
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
        if hostcalls::set_tick_period(config.tick_period()).is_err() {
            error!(
                "ewma-lb: the host refused tick_period_ms {}",
                // As u64: formatting the u128 of `as_millis` would add 1.4 KB to the module.
                u64::try_from(config.tick_period().as_millis()).unwrap_or(u64::MAX)
            );
            return false;
        }
        let policy = config.policy();
        info!(
            "ewma-lb {} ({}): configured: smoothing {}, pick {}, refresh every {} ms, steered clusters: {}{}",
            BUILD.version,
            BUILD.commit,
            policy.smoother.name(),
            config.pick().name(),
            ns_to_whole_ms(policy.refresh_interval_ns),
            config.steered_clusters().join(", "),
            if config.shadow() {
                ", shadow mode (never overrides)"
            } else {
                ""
            }
        );
        if let Some(warning) = config.guard_warning() {
            warn!("ewma-lb: {warning}");
        }
        let mut worker = Worker::new(config, random_seed());
        learn_local_zone(&mut worker);
        let mut vm = Vm::new(worker);
        vm.metrics.build_info(&BUILD);
        self.vm = Some(Rc::new(RefCell::new(vm)));
        true
    }

    fn on_tick(&mut self) {
        let _span = timing::span(Slot::Tick);
        let Some(vm) = &self.vm else { return };
        let Ok(mut vm) = vm.try_borrow_mut() else {
            return;
        };
        let Vm {
            worker,
            metrics,
            tick_soon,
            ..
        } = &mut *vm;
        if std::mem::take(tick_soon) {
            // The tick a request asked for (`Http`): back to the configured period. The period
            // was accepted at configuration, so a refusal now would leave ticks at 1 ms; say so.
            if hostcalls::set_tick_period(worker.config().tick_period()).is_err() {
                error!("ewma-lb: the host refused to set the tick period back");
            }
        }
        learn_local_zone(worker);
        if worker.envoy_health_due(host::monotonic_ns()) {
            ask_envoy_health(worker, &mut self.warned_admin);
        }
        let report = worker.tick(host::monotonic_ns(), &mut SharedData);
        for update in &report.metrics {
            metrics.apply(update);
        }
        for cluster in &report.gauges_due {
            worker.host_gauges(cluster, |update| metrics.apply(&update));
        }
        if log::log_enabled!(log::Level::Debug) {
            for (cluster, version) in &report.adopted {
                debug!(
                    "ewma-lb: adopted table v{version} for cluster {cluster}: {}",
                    worker.table_summary(cluster)
                );
            }
        }
        for (cluster, e) in &report.bad_records {
            warn!("ewma-lb: the shared record of cluster {cluster} could not be read ({e}); rebuilt it (counted in ewma_lb_shared_record_errors_total)");
        }
        for (cluster, e, unlogged) in &report.error_warnings {
            let more = if *unlogged > 0 {
                format!(" ({unlogged} more since the last such warning)")
            } else {
                String::new()
            };
            warn!("ewma-lb: samples for cluster {cluster} kept for the next tick: {e}{more}");
        }
        for warning in &report.warnings {
            warn!("ewma-lb: {warning}");
        }
        metrics.flush();
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let _span = timing::span(Slot::CreateContext);
        let vm = self.vm.clone()?;
        Some(Box::new(Http::new(vm)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Asks Envoy's admin `/clusters`, through `envoy_health.admin_cluster`, for its hosts' health;
/// the answer comes to `on_http_call_response`.
fn ask_envoy_health(worker: &Worker, warned: &mut bool) {
    let Some(cluster) = worker.config().admin_cluster() else {
        return;
    };
    let headers = vec![
        (":method", "GET"),
        (":path", "/clusters"),
        (":authority", "envoy-admin"),
    ];
    let timeout = Duration::from_nanos(worker.config().health_poll_ns());
    if let Err(e) = hostcalls::dispatch_http_call(cluster, headers, None, vec![], timeout) {
        if !std::mem::replace(warned, true) {
            warn!("ewma-lb: cannot ask Envoy's admin for its hosts' health through cluster {cluster} ({e:?}): hosts its health checks mark unhealthy keep getting picks");
        }
    }
}

/// Reads the node's zone (Istio sets it from the pod's locality) once it is there: at
/// configuration, so the first requests already know which hosts are remote, else on a tick.
/// No zone is a valid answer (locality off).
fn learn_local_zone(worker: &mut Worker) {
    if !worker.wants_local_zone() {
        return;
    }
    if let Ok(zone) = host::optional_property_string(&["xds", "node", "locality", "zone"]) {
        let zone = zone.unwrap_or_default();
        info!(
            "ewma-lb: local zone: {}",
            if zone.is_empty() {
                "none (locality off)"
            } else {
                zone.as_str()
            }
        );
        worker.set_local_zone(&zone);
    }
}

/// Seed of this VM's picker: the WASI random source, with the clock as a last resort (picks only
/// need to differ between VMs, not to be secret).
fn random_seed() -> u64 {
    let mut bytes = [0u8; 8];
    match getrandom::fill(&mut bytes) {
        Ok(()) => u64::from_le_bytes(bytes),
        Err(_) => host::monotonic_ns(),
    }
}
