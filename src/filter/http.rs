//! Per-request context: route on the way in, record the outcome on the way out.

use std::cell::RefCell;
use std::rc::Rc;

use log::trace;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, MetricType};

use super::host;
use super::metrics::Key;
use super::root::Vm;
use crate::outcome::Outcome;
use crate::worker::{Decision, Finished, Request};

pub struct Http {
    vm: Rc<RefCell<Vm>>,
    /// The cluster of a sampled request; `None` for everything the balancer leaves alone.
    sampled_cluster: Option<String>,
    picked: Option<String>,
    start_ns: u64,
    /// Time to the upstream's response headers: the latency sample.
    latency_ns: Option<u64>,
}

impl Http {
    pub fn new(vm: Rc<RefCell<Vm>>) -> Self {
        Http { vm, sampled_cluster: None, picked: None, start_ns: 0, latency_ns: None }
    }
}

impl Context for Http {}

/// Body of the local reply to a management path from outside the allowlist.
const FORBIDDEN_BODY: &[u8] = b"forbidden: management endpoint\n";

/// Answers the request locally; `Pause` stops it from reaching the upstream.
fn local_reply(status: u32, content_type: &str, body: &[u8]) -> Action {
    match hostcalls::send_http_response(status, vec![("content-type", content_type)], Some(body)) {
        Ok(()) => Action::Pause,
        Err(_) => Action::Continue,
    }
}

fn counter<'a>(name: &'static str, cluster: &'a str, label: Option<(&'static str, &'a str)>) -> Key<'a> {
    Key { name, kind: MetricType::Counter, cluster, label }
}

fn in_flight_gauge<'a>(cluster: &'a str, host: &'a str) -> Key<'a> {
    Key { name: "ewma_lb_host_in_flight_requests", kind: MetricType::Gauge, cluster, label: Some(("host", host)) }
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Ok(mut vm) = self.vm.try_borrow_mut() else { return Action::Continue };
        let Vm { worker, metrics } = &mut *vm;
        let path = host::request_header(":path").unwrap_or_default();
        let cluster = host::property_string(&["xds", "cluster_name"]);
        let decision = worker.route(&Request { path: &path, cluster: cluster.as_deref() }, || {
            host::property_string(&["source", "address"])
        });
        trace!("ewma-lb: {path} -> {decision:?}");
        let header = worker.config().override_header.as_str();
        // The client's copy is replaced or removed whatever happens: client input never chooses
        // the host.
        let steered = match &decision {
            Decision::Override { header_value, .. } => host::set_request_header(header, Some(header_value)),
            _ => !host::set_request_header(header, None),
        };
        let cluster_label = cluster.as_deref().unwrap_or("none");
        let sampled = decision.is_sampled();
        match decision {
            Decision::Deny => {
                metrics.add(counter("ewma_lb_management_denied_requests_total", cluster_label, None), 1);
                return local_reply(403, "text/plain", FORBIDDEN_BODY);
            }
            Decision::Status => {
                return local_reply(200, "application/json", worker.status_json(host::now_ns()).as_bytes());
            }
            Decision::Override { host, .. } if steered => {
                metrics.add(counter("ewma_lb_steered_requests_total", cluster_label, None), 1);
                metrics.add(in_flight_gauge(cluster_label, &host), 1);
                self.picked = Some(host);
            }
            Decision::Override { host, .. } => {
                // The host refused the header, so Envoy's fallback decides: undo the pick.
                if let Some(c) = cluster.as_deref() {
                    worker.finish(c, &Finished { picked: Some(&host), ..Finished::default() });
                }
            }
            Decision::Fallback(reason) => {
                let key = counter("ewma_lb_fallback_requests_total", cluster_label, Some(("reason", reason.label())));
                metrics.add(key, 1);
            }
        }
        if sampled {
            self.start_ns = host::now_ns();
            self.sampled_cluster = cluster;
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if self.sampled_cluster.is_some() && self.latency_ns.is_none() {
            self.latency_ns = Some(host::now_ns().saturating_sub(self.start_ns));
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        let Some(cluster) = self.sampled_cluster.take() else { return };
        let Ok(mut vm) = self.vm.try_borrow_mut() else { return };
        let Vm { worker, metrics } = &mut *vm;
        let served_by = host::property_string(&["upstream", "address"]);
        let code = host::property_i64(&["response", "code"]);
        let flags = host::property_i64(&["response", "flags"]).map_or(0, |f| f as u64);
        let attempts = host::property_i64(&["upstream", "request_attempt_count"]).unwrap_or(1);
        // Without response headers (reset, timeout) the request's whole life is the sample.
        let latency_ns = self.latency_ns.unwrap_or_else(|| host::now_ns().saturating_sub(self.start_ns));
        worker.finish(
            &cluster,
            &Finished {
                picked: self.picked.as_deref(),
                served_by: served_by.as_deref(),
                attempts: u32::try_from(attempts).unwrap_or(1),
                latency_ms: latency_ns as f64 / 1e6,
                outcome: Outcome::classify(code, flags),
            },
        );
        if let Some(picked) = &self.picked {
            metrics.add(in_flight_gauge(&cluster, picked), -1);
        }
    }
}
