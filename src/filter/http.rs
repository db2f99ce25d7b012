//! Per-request context: choose the host on the way in, record the outcome on the way out.

use std::cell::RefCell;
use std::rc::Rc;

use log::trace;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::host;
use crate::outcome::Outcome;
use crate::worker::{Decision, Worker};

pub struct Http {
    worker: Rc<RefCell<Worker>>,
    /// Set once the request is steered or left to the fallback; `None`: not balanced by us.
    cluster: Option<String>,
    picked: Option<String>,
    start_ns: u64,
    /// Time to the upstream's response headers: the latency sample.
    latency_ns: Option<u64>,
}

impl Http {
    pub fn new(worker: Rc<RefCell<Worker>>) -> Self {
        Http { worker, cluster: None, picked: None, start_ns: 0, latency_ns: None }
    }
}

impl Context for Http {}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Ok(mut worker) = self.worker.try_borrow_mut() else { return Action::Continue };
        // The client's copy goes whatever happens next: client input never chooses the host.
        let header = worker.config().override_header.clone();
        host::set_request_header(&header, None);
        let Some(cluster) = host::property_string(&["xds", "cluster_name"]) else {
            return Action::Continue;
        };
        self.start_ns = host::now_ns();
        match worker.pick(&cluster) {
            Decision::Override { host, header_value } => {
                trace!("ewma-lb: {cluster} -> {header_value}");
                host::set_request_header(&header, Some(&header_value));
                self.picked = Some(host);
            }
            Decision::Fallback(reason) => trace!("ewma-lb: {cluster} -> fallback ({reason:?})"),
        }
        self.cluster = Some(cluster);
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if self.cluster.is_some() {
            self.latency_ns = Some(host::now_ns().saturating_sub(self.start_ns));
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        let Some(cluster) = self.cluster.take() else { return };
        let Ok(mut worker) = self.worker.try_borrow_mut() else { return };
        let served_by = host::property_string(&["upstream", "address"]);
        let code = host::property_i64(&["response", "code"]);
        let flags = host::property_i64(&["response", "flags"]).map_or(0, |f| f as u64);
        let outcome = Outcome::classify(code, flags);
        // Without response headers (reset, timeout) the request's whole life is the sample.
        let latency_ns = self.latency_ns.unwrap_or_else(|| host::now_ns().saturating_sub(self.start_ns));
        worker.finish(&cluster, self.picked.as_deref(), served_by.as_deref(), latency_ns as f64 / 1e6, outcome);
    }
}
