//! ewma-lb: latency-aware load balancing for an unmodified Envoy, as a proxy-wasm filter.
//!
//! The host-free core (everything but `filter`) decides; `filter` is the thin adapter to the
//! proxy-wasm host and the only place, with this file, that names `proxy_wasm`.

#![forbid(unsafe_code)]

pub mod balance;
pub mod clock;
pub mod config;
mod hash;
pub mod map;
mod names;
pub mod record;
pub mod rules;
#[cfg(feature = "testing")]
pub mod testing;
pub mod units;
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
