//! Prometheus metrics through proxy-wasm metrics.
//!
//! proxy-wasm metrics have names, not labels. Labels travel inside the name as
//! `NAME.label=.=value;.;` segments, Istio's convention: the `stats_tags` rules shipped in
//! envoy.yaml, and the ones Istio generates from `extraStatTags`, cut them out again, so
//! `/stats/prometheus` shows `NAME{label="value"}`.
//!
//! Requests only bump counts in this VM's memory (a hash lookup, no allocation once a series
//! exists); the tick hands the sums to the host. Every series has at most two labels, the
//! cluster and one more.

use std::collections::HashMap;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

/// Series one VM defines at most: the host keeps every one for good.
const MAX_SERIES: usize = 4096;

struct Series {
    id: u32,
    /// Added since the last flush.
    pending: i64,
}

/// `name -> cluster -> second label value -> series`.
type Index = HashMap<&'static str, HashMap<String, HashMap<String, Series>>>;

#[derive(Default)]
pub struct Metrics {
    series: Index,
    defined: usize,
}

/// One series: a metric, its cluster, and its optional second label.
#[derive(Clone, Copy)]
pub struct Key<'a> {
    pub name: &'static str,
    pub kind: MetricType,
    pub cluster: &'a str,
    /// `("reason", "exploring")`, `("host", "10.0.0.1:80")`, or none.
    pub label: Option<(&'static str, &'a str)>,
}

impl Metrics {
    /// Adds `by` to a counter or gauge; handed to the host on the next `flush`.
    pub fn add(&mut self, key: Key, by: i64) {
        if let Some(series) = self.series_mut(key) {
            series.pending += by;
        }
    }

    /// Sets a gauge now. For values every VM sets alike (the shared weight table).
    pub fn set(&mut self, key: Key, value: u64) {
        if let Some(series) = self.series_mut(key) {
            let _ = hostcalls::record_metric(series.id, value);
        }
    }

    /// Hands every pending sum to the host.
    pub fn flush(&mut self) {
        for series in self.series.values_mut().flat_map(HashMap::values_mut).flat_map(HashMap::values_mut) {
            if series.pending != 0 {
                let _ = hostcalls::increment_metric(series.id, series.pending);
                series.pending = 0;
            }
        }
    }

    fn series_mut(&mut self, key: Key) -> Option<&mut Series> {
        let second = key.label.map_or("", |(_, value)| value);
        let exists = self
            .series
            .get(key.name)
            .and_then(|by_cluster| by_cluster.get(key.cluster))
            .is_some_and(|by_label| by_label.contains_key(second));
        if !exists {
            if self.defined >= MAX_SERIES {
                return None;
            }
            let id = hostcalls::define_metric(key.kind, &encode(key)).ok()?;
            self.defined += 1;
            self.series
                .entry(key.name)
                .or_default()
                .entry(key.cluster.to_owned())
                .or_default()
                .insert(second.to_owned(), Series { id, pending: 0 });
        }
        self.series.get_mut(key.name)?.get_mut(key.cluster)?.get_mut(second)
    }
}

/// `NAME.cluster_name=.=C;.;LABEL=.=V;.;`, with `;` in values replaced so a value cannot end its
/// segment early. Envoy drops the dot left at the end once the labels are cut out.
fn encode(key: Key) -> String {
    let mut out = format!("{}.", key.name);
    let labels = std::iter::once(("cluster_name", key.cluster)).chain(key.label);
    for (label, value) in labels {
        out.push_str(label);
        out.push_str("=.=");
        out.extend(value.chars().map(|c| if c == ';' { '_' } else { c }));
        out.push_str(";.;");
    }
    out
}
