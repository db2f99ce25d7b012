//! Reading access logs: one JSON object a line, as the shipped envoy.yaml writes them
//! (docs/observability.md, "Access log"), plain or gzip, streamed line by line so a day of a busy
//! proxy never sits in memory. A line that is not such an object is counted and skipped, with its
//! line number.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use anyhow::{Context, Result};
use serde_json::Value;

/// The fields a line needs to be replayed.
pub const REQUIRED: [&str; 4] = ["start_time", "upstream_host", "duration", "response_code"];

/// What one access log line says about a request that reached a host.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Milliseconds since the Unix epoch.
    pub start_ms: f64,
    pub cluster: Option<String>,
    pub host: String,
    /// To the upstream's first byte (`response_duration`), when the line has it.
    pub first_byte_ms: Option<f64>,
    pub duration_ms: f64,
    pub code: u16,
    pub flags: String,
    pub grpc_status: Option<i64>,
    /// The plugin's decision (`ewma_lb`), when the line has one.
    pub decision: Option<String>,
}

impl Entry {
    /// The latency the plugin samples: to the upstream's first byte, else the whole request.
    pub fn latency_ms(&self) -> f64 {
        self.first_byte_ms.unwrap_or(self.duration_ms)
    }

    /// Envoy gave up at the route timeout (flag `UT`): the host's slowness, which the replay
    /// produces from its latency, not a failure of its own.
    pub fn timed_out(&self) -> bool {
        self.flags.split(',').any(|f| f == "UT")
    }

    /// An error as the plugin counts one: no answer, a 5xx, or a gRPC status other than OK.
    pub fn failed(&self) -> bool {
        self.code == 0 || self.code >= 500 || self.grpc_status.is_some_and(|s| s != 0)
    }

    /// A request the plugin never steers whatever its settings (a health probe, a management or
    /// status request): left out of the replay.
    pub fn never_steered(&self) -> bool {
        matches!(
            self.decision.as_deref().and_then(|d| d.split(' ').next()),
            Some("health_path" | "management" | "denied" | "status")
        )
    }
}

/// What reading the logs found, line by line.
#[derive(Clone, Debug, Default)]
pub struct ReadSummary {
    pub lines: u64,
    pub usable: u64,
    /// Lines that are not a JSON object.
    pub unparsable: u64,
    /// Objects without a field replay needs: how many, and how often each field was missing.
    pub missing_lines: u64,
    pub missing: BTreeMap<&'static str, u64>,
    /// Objects with every field but one that does not read (a bad time, a code that is no
    /// number).
    pub bad_value: u64,
    /// Requests that reached no host (local replies, the status page, a request reset before).
    pub no_upstream: u64,
    /// The first skipped lines: file, line number, why.
    pub skipped: Vec<(PathBuf, u64, String)>,
}

/// How many skipped lines the summary names one by one.
pub const SKIPPED_SHOWN: usize = 20;

impl ReadSummary {
    fn skip(&mut self, file: &Path, line: u64, why: String) {
        if self.skipped.len() < SKIPPED_SHOWN {
            self.skipped.push((file.to_owned(), line, why));
        }
    }

    /// Lines skipped for any reason but "reached no host".
    pub fn skipped_count(&self) -> u64 {
        self.unparsable + self.bad_value + self.missing_lines
    }
}

/// Reads every line of `files` in order and hands each usable one to `each`. `progress` shows a
/// bar over the bytes read (on a terminal only).
pub fn read(files: &[PathBuf], progress: bool, mut each: impl FnMut(Entry)) -> Result<ReadSummary> {
    let total: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let bar = if progress {
        let bar = indicatif::ProgressBar::new(total);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "reading {bytes}/{total_bytes} [{bar:30}] {eta} left",
        ) {
            bar.set_style(style);
        }
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut summary = ReadSummary::default();
    for file in files {
        let raw = File::open(file).with_context(|| format!("opening {}", file.display()))?;
        let mut raw = BufReader::new(bar.wrap_read(raw));
        let gzip = raw.fill_buf().map(|b| b.starts_with(&[0x1f, 0x8b]))?;
        let reader: Box<dyn Read> = if gzip {
            Box::new(flate2::read::MultiGzDecoder::new(raw))
        } else {
            Box::new(raw)
        };
        let mut reader = BufReader::new(reader);
        let mut buf = Vec::new();
        let mut number = 0u64;
        loop {
            buf.clear();
            let n = reader
                .read_until(b'\n', &mut buf)
                .with_context(|| format!("reading {} after line {number}", file.display()))?;
            if n == 0 {
                break;
            }
            number += 1;
            let line = String::from_utf8_lossy(&buf);
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            summary.lines += 1;
            match parse(line) {
                Parsed::Entry(e) => {
                    summary.usable += 1;
                    each(e);
                }
                Parsed::NoUpstream => summary.no_upstream += 1,
                Parsed::NotJson(why) => {
                    summary.unparsable += 1;
                    summary.skip(file, number, why);
                }
                Parsed::Missing(fields) => {
                    summary.missing_lines += 1;
                    for f in &fields {
                        *summary.missing.entry(f).or_default() += 1;
                    }
                    summary.skip(file, number, format!("no {}", fields.join(", ")));
                }
                Parsed::BadValue(why) => {
                    summary.bad_value += 1;
                    summary.skip(file, number, why);
                }
            }
        }
    }
    bar.finish_and_clear();
    Ok(summary)
}

enum Parsed {
    Entry(Entry),
    NoUpstream,
    NotJson(String),
    Missing(Vec<&'static str>),
    BadValue(String),
}

/// A number, or a string holding one (`"12"`); `-`, null and anything else are none.
fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A string that says something: not empty, not Envoy's `-` for "none".
fn text(v: &Value) -> Option<&str> {
    v.as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "-")
}

fn parse(line: &str) -> Parsed {
    let v: Value = match serde_json::from_str(line) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return Parsed::NotJson("not a JSON object".into()),
        Err(e) => return Parsed::NotJson(format!("not JSON: {e}")),
    };
    let missing: Vec<&'static str> = REQUIRED
        .into_iter()
        .filter(|f| v.get(f).is_none())
        .collect();
    if !missing.is_empty() {
        return Parsed::Missing(missing);
    }
    let Some(host) = text(&v["upstream_host"]) else {
        return Parsed::NoUpstream;
    };
    let start_ms = match &v["start_time"] {
        Value::String(s) => match humantime::parse_rfc3339_weak(s.trim()) {
            Ok(t) => match t.duration_since(UNIX_EPOCH) {
                Ok(d) => d.as_secs_f64() * 1000.0,
                Err(_) => return Parsed::BadValue(format!("start_time {s:?} before 1970")),
            },
            Err(e) => return Parsed::BadValue(format!("start_time {s:?}: {e}")),
        },
        // Seconds since the epoch (`%START_TIME(%s.%3f)%`).
        Value::Number(n) => n.as_f64().unwrap_or(0.0) * 1000.0,
        other => return Parsed::BadValue(format!("start_time {other}: not a time")),
    };
    let Some(duration_ms) = number(&v["duration"]).filter(|d| *d >= 0.0) else {
        return Parsed::BadValue(format!("duration {}: not a number of ms", v["duration"]));
    };
    let Some(code) = number(&v["response_code"]).and_then(|c| u16::try_from(c as i64).ok()) else {
        return Parsed::BadValue(format!(
            "response_code {}: not a status",
            v["response_code"]
        ));
    };
    Parsed::Entry(Entry {
        start_ms,
        cluster: v.get("upstream_cluster").and_then(text).map(str::to_owned),
        host: host.to_owned(),
        first_byte_ms: v.get("response_duration").and_then(number),
        duration_ms,
        code,
        flags: v
            .get("response_flags")
            .and_then(text)
            .unwrap_or_default()
            .to_owned(),
        grpc_status: v.get("grpc_status").and_then(number).map(|n| n as i64),
        decision: v.get("ewma_lb").and_then(text).map(str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shipped_line_reads() {
        let line = r#"{"duration":14,"ewma_lb":"steered 127.0.0.1:1 3","grpc_status":null,"method":"GET","path":"/work","response_code":200,"response_duration":13,"response_flags":"-","start_time":"2026-12-02T05:34:35.758Z","upstream_cluster":"backend","upstream_host":"127.0.0.1:1","upstream_request_attempt_count":1}"#;
        let Parsed::Entry(e) = parse(line) else {
            panic!("not read")
        };
        assert_eq!(e.host, "127.0.0.1:1");
        assert_eq!(e.latency_ms(), 13.0);
        assert_eq!(e.code, 200);
        assert!(!e.failed() && !e.timed_out() && !e.never_steered());
        assert_eq!(e.start_ms, 1_796_189_675_758.0);
    }

    #[test]
    fn what_cannot_be_read_says_why() {
        assert!(matches!(parse("[info] envoy started"), Parsed::NotJson(_)));
        assert!(
            matches!(parse(r#"{"upstream_host": "a", "duration": 1}"#), Parsed::Missing(f) if f == ["start_time", "response_code"])
        );
        assert!(matches!(
            parse(
                r#"{"start_time": "yesterday", "upstream_host": "a", "duration": 1, "response_code": 200}"#
            ),
            Parsed::BadValue(_)
        ));
        assert!(matches!(
            parse(
                r#"{"start_time": 1, "upstream_host": null, "duration": 1, "response_code": 200}"#
            ),
            Parsed::NoUpstream
        ));
    }
}
