//! Per-request context: route on the way in, record the outcome on the way out.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use log::trace;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, MapType};

use super::host;
use super::timing::{self, timed, Slot};
use super::vm::Vm;
use crate::balance::outcome::{GrpcResponse, Outcome};
use crate::balance::score::{LoadReportWatch, LOAD_REPORT_HEADER};
use crate::units::ns_to_ms;
use crate::worker::{
    Decision, Finished, Request, HEDGE_HEADER, PER_TRY_TIMEOUT_HEADER, RETRY_ON_HEADER,
};

pub struct Http {
    vm: Rc<RefCell<Vm>>,
    /// The cluster of a sampled request; `None` for everything the balancer leaves alone.
    sampled_cluster: Option<String>,
    picked: Option<Rc<str>>,
    /// Whether the picked host counts the request in flight yet (from the request's end).
    in_flight: bool,
    /// When the request's headers arrived.
    start_ns: u64,
    /// When the client finished sending the request (its end of stream): the latency sample
    /// starts here, so the time a client takes to send its body is not the host's.
    request_end_ns: Option<u64>,
    /// From the request's end (or its headers, when the upstream answered before the body
    /// ended) to the upstream's response headers: the latency sample.
    latency_ns: Option<u64>,
    /// The response's gRPC status, when it is a gRPC response.
    grpc: GrpcResponse,
    /// The upstream response's ORCA load report (`score`), read once with its headers.
    load_report: Option<Vec<u8>>,
    /// The request came with a body (its headers did not end the stream). gRPC requires one:
    /// a call's request ends in a DATA frame, empty if it has no message (gRPC's HTTP/2
    /// protocol, "MUST send an empty DATA frame"), so a request without one is not a gRPC call.
    request_body: bool,
    /// The response's end passed through this filter: Envoy's router had it all.
    response_ended: bool,
    /// A probe's wait, when Envoy was told to hedge it on the alternative after it.
    probe_timeout_ms: Option<u32>,
}

impl Http {
    pub fn new(vm: Rc<RefCell<Vm>>) -> Self {
        Http {
            vm,
            sampled_cluster: None,
            picked: None,
            in_flight: false,
            start_ns: 0,
            request_end_ns: None,
            latency_ns: None,
            grpc: GrpcResponse::default(),
            load_report: None,
            request_body: false,
            response_ended: false,
            probe_timeout_ms: None,
        }
    }
}

impl Context for Http {}

/// The filter state (`wasm.` + this) that holds each request's decision (`Decision::write_log_value`).
const DECISION_STATE: &str = "ewma_lb_decision";

/// Body of the local reply to a management path from outside the allowlist.
const FORBIDDEN_BODY: &[u8] = b"forbidden: management endpoint\n";

/// Answers the request locally; `Pause` stops it from reaching the upstream.
fn local_reply(status: u32, content_type: &str, body: &[u8]) -> Action {
    match hostcalls::send_http_response(status, vec![("content-type", content_type)], Some(body)) {
        Ok(()) => Action::Pause,
        Err(_) => Action::Continue,
    }
}

impl Http {
    /// Notes the request's end of stream, once, for a sampled request; a picked host counts it in
    /// flight from here.
    fn request_ended(&mut self) {
        let Some(cluster) = self.sampled_cluster.as_deref() else {
            return;
        };
        if self.request_end_ns.is_some() {
            return;
        }
        if let Ok(mut vm) = self.vm.try_borrow_mut() {
            let now_ns = vm.worker.clock(host::monotonic_ns());
            self.request_end_ns = Some(now_ns);
            if let (Some(picked), false) = (&self.picked, self.in_flight) {
                vm.worker.request_sent(cluster, picked, now_ns);
                self.in_flight = true;
            }
        }
    }

    /// Since when the response is the upstream's to answer: the request's end, or its headers
    /// when the upstream answers before the body has ended.
    fn sample_start_ns(&self) -> u64 {
        self.request_end_ns.unwrap_or(self.start_ns)
    }
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let _span = timing::span(Slot::RequestHeaders);
        let Ok(mut vm) = self.vm.try_borrow_mut() else {
            return Action::Continue;
        };
        let Vm {
            worker,
            header_value,
            decision_value,
            tick_soon,
            ..
        } = &mut *vm;
        let path = timed(Slot::Path, || host::request_header_bytes(":path")).unwrap_or_default();
        let cluster = timed(Slot::ClusterName, || {
            host::property_string(&["xds", "cluster_name"])
        });
        let now_ns = worker.clock(host::monotonic_ns());
        let decision = timed(Slot::Route, || {
            worker.route(
                &Request {
                    path: &path,
                    cluster: cluster.as_deref(),
                    now_ns,
                    body_pending: !end_of_stream,
                },
                || host::property_string(&["source", "address"]),
            )
        });
        if worker.take_tick_wanted() && !*tick_soon {
            // A tick period is the host's only timer: the shortest, 1 ms, then the tick puts it
            // back (`Root::on_tick`).
            *tick_soon = hostcalls::set_tick_period(Duration::from_millis(1)).is_ok();
        }
        trace!("ewma-lb: {} -> {decision}", path.escape_ascii());
        // Why the request goes where it goes, for the access log: one host call.
        let version = match &decision {
            Decision::Fallback(_) => cluster.as_deref().and_then(|c| worker.table_version(c)),
            _ => None,
        };
        decision.write_log_value(version, decision_value);
        timed(Slot::FilterState, || {
            host::set_filter_state(DECISION_STATE, decision_value)
        });
        let header = worker.config().override_header();
        // The client's copy is replaced or removed whatever happens: client input never chooses
        // the host.
        match &decision {
            Decision::Override(pick) => {
                pick.write_header_value(header_value);
                if timed(Slot::OverrideHeader, || {
                    host::set_request_header(header, Some(header_value))
                }) {
                    self.picked = Some(pick.host.clone());
                    self.in_flight = end_of_stream;
                    // Three header reads, for probes with a wait only.
                    let hedge = match pick.probe_timeout_ms {
                        Some(_) => pick.probe_hedge(
                            &host::request_header_bytes(":method").unwrap_or_default(),
                            !end_of_stream,
                            host::request_header_bytes(RETRY_ON_HEADER).as_deref(),
                            host::request_header_bytes(PER_TRY_TIMEOUT_HEADER).is_some(),
                        ),
                        _ => None,
                    };
                    // The timeout last: without the retry it would fail the request, and
                    // without hedging it would cancel the probe's attempt, so the second
                    // attempt would have the same short wait.
                    if let Some((per_try, retry_on)) = hedge {
                        if host::set_request_header(RETRY_ON_HEADER, Some(&retry_on))
                            && host::set_request_header(HEDGE_HEADER, Some("true"))
                            && host::set_request_header(PER_TRY_TIMEOUT_HEADER, Some(&per_try))
                        {
                            self.probe_timeout_ms = pick.probe_timeout_ms;
                        }
                    }
                } else if let Some(c) = cluster.as_deref() {
                    // The host refused the header, so Envoy's fallback decides.
                    worker.cancel(c, pick, end_of_stream);
                }
            }
            _ => {
                host::set_request_header(header, None);
            }
        }
        match decision {
            Decision::Deny => return local_reply(403, "text/plain", FORBIDDEN_BODY),
            Decision::Status => {
                return local_reply(
                    200,
                    "application/json",
                    worker.status_json(&host::SharedData).as_bytes(),
                );
            }
            d if d.is_sampled() => {
                self.start_ns = now_ns;
                self.request_end_ns = end_of_stream.then_some(now_ns);
                self.request_body = !end_of_stream;
                self.sampled_cluster = cluster;
            }
            _ => {}
        }
        Action::Continue
    }

    fn on_http_request_body(&mut self, _body_size: usize, end_of_stream: bool) -> Action {
        let _span = timing::span(Slot::RequestBody);
        if end_of_stream {
            self.request_ended();
        }
        Action::Continue
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        self.request_ended();
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let _span = timing::span(Slot::ResponseHeaders);
        self.response_ended |= end_of_stream;
        let Some(cluster) = self.sampled_cluster.as_deref() else {
            return Action::Continue;
        };
        if self.latency_ns.is_some() {
            return Action::Continue;
        }
        let Ok(mut vm) = self.vm.try_borrow_mut() else {
            return Action::Continue;
        };
        let now_ns = vm.worker.clock(host::monotonic_ns());
        self.latency_ns = Some(now_ns.saturating_sub(self.sample_start_ns()));
        // A trailers-only gRPC response (an error before any message) has its grpc-status here.
        // No content-type read (a host call) for a request that cannot be a gRPC call.
        if self.request_body {
            let content_type = host::map_value_bytes(MapType::HttpResponseHeaders, "content-type");
            self.grpc = GrpcResponse::from_headers(content_type.as_deref(), || {
                host::map_value_bytes(MapType::HttpResponseHeaders, "grpc-status")
            });
        }
        // The upstream's response headers only: a report in the client's request is never
        // read. None when the score ignores reports, and for a cluster whose responses carry
        // none only an occasional look (`LoadReportWatch`).
        if vm.worker.reads_load_reports() {
            let Vm { load_reports, .. } = &mut *vm;
            if !load_reports.contains_key(cluster) {
                load_reports.insert(cluster.to_owned(), LoadReportWatch::default());
            }
            if let Some(watch) = load_reports.get_mut(cluster) {
                if watch.wants(now_ns) {
                    self.load_report =
                        host::map_value_bytes(MapType::HttpResponseHeaders, LOAD_REPORT_HEADER);
                    watch.looked(self.load_report.is_some());
                }
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, _body_size: usize, end_of_stream: bool) -> Action {
        let _span = timing::span(Slot::ResponseBody);
        self.response_ended |= end_of_stream;
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        let _span = timing::span(Slot::ResponseTrailers);
        // Trailers end the response.
        self.response_ended = true;
        if self.sampled_cluster.is_some() {
            self.grpc
                .trailers(|| host::map_value_bytes(MapType::HttpResponseTrailers, "grpc-status"));
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        let _span = timing::span(Slot::Log);
        timing::request_logged();
        let Some(cluster) = self.sampled_cluster.take() else {
            return;
        };
        let Ok(mut vm) = self.vm.try_borrow_mut() else {
            return;
        };
        let served_by = timed(Slot::UpstreamAddress, || {
            host::property_string(&["upstream", "address"])
        });
        let answered = self.latency_ns.is_some();
        let code = timed(Slot::ResponseCode, || {
            host::property_i64(&["response", "code"])
        });
        // Read only when they could change the outcome (`Outcome::needs_flags`).
        let flags = if Outcome::needs_flags(code, answered, self.response_ended) {
            host::property_i64(&["response", "flags"]).map_or(0, |f| f as u64)
        } else {
            0
        };
        // The attempt count only matters when another host served our pick (`Worker::finish`):
        // one host call less for every other request.
        let attempts = match (self.picked.as_deref(), served_by.as_deref()) {
            (Some(picked), Some(served)) if picked != served => {
                host::property_i64(&["upstream", "request_attempt_count"]).unwrap_or(1)
            }
            _ => 1,
        };
        // Without response headers (reset, timeout) the time since the request ended is the
        // sample; with them the sample is taken and the clock need not be read again. A request
        // whose body never ended and that the upstream never answered (the client stalled or
        // left, Envoy's stream idle timeout) says nothing about the host, unless the host failed
        // it (a refused connection, a reset).
        let latency_ns = match (self.latency_ns, self.request_end_ns) {
            (Some(latency_ns), _) => latency_ns,
            (None, Some(end_ns)) => vm.worker.clock(host::monotonic_ns()).saturating_sub(end_ns),
            (None, None) => 0,
        };
        let outcome = Outcome::of_request(code, flags, answered, self.request_end_ns.is_some());
        // Facts that rarely change are read only when the worker lacks them.
        let num_endpoints = vm
            .worker
            .wants_endpoint_count(&cluster)
            .then(|| host::property_i64(&["upstream", "num_endpoints"]))
            .flatten()
            .and_then(|n| u32::try_from(n).ok());
        // A host without a zone answers empty (or not at all), which is an answer too: the
        // worker keeps it like any zone, so the host is not asked again on every request.
        let zone = served_by
            .as_deref()
            .filter(|h| vm.worker.wants_zone(&cluster, h))
            .and_then(|_| {
                timed(Slot::Zone, || {
                    host::optional_property_string(&["upstream", "locality", "zone"])
                })
                .ok()
                .map(Option::unwrap_or_default)
            });
        let _finish = timing::span(Slot::Finish);
        vm.worker.finish(
            &cluster,
            &Finished {
                picked: self.picked.as_deref(),
                in_flight: self.in_flight,
                served_by: served_by.as_deref(),
                attempts: u32::try_from(attempts).unwrap_or(1),
                probe_timeout_ms: self.probe_timeout_ms,
                latency_ms: ns_to_ms(latency_ns),
                ended_ns: self.sample_start_ns().saturating_add(latency_ns),
                outcome,
                grpc_status: self.grpc.code(),
                num_endpoints,
                zone: zone.as_deref(),
                load_report: self.load_report.as_deref(),
            },
        );
    }
}
