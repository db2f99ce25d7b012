//! In-process test backends on 127.0.0.1 with latency profiles, a bounded worker pool, injected
//! failures, and stop/restart that look like a killed and restarted process to Envoy. Each
//! speaks HTTP/1.1 and HTTP/2 (h2c, prior knowledge) on the same port, and answers gRPC
//! requests as the test service of [`crate::grpc`] ([`grpc`] here).
//!
//! A backend started alone runs on a runtime of its own (one thread); dozens of them (a cluster
//! of 50 endpoints, a rolling restart that starts a new one per endpoint) share the two threads
//! of one [`BackendPool`] instead: they spend their time sleeping out their latency, so two
//! threads serve thousands of requests a second between them.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rand::Rng;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinSet;

use crate::latency::Latency;

mod grpc;
mod spec;
pub use spec::{BackendSpec, GrpcFailure, GrpcStatusIn, Orca, Phase};

/// Response header naming the backend that answered.
pub const BACKEND_HEADER: &str = "x-backend";
/// Request header the filter sets to steer Envoy's host choice.
pub const OVERRIDE_HEADER: &str = "x-ewma-lb-host";
/// Response header echoing the override header the backend received (absent if none).
pub const SEEN_OVERRIDE_HEADER: &str = "x-seen-override";
/// The `user-agent` of Envoy's own HTTP health checks.
const ENVOY_HEALTH_CHECKER: &[u8] = b"Envoy/HC";
/// ORCA's load report header, in the backend's responses when its spec has `orca`.
pub const LOAD_REPORT_HEADER: &str = "endpoint-load-metrics";

/// Distinct paths counted one by one; beyond this they are lumped together so a scan cannot grow
/// the map without bound.
const MAX_TRACKED_PATHS: usize = 10_000;
const OTHER_PATHS: &str = "<other>";
/// Request bodies are drained (so keep-alive works) but never buffered beyond this.
const MAX_BODY: usize = 1 << 20;
const STOP_WAIT: Duration = Duration::from_secs(5);

/// Health probes: light, counted apart, never queued behind business requests.
pub fn is_health_path(path: &str) -> bool {
    path == "/health" || path.starts_with("/actuator/health")
}

#[derive(Default)]
struct Counts {
    /// HTTP business requests that arrived, answered or not (a request Envoy gave up on never is).
    received: AtomicU64,
    served: AtomicU64,
    failed: AtomicU64,
    health: AtomicU64,
    /// Envoy's own active health checks (`user-agent: Envoy/HC`), counted apart from `health`.
    active_checks: AtomicU64,
    /// Business requests that found every worker busy (`capacity`) and waited for one, and their
    /// waits in all, in nanoseconds.
    queued: AtomicU64,
    queued_ns: AtomicU64,
}

struct Shared {
    name: String,
    name_value: HeaderValue,
    base: Mutex<Latency>,
    schedule: Vec<Phase>,
    health_latency: Latency,
    fail_rate: f64,
    grpc_failure: GrpcFailure,
    workers: Option<Arc<Semaphore>>,
    /// Start of the schedule's clock: the backend's start, or the last [`Backend::reset_clock`].
    started: Mutex<Instant>,
    counts: Counts,
    paths: Mutex<HashMap<String, u64>>,
    open_conns: AtomicUsize,
    /// Business requests being served (queued ones included).
    in_flight: AtomicUsize,
    orca: Mutex<Option<spec::Orca>>,
    /// Business requests answered per second, for the load reports: (start of the current
    /// second, answered in it, the rate of the last whole second).
    rate: Mutex<(Instant, u64, f64)>,
    /// What the health path answers.
    health_status: AtomicU16,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test thread must not turn every later count into a panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn current_latency(&self) -> Latency {
        let t = lock(&self.started).elapsed().as_secs_f64();
        self.schedule
            .iter()
            .find(|p| t >= p.from_s && t < p.to_s)
            .map(|p| p.latency.clone())
            .unwrap_or_else(|| lock(&self.base).clone())
    }

    /// One business request's work, whatever the protocol: a worker (when capacity is bounded)
    /// held through the profile's delay, then counted served and, drawn by the failure rate,
    /// failed. True when it fails.
    async fn work(&self) -> bool {
        // The permit is held through the delay: that is what makes requests queue.
        let _permit = match &self.workers {
            Some(w) => match w.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    let since = Instant::now();
                    let permit = w.clone().acquire_owned().await.ok();
                    let waited = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    self.counts.queued.fetch_add(1, Ordering::Relaxed);
                    self.counts.queued_ns.fetch_add(waited, Ordering::Relaxed);
                    permit
                }
            },
            None => None,
        };
        let delay = self.current_latency().sample(&mut rand::rng());
        crate::timer::sleep(delay).await;
        let fail = self.fail_rate > 0.0 && rand::rng().random_bool(self.fail_rate.clamp(0.0, 1.0));
        self.counts.served.fetch_add(1, Ordering::Relaxed);
        if fail {
            self.counts.failed.fetch_add(1, Ordering::Relaxed);
        }
        fail
    }

    /// The rate of business answers over the last whole second; `answered`: count one more.
    fn answered_per_second(&self, answered: bool) -> f64 {
        let mut rate = lock(&self.rate);
        let elapsed = rate.0.elapsed();
        if elapsed >= Duration::from_secs(1) {
            // A silence of several seconds is a rate of 0, not the last busy second's.
            let whole = elapsed.as_secs_f64().floor().max(1.0);
            *rate = (Instant::now(), 0, rate.1 as f64 / whole);
        }
        if answered {
            rate.1 += 1;
        }
        rate.2
    }

    fn count_path(&self, path: &str) {
        let mut paths = lock(&self.paths);
        if let Some(n) = paths.get_mut(path) {
            *n += 1;
        } else if paths.len() < MAX_TRACKED_PATHS {
            paths.insert(path.to_string(), 1);
        } else {
            *paths.entry(OTHER_PATHS.to_string()).or_insert(0) += 1;
        }
    }
}

struct Serving {
    stop: oneshot::Sender<()>,
    done: std_mpsc::Receiver<()>,
}

/// A running (or stopped) backend. Dropping it stops it.
pub struct Backend {
    shared: Arc<Shared>,
    addr: SocketAddr,
    serving: Mutex<Option<Serving>>,
    /// Its own runtime, or its pool's; the last backend (or pool) to let go shuts it down.
    rt: Option<Arc<tokio::runtime::Runtime>>,
}

/// One runtime for many backends: start each with [`BackendPool::start`]. The runtime lives as
/// long as the pool or any of its backends.
pub struct BackendPool {
    rt: Option<Arc<tokio::runtime::Runtime>>,
}

/// Threads of a [`BackendPool`]'s runtime.
pub const POOL_THREADS: usize = 2;

impl BackendPool {
    pub fn new() -> Result<BackendPool> {
        Ok(BackendPool {
            rt: Some(Arc::new(runtime("backend-pool", POOL_THREADS)?)),
        })
    }

    /// Starts a backend on a free loopback port, on the pool's runtime.
    pub fn start(&self, spec: BackendSpec) -> Result<Backend> {
        let rt = self.rt.clone().context("backend pool already shut down")?;
        Backend::start_on(rt, spec, "127.0.0.1:0")
    }

    /// Starts one backend per spec.
    pub fn start_all(&self, specs: impl IntoIterator<Item = BackendSpec>) -> Result<Vec<Backend>> {
        specs.into_iter().map(|s| self.start(s)).collect()
    }
}

impl Drop for BackendPool {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take().and_then(|rt| Arc::try_unwrap(rt).ok()) {
            rt.shutdown_background();
        }
    }
}

fn runtime(name: &str, threads: usize) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(name)
        .enable_all()
        .build()
        .context("building the backend runtime")
}

impl Backend {
    /// Starts a backend on `addr` ("127.0.0.1:0" for any free port), on a runtime of its own;
    /// loopback addresses only.
    pub fn start(spec: BackendSpec, addr: &str) -> Result<Backend> {
        let rt = Arc::new(runtime(&format!("backend-{}", spec.name), 1)?);
        Backend::start_on(rt, spec, addr)
    }

    fn start_on(
        rt: Arc<tokio::runtime::Runtime>,
        spec: BackendSpec,
        addr: &str,
    ) -> Result<Backend> {
        spec.validate()?;
        let want: SocketAddr = addr
            .parse()
            .with_context(|| format!("backend address {addr:?}"))?;
        if !want.ip().is_loopback() {
            bail!(
                "backend {}: address {want} is not loopback; tests stay on this machine",
                spec.name
            );
        }
        let listener =
            bind(&rt, want).with_context(|| format!("backend {}: binding {want}", spec.name))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            name_value: HeaderValue::from_str(&spec.name)?,
            name: spec.name,
            base: Mutex::new(spec.latency),
            schedule: spec.schedule,
            health_latency: spec.health_latency,
            fail_rate: spec.fail_rate,
            grpc_failure: spec.grpc_failure,
            workers: spec.capacity.map(|k| Arc::new(Semaphore::new(k))),
            started: Mutex::new(Instant::now()),
            counts: Counts::default(),
            paths: Mutex::new(HashMap::new()),
            open_conns: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            orca: Mutex::new(spec.orca),
            rate: Mutex::new((Instant::now(), 0, 0.0)),
            health_status: AtomicU16::new(200),
        });
        let serving = spawn_accept(&rt, listener, shared.clone());
        Ok(Backend {
            shared,
            addr,
            serving: Mutex::new(Some(serving)),
            rt: Some(rt),
        })
    }

    /// Starts a backend on a free loopback port.
    pub fn start_local(spec: BackendSpec) -> Result<Backend> {
        Backend::start(spec, "127.0.0.1:0")
    }

    /// The bound address (stable across stop/restart).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://IP:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The backend's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// HTTP business requests that arrived, whether or not they were answered: a request Envoy
    /// stopped waiting for is received and never served.
    pub fn received(&self) -> u64 {
        self.shared.counts.received.load(Ordering::Relaxed)
    }

    /// Business requests answered (200 or 503, gRPC `Work` calls whatever their status), health
    /// probes and gRPC streams excluded.
    pub fn served(&self) -> u64 {
        self.shared.counts.served.load(Ordering::Relaxed)
    }

    /// Business requests answered 503 (gRPC: the spec's failure code).
    pub fn failed(&self) -> u64 {
        self.shared.counts.failed.load(Ordering::Relaxed)
    }

    /// Health-path requests answered, Envoy's own active health checks excluded.
    pub fn health_served(&self) -> u64 {
        self.shared.counts.health.load(Ordering::Relaxed)
    }

    /// Envoy's active health checks answered (`user-agent: Envoy/HC`).
    pub fn active_checks_served(&self) -> u64 {
        self.shared.counts.active_checks.load(Ordering::Relaxed)
    }

    /// Requests answered (health included, Envoy's active checks not) whose path starts with
    /// `prefix`.
    pub fn served_path(&self, prefix: &str) -> u64 {
        lock(&self.shared.paths)
            .iter()
            .filter(|(p, _)| p.starts_with(prefix))
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests answered per path (query strings stripped), health included, Envoy's active
    /// checks not.
    pub fn path_counts(&self) -> HashMap<String, u64> {
        lock(&self.shared.paths).clone()
    }

    /// Business requests that waited for a worker because all `capacity` were busy, and how long
    /// they waited in all: this backend's queue. How the proxy splits the traffic makes it; a
    /// delay inside the proxy (a worker thread descheduled) does not, so it tells a split that
    /// piles requests on a few hosts from a machine that is merely busy.
    pub fn queued(&self) -> (u64, Duration) {
        let c = &self.shared.counts;
        (
            c.queued.load(Ordering::Relaxed),
            Duration::from_nanos(c.queued_ns.load(Ordering::Relaxed)),
        )
    }

    /// Replaces the base latency profile; schedule phases still win inside their windows.
    pub fn set_latency(&self, latency: Latency) {
        *lock(&self.shared.base) = latency;
    }

    /// The latency profile in force right now.
    pub fn latency(&self) -> Latency {
        self.shared.current_latency()
    }

    /// Restarts the schedule's clock: phases count from now (a benchmark run that starts later
    /// than the backend still sees its slowdown at the scheduled second).
    pub fn reset_clock(&self) {
        *lock(&self.shared.started) = Instant::now();
    }

    /// Zeroes all counters.
    pub fn reset_counts(&self) {
        let c = &self.shared.counts;
        c.received.store(0, Ordering::Relaxed);
        c.served.store(0, Ordering::Relaxed);
        c.failed.store(0, Ordering::Relaxed);
        c.health.store(0, Ordering::Relaxed);
        c.active_checks.store(0, Ordering::Relaxed);
        c.queued.store(0, Ordering::Relaxed);
        c.queued_ns.store(0, Ordering::Relaxed);
        lock(&self.shared.paths).clear();
    }

    /// Changes what it reports of its load from now on; `None` stops the reports.
    pub fn set_orca(&self, orca: Option<Orca>) {
        *lock(&self.shared.orca) = orca;
    }

    /// Makes the health path answer `status` from now on (503: a failing readiness check).
    pub fn set_health_status(&self, status: u16) {
        self.shared.health_status.store(status, Ordering::Relaxed);
    }

    /// Client connections open right now.
    pub fn open_connections(&self) -> usize {
        self.shared.open_conns.load(Ordering::Relaxed)
    }

    /// Whether the listener is open.
    pub fn is_running(&self) -> bool {
        lock(&self.serving).is_some()
    }

    /// Closes the listener and every open connection, in-flight requests included, and waits
    /// (a few seconds at most) until they are gone, so new connects are refused like a dead process.
    pub fn stop(&self) {
        let Some(serving) = lock(&self.serving).take() else {
            return;
        };
        let _ = serving.stop.send(());
        let _ = serving.done.recv_timeout(STOP_WAIT);
    }

    /// Listens again on the same address after [`Backend::stop`]; a no-op if running.
    pub fn restart(&self) -> Result<()> {
        let mut serving = lock(&self.serving);
        if serving.is_some() {
            return Ok(());
        }
        let rt = self.rt.as_ref().context("backend runtime is gone")?;
        let listener = bind(rt, self.addr)
            .with_context(|| format!("backend {}: re-binding {}", self.shared.name, self.addr))?;
        *serving = Some(spawn_accept(rt, listener, self.shared.clone()));
        Ok(())
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop();
        // shutdown_background: Drop may run inside another runtime (an async test), where a
        // blocking shutdown would panic. A pool's runtime goes with its last user.
        if let Some(rt) = self.rt.take().and_then(|rt| Arc::try_unwrap(rt).ok()) {
            rt.shutdown_background();
        }
    }
}

fn bind(rt: &tokio::runtime::Runtime, addr: SocketAddr) -> Result<TcpListener> {
    // std's bind sets SO_REUSEADDR, which restart() needs while old connections sit in TIME_WAIT.
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    let _enter = rt.enter();
    Ok(TcpListener::from_std(std_listener)?)
}

fn spawn_accept(
    rt: &tokio::runtime::Runtime,
    listener: TcpListener,
    shared: Arc<Shared>,
) -> Serving {
    let (stop_tx, stop_rx) = oneshot::channel();
    let (done_tx, done_rx) = std_mpsc::channel();
    rt.spawn(accept_loop(listener, shared, stop_rx, done_tx));
    Serving {
        stop: stop_tx,
        done: done_rx,
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut stop: oneshot::Receiver<()>,
    done: std_mpsc::Sender<()>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    conns.spawn(serve_conn(stream, shared.clone()));
                }
                // Out of descriptors and the like: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    // Aborting drops each connection's socket: the peer sees its in-flight request cut.
    conns.shutdown().await;
    let _ = done.send(());
}

struct ConnGuard(Arc<Shared>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.open_conns.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn serve_conn(stream: TcpStream, shared: Arc<Shared>) {
    shared.open_conns.fetch_add(1, Ordering::Relaxed);
    let _guard = ConnGuard(shared.clone());
    let _ = stream.set_nodelay(true);
    let svc = service_fn(move |req| handle(req, shared.clone()));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
}

async fn handle(
    req: Request<Incoming>,
    sh: Arc<Shared>,
) -> Result<Response<tonic::body::Body>, Infallible> {
    if grpc::is_grpc(&req) {
        return Ok(grpc::handle(req, sh).await);
    }
    Ok(handle_http(req, sh).await.map(tonic::body::Body::new))
}

async fn handle_http(req: Request<Incoming>, sh: Arc<Shared>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let seen = req.headers().get(OVERRIDE_HEADER).cloned();
    let active_check = req
        .headers()
        .get(hyper::header::USER_AGENT)
        .is_some_and(|v| v.as_bytes() == ENVOY_HEALTH_CHECKER);
    let _ = Limited::new(req.into_body(), MAX_BODY).collect().await;

    let health = is_health_path(&path);
    let mut report = None;
    let status = if health {
        let delay = sh.health_latency.sample(&mut rand::rng());
        crate::timer::sleep(delay).await;
        let count = match active_check {
            true => &sh.counts.active_checks,
            false => &sh.counts.health,
        };
        count.fetch_add(1, Ordering::Relaxed);
        StatusCode::from_u16(sh.health_status.load(Ordering::Relaxed))
            .unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
    } else {
        sh.counts.received.fetch_add(1, Ordering::Relaxed);
        let in_flight = sh.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        // The load as the request arrived: what a host reports with its answer is the state it
        // was in, and a report taken after the request left would always miss that request.
        let rps = sh.answered_per_second(false);
        report = lock(&sh.orca).as_ref().map(|o| o.header(in_flight, rps));
        let failed = sh.work().await;
        sh.in_flight.fetch_sub(1, Ordering::Relaxed);
        sh.answered_per_second(true);
        if failed {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::OK
        }
    };
    // Envoy's own health checks are the pool's, not the test's traffic: counted apart only.
    if !active_check {
        sh.count_path(&path);
    }

    let mut resp = Response::new(Full::new(Bytes::from(format!("{}\n", sh.name))));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(BACKEND_HEADER, sh.name_value.clone());
    h.insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain"),
    );
    if let Some(v) = seen {
        h.insert(SEEN_OVERRIDE_HEADER, v);
    }
    if let Some(v) = report.and_then(|r| HeaderValue::from_str(&r).ok()) {
        h.insert(LOAD_REPORT_HEADER, v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_health_paths() {
        assert!(is_health_path("/health"));
        assert!(is_health_path("/actuator/health"));
        assert!(is_health_path("/actuator/health/liveness"));
        assert!(!is_health_path("/healthy"));
        assert!(!is_health_path("/actuator/metrics"));
    }
}
