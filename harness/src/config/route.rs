//! A route: its timeout and the headers it adds to responses.

use std::time::Duration;

use anyhow::Result;
use serde_json::json;

use super::node::view;

view!(
    /// An item of a virtual host's `routes`.
    Route
);

impl Route<'_> {
    /// The route's `timeout` (the shipped route has one).
    pub fn set_timeout(&mut self, timeout: Duration) -> Result<&mut Self> {
        self.set("route.timeout", proto_duration(timeout))?;
        Ok(self)
    }

    /// Appends to `response_headers_to_add`; `value` may use Envoy's format strings
    /// (`%UPSTREAM_HOST%`).
    pub fn add_response_header(&mut self, key: &str, value: &str) -> Result<&mut Self> {
        if self.get("response_headers_to_add").is_err() {
            self.insert("response_headers_to_add", json!([]))?;
        }
        self.node("response_headers_to_add")?
            .push(json!({ "header": { "key": key, "value": value } }))?;
        Ok(self)
    }
}

/// A protobuf `Duration` in its JSON form: seconds with up to nine decimals, `"1.64s"`.
pub fn proto_duration(d: Duration) -> String {
    let text = format!("{}.{:09}", d.as_secs(), d.subsec_nanos());
    format!("{}s", text.trim_end_matches('0').trim_end_matches('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_protobuf_json() {
        assert_eq!(proto_duration(Duration::from_secs(5)), "5s");
        assert_eq!(proto_duration(Duration::from_millis(1640)), "1.64s");
        assert_eq!(proto_duration(Duration::from_nanos(1)), "0.000000001s");
        assert_eq!(proto_duration(Duration::ZERO), "0s");
    }
}
