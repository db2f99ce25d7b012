//! ewma-lb: latency-aware load balancing for an unmodified Envoy, as a proxy-wasm filter.
//!
//! The host-free core (everything but `filter`) decides; `filter` is the thin adapter to the
//! proxy-wasm host and the only place, with this file, that names `proxy_wasm`.

#![forbid(unsafe_code)]

pub mod clock;
pub mod config;
pub mod diagnose;
pub mod health;
pub mod json;
pub mod locality;
pub mod map;
pub mod outcome;
pub mod outlier;
pub mod persistence;
pub mod pick;
pub mod probe;
pub mod rules;
pub mod score;
pub mod smoothing;
pub mod state;
pub mod status;
pub mod sync;
pub mod telemetry;
pub mod units;
pub mod weights;
pub mod worker;

#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
mod filter;

#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Trace);
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(filter::root::Root::default())
    });
}}
