//! Outcome: what a finished request says about the host that served it.
//!
//! Envoy reports a request's end as a status code plus response flags (the `%RESPONSE_FLAGS%` of
//! its access log, as a bitmask). A 5xx, a reset, a timeout or a failed connection is the host's
//! failure; a request the client abandoned says nothing about the host and is not sampled.
//!
//! A gRPC server answers its errors with HTTP 200 and a `grpc-status` in the trailers (or in the
//! headers of a trailers-only response), so for a gRPC response the status code is read from
//! there instead, and only there: Envoy's `response.grpc_status` reads 2 (UNKNOWN) for a plain
//! HTTP 200, so a `grpc-status` counts only when the response's `content-type` is gRPC.

use std::fmt;

/// Response flag bits, as Envoy's `StreamInfo::CoreResponseFlag` numbers them.
pub mod flags {
    /// UH: no healthy upstream host (no host was tried).
    pub const NO_HEALTHY_UPSTREAM: u64 = 0x2;
    /// UT: the route's timeout expired.
    pub const UPSTREAM_REQUEST_TIMEOUT: u64 = 0x4;
    /// UR: the upstream reset the stream.
    pub const UPSTREAM_REMOTE_RESET: u64 = 0x10;
    /// UF: connecting to the upstream failed.
    pub const UPSTREAM_CONNECTION_FAILURE: u64 = 0x20;
    /// UC: the upstream connection closed mid-request.
    pub const UPSTREAM_CONNECTION_TERMINATION: u64 = 0x40;
    /// DC: the client's connection ended before the response did.
    pub const DOWNSTREAM_CONNECTION_TERMINATION: u64 = 0x4000;
    /// SI: the stream was idle too long (a client that stopped sending its body); Envoy answers
    /// 408 itself.
    pub const STREAM_IDLE_TIMEOUT: u64 = 0x10000;
    /// DPE: the client broke the HTTP protocol.
    pub const DOWNSTREAM_PROTOCOL_ERROR: u64 = 0x40000;
    /// DT: the request outlived the connection manager's `max_stream_duration`.
    pub const DURATION_TIMEOUT: u64 = 0x400000;
    /// DR: the client reset the stream.
    pub const DOWNSTREAM_REMOTE_RESET: u64 = 0x1000_0000;
    /// Ends caused by the client or by Envoy's limits on it, not by the upstream.
    pub const DOWNSTREAM: u64 = DOWNSTREAM_CONNECTION_TERMINATION
        | STREAM_IDLE_TIMEOUT
        | DOWNSTREAM_PROTOCOL_ERROR
        | DURATION_TIMEOUT
        | DOWNSTREAM_REMOTE_RESET;
    /// The flags that override a status code in [`super::Outcome::classify`]. Envoy's router
    /// sets them only when it gives up on the upstream: before the response's end (the stream
    /// is reset, so the response never ends), or with a reply of its own, 502, 503 or 504.
    pub const UPSTREAM_FAILURE: u64 = NO_HEALTHY_UPSTREAM
        | UPSTREAM_REQUEST_TIMEOUT
        | UPSTREAM_REMOTE_RESET
        | UPSTREAM_CONNECTION_FAILURE
        | UPSTREAM_CONNECTION_TERMINATION;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// 1xx-4xx from the upstream, or a gRPC status that is not the host's failure: the host did
    /// its job (a 404 or a gRPC NOT_FOUND is an answer).
    Success,
    ServerError,
    /// A gRPC status in the configured failure list (`grpc_failure_status_codes`).
    GrpcFailure(GrpcCode),
    Reset,
    Timeout,
    ConnectFailure,
    /// The client left (or Envoy's limits on it ended the stream) after sending the whole request
    /// and before the upstream answered: the host took at least that long. Not a failure; its
    /// wait is a latency sample, which a client cannot make longer than it really waited.
    Abandoned,
}

impl Outcome {
    pub fn is_failure(self) -> bool {
        !matches!(self, Outcome::Success | Outcome::Abandoned)
    }

    /// A failure of the connection or stream to the upstream, rather than an answer.
    pub(crate) fn is_transport_failure(self) -> bool {
        matches!(
            self,
            Outcome::Reset | Outcome::Timeout | Outcome::ConnectFailure
        )
    }

    /// What a finished request says about the host that served it, knowing whether the upstream
    /// answered (its response headers arrived) and whether the client finished sending the
    /// request. `None`: nothing.
    ///
    /// The client controls when its request ends and whether it stays for the answer, so neither
    /// may count against a host: a request whose body never ended says something only if the host
    /// failed it (refused the connection, reset the stream), and a client that left, or that
    /// Envoy's limits on clients cut off (a stream idle timeout's 408 is Envoy's answer to a
    /// stalled client), leaves only the time it waited after its request had ended.
    pub fn of_request(
        code: Option<i64>,
        response_flags: u64,
        answered: bool,
        request_ended: bool,
    ) -> Option<Outcome> {
        let downstream = response_flags & flags::DOWNSTREAM != 0;
        let upstream_flags = response_flags & !flags::DOWNSTREAM;
        match (answered, request_ended) {
            (true, _) => Outcome::classify(code, upstream_flags),
            (false, false) => Outcome::classify(code, upstream_flags)
                .filter(|o| !downstream && o.is_transport_failure()),
            (false, true) if downstream => Some(Outcome::Abandoned),
            (false, true) => Outcome::classify(code, upstream_flags),
        }
    }

    /// Whether [`Outcome::of_request`] needs the response flags, knowing the status code,
    /// whether the upstream answered and whether the response's end passed through the filter.
    /// Not for a complete answer with a code below 500: only [`flags::UPSTREAM_FAILURE`] could
    /// change its outcome, and Envoy never sets those on a response that ended with such a code
    /// (see there), so reading the flags (a host call) would change nothing. One exception:
    /// a `local_reply_config` mapper that rewrites Envoy's own 502-504 to a code below 500 makes
    /// the request count as that code says.
    pub fn needs_flags(code: Option<i64>, answered: bool, response_ended: bool) -> bool {
        !(answered && response_ended && code.is_some_and(|c| (100..500).contains(&c)))
    }

    /// Classifies a request from its status code (0 or absent when none was sent) and response
    /// flags. `None`: the request carries no signal about a host.
    pub fn classify(code: Option<i64>, response_flags: u64) -> Option<Outcome> {
        use flags::*;
        if response_flags & UPSTREAM_CONNECTION_FAILURE != 0 {
            return Some(Outcome::ConnectFailure);
        }
        if response_flags & UPSTREAM_REQUEST_TIMEOUT != 0 {
            return Some(Outcome::Timeout);
        }
        if response_flags & (UPSTREAM_REMOTE_RESET | UPSTREAM_CONNECTION_TERMINATION) != 0 {
            return Some(Outcome::Reset);
        }
        if response_flags & NO_HEALTHY_UPSTREAM != 0 {
            return None;
        }
        match code {
            Some(c) if (500..600).contains(&c) => Some(Outcome::ServerError),
            Some(c) if (100..500).contains(&c) => Some(Outcome::Success),
            _ => None,
        }
    }

    /// Refines what [`Outcome::classify`] made of the status code and flags with the gRPC status
    /// of a gRPC response (`None` for a response that is not gRPC or carried no status). A
    /// transport failure (reset, timeout, failed connection) and "no signal" stand: the status,
    /// if any, is Envoy's own reply about them. Otherwise the gRPC status decides: a code in
    /// `failures` is the host's failure, CANCELLED is no sample (the call was abandoned, most
    /// often by the client), any other code is an answer.
    pub fn with_grpc(
        http: Option<Outcome>,
        grpc: Option<GrpcCode>,
        failures: GrpcCodes,
    ) -> Option<Outcome> {
        match (http?, grpc) {
            (Outcome::Success | Outcome::ServerError, Some(GrpcCode::Cancelled)) => None,
            (Outcome::Success | Outcome::ServerError, Some(code)) if failures.contains(code) => {
                Some(Outcome::GrpcFailure(code))
            }
            (Outcome::Success | Outcome::ServerError, Some(_)) => Some(Outcome::Success),
            (http, _) => Some(http),
        }
    }
}

// === gRPC ===

/// The canonical gRPC status codes (grpc/grpc `doc/statuscodes.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum GrpcCode {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl GrpcCode {
    /// Every code, in numeric order, with its canonical name (as a gRPC service config's
    /// `retryableStatusCodes` spells it).
    pub const ALL: [(GrpcCode, &'static str); 17] = [
        (GrpcCode::Ok, "OK"),
        (GrpcCode::Cancelled, "CANCELLED"),
        (GrpcCode::Unknown, "UNKNOWN"),
        (GrpcCode::InvalidArgument, "INVALID_ARGUMENT"),
        (GrpcCode::DeadlineExceeded, "DEADLINE_EXCEEDED"),
        (GrpcCode::NotFound, "NOT_FOUND"),
        (GrpcCode::AlreadyExists, "ALREADY_EXISTS"),
        (GrpcCode::PermissionDenied, "PERMISSION_DENIED"),
        (GrpcCode::ResourceExhausted, "RESOURCE_EXHAUSTED"),
        (GrpcCode::FailedPrecondition, "FAILED_PRECONDITION"),
        (GrpcCode::Aborted, "ABORTED"),
        (GrpcCode::OutOfRange, "OUT_OF_RANGE"),
        (GrpcCode::Unimplemented, "UNIMPLEMENTED"),
        (GrpcCode::Internal, "INTERNAL"),
        (GrpcCode::Unavailable, "UNAVAILABLE"),
        (GrpcCode::DataLoss, "DATA_LOSS"),
        (GrpcCode::Unauthenticated, "UNAUTHENTICATED"),
    ];

    /// The code of a number; `None` outside 0-16.
    pub(crate) fn from_number(n: u64) -> Option<GrpcCode> {
        Self::ALL
            .iter()
            .map(|(c, _)| *c)
            .find(|c| u64::from(*c as u8) == n)
    }

    /// The code of a canonical name, e.g. `UNAVAILABLE`.
    pub fn from_name(name: &str) -> Option<GrpcCode> {
        Self::ALL.iter().find(|(_, n)| *n == name).map(|(c, _)| *c)
    }

    pub fn name(self) -> &'static str {
        Self::ALL.get(self as usize).map_or("", |(_, n)| n)
    }

    /// The code a `grpc-status` value stands for, as gRPC clients read it: a number 0-16 is that
    /// code; a number outside that range is UNKNOWN; a value that is not a number at all is
    /// INTERNAL (a server that cannot write its status is broken).
    pub fn parse(value: &[u8]) -> GrpcCode {
        let digits = value.trim_ascii();
        if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
            return GrpcCode::Internal;
        }
        let n = digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        GrpcCode::from_number(n).unwrap_or(GrpcCode::Unknown)
    }
}

impl fmt::Display for GrpcCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of gRPC codes: one bit per code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrpcCodes(u32);

impl GrpcCodes {
    /// The codes that are the host's failure unless configured otherwise (docs/grpc.md says why
    /// each).
    pub const DEFAULT_FAILURES: [GrpcCode; 6] = [
        GrpcCode::Unknown,
        GrpcCode::DeadlineExceeded,
        GrpcCode::ResourceExhausted,
        GrpcCode::Internal,
        GrpcCode::Unavailable,
        GrpcCode::DataLoss,
    ];

    pub fn contains(self, code: GrpcCode) -> bool {
        self.0 & (1 << code as u8) != 0
    }

    pub fn iter(self) -> impl Iterator<Item = GrpcCode> {
        GrpcCode::ALL
            .into_iter()
            .map(|(c, _)| c)
            .filter(move |c| self.contains(*c))
    }
}

impl FromIterator<GrpcCode> for GrpcCodes {
    fn from_iter<I: IntoIterator<Item = GrpcCode>>(codes: I) -> Self {
        GrpcCodes(codes.into_iter().fold(0, |bits, c| bits | 1 << c as u8))
    }
}

/// Whether a response `content-type` is gRPC: `application/grpc`, optionally followed by `+`
/// and a codec (`application/grpc+proto`) or by `;` and parameters, in any case. gRPC-Web
/// (`application/grpc-web...`) is not: its trailers travel in the body, out of the plugin's sight.
pub fn is_grpc_content_type(value: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    let value = value.trim_ascii();
    match (value.get(..GRPC.len()), value.get(GRPC.len())) {
        (Some(head), next) => {
            head.eq_ignore_ascii_case(GRPC) && matches!(next, None | Some(b'+' | b';' | b' '))
        }
        (None, _) => false,
    }
}

/// What the adapter has seen of a response's gRPC status so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrpcResponse {
    /// The response headers said `content-type: application/grpc...`.
    pub is_grpc: bool,
    /// The last `grpc-status` seen: in the headers of a trailers-only response, else in the
    /// trailers.
    pub status: Option<GrpcCode>,
}

impl GrpcResponse {
    /// From the response headers: their `content-type`, and a function reading their
    /// `grpc-status`, called only when the response is gRPC.
    pub fn from_headers(
        content_type: Option<&[u8]>,
        grpc_status: impl FnOnce() -> Option<Vec<u8>>,
    ) -> GrpcResponse {
        let is_grpc = content_type.is_some_and(is_grpc_content_type);
        let status = if is_grpc {
            grpc_status().map(|v| GrpcCode::parse(&v))
        } else {
            None
        };
        GrpcResponse { is_grpc, status }
    }

    /// The trailers' `grpc-status`, read only when the response is gRPC; it replaces anything
    /// the headers said.
    pub fn trailers(&mut self, grpc_status: impl FnOnce() -> Option<Vec<u8>>) {
        if self.is_grpc {
            if let Some(v) = grpc_status() {
                self.status = Some(GrpcCode::parse(&v));
            }
        }
    }

    /// The status to classify the response by: `None` unless the response is gRPC and said one.
    pub fn code(&self) -> Option<GrpcCode> {
        self.status.filter(|_| self.is_grpc)
    }
}
