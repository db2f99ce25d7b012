//! Outcome: what a finished request says about the host that served it.
//!
//! Envoy reports a request's end as a status code plus response flags (the `%RESPONSE_FLAGS%` of
//! its access log, as a bitmask). A 5xx, a reset, a timeout or a failed connection is the host's
//! failure; a request the client abandoned says nothing about the host and is not sampled.

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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// 1xx-4xx from the upstream: the host did its job (a 404 is an answer).
    Success,
    ServerError,
    Reset,
    Timeout,
    ConnectFailure,
}

impl Outcome {
    pub fn is_failure(self) -> bool {
        self != Outcome::Success
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
}
