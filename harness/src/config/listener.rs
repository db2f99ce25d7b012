//! A listener and its HTTP connection manager: the port, how far X-Forwarded-For is trusted, the
//! route to a cluster, the HTTP filter chain.

use anyhow::Result;
use serde_json::Value;

use super::node::view;
use super::route::Route;
use super::wasm::{WasmFilter, WASM_FILTER};

/// The network filter that holds the HTTP filters and routes.
pub const HTTP_CONNECTION_MANAGER: &str = "envoy.filters.network.http_connection_manager";

view!(
    /// `static_resources.listeners[name=...]`.
    Listener
);

impl<'a> Listener<'a> {
    pub fn port(&self) -> Result<u16> {
        let v = self.get("address.socket_address.port_value")?;
        v.as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| {
                self.error(
                    "address.socket_address.port_value",
                    format!("{v} is not a port"),
                )
            })
    }

    /// 0 lets Envoy choose.
    pub fn set_port(&mut self, port: u16) -> Result<&mut Self> {
        self.set("address.socket_address.port_value", port)?;
        Ok(self)
    }

    /// The HTTP connection manager of the listener's (first) filter chain.
    pub fn http(self) -> Result<HttpManager<'a>> {
        let at = format!("filter_chains[0].filters[name={HTTP_CONNECTION_MANAGER}].typed_config");
        Ok(HttpManager(self.0.into_node(&at)?))
    }
}

view!(
    /// The `typed_config` of a listener's `http_connection_manager`.
    HttpManager
);

impl<'a> HttpManager<'a> {
    /// How many proxies in front are trusted to append to X-Forwarded-For (Envoy's
    /// `xff_num_trusted_hops`): the client address the plugin's allowlist checks follows it.
    pub fn set_xff_num_trusted_hops(&mut self, hops: u32) -> Result<&mut Self> {
        self.upsert("xff_num_trusted_hops", hops)?;
        Ok(self)
    }

    /// The one route whose action sends to `cluster`, in any virtual host.
    pub fn route_to(self, cluster: &str) -> Result<Route<'a>> {
        let hosts = self
            .get("route_config.virtual_hosts")?
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut found = Vec::new();
        for (h, host) in hosts.iter().enumerate() {
            let host_at = match host.get("name").and_then(Value::as_str) {
                Some(name) => format!("route_config.virtual_hosts[name={name}]"),
                None => format!("route_config.virtual_hosts[{h}]"),
            };
            for (r, route) in host
                .get("routes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                if route.pointer("/route/cluster").and_then(Value::as_str) == Some(cluster) {
                    found.push(format!("{host_at}.routes[{r}]"));
                }
            }
        }
        match found.as_slice() {
            [one] => Ok(Route(self.0.into_node(one)?)),
            [] => Err(self.error("", format!("no route sends to cluster {cluster:?}"))),
            many => Err(self.error(
                "",
                format!(
                    "{} routes send to cluster {cluster:?}: {many:?}",
                    many.len()
                ),
            )),
        }
    }

    /// The wasm HTTP filter.
    pub fn wasm(self) -> Result<WasmFilter<'a>> {
        Ok(WasmFilter(
            self.0
                .into_node(&format!("http_filters[name={WASM_FILTER}]"))?,
        ))
    }

    /// The networks the shipped native RBAC filter (the management guard that holds while the
    /// plugin is not running) lets reach management paths: set them with the plugin's
    /// `management.allowed_cidrs`, as an operator would.
    pub fn set_management_guard_cidrs(&mut self, cidrs: &[&str]) -> Result<&mut Self> {
        let ids: Vec<Value> = cidrs
            .iter()
            .map(|c| {
                let (addr, len) = c.split_once('/').unwrap_or((c, if c.contains(':') { "128" } else { "32" }));
                serde_json::json!({"remote_ip": {"address_prefix": addr, "prefix_len": len.parse::<u32>().unwrap_or(0)}})
            })
            .collect();
        self.set(
            "http_filters[name=envoy.filters.http.rbac].typed_config.rules.policies.management-outside-allowlist.principals[0].not_id.or_ids.ids",
            Value::Array(ids),
        )?;
        Ok(self)
    }

    /// Takes the HTTP filter `name` out of the chain; an error if the chain has none.
    pub fn remove_http_filter(&mut self, name: &str) -> Result<Value> {
        self.remove(&format!("http_filters[name={name}]"))
    }
}
