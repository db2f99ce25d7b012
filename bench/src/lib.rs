//! Test and benchmark tooling for ewma-lb: real HTTP backends on 127.0.0.1, an open/closed-loop
//! load generator with latency summaries, and a real Envoy process runner.

pub mod backend;
pub mod compare;
pub mod envoy;
pub mod http;
pub mod latency;
pub mod load;
pub mod metrics;
pub mod micro;
pub mod overhead;
pub mod plot;
pub mod policy;
pub mod ports;
pub mod scenario;
pub mod summary;
pub mod template;
pub mod wait;

pub use backend::{Backend, BackendSpec, Phase};
pub use envoy::{Envoy, EnvoyOptions};
pub use latency::Latency;
pub use load::{LoadSpec, Record};
pub use ports::free_port;
pub use summary::{shares_per_second, Summary};
pub use template::render;
