//! Prometheus metrics through proxy-wasm metrics: the core's [`Update`]s mapped to host calls.
//!
//! proxy-wasm metrics have names, not labels. Labels travel inside the name as
//! `NAME.label=.=value;.;` segments, Istio's convention: the `stats_tags` rules shipped in
//! envoy.yaml, and the ones Istio generates from `extraStatTags`, cut them out again, so
//! `/stats/prometheus` shows `NAME{label="value"}`.
//!
//! Additions are summed in this VM's memory and handed to the host once per tick (`flush`).
//!
//! The host keeps every series a VM defines, for good, and offers no delete. So a VM keeps at
//! most `MAX_SERIES` in use: past that, the series updated least recently is evicted (a gauge every
//! VM sets is set to 0 first, so a forgotten host does not keep its last weight; one every VM
//! moves by deltas, requests in flight, keeps what the VMs added) and counted in
//! `ewma_lb_metric_series_evicted_total`, and the new series takes its place.

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

use crate::map::Map;
use crate::worker::telemetry::{
    Build, Change, Metric, MetricKind, Update, CLUSTER_LABEL, NO_CLUSTER,
};

/// Series one VM keeps updating at most (docs/observability.md).
const MAX_SERIES: usize = 4096;

struct Series {
    id: u32,
    metric: Metric,
    /// Added since the last flush.
    pending: i64,
    /// When it was last updated, in updates applied by this VM.
    last_used: u64,
}

/// `(metric, cluster, label value) -> series`, keyed by the updates' shared names: finding a
/// series allocates nothing.
type Index = Map<(Metric, Rc<str>, Option<Rc<str>>), Series>;

#[derive(Default)]
pub struct Metrics {
    series: Index,
    /// Updates applied so far: the clock of `Series::last_used`.
    applied: u64,
    /// Evictions not yet handed to the host.
    evicted: i64,
    /// The eviction counter's own series (never evicted).
    evicted_id: Option<u32>,
}

impl Metrics {
    /// Applies one update: additions wait for `flush`, gauges are set at once.
    pub fn apply(&mut self, update: &Update) {
        let Some(series) = self.series_mut(update) else {
            return;
        };
        match update.change {
            Change::Add(by) => series.pending += by,
            Change::Set(value) => {
                let _ = hostcalls::record_metric(series.id, value);
            }
        }
    }

    /// `ewma_lb_build_info{version, commit}` = 1. Every VM sets the same value, once.
    pub fn build_info(&mut self, build: &Build) {
        let name = encode_name(Metric::BuildInfo, &build.labels());
        if let Ok(id) = hostcalls::define_metric(MetricType::Gauge, &name) {
            let _ = hostcalls::record_metric(id, 1);
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
        if self.evicted > 0 {
            let eviction = Update {
                metric: Metric::MetricSeriesEvicted,
                cluster: NO_CLUSTER.into(),
                label: None,
                change: Change::Add(self.evicted),
            };
            let id = self.evicted_id.or_else(|| define(&eviction));
            if let Some(id) = id {
                let _ = hostcalls::increment_metric(id, self.evicted);
                self.evicted_id = Some(id);
                self.evicted = 0;
            }
        }
    }

    fn series_mut(&mut self, update: &Update) -> Option<&mut Series> {
        self.applied += 1;
        let key = (update.metric, update.cluster.clone(), update.label.clone());
        if !self.series.contains_key(&key) {
            if self.series.len() >= MAX_SERIES {
                self.evict_least_recent();
            }
            let id = define(update)?;
            let series = Series {
                id,
                metric: update.metric,
                pending: 0,
                last_used: self.applied,
            };
            self.series.insert(key.clone(), series);
        }
        let series = self.series.get_mut(&key)?;
        series.last_used = self.applied;
        Some(series)
    }

    fn evict_least_recent(&mut self) {
        let Some(key) = self
            .series
            .iter()
            .min_by_key(|(_, s)| s.last_used)
            .map(|(k, _)| k.clone())
        else {
            return;
        };
        if let Some(series) = self.series.remove(&key) {
            if series.metric.moved_by_deltas() {
                if series.pending != 0 {
                    let _ = hostcalls::increment_metric(series.id, series.pending);
                }
            } else if series.metric.kind() == MetricKind::Gauge {
                let _ = hostcalls::record_metric(series.id, 0);
            }
            self.evicted += 1;
        }
    }
}

fn define(update: &Update) -> Option<u32> {
    let kind = match update.metric.kind() {
        MetricKind::Counter => MetricType::Counter,
        MetricKind::Gauge => MetricType::Gauge,
    };
    hostcalls::define_metric(kind, &encode(update)).ok()
}

/// `NAME.cluster_name=.=C;.;LABEL=.=V;.;`. Envoy drops the dot left at the end once the labels are
/// cut out.
fn encode(update: &Update) -> String {
    let second = update.metric.label().zip(update.label.as_deref());
    let labels: Vec<(&str, &str)> = std::iter::once((CLUSTER_LABEL, &*update.cluster))
        .chain(second)
        .collect();
    encode_name(update.metric, &labels)
}

/// `NAME.LABEL=.=VALUE;.;...`, with `;` in values replaced so a value cannot end its segment
/// early.
fn encode_name(metric: Metric, labels: &[(&str, &str)]) -> String {
    let mut out = format!("{}.", metric.name());
    for (label, value) in labels {
        out.push_str(label);
        out.push_str("=.=");
        out.extend(value.chars().map(|c| if c == ';' { '_' } else { c }));
        out.push_str(";.;");
    }
    out
}
