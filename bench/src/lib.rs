//! The benchmark tool: one scenario through a real Envoy with each policy (`compare`), what the
//! plugin costs per request (`overhead`, `micro`, `hostcalls`: each host call's price in V8), a fleet of proxies simulated over the plugin's
//! own core (`simulate`), plots, and the published tables rendered from the results (`tables`).
//! Envoy, backends, load and the shipped config's edits come from the harness crate, the same the
//! end-to-end tests use.

pub mod backend_arg;
pub mod compare;
pub mod figures;
pub mod hostcalls;
pub mod membership;
pub mod metrics;
pub mod micro;
pub mod overhead;
pub mod plot;
pub mod policy;
pub mod protocol;
pub mod scenario;
pub mod sim;
pub mod tables;
pub mod tune;
pub mod windows;
