//! One way to run ewma-lb outside a unit test, shared by the end-to-end tests and the benchmark:
//! the shipped envoy-config/envoy.yaml with typed, checked edits ([`config`]), a real Envoy
//! process ([`envoy`]), in-process backends ([`backend`]) with latency profiles ([`latency`]),
//! load ([`load`], [`summary`]), waits that end when due for both ([`timer`]), a tiny HTTP
//! client ([`http`]), free ports, bounded polling, and a [`Stack`] of all of them. Everything
//! talks to 127.0.0.1 only.

pub mod backend;
pub mod config;
pub mod crds;
pub mod eds;
pub mod envoy;
pub mod grpc;
pub mod http;
pub mod latency;
pub mod load;
pub mod paths;
pub mod poll;
pub mod ports;
pub mod stack;
pub mod summary;
pub mod timer;

pub use backend::{Backend, BackendPool, BackendSpec, GrpcStatusIn, Orca, Phase};
pub use config::EnvoyConfig;
pub use eds::{EdsFile, Endpoint};
pub use envoy::{Envoy, EnvoyOptions};
pub use latency::Latency;
pub use load::{LoadSpec, Record};
pub use paths::{plugin_wasm, repo_root, test_module, tool};
pub use poll::{poll, within};
pub use ports::free_port;
pub use stack::Stack;
pub use summary::{shares_per_second, Summary};
