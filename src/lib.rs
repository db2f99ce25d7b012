//! ewma-lb: latency-aware load balancing for an unmodified Envoy, as a proxy-wasm filter.
//!
//! The host-free core (everything but `filter`) decides; `filter` is the thin adapter to the
//! proxy-wasm host and the only place, with this file, that names `proxy_wasm`.

#![forbid(unsafe_code)]

pub mod clock;
#[path = "config/mod.rs"]
pub mod config;
#[path = "worker/diagnose.rs"]
pub mod diagnose;
#[path = "worker/health.rs"]
pub mod health;
#[path = "config/json.rs"]
pub mod json;
#[path = "balance/locality.rs"]
pub mod locality;
pub mod map;
#[path = "worker/outcome.rs"]
pub mod outcome;
#[path = "balance/outlier.rs"]
pub mod outlier;
#[path = "record/persistence.rs"]
pub mod persistence;
#[path = "balance/pick.rs"]
pub mod pick;
#[path = "balance/probe.rs"]
pub mod probe;
#[path = "worker/rules.rs"]
pub mod rules;
#[path = "balance/score.rs"]
pub mod score;
#[path = "balance/smoothing.rs"]
pub mod smoothing;
#[path = "record/state.rs"]
pub mod state;
#[path = "worker/status.rs"]
pub mod status;
#[path = "record/sync.rs"]
pub mod sync;
#[path = "worker/telemetry.rs"]
pub mod telemetry;
pub mod units;
#[path = "balance/weights.rs"]
pub mod weights;
#[path = "worker/mod.rs"]
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
