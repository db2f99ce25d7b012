//! What a finished request says about its host, from odd codes and flags included, and what a
//! gRPC response's status says.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

use ewma_lb::balance::outcome::{
    flags, is_grpc_content_type, GrpcCode, GrpcCodes, GrpcResponse, Outcome,
};

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn codes_and_flags_classify_the_host() {
    let cases = [
        (Some(200), 0, Some(Outcome::Success)),
        (Some(404), 0, Some(Outcome::Success)),
        (Some(101), 0, Some(Outcome::Success)),
        (Some(503), 0, Some(Outcome::ServerError)),
        (Some(599), 0, Some(Outcome::ServerError)),
        (
            Some(503),
            flags::UPSTREAM_CONNECTION_FAILURE,
            Some(Outcome::ConnectFailure),
        ),
        (
            Some(504),
            flags::UPSTREAM_REQUEST_TIMEOUT,
            Some(Outcome::Timeout),
        ),
        (
            Some(503),
            flags::UPSTREAM_REMOTE_RESET,
            Some(Outcome::Reset),
        ),
        (
            Some(503),
            flags::UPSTREAM_CONNECTION_TERMINATION,
            Some(Outcome::Reset),
        ),
        (None, flags::UPSTREAM_REMOTE_RESET, Some(Outcome::Reset)),
        // No host was tried, or the client left: nothing to learn about a host.
        (Some(503), flags::NO_HEALTHY_UPSTREAM, None),
        (Some(0), 0, None),
        (None, 0, None),
        // Codes no HTTP server sends.
        (Some(-1), 0, None),
        (Some(99), 0, None),
        (Some(600), 0, None),
        (Some(i64::MAX), 0, None),
    ];
    for (code, response_flags, want) in cases {
        assert_eq!(
            Outcome::classify(code, response_flags),
            want,
            "code {code:?} flags {response_flags:#x}"
        );
    }
    assert!(Outcome::Timeout.is_failure() && !Outcome::Success.is_failure());
    assert!(Outcome::GrpcFailure(GrpcCode::Unavailable).is_failure());
}

/// content-type, the headers' grpc-status, the trailers' grpc-status, HTTP code, flags: outcome.
type Case = (
    Option<&'static str>,
    Option<&'static str>,
    Option<&'static str>,
    i64,
    u64,
    Option<Outcome>,
);

/// One response end to end through the pure functions the adapter calls: the response headers'
/// content-type and grpc-status, the trailers' grpc-status (`None`: no trailers), Envoy's code
/// and flags, and the default failure codes.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn grpc_responses_are_classified_by_their_status_only_when_they_are_grpc() {
    use GrpcCode::*;
    const GRPC: Option<&str> = Some("application/grpc");
    const UR: u64 = flags::UPSTREAM_REMOTE_RESET;
    let failed = |c| Some(Outcome::GrpcFailure(c));
    let ok = Some(Outcome::Success);
    #[rustfmt::skip]
    let cases: &[Case] = &[
        // content-type, headers' grpc-status, trailers' grpc-status, HTTP code, flags: outcome
        // Status in the trailers, HTTP 200: the usual gRPC answer.
        (GRPC, None, Some("0"), 200, 0, ok),
        (GRPC, None, Some("14"), 200, 0, failed(Unavailable)),
        (GRPC, None, Some("13"), 200, 0, failed(Internal)),
        (GRPC, None, Some("2"), 200, 0, failed(Unknown)),
        (GRPC, None, Some("15"), 200, 0, failed(DataLoss)),
        (GRPC, None, Some("4"), 200, 0, failed(DeadlineExceeded)),
        (GRPC, None, Some("8"), 200, 0, failed(ResourceExhausted)),
        // The caller's mistakes are answers.
        (GRPC, None, Some("3"), 200, 0, ok),
        (GRPC, None, Some("5"), 200, 0, ok),
        (GRPC, None, Some("7"), 200, 0, ok),
        (GRPC, None, Some("12"), 200, 0, ok),
        (GRPC, None, Some("16"), 200, 0, ok),
        // CANCELLED: the call was abandoned, no sample.
        (GRPC, None, Some("1"), 200, 0, None),
        // Trailers-only: the status in the headers, no trailers.
        (GRPC, Some("14"), None, 200, 0, failed(Unavailable)),
        (GRPC, Some("0"), None, 200, 0, ok),
        (GRPC, Some("1"), None, 200, 0, None),
        // The trailers have the last word.
        (GRPC, Some("0"), Some("14"), 200, 0, failed(Unavailable)),
        // Codecs, parameters and case.
        (Some("application/grpc+proto"), None, Some("14"), 200, 0, failed(Unavailable)),
        (Some("application/grpc; charset=utf-8"), None, Some("14"), 200, 0, failed(Unavailable)),
        (Some("Application/GRPC"), None, Some("14"), 200, 0, failed(Unavailable)),
        // Not gRPC: a grpc-status means nothing (Envoy's response.grpc_status reads 2 for these).
        (Some("text/plain"), Some("14"), Some("14"), 200, 0, ok),
        (None, Some("14"), None, 200, 0, ok),
        (Some("application/grpc-web"), Some("14"), None, 200, 0, ok),
        (Some("application/grpcx"), Some("14"), None, 200, 0, ok),
        (Some("text/plain"), None, None, 503, 0, Some(Outcome::ServerError)),
        // gRPC without a status: the HTTP code decides.
        (GRPC, None, None, 200, 0, ok),
        (GRPC, None, None, 503, 0, Some(Outcome::ServerError)),
        (GRPC, Some("5"), None, 503, 0, ok),
        // Statuses gRPC clients read as UNKNOWN (out of range) or INTERNAL (not a number).
        (GRPC, None, Some("17"), 200, 0, failed(Unknown)),
        (GRPC, None, Some("99999999999"), 200, 0, failed(Internal)),
        (GRPC, None, Some("-1"), 200, 0, failed(Internal)),
        (GRPC, None, Some(""), 200, 0, failed(Internal)),
        (GRPC, None, Some(" 14 "), 200, 0, failed(Unavailable)),
        // Transport failures win over whatever status Envoy's local reply carries.
        (GRPC, Some("14"), None, 200, UR, Some(Outcome::Reset)),
        (GRPC, Some("14"), None, 504, flags::UPSTREAM_REQUEST_TIMEOUT, Some(Outcome::Timeout)),
        (GRPC, Some("14"), None, 200, flags::NO_HEALTHY_UPSTREAM, None),
        (GRPC, Some("0"), None, 0, 0, None),
    ];
    let failures: GrpcCodes = GrpcCodes::DEFAULT_FAILURES.into_iter().collect();
    for &(content_type, in_headers, in_trailers, code, response_flags, want) in cases {
        let mut grpc = GrpcResponse::from_headers(content_type.map(str::as_bytes), || {
            in_headers.map(|v| v.as_bytes().to_vec())
        });
        if in_trailers.is_some() {
            grpc.trailers(|| in_trailers.map(|v| v.as_bytes().to_vec()));
        }
        let got = Outcome::with_grpc(
            Outcome::classify(Some(code), response_flags),
            grpc.code(),
            failures,
        );
        assert_eq!(got, want, "{content_type:?} headers {in_headers:?} trailers {in_trailers:?} code {code} flags {response_flags:#x}");
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_failure_list_is_the_operators() {
    let only_unimplemented: GrpcCodes = [GrpcCode::Unimplemented].into_iter().collect();
    let classify = |status: GrpcCode, failures| {
        Outcome::with_grpc(Some(Outcome::Success), Some(status), failures)
    };
    assert_eq!(
        classify(GrpcCode::Unimplemented, only_unimplemented),
        Some(Outcome::GrpcFailure(GrpcCode::Unimplemented))
    );
    assert_eq!(
        classify(GrpcCode::Unavailable, only_unimplemented),
        Some(Outcome::Success)
    );
    assert_eq!(
        classify(GrpcCode::Unavailable, GrpcCodes::default()),
        Some(Outcome::Success)
    );
    assert_eq!(classify(GrpcCode::Cancelled, GrpcCodes::default()), None);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn codes_have_their_canonical_numbers_and_names() {
    for (i, (code, name)) in GrpcCode::ALL.iter().enumerate() {
        assert_eq!(*code as usize, i);
        assert_eq!(GrpcCode::from_name(name), Some(*code));
        assert_eq!(GrpcCode::parse(i.to_string().as_bytes()), *code);
        assert_eq!(code.to_string(), *name);
    }
    assert!(!is_grpc_content_type(b"application/grp"));
    assert!(is_grpc_content_type(b" application/grpc "));
}

/// The client controls when its request ends and whether it waits for the answer: neither may
/// count against the host.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn what_a_request_says_depends_on_who_ended_it() {
    // (code, flags, upstream answered, request ended) -> outcome
    let cases = [
        (Some(200), 0, true, true, Some(Outcome::Success)),
        (Some(503), 0, true, true, Some(Outcome::ServerError)),
        // The upstream answered before the body ended (it did not need it): its answer.
        (Some(200), 0, true, false, Some(Outcome::Success)),
        // The client left after the upstream's answer had started: the answer stands.
        (
            Some(200),
            flags::DOWNSTREAM_CONNECTION_TERMINATION,
            true,
            true,
            Some(Outcome::Success),
        ),
        // Envoy's stream idle timeout on a stalled body: Envoy's 408, not the host's.
        (Some(408), flags::STREAM_IDLE_TIMEOUT, false, false, None),
        // A body that never ended, the client gone: nothing about the host.
        (
            Some(0),
            flags::DOWNSTREAM_CONNECTION_TERMINATION,
            false,
            false,
            None,
        ),
        (None, flags::DOWNSTREAM_REMOTE_RESET, false, false, None),
        // ... unless the host failed it.
        (
            Some(503),
            flags::UPSTREAM_CONNECTION_FAILURE,
            false,
            false,
            Some(Outcome::ConnectFailure),
        ),
        (
            Some(503),
            flags::UPSTREAM_REMOTE_RESET,
            false,
            false,
            Some(Outcome::Reset),
        ),
        (Some(503), 0, false, false, None),
        // The whole request sent, the client gone before the answer: it waited that long.
        (
            Some(0),
            flags::DOWNSTREAM_CONNECTION_TERMINATION,
            false,
            true,
            Some(Outcome::Abandoned),
        ),
        (
            Some(408),
            flags::STREAM_IDLE_TIMEOUT,
            false,
            true,
            Some(Outcome::Abandoned),
        ),
        (
            Some(504),
            flags::UPSTREAM_REQUEST_TIMEOUT,
            false,
            true,
            Some(Outcome::Timeout),
        ),
    ];
    for (code, f, answered, ended, want) in cases {
        assert_eq!(
            Outcome::of_request(code, f, answered, ended),
            want,
            "code {code:?}, flags {f:#x}, answered {answered}, ended {ended}"
        );
    }
    assert!(!Outcome::Abandoned.is_failure());
}

/// The adapter skips the `response.flags` read when `Outcome::needs_flags` says so: then no
/// flag Envoy can set with such a response changes the outcome, whoever ended the request. And
/// where it reads them, some flag would change it.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_flags_are_read_exactly_when_they_can_change_the_outcome() {
    let codes = [
        None,
        Some(0),
        Some(99),
        Some(100),
        Some(200),
        Some(204),
        Some(302),
        Some(404),
        Some(408),
        Some(429),
        Some(499),
        Some(500),
        Some(502),
        Some(503),
        Some(504),
        Some(599),
        Some(600),
        Some(-1),
    ];
    let downstream = [
        flags::DOWNSTREAM_CONNECTION_TERMINATION,
        flags::STREAM_IDLE_TIMEOUT,
        flags::DOWNSTREAM_PROTOCOL_ERROR,
        flags::DURATION_TIMEOUT,
        flags::DOWNSTREAM_REMOTE_RESET,
    ];
    // Every combination of the client's flags, each with any other single bit Envoy might add
    // (rate limited, local reset, retries exhausted, ...), but never a bit of UPSTREAM_FAILURE.
    let mut possible = Vec::new();
    for subset in 0..1u32 << downstream.len() {
        let base = downstream
            .iter()
            .enumerate()
            .filter(|(i, _)| subset & 1 << i != 0)
            .fold(0, |f, (_, bit)| f | bit);
        for extra in (0..64).map(|b| 1u64 << b).chain([0]) {
            possible.push((base | extra) & !flags::UPSTREAM_FAILURE);
        }
    }
    let decisive: Vec<u64> = (0..64)
        .map(|b| 1u64 << b)
        .filter(|bit| bit & (flags::UPSTREAM_FAILURE | flags::DOWNSTREAM) != 0)
        .collect();
    let mut skipped = 0;
    for code in codes {
        for answered in [false, true] {
            for response_ended in [false, true] {
                for request_ended in [false, true] {
                    let without = Outcome::of_request(code, 0, answered, request_ended);
                    let changes =
                        |f: u64| Outcome::of_request(code, f, answered, request_ended) != without;
                    let case = format!(
                        "code {code:?}, answered {answered}, response ended {response_ended}, request ended {request_ended}"
                    );
                    if Outcome::needs_flags(code, answered, response_ended) {
                        assert!(
                            decisive.iter().any(|&f| changes(f)),
                            "read for nothing: {case}"
                        );
                    } else {
                        skipped += 1;
                        for &f in &possible {
                            assert!(!changes(f), "flags {f:#x} change {case}");
                        }
                    }
                }
            }
        }
    }
    // Complete answers with codes 100-499, whoever ended the request: 8 codes x 2.
    assert_eq!(skipped, 16);
}
