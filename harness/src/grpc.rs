//! gRPC for tests and benchmarks: a minimal service, `ewma.test.Echo`, its client calls, and a
//! load of unary calls on the same schedule as the HTTP load ([`crate::load`]).
//!
//! The service is defined here in Rust, not in a `.proto` file: its messages are prost messages
//! derived by hand, and calls go through tonic's generic client and server halves with its
//! prost codec, so there is no build script and no `protoc`. On the wire it is ordinary gRPC
//! over HTTP/2 (h2c): any gRPC client could call it with the equivalent `.proto`:
//!
//! ```text
//! package ewma.test;
//! service Echo {
//!   rpc Work(WorkRequest) returns (WorkReply);                // unary
//!   rpc Watch(WatchRequest) returns (stream WorkReply);       // server streaming
//! }
//! message WorkRequest { string payload = 1; }
//! message WatchRequest { uint32 messages = 1; }
//! message WorkReply { string backend = 1; uint32 seq = 2; }
//! ```
//!
//! Every answer names its backend: the reply's `backend` field and the `x-backend` metadata
//! (response headers, and the trailers of an error), so a test knows who served a call that
//! failed too.

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use hyper::http::uri::PathAndQuery;
use hyper::Uri;
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};
use tonic_prost::ProstCodec;

use crate::backend::{BACKEND_HEADER, SEEN_OVERRIDE_HEADER};
use crate::http::loopback_authority;
use crate::load::{run_calls, LoadSpec, Record};

/// gRPC status codes, for callers that have no tonic of their own.
pub use tonic::Code;

/// The unary method: one reply after the backend's latency (or its injected failure).
pub const UNARY_PATH: &str = "/ewma.test.Echo/Work";
/// The server-streaming method: `messages` replies, one per latency sample.
pub const STREAM_PATH: &str = "/ewma.test.Echo/Watch";
/// Connections a gRPC load opens to its target; calls are spread over them and multiplexed on
/// each. Several, so every Envoy worker gets some (Envoy balances connections, not calls).
pub const LOAD_CONNECTIONS: usize = 8;

#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkRequest {
    #[prost(string, tag = "1")]
    pub payload: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchRequest {
    #[prost(uint32, tag = "1")]
    pub messages: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkReply {
    #[prost(string, tag = "1")]
    pub backend: String,
    #[prost(uint32, tag = "2")]
    pub seq: u32,
}

/// How a call ended, as the client saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallResult {
    /// The gRPC status; `None` when no answer came (connection failure, timeout).
    pub code: Option<Code>,
    /// `x-backend` of the answer (headers, else the error's trailers).
    pub backend: Option<String>,
    /// `x-seen-override`: the override header the backend received, if any.
    pub seen_override: Option<String>,
    /// Replies received (streaming: how many of the stream's messages arrived).
    pub replies: u32,
}

/// A client connection (HTTP/2, h2c) to `url` (`http://127.0.0.1:PORT`, loopback only),
/// established lazily on the first call. Call it inside a Tokio runtime (the channel's driver
/// is spawned on it).
pub fn channel(url: &str) -> Result<Channel> {
    let uri: Uri = url.parse().with_context(|| format!("url {url:?}"))?;
    loopback_authority(&uri)?;
    let endpoint = Endpoint::from_str(url)
        .with_context(|| format!("gRPC endpoint {url:?}"))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    Ok(endpoint.connect_lazy())
}

fn metadata(map: &tonic::metadata::MetadataMap, name: &str) -> Option<String> {
    map.get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// `None` for a status the client made up because no answer came (connection refused, reset):
/// those are transport errors, not answers.
fn answered(status: &Status) -> Option<Code> {
    let transport = std::error::Error::source(status)
        .is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some());
    (!transport).then_some(status.code())
}

fn error_result(status: &Status) -> CallResult {
    CallResult {
        code: answered(status),
        backend: metadata(status.metadata(), BACKEND_HEADER),
        seen_override: metadata(status.metadata(), SEEN_OVERRIDE_HEADER),
        replies: 0,
    }
}

/// One unary call `Work`, with extra request metadata `headers`.
pub async fn unary(channel: Channel, headers: &[(String, String)]) -> CallResult {
    let mut grpc = tonic::client::Grpc::new(channel);
    if grpc.ready().await.is_err() {
        return CallResult::unanswered();
    }
    let request = with_headers(
        Request::new(WorkRequest {
            payload: "work".into(),
        }),
        headers,
    );
    let path = PathAndQuery::from_static(UNARY_PATH);
    match grpc
        .unary::<WorkRequest, WorkReply, _>(request, path, ProstCodec::default())
        .await
    {
        Ok(response) => CallResult {
            code: Some(Code::Ok),
            backend: metadata(response.metadata(), BACKEND_HEADER)
                .or_else(|| Some(response.get_ref().backend.clone())),
            seen_override: metadata(response.metadata(), SEEN_OVERRIDE_HEADER),
            replies: 1,
        },
        Err(status) => error_result(&status),
    }
}

/// One server-streaming call `Watch` asking for `messages` replies, read to its end.
pub async fn watch(channel: Channel, messages: u32, headers: &[(String, String)]) -> CallResult {
    let mut grpc = tonic::client::Grpc::new(channel);
    if grpc.ready().await.is_err() {
        return CallResult::unanswered();
    }
    let request = with_headers(Request::new(WatchRequest { messages }), headers);
    let path = PathAndQuery::from_static(STREAM_PATH);
    let response = match grpc
        .server_streaming::<WatchRequest, WorkReply, _>(request, path, ProstCodec::default())
        .await
    {
        Ok(r) => r,
        Err(status) => return error_result(&status),
    };
    let backend = metadata(response.metadata(), BACKEND_HEADER);
    let seen_override = metadata(response.metadata(), SEEN_OVERRIDE_HEADER);
    let mut stream = response.into_inner();
    let mut replies = 0;
    loop {
        match stream.message().await {
            Ok(Some(_)) => replies += 1,
            Ok(None) => {
                return CallResult {
                    code: Some(Code::Ok),
                    backend,
                    seen_override,
                    replies,
                }
            }
            Err(status) => {
                return CallResult {
                    replies,
                    backend: backend.or_else(|| metadata(status.metadata(), BACKEND_HEADER)),
                    ..error_result(&status)
                }
            }
        }
    }
}

impl CallResult {
    fn unanswered() -> CallResult {
        CallResult {
            code: None,
            backend: None,
            seen_override: None,
            replies: 0,
        }
    }
}

fn with_headers<T>(mut request: Request<T>, headers: &[(String, String)]) -> Request<T> {
    for (name, value) in headers {
        let (Ok(name), Ok(value)) = (
            name.parse::<tonic::metadata::AsciiMetadataKey>(),
            value.parse(),
        ) else {
            continue;
        };
        request.metadata_mut().insert(name, value);
    }
    request
}

/// One call of [`sequence`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Unary,
    /// A `Watch` stream asking for this many replies.
    Watch(u32),
}

/// Starts `calls` in order, `every` apart, spread over `connections` connections to `url`
/// (multiplexed: a call does not wait for the one before), and returns their results in the
/// same order once all have ended. Runs on a runtime of its own.
pub fn sequence(
    url: &str,
    calls: &[Call],
    every: Duration,
    connections: usize,
) -> Result<Vec<CallResult>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("grpc-calls")
        .enable_all()
        .build()
        .context("building the gRPC calls runtime")?;
    rt.block_on(async {
        let channels = channels(url, connections)?;
        let mut started = Vec::with_capacity(calls.len());
        for (i, call) in calls.iter().enumerate() {
            let channel = channels
                .get(i % channels.len())
                .cloned()
                .context("no channel")?;
            started.push(match *call {
                Call::Unary => tokio::spawn(async move { unary(channel, &[]).await }),
                Call::Watch(n) => tokio::spawn(async move { watch(channel, n, &[]).await }),
            });
            tokio::time::sleep(every).await;
        }
        let mut results = Vec::with_capacity(started.len());
        for handle in started {
            results.push(handle.await.context("a call's task failed")?);
        }
        Ok(results)
    })
}

/// `n` lazily connected channels to `url`.
pub fn channels(url: &str, n: usize) -> Result<Vec<Channel>> {
    (0..n.max(1)).map(|_| channel(url)).collect()
}

/// Runs a load of unary calls on a runtime of its own: `spec`'s schedule, rate and timeout;
/// its URL names only the target (`http://127.0.0.1:PORT`, any path is ignored: the method is
/// [`UNARY_PATH`]); its headers become request metadata. Calls are spread over
/// [`LOAD_CONNECTIONS`] connections. A record's status is 200 when an answer came (its gRPC
/// code in `grpc_status`), 0 when none did.
pub fn run(spec: &LoadSpec) -> Result<Vec<Record>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("grpc-load")
        .enable_all()
        .build()
        .context("building the gRPC load runtime")?;
    rt.block_on(run_observed(spec, None))
}

/// Async [`run`], sending each record to `observer` as it completes.
pub async fn run_observed(
    spec: &LoadSpec,
    observer: Option<UnboundedSender<Record>>,
) -> Result<Vec<Record>> {
    let uri: Uri = spec
        .url
        .parse()
        .with_context(|| format!("url {:?}", spec.url))?;
    let Some(authority) = uri.authority() else {
        bail!("{}: no host", spec.url)
    };
    let channels = Arc::new(channels(&format!("http://{authority}"), LOAD_CONNECTIONS)?);
    let next = Arc::new(AtomicUsize::new(0));
    let (headers, timeout) = (Arc::new(spec.headers.clone()), spec.timeout);
    let call = move |start: Instant, due: Instant| {
        let i = next.fetch_add(1, Ordering::Relaxed) % channels.len();
        let (channel, headers) = (channels.get(i).cloned(), headers.clone());
        async move {
            let sent_at = due.saturating_duration_since(start);
            let Some(channel) = channel else {
                return Record::failed(sent_at, Duration::ZERO);
            };
            let result = tokio::time::timeout(timeout, unary(channel, &headers))
                .await
                .ok();
            let latency = due.elapsed();
            match result.and_then(|r| r.code.map(|code| (code, r.backend))) {
                Some((code, backend)) => Record {
                    status: 200,
                    backend,
                    grpc_status: Some(code as i32),
                    ..Record::failed(sent_at, latency)
                },
                None => Record::failed(sent_at, latency),
            }
        }
    };
    run_calls(spec, observer, call).await
}
