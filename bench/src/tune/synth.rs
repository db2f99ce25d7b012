//! Synthetic access logs: the simulator runs a world (hosts whose latency is known) under some
//! settings and writes what a real Envoy's shipped access log would (docs/observability.md,
//! "Access log"), so tests know the answer the tuner must find.

use std::io::Write;

use anyhow::Result;
use serde_json::json;

use crate::policy::Policy;
use crate::sim::engine::run_logged;
use crate::sim::{host_address, SimSpec};

/// Epoch ms of the logs' first second (2026-01-01T00:00:00Z).
const EPOCH_MS: u64 = 1_767_225_600_000;

/// Runs `policy` over `spec` (its first seed) and writes one shipped-format line per answered
/// request to `out`, in the order of their answers as Envoy writes them.
pub fn write_log(spec: &SimSpec, policy: &Policy, out: &mut dyn Write) -> Result<usize> {
    let (_, log) = run_logged(spec, policy)?;
    for r in &log {
        let ms = EPOCH_MS + r.arrival_ns / 1_000_000;
        let start = humantime::format_rfc3339_millis(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
        );
        let latency_ms = r.latency_ns / 1_000_000;
        let (code, flags) = match r.outcome {
            ewma_lb::balance::outcome::Outcome::Timeout => (504, "UT"),
            o if o.is_failure() => (503, "-"),
            _ => (200, "-"),
        };
        let line = json!({
            "start_time": start.to_string(),
            "method": "GET",
            "path": "/work",
            "response_code": code,
            "response_flags": flags,
            "grpc_status": null,
            "upstream_cluster": "backend",
            "upstream_host": host_address(r.host as usize),
            "response_duration": latency_ms,
            "duration": latency_ms,
            "upstream_request_attempt_count": 1,
            "ewma_lb": r.decision.as_deref().unwrap_or("-"),
        });
        writeln!(out, "{line}")?;
    }
    Ok(log.len())
}
