//! The adapter between the host-free core and the proxy-wasm host: the only module that makes
//! host calls. It maps host calls to core calls and host errors to values and logs; every
//! decision is the core's. Nothing here may panic, since a panic fails the request (and, with
//! FAIL_CLOSED, the worker for good).

mod host;
mod http;
mod metrics;
pub mod root;
mod timing;
mod vm;
