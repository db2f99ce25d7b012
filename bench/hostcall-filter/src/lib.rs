//! N of one host call per request, the result kept from the optimiser, nothing else. The plugin
//! configuration is `CALL N`; the calls are those ewma-lb makes per request:
//!
//! | CALL | host call | where |
//! |---|---|---|
//! | `path` | get_http_request_header(":path") | request headers |
//! | `cluster_name` | get_property(["xds", "cluster_name"]) | request headers |
//! | `monotonic_clock` | `Instant::now()` (WASI clock_time_get, monotonic: ewma-lb's clock) | request headers |
//! | `current_time` | get_current_time (proxy_get_current_time_nanoseconds) | request headers |
//! | `set_header` | set_http_request_header("x-bench-hostcall", ...) | request headers |
//! | `filter_state` | set_property(["bench_hostcall_I"], ...), I = 0..N: a new filter state each, as ewma-lb's decision for the access log | request headers |
//! | `gauge` | record_metric(gauge I, ...), I = 0..N, each defined at configure time: as the refreshing VM sets its per-host gauges | request headers |
//! | `content_type` | get_http_response_header("content-type") | response headers |
//! | `upstream_address` | get_property(["upstream", "address"]) | on_log |
//! | `response_code` | get_property(["response", "code"]) | on_log |
//!
//! N = 0 is the module doing nothing: the baseline the per-call cost is taken against.

use std::hint::black_box;
use std::rc::Rc;
use std::time::Instant;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, MetricType};

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(CallRoot { call: Call::Path, n: 0, keys: Rc::from([]), gauges: Rc::from([]) })
    });
}}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Call {
    Path,
    ClusterName,
    MonotonicClock,
    CurrentTime,
    SetHeader,
    FilterState,
    Gauge,
    ContentType,
    UpstreamAddress,
    ResponseCode,
}

impl Call {
    fn parse(name: &str) -> Option<Call> {
        Some(match name {
            "path" => Call::Path,
            "cluster_name" => Call::ClusterName,
            "monotonic_clock" => Call::MonotonicClock,
            "current_time" => Call::CurrentTime,
            "set_header" => Call::SetHeader,
            "filter_state" => Call::FilterState,
            "gauge" => Call::Gauge,
            "content_type" => Call::ContentType,
            "upstream_address" => Call::UpstreamAddress,
            "response_code" => Call::ResponseCode,
            _ => return None,
        })
    }
}

struct CallRoot {
    call: Call,
    n: u32,
    keys: Rc<[String]>,
    gauges: Rc<[u32]>,
}

impl Context for CallRoot {}

impl RootContext for CallRoot {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let config = self.get_plugin_configuration().unwrap_or_default();
        let text = String::from_utf8_lossy(&config);
        let mut words = text.split_whitespace();
        let call = words.next().and_then(Call::parse);
        let n = words.next().and_then(|n| n.parse().ok());
        match (call, n) {
            (Some(call), Some(n)) => {
                self.call = call;
                self.n = n;
                if call == Call::FilterState {
                    self.keys = (0..n).map(|i| format!("bench_hostcall_{i}")).collect();
                }
                if call == Call::Gauge {
                    let gauges: Option<Rc<[u32]>> = (0..n)
                        .map(|i| {
                            hostcalls::define_metric(
                                MetricType::Gauge,
                                &format!("bench_hostcall_gauge_{i}"),
                            )
                            .ok()
                        })
                        .collect();
                    // Without its gauges the call would measure nothing: refuse to start.
                    let Some(gauges) = gauges else {
                        return false;
                    };
                    self.gauges = gauges;
                }
                true
            }
            // A configuration it cannot read would measure nothing: refuse to start.
            _ => false,
        }
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(CallHttp {
            call: self.call,
            n: self.n,
            keys: self.keys.clone(),
            gauges: self.gauges.clone(),
            sets: 0,
        }))
    }
}

struct CallHttp {
    call: Call,
    n: u32,
    /// `filter_state`'s keys, made once at configure time.
    keys: Rc<[String]>,
    /// `gauge`'s metrics, defined once at configure time.
    gauges: Rc<[u32]>,
    /// A value that changes from one request to the next, as a host's weight does between
    /// refreshes.
    sets: u64,
}

impl CallHttp {
    fn repeat(&self, calls: &[Call], mut once: impl FnMut(Call)) {
        if calls.contains(&self.call) {
            for _ in 0..self.n {
                once(self.call);
            }
        }
    }
}

impl Context for CallHttp {}

impl HttpContext for CallHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        // Each its own key: ewma-lb creates its filter state once per request, and setting a key
        // again only replaces the value.
        if self.call == Call::FilterState {
            for key in self.keys.iter() {
                self.set_property(vec![key.as_str()], Some(b"steered 10.0.0.1:80 7"));
            }
        }
        for id in self.gauges.iter() {
            self.sets = self.sets.wrapping_add(1);
            let _ = hostcalls::record_metric(*id, self.sets);
        }
        self.repeat(
            &[
                Call::Path,
                Call::ClusterName,
                Call::MonotonicClock,
                Call::CurrentTime,
                Call::SetHeader,
            ],
            |call| match call {
                Call::Path => {
                    black_box(self.get_http_request_header(":path"));
                }
                Call::ClusterName => {
                    black_box(self.get_property(vec!["xds", "cluster_name"]));
                }
                Call::MonotonicClock => {
                    black_box(Instant::now());
                }
                Call::CurrentTime => {
                    black_box(self.get_current_time());
                }
                Call::SetHeader => self.set_http_request_header("x-bench-hostcall", Some("1")),
                _ => {}
            },
        );
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        self.repeat(&[Call::ContentType], |_| {
            black_box(self.get_http_response_header("content-type"));
        });
        Action::Continue
    }

    fn on_log(&mut self) {
        self.repeat(&[Call::UpstreamAddress, Call::ResponseCode], |call| {
            let path = if call == Call::UpstreamAddress {
                vec!["upstream", "address"]
            } else {
                vec!["response", "code"]
            };
            black_box(self.get_property(path));
        });
    }
}
