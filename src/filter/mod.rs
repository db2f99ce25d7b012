//! The adapter between the host-free core and the proxy-wasm host: the only module that makes
//! host calls. Every host call goes through `host`, which turns host errors into values; nothing
//! here may panic, since a panic fails the request (and, with FAIL_CLOSED, the worker for good).

mod host;
mod http;
mod metrics;
pub mod root;
