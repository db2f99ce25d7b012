//! Prometheus metrics through proxy-wasm metrics.
//!
//! proxy-wasm metrics have names, not labels. Labels travel inside the name as
//! `NAME_label=.=value;.;` segments, which the `stats_tags` rules shipped in envoy.yaml (and
//! Istio's own rules for the same convention) cut out again, so `/stats/prometheus` shows
//! `NAME{label="value"}`. Metric ids are defined once per name and cached in the VM.

use std::collections::HashMap;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

/// Defines metrics on first use and remembers their ids.
#[derive(Default)]
pub struct Metrics {
    ids: HashMap<String, u32>,
}

/// Number of distinct metric names a VM defines at most: the host keeps every one for good.
const MAX_METRICS: usize = 4096;

impl Metrics {
    fn id(&mut self, kind: MetricType, name: &str, labels: &[(&str, &str)]) -> Option<u32> {
        let full = encode(name, labels);
        if let Some(id) = self.ids.get(&full) {
            return Some(*id);
        }
        if self.ids.len() >= MAX_METRICS {
            return None;
        }
        let id = hostcalls::define_metric(kind, &full).ok()?;
        self.ids.insert(full, id);
        Some(id)
    }

    pub fn increment(&mut self, name: &str, labels: &[(&str, &str)], by: i64) {
        if let Some(id) = self.id(MetricType::Counter, name, labels) {
            let _ = hostcalls::increment_metric(id, by);
        }
    }

    /// Adds to a gauge that several VMs share (each adds its own part, e.g. in-flight requests).
    pub fn add_gauge(&mut self, name: &str, labels: &[(&str, &str)], by: i64) {
        if let Some(id) = self.id(MetricType::Gauge, name, labels) {
            let _ = hostcalls::increment_metric(id, by);
        }
    }

    /// Sets a gauge every VM would set to the same value (from the shared table).
    pub fn set_gauge(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        if let Some(id) = self.id(MetricType::Gauge, name, labels) {
            let _ = hostcalls::record_metric(id, value);
        }
    }
}

/// `NAME_l1=.=v1;.;l2=.=v2;.;`. Characters that would end a segment early are replaced.
fn encode(name: &str, labels: &[(&str, &str)]) -> String {
    let mut out = String::from(name);
    for (i, (label, value)) in labels.iter().enumerate() {
        if i == 0 {
            out.push('_');
        }
        out.push_str(label);
        out.push_str("=.=");
        out.extend(value.chars().map(|c| if c == ';' { '_' } else { c }));
        out.push_str(";.;");
    }
    out
}
