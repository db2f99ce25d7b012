//! What a finished request says about its host, from odd codes and flags included.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

use ewma_lb::outcome::{flags, Outcome};

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn codes_and_flags_classify_the_host() {
    let cases = [
        (Some(200), 0, Some(Outcome::Success)),
        (Some(404), 0, Some(Outcome::Success)),
        (Some(101), 0, Some(Outcome::Success)),
        (Some(503), 0, Some(Outcome::ServerError)),
        (Some(599), 0, Some(Outcome::ServerError)),
        (Some(503), flags::UPSTREAM_CONNECTION_FAILURE, Some(Outcome::ConnectFailure)),
        (Some(504), flags::UPSTREAM_REQUEST_TIMEOUT, Some(Outcome::Timeout)),
        (Some(503), flags::UPSTREAM_REMOTE_RESET, Some(Outcome::Reset)),
        (Some(503), flags::UPSTREAM_CONNECTION_TERMINATION, Some(Outcome::Reset)),
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
        assert_eq!(Outcome::classify(code, response_flags), want, "code {code:?} flags {response_flags:#x}");
    }
    assert!(Outcome::Timeout.is_failure() && !Outcome::Success.is_failure());
}
