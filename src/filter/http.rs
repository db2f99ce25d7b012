//! Per-request context: route on the way in, record the outcome on the way out.

use std::cell::RefCell;
use std::rc::Rc;

use log::trace;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::host;
use crate::outcome::Outcome;
use crate::worker::{Decision, Finished, Request, Worker};

pub struct Http {
    worker: Rc<RefCell<Worker>>,
    /// The cluster of a sampled request; `None` for everything the balancer leaves alone.
    sampled_cluster: Option<String>,
    picked: Option<String>,
    start_ns: u64,
    /// Time to the upstream's response headers: the latency sample.
    latency_ns: Option<u64>,
}

impl Http {
    pub fn new(worker: Rc<RefCell<Worker>>) -> Self {
        Http { worker, sampled_cluster: None, picked: None, start_ns: 0, latency_ns: None }
    }
}

impl Context for Http {}

/// Body of the local reply to a management path from outside the allowlist.
const FORBIDDEN_BODY: &[u8] = b"forbidden: management endpoint\n";

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Ok(mut worker) = self.worker.try_borrow_mut() else { return Action::Continue };
        // The client's copy goes whatever happens next: client input never chooses the host.
        let header = worker.config().override_header.clone();
        host::set_request_header(&header, None);

        let path = host::request_header(":path").unwrap_or_default();
        let cluster = host::property_string(&["xds", "cluster_name"]);
        let source = host::property_string(&["source", "address"]);
        let forwarded_for = host::request_header("x-forwarded-for");
        let decision = worker.route(&Request {
            path: &path,
            cluster: cluster.as_deref(),
            source: source.as_deref(),
            forwarded_for: forwarded_for.as_deref(),
        });
        trace!("ewma-lb: {path} -> {decision:?}");
        let sampled = decision.is_sampled();
        match decision {
            Decision::Deny => {
                let headers = vec![("content-type", "text/plain")];
                return match hostcalls::send_http_response(403, headers, Some(FORBIDDEN_BODY)) {
                    Ok(()) => Action::Pause,
                    Err(_) => Action::Continue,
                };
            }
            Decision::Override { host, header_value } => {
                host::set_request_header(&header, Some(&header_value));
                self.picked = Some(host);
            }
            Decision::Fallback(_) => {}
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
        let Ok(mut worker) = self.worker.try_borrow_mut() else { return };
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
    }
}
