//! Host calls that cannot fail loudly: each returns an Option or a Result instead of panicking.
//!
//! proxy-wasm 0.2.5 unwraps UTF-8 in every call that returns text the client may have written:
//! `hostcalls::get_map_value`, `get_map` and `get_map_bytes` (header names and values),
//! `get_grpc_status` (the message), and the `Context` helpers built on them. An HTTP/2 request
//! whose `:path` or a header value holds a byte that is not UTF-8 passes Envoy's codec and would
//! panic the VM. So client-controlled values are read here only as bytes
//! (`get_map_value_bytes`), and text properties are decoded without unwrapping.

use std::sync::OnceLock;
use std::time::Instant;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{MapType, Status};

use crate::record::sync::{SharedStore, StoreError};

/// The host's monotonic clock in ns since this VM first read it. `Instant` reads WASI's
/// `clock_time_get` with the monotonic clock, which Envoy serves from its own steady clock, so
/// no wall-clock step reaches the plugin's timers (docs/architecture.md, "Time").
pub fn monotonic_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let elapsed = START.get_or_init(Instant::now).elapsed();
    u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
}

fn property(path: &[&str]) -> Option<Vec<u8>> {
    hostcalls::get_property(path.to_vec()).ok().flatten()
}

/// A property that may legitimately be absent: `Ok(None)` when the host has none, `Err` when
/// the host could not answer (try again later).
pub fn optional_property_string(path: &[&str]) -> Result<Option<String>, Status> {
    hostcalls::get_property(path.to_vec())
        .map(|b| b.map(|b| String::from_utf8_lossy(&b).into_owned()))
}

/// A string property, e.g. `xds.cluster_name` or `upstream.address`.
pub fn property_string(path: &[&str]) -> Option<String> {
    property(path)
        .and_then(|b| String::from_utf8(b).ok())
        .filter(|s| !s.is_empty())
}

/// A numeric property (8-byte little-endian), e.g. `response.code` or `response.flags`.
pub fn property_i64(path: &[&str]) -> Option<i64> {
    let bytes: [u8; 8] = property(path)?.try_into().ok()?;
    Some(i64::from_le_bytes(bytes))
}

/// Sets (or, with `None`, removes) a request header. proxy-wasm 0.2.5's setter returns Ok or
/// panics (on any status but Ok, like `set_filter_state`'s), so this is true wherever it returns;
/// Envoy answers Ok while the request's headers are there, in `on_http_request_headers`, the
/// only place it is called. The callers' fallback for `false` is for an SDK that reports a
/// refusal instead.
pub fn set_request_header(name: &str, value: Option<&str>) -> bool {
    hostcalls::set_map_value(MapType::HttpRequestHeaders, name, value).is_ok()
}

/// Sets the request's filter state `wasm.NAME` to `value` (bytes): what the access log reads as
/// `%FILTER_STATE(wasm.NAME:PLAIN)%`. The SDK panics on any status but Ok, like its header
/// setters; Envoy answers Ok for a request context (it has stream info) and a key set once per
/// request (the default state is mutable bytes), which is the only way it is called.
pub fn set_filter_state(name: &str, value: &str) -> bool {
    hostcalls::set_property(vec![name], Some(value.as_bytes())).is_ok()
}

/// proxy-wasm shared data of this VM id.
pub struct SharedData;

impl SharedStore for SharedData {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        match hostcalls::get_shared_data(key) {
            Ok(found) => Ok(found),
            Err(Status::NotFound) => Ok((None, None)),
            Err(status) => Err(StoreError::Other(format!("{status:?}"))),
        }
    }

    fn set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        match hostcalls::set_shared_data(key, Some(value), cas) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) => Err(StoreError::CasMismatch),
            Err(status) => Err(StoreError::Other(format!("{status:?}"))),
        }
    }
}

/// A request header as the client sent it: bytes, which need not be UTF-8.
pub fn request_header_bytes(name: &str) -> Option<Vec<u8>> {
    map_value_bytes(MapType::HttpRequestHeaders, name)
}

/// A header or trailer of `map` as bytes, `None` when absent or unreadable (e.g. a response
/// header, or trailer, of `HttpResponseHeaders` / `HttpResponseTrailers`).
pub fn map_value_bytes(map: MapType, name: &str) -> Option<Vec<u8>> {
    hostcalls::get_map_value_bytes(map, name).ok().flatten()
}
