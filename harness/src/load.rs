//! Load generator: open loop at a fixed arrival rate (default) or closed loop with N workers.

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::backend::BACKEND_HEADER;

/// Response header a benchmark's Envoy adds with the upstream host (`%UPSTREAM_HOST%`): it names
/// the host of answers the backend never sent, such as Envoy's 504 on a route timeout.
pub const UPSTREAM_HOST_HEADER: &str = "x-upstream-host";
use crate::http::loopback_authority;

/// Hard cap on requests per run, so a typo in rate or duration cannot run for hours.
pub const MAX_REQUESTS: u64 = 5_000_000;
/// Longest run accepted.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);
/// Pause of a closed-loop worker after a transport error, so a dead target is not hammered in a spin.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// What to send, how fast, for how long.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    pub url: String,
    /// Arrivals per second in open loop; ignored in closed loop.
    pub rate_per_s: f64,
    pub duration: Duration,
    /// Open loop: arrivals beyond this many outstanding requests are recorded as dropped.
    pub max_in_flight: usize,
    /// `Some(n)`: closed loop, n workers each sending back to back.
    pub closed_loop_workers: Option<usize>,
    pub headers: Vec<(String, String)>,
    /// Per request, headers and body; a timeout is recorded as status 0.
    pub timeout: Duration,
    /// The run's time zero, which `sent_at` counts from; `None`: when the run starts. A caller
    /// that compares records with its own clock (when it killed a backend) sets it, or the time
    /// the run took to start would shift one timeline against the other.
    pub epoch: Option<std::time::Instant>,
}

impl LoadSpec {
    /// Open loop at `rate_per_s` for `duration`, 1000 in flight at most, 10 s timeout.
    pub fn new(url: impl Into<String>, rate_per_s: f64, duration: Duration) -> Self {
        LoadSpec {
            url: url.into(),
            rate_per_s,
            duration,
            max_in_flight: 1000,
            closed_loop_workers: None,
            headers: Vec::new(),
            timeout: Duration::from_secs(10),
            epoch: None,
        }
    }

    /// Adds a request header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    fn validate(&self) -> Result<Uri> {
        let uri = Uri::from_str(&self.url).with_context(|| format!("url {:?}", self.url))?;
        loopback_authority(&uri)?;
        if self.duration > MAX_DURATION {
            bail!("duration {:?} exceeds {:?}", self.duration, MAX_DURATION);
        }
        for (k, v) in &self.headers {
            hyper::header::HeaderName::from_bytes(k.as_bytes())
                .with_context(|| format!("header name {k:?}"))?;
            hyper::header::HeaderValue::from_str(v)
                .with_context(|| format!("header {k}: value {v:?}"))?;
        }
        if self.timeout.is_zero() {
            bail!("timeout must be > 0");
        }
        match self.closed_loop_workers {
            Some(0) => bail!("closed loop needs at least one worker"),
            Some(n) if n > 10_000 => bail!("closed loop: {n} workers is too many"),
            Some(_) => {}
            None => {
                if !(self.rate_per_s.is_finite() && self.rate_per_s > 0.0) {
                    bail!("rate {} must be > 0", self.rate_per_s);
                }
                if self.max_in_flight == 0 {
                    bail!("max_in_flight must be >= 1");
                }
                if self.rate_per_s * self.duration.as_secs_f64() > MAX_REQUESTS as f64 {
                    bail!("rate x duration exceeds {MAX_REQUESTS} requests");
                }
            }
        }
        Ok(uri)
    }
}

/// One request's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    /// When it was due (open loop) or sent (closed loop), since the run started.
    pub sent_at: Duration,
    /// From `sent_at` to the end of the body, so generator lag counts against the target.
    pub latency: Duration,
    /// HTTP status, or 0 for a transport error or timeout (and for dropped arrivals).
    pub status: u16,
    /// The `x-backend` response header, else the `x-upstream-host` one (an `IP:port`).
    pub backend: Option<String>,
    /// Open loop: never sent because `max_in_flight` requests were outstanding.
    pub dropped: bool,
    /// A gRPC call's status code (0 is OK); `None` for plain HTTP and for a call that got no
    /// answer (status 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<i32>,
}

impl Record {
    /// A request that got no answer (status 0).
    pub fn failed(sent_at: Duration, latency: Duration) -> Record {
        Record {
            sent_at,
            latency,
            status: 0,
            backend: None,
            dropped: false,
            grpc_status: None,
        }
    }

    /// A completed request with status 0 or >= 500, or a gRPC call whose status is not OK.
    pub fn is_error(&self) -> bool {
        !self.dropped
            && (self.status == 0 || self.status >= 500 || self.grpc_status.is_some_and(|c| c != 0))
    }
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

fn client(pool: usize) -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(Duration::from_secs(5)));
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(pool)
        .pool_idle_timeout(Duration::from_secs(30))
        .build(conn)
}

/// Runs the load on a runtime of its own and returns every record, ordered by `sent_at`.
/// Do not call from inside an async runtime: use [`run_async`] there.
pub fn run(spec: &LoadSpec) -> Result<Vec<Record>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("load")
        .enable_all()
        .build()
        .context("building the load runtime")?;
    rt.block_on(run_async(spec))
}

/// Async [`run`].
pub async fn run_async(spec: &LoadSpec) -> Result<Vec<Record>> {
    run_observed(spec, None).await
}

/// Like [`run_async`], and also sends each record to `observer` as it completes (live reports).
pub async fn run_observed(
    spec: &LoadSpec,
    observer: Option<UnboundedSender<Record>>,
) -> Result<Vec<Record>> {
    let uri = spec.validate()?;
    let pool = spec.closed_loop_workers.unwrap_or(spec.max_in_flight);
    let client = client(pool);
    let (headers, timeout) = (Arc::new(spec.headers.clone()), spec.timeout);
    let call = move |start: Instant, due: Instant| {
        let (client, uri, headers) = (client.clone(), uri.clone(), headers.clone());
        async move { one(&client, uri, &headers, timeout, start, due).await }
    };
    run_calls(spec, observer, call).await
}

/// The schedule of `spec` (open or closed loop, bounds, the final wait) around any kind of call:
/// `call(start, due)` makes one request due at `due` and records it. Plain HTTP is
/// [`run_observed`]; gRPC is `grpc::run_observed`.
pub async fn run_calls<C, F>(
    spec: &LoadSpec,
    observer: Option<UnboundedSender<Record>>,
    call: C,
) -> Result<Vec<Record>>
where
    C: Fn(Instant, Instant) -> F + Send + Sync + Clone + 'static,
    F: Future<Output = Record> + Send + 'static,
{
    spec.validate()?;
    let mut records = match spec.closed_loop_workers {
        None => open_loop(spec, observer, call).await,
        Some(n) => closed_loop(spec, n, observer, call).await,
    };
    records.sort_by_key(|r| r.sent_at);
    Ok(records)
}

struct Sink {
    records: Vec<Record>,
    observer: Option<UnboundedSender<Record>>,
}

impl Sink {
    fn push(&mut self, r: Record) {
        if let Some(o) = &self.observer {
            let _ = o.send(r.clone());
        }
        self.records.push(r);
    }
}

async fn open_loop<C, F>(
    spec: &LoadSpec,
    observer: Option<UnboundedSender<Record>>,
    call: C,
) -> Vec<Record>
where
    C: Fn(Instant, Instant) -> F,
    F: Future<Output = Record> + Send + 'static,
{
    let total = (spec.rate_per_s * spec.duration.as_secs_f64()).floor() as u64;
    let period = Duration::from_secs_f64(1.0 / spec.rate_per_s);
    let mut sink = Sink {
        records: Vec::with_capacity(total.min(1 << 20) as usize),
        observer,
    };
    let mut inflight = JoinSet::new();
    // Arrivals due before the run could start are sent at once, late: that lag counts.
    let start = spec.epoch.map_or_else(Instant::now, Instant::from_std);
    for i in 0..total {
        // Due times come from the schedule, never from earlier answers: a slow target cannot
        // slow the arrivals down and hide its own tail.
        let due = start + period.mul_f64(i as f64);
        crate::timer::sleep_until(due.into_std()).await;
        while let Some(done) = inflight.try_join_next() {
            if let Ok(r) = done {
                sink.push(r);
            }
        }
        if inflight.len() >= spec.max_in_flight {
            sink.push(Record {
                dropped: true,
                ..Record::failed(due - start, Duration::ZERO)
            });
            continue;
        }
        inflight.spawn(call(start, due));
    }
    // Each request is bounded by its timeout; the margin covers scheduling only.
    let deadline = Instant::now() + spec.timeout + Duration::from_secs(2);
    while let Ok(Some(done)) = tokio::time::timeout_at(deadline, inflight.join_next()).await {
        if let Ok(r) = done {
            sink.push(r);
        }
    }
    inflight.abort_all();
    sink.records
}

async fn closed_loop<C, F>(
    spec: &LoadSpec,
    workers: usize,
    observer: Option<UnboundedSender<Record>>,
    call: C,
) -> Vec<Record>
where
    C: Fn(Instant, Instant) -> F + Send + Clone + 'static,
    F: Future<Output = Record> + Send + 'static,
{
    let start = spec.epoch.map_or_else(Instant::now, Instant::from_std);
    let end = start + spec.duration;
    let per_worker_cap = MAX_REQUESTS / workers as u64;
    let mut set = JoinSet::new();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..workers {
        let (call, tx) = (call.clone(), tx.clone());
        set.spawn(async move {
            for _ in 0..per_worker_cap {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                let r = call(start, now).await;
                let failed = r.status == 0;
                if tx.send(r).is_err() {
                    break;
                }
                if failed {
                    tokio::time::sleep(ERROR_BACKOFF).await;
                }
            }
        });
    }
    drop(tx);
    let mut sink = Sink {
        records: Vec::new(),
        observer,
    };
    let deadline = end + spec.timeout + Duration::from_secs(2);
    while let Ok(Some(r)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        sink.push(r);
    }
    set.abort_all();
    sink.records
}

async fn one(
    client: &HttpClient,
    uri: Uri,
    headers: &[(String, String)],
    timeout: Duration,
    start: Instant,
    due: Instant,
) -> Record {
    let mut builder = hyper::Request::get(uri);
    for (k, v) in headers {
        builder = builder.header(k.as_str(), v.as_str());
    }
    let sent_at = due.saturating_duration_since(start);
    let Ok(req) = builder.body(Empty::<Bytes>::new()) else {
        return Record::failed(sent_at, Duration::ZERO);
    };
    let exchange = async {
        let resp = client.request(req).await.ok()?;
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        // `x-backend` names the backend that answered; failing that, the upstream address Envoy
        // reports (`IP:port`), which the caller may map to a name.
        let backend = header(BACKEND_HEADER)
            .or_else(|| header(UPSTREAM_HOST_HEADER).filter(|h| !h.is_empty() && h != "-"));
        // The body is read so the connection goes back to the pool.
        resp.into_body().collect().await.ok()?;
        Some((status, backend))
    };
    let (status, backend) = match tokio::time::timeout(timeout, exchange).await {
        Ok(Some(x)) => x,
        _ => (0, None),
    };
    Record {
        status,
        backend,
        ..Record::failed(sent_at, due.elapsed())
    }
}
