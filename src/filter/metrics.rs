//! Prometheus metrics through proxy-wasm metrics: the core's [`Update`]s mapped to host calls.
//!
//! proxy-wasm metrics have names, not labels. Labels travel inside the name as
//! `NAME.label=.=value;.;` segments, Istio's convention: the `stats_tags` rules shipped in
//! envoy.yaml, and the ones Istio generates from `extraStatTags`, cut them out again, so
//! `/stats/prometheus` shows `NAME{label="value"}`.
//!
//! Additions are summed in this VM's memory and handed to the host once per tick (`flush`).

use std::collections::HashMap;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

use crate::telemetry::{Change, Metric, MetricKind, Update, CLUSTER_LABEL};

/// Series one VM defines at most: the host keeps every one for good.
const MAX_SERIES: usize = 4096;

struct Series {
    id: u32,
    /// Added since the last flush.
    pending: i64,
}

/// `(metric, cluster, label value) -> series`.
type Index = HashMap<(Metric, String, String), Series>;

#[derive(Default)]
pub struct Metrics {
    series: Index,
}

impl Metrics {
    /// Applies one update: additions wait for `flush`, gauges are set at once.
    pub fn apply(&mut self, update: &Update) {
        let Some(series) = self.series_mut(update) else { return };
        match update.change {
            Change::Add(by) => series.pending += by,
            Change::Set(value) => {
                let _ = hostcalls::record_metric(series.id, value);
            }
        }
    }

    /// Hands every pending sum to the host.
    pub fn flush(&mut self) {
        for series in self.series.values_mut() {
            if series.pending != 0 {
                let _ = hostcalls::increment_metric(series.id, series.pending);
                series.pending = 0;
            }
        }
    }

    fn series_mut(&mut self, update: &Update) -> Option<&mut Series> {
        let key = (update.metric, update.cluster.clone(), update.label.clone().unwrap_or_default());
        if !self.series.contains_key(&key) {
            if self.series.len() >= MAX_SERIES {
                return None;
            }
            let kind = match update.metric.kind() {
                MetricKind::Counter => MetricType::Counter,
                MetricKind::Gauge => MetricType::Gauge,
            };
            let id = hostcalls::define_metric(kind, &encode(update)).ok()?;
            self.series.insert(key.clone(), Series { id, pending: 0 });
        }
        self.series.get_mut(&key)
    }
}

/// `NAME.cluster_name=.=C;.;LABEL=.=V;.;`, with `;` in values replaced so a value cannot end its
/// segment early. Envoy drops the dot left at the end once the labels are cut out.
fn encode(update: &Update) -> String {
    let mut out = format!("{}.", update.metric.name());
    let second = update.metric.label().zip(update.label.as_deref());
    for (label, value) in std::iter::once((CLUSTER_LABEL, update.cluster.as_str())).chain(second) {
        out.push_str(label);
        out.push_str("=.=");
        out.extend(value.chars().map(|c| if c == ';' { '_' } else { c }));
        out.push_str(";.;");
    }
    out
}
