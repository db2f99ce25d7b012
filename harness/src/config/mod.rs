//! The shipped Envoy config (envoy-config/envoy.yaml) as a tree, with typed, checked edits:
//! every test and every benchmark runs that file with only what it names changed. An edit that
//! does not find the shape it expects fails with the file and the path, so a change to the
//! shipped config can never leave a test silently running something else.
//!
//! The views ([`Listener`], [`HttpManager`], [`Route`], [`WasmFilter`], [`Cluster`]) are named
//! places of the tree with the edits that belong there; anything else is reached by path
//! (`set`, `insert`, `remove`, `push`). A new edit goes on the view that owns its place (an EDS
//! source or HTTP/2 upstream options on `Cluster`, a native filter ahead of the plugin on
//! `HttpManager`), and a second listener or cluster is found by its name like the first.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use harness::config::{EnvoyConfig, CLUSTER, LISTENER};
//! let mut config = EnvoyConfig::shipped()?;
//! config.set_admin_port(0)?;
//! config.listener(LISTENER)?.set_port(10_001)?;
//! config.cluster(CLUSTER)?.set_endpoints(&["127.0.0.1:8081".parse()?])?;
//! config.plugin()?.set_plugin_config(r#"{"shadow": true}"#)?;
//! config.listener(LISTENER)?.http()?.route_to(CLUSTER)?.set_timeout(std::time::Duration::from_secs(2))?;
//! let yaml = config.to_yaml()?;
//! # Ok(()) }
//! ```

mod cluster;
mod listener;
mod node;
mod path;
mod route;
mod wasm;

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{anyhow, Context, Result};
use serde::Deserialize;
use serde_json::Value;

pub use cluster::{Cluster, EnvoyLb, LbPolicy};
pub use listener::{HttpManager, Listener, HTTP_CONNECTION_MANAGER};
pub use node::Node;
pub use path::{KeyPath, Seg};
pub use route::{proto_duration, Route};
pub use wasm::{WasmFilter, WASM_FILTER};

use crate::eds::EdsFile;
use crate::paths;

/// The shipped config's listener.
pub const LISTENER: &str = "ingress";
/// The shipped config's balanced cluster.
pub const CLUSTER: &str = "backend";
/// The cluster through which the plugin reads Envoy's admin `/clusters` (`envoy_health`).
pub const ADMIN_CLUSTER: &str = "envoy_admin";

/// A bootstrap config, parsed, edited in place, rendered for Envoy.
#[derive(Clone, Debug)]
pub struct EnvoyConfig {
    /// Where it came from, for error messages.
    origin: String,
    root: Value,
}

impl EnvoyConfig {
    /// envoy-config/envoy.yaml as it is in the repository now.
    pub fn shipped() -> Result<EnvoyConfig> {
        let text = std::fs::read_to_string(paths::shipped_config())
            .with_context(|| format!("reading {}", paths::shipped_config().display()))?;
        EnvoyConfig::from_yaml(paths::SHIPPED_CONFIG, &text)
    }

    /// The shipped config made runnable here, next to other Envoys: the admin port left to Envoy
    /// (the runner reads it back), or a free one that the plugin's admin cluster
    /// ([`ADMIN_CLUSTER`]) points at when the config has one; the listener on `listen_port`, the
    /// plugin's module at `module` (the shipped path is relative to the repository root).
    ///
    /// A `listen_port` of 0 leaves the listener's port to Envoy too ([`crate::Envoy::listener_addr`]
    /// reads it back).
    pub fn local(listen_port: u16, module: &Path) -> Result<EnvoyConfig> {
        let mut config = EnvoyConfig::shipped()?;
        config.pick_admin_port()?;
        config.listener(LISTENER)?.set_port(listen_port)?;
        config.plugin()?.set_module_file(module)?;
        Ok(config)
    }

    /// The admin port: left to Envoy (0), or, when the config has the plugin's admin cluster
    /// ([`ADMIN_CLUSTER`]), which must name it beforehand, a free one it points at. Called
    /// again, it picks another: a start that found the port taken tries again with it.
    pub fn pick_admin_port(&mut self) -> Result<&mut Self> {
        match self.cluster(ADMIN_CLUSTER) {
            Ok(mut admin) => {
                let port = crate::ports::free_port()?;
                admin.set_endpoints(&[SocketAddr::from(([127, 0, 0, 1], port))])?;
                self.set_admin_port(port)
            }
            Err(_) => self.set_admin_port(0),
        }
    }

    /// Any bootstrap file.
    pub fn load(file: &Path) -> Result<EnvoyConfig> {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        EnvoyConfig::from_yaml(&file.display().to_string(), &text)
    }

    /// Parses YAML (or JSON) text; `origin` names it in errors.
    pub fn from_yaml(origin: &str, text: &str) -> Result<EnvoyConfig> {
        let root = Value::deserialize(serde_norway::Deserializer::from_str(text))
            .with_context(|| format!("{origin}: not YAML"))?;
        if !root.is_object() {
            return Err(anyhow!(
                "{origin}: not an Envoy bootstrap (expected a mapping at the top)"
            ));
        }
        Ok(EnvoyConfig {
            origin: origin.to_string(),
            root,
        })
    }

    /// The YAML Envoy reads.
    pub fn to_yaml(&self) -> Result<String> {
        serde_norway::to_string(&self.root).with_context(|| format!("rendering {}", self.origin))
    }

    /// The tree, for reading.
    pub fn value(&self) -> &Value {
        &self.root
    }

    /// The whole config as a [`Node`]: `get`/`set`/`insert`/`remove` by path.
    pub fn root(&mut self) -> Node<'_> {
        Node::new(&mut self.root, &self.origin)
    }

    /// What `path` names (`static_resources.clusters[name=backend].connect_timeout`).
    pub fn get(&self, path: &str) -> Result<&Value> {
        let rel = KeyPath::parse(path)?;
        path::walk(&self.root, &rel)
            .map_err(|(failed, why)| anyhow!("{}: {failed}: {why}", self.origin))
    }

    /// Replaces what `path` names; it must exist (anything without a named edit below).
    pub fn set(&mut self, path: &str, value: impl Into<Value>) -> Result<&mut Self> {
        self.root().set(path, value)?;
        Ok(self)
    }

    /// The admin listener's port (0: Envoy chooses; the runner reads it back).
    pub fn set_admin_port(&mut self, port: u16) -> Result<&mut Self> {
        self.set("admin.address.socket_address.port_value", port)
    }

    pub fn listener(&mut self, name: &str) -> Result<Listener<'_>> {
        Ok(Listener(self.root().into_node(&format!(
            "static_resources.listeners[name={name}]"
        ))?))
    }

    pub fn cluster(&mut self, name: &str) -> Result<Cluster<'_>> {
        Ok(Cluster(self.root().into_node(&format!(
            "static_resources.clusters[name={name}]"
        ))?))
    }

    /// The proxy's own zone: the bootstrap's `node.locality.zone` (Istio sets it from the pod's
    /// topology labels; the plugin reads it as `xds.node.locality.zone`).
    pub fn set_node_zone(&mut self, zone: &str) -> Result<&mut Self> {
        self.ensure_node()?;
        self.root()
            .node("node")?
            .upsert("locality", serde_json::json!({ "zone": zone }))?;
        Ok(self)
    }

    /// `cluster` reads its endpoints from `eds`'s file ([`Cluster::use_eds_file`]). Envoy asks
    /// the bootstrap's node for an id and a cluster name to read it: a `node` with both is added
    /// when the config has none.
    pub fn use_eds_file(&mut self, cluster: &str, eds: &EdsFile) -> Result<&mut Self> {
        self.cluster(cluster)?.use_eds_file(eds)?;
        self.ensure_node()
    }

    /// A bootstrap `node` with an `id` and a `cluster`, added when missing.
    fn ensure_node(&mut self) -> Result<&mut Self> {
        if self.get("node").is_err() {
            self.root().insert(
                "node",
                serde_json::json!({ "id": "ewma-lb", "cluster": "ewma-lb" }),
            )?;
        }
        Ok(self)
    }

    /// The plugin: the wasm filter of the shipped listener.
    pub fn plugin(&mut self) -> Result<WasmFilter<'_>> {
        self.listener(LISTENER)?.http()?.wasm()
    }

    /// Takes the plugin out of the shipped listener's filter chain.
    pub fn remove_plugin(&mut self) -> Result<&mut Self> {
        self.listener(LISTENER)?
            .http()?
            .remove_http_filter(WASM_FILTER)?;
        Ok(self)
    }

    /// The policy swap: `cluster` balanced by Envoy's own `lb`, and no plugin, so nothing but
    /// Envoy chooses the host.
    pub fn use_envoy_lb(&mut self, cluster: &str, lb: EnvoyLb) -> Result<&mut Self> {
        self.cluster(cluster)?.use_envoy_lb(lb)?;
        self.remove_plugin()
    }

    /// The policy swap to Envoy's `client_side_weighted_round_robin` (see
    /// [`Cluster::use_client_side_wrr`]), and no plugin.
    pub fn use_client_side_wrr(
        &mut self,
        cluster: &str,
        blackout: &str,
        weight_update_period: &str,
    ) -> Result<&mut Self> {
        self.cluster(cluster)?
            .use_client_side_wrr(blackout, weight_update_period)?;
        self.remove_plugin()
    }

    /// Every wasm module given by a relative file name, made relative to `base` instead (Envoy
    /// reads them from its working directory); how many there were.
    pub fn resolve_module_paths(&mut self, base: &Path) -> usize {
        wasm::resolve_module_paths(&mut self.root, base)
    }
}
