//! What the adapter hands the worker about a request: when it arrives ([`Request`]) and when it
//! is done ([`Finished`]).

use crate::balance::outcome::{GrpcCode, Outcome};

/// What the filter knows of a request when it arrives.
#[derive(Clone, Copy, Debug, Default)]
pub struct Request<'a> {
    /// `:path` as the client sent it: bytes, not necessarily UTF-8.
    pub path: &'a [u8],
    /// `xds.cluster_name`: the cluster the route chose.
    pub cluster: Option<&'a str>,
    /// This VM's steady time (`Worker::clock`) when the request arrived.
    pub now_ns: u64,
    /// The client has a body still to send. A picked host starts counting the request in flight
    /// only once it has it (`Worker::request_sent`): until then it is not working for it, and
    /// a client that trickles its body must not make a host look busy.
    pub body_pending: bool,
}

/// What the filter knows of a request when it is done.
#[derive(Clone, Copy, Debug, Default)]
pub struct Finished<'a> {
    /// The host this worker chose, if it chose one.
    pub picked: Option<&'a str>,
    /// Whether the request counted in the picked host's requests in flight (a request whose body
    /// never ended did not).
    pub in_flight: bool,
    /// `upstream.address`: the host that served the last attempt.
    pub served_by: Option<&'a str>,
    /// `upstream.request_attempt_count`.
    pub attempts: u32,
    /// The probe's wait for the picked host, when the adapter had Envoy hedge it on the
    /// alternative after that wait (`Pick::probe_timeout_ms`).
    pub probe_timeout_ms: Option<u32>,
    pub latency_ms: f64,
    /// This VM's steady time (`Worker::clock`) when the request ended for its host: the answer's
    /// headers, or the end of the wait. 0 when unknown: the host's answer then does not count
    /// as the end of a wait on it (the pick's patience, `balance::pick`).
    pub ended_ns: u64,
    /// What the status code and response flags say ([`Outcome::classify`]).
    pub outcome: Option<Outcome>,
    /// The `grpc-status` of a gRPC response; `None` for any other response. It refines
    /// `outcome` by the configured failure codes ([`Outcome::with_grpc`]).
    pub grpc_status: Option<GrpcCode>,
    /// `upstream.num_endpoints`: the cluster's endpoint count (asked for once a tick, see
    /// `Worker::wants_endpoint_count`).
    pub num_endpoints: Option<u32>,
    /// `upstream.locality.zone` of `served_by` (asked for once a host, see `Worker::wants_zone`);
    /// `Some("")` for a host that has none, so it is not asked again.
    pub zone: Option<&'a str>,
    /// The upstream response's `endpoint-load-metrics` header, as the host sent it: the load
    /// `served_by` reports (`score`). Never a request header: a client's report counts for nothing.
    pub load_report: Option<&'a [u8]>,
}
