//! The backends' gRPC side: `ewma.test.Echo` ([`crate::grpc`]) with the backend's latency
//! profile, worker pool and failure rate. A failed call answers the spec's gRPC code, either
//! trailers-only (status in the response headers, what tonic and grpc-go send for an error
//! before any message) or after the response headers, in the trailers (what a server that had
//! started its answer sends).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Request, Response};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::metadata::MetadataMap;
use tonic::server::{Grpc, ServerStreamingService};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

use super::spec::GrpcStatusIn;
use super::{Shared, OVERRIDE_HEADER, SEEN_OVERRIDE_HEADER};
use crate::grpc::{WatchRequest, WorkReply, WorkRequest, STREAM_PATH, UNARY_PATH};

/// Most replies one `Watch` call may ask for.
const MAX_STREAM_MESSAGES: u32 = 1000;

/// Whether a request is gRPC (its content-type), so the backend answers it as such.
pub(super) fn is_grpc(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(hyper::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// Answers one gRPC request.
pub(super) async fn handle(req: Request<Incoming>, sh: Arc<Shared>) -> Response<tonic::body::Body> {
    let path = req.uri().path().to_string();
    sh.count_path(&path);
    match path.as_str() {
        UNARY_PATH => {
            Grpc::new(ProstCodec::<WorkReply, WorkRequest>::default())
                .server_streaming(Work(sh), req)
                .await
        }
        STREAM_PATH => {
            Grpc::new(ProstCodec::<WorkReply, WatchRequest>::default())
                .server_streaming(Watch(sh), req)
                .await
        }
        _ => Status::with_metadata(
            Code::Unimplemented,
            format!("no method {path}"),
            named(&sh, None),
        )
        .into_http(),
    }
}

type Replies = Pin<Box<dyn Stream<Item = Result<WorkReply, Status>> + Send>>;
type Answer = Pin<Box<dyn Future<Output = Result<tonic::Response<Replies>, Status>> + Send>>;

/// `x-backend`, and `x-seen-override` when the request carried one.
fn named(sh: &Shared, seen: Option<&HeaderValue>) -> MetadataMap {
    let mut headers = hyper::HeaderMap::new();
    headers.insert(super::BACKEND_HEADER, sh.name_value.clone());
    if let Some(v) = seen {
        headers.insert(SEEN_OVERRIDE_HEADER, v.clone());
    }
    MetadataMap::from_headers(headers)
}

fn seen_override<T>(request: &tonic::Request<T>) -> Option<HeaderValue> {
    request
        .metadata()
        .get(OVERRIDE_HEADER)
        .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok())
}

fn answer(metadata: MetadataMap, replies: Replies) -> tonic::Response<Replies> {
    let mut response = tonic::Response::new(replies);
    *response.metadata_mut() = metadata;
    response
}

/// `Work`: unary on the wire (one request, one reply or a status); served as a one-item stream
/// so that a failure can come in the trailers after the headers.
struct Work(Arc<Shared>);

impl ServerStreamingService<WorkRequest> for Work {
    type Response = WorkReply;
    type ResponseStream = Replies;
    type Future = Answer;

    fn call(&mut self, request: tonic::Request<WorkRequest>) -> Answer {
        let sh = self.0.clone();
        Box::pin(async move {
            let seen = seen_override(&request);
            let fail = sh.work().await;
            let metadata = named(&sh, seen.as_ref());
            if !fail {
                let reply = WorkReply {
                    backend: sh.name.clone(),
                    seq: 0,
                };
                return Ok(answer(metadata, Box::pin(tokio_stream::once(Ok(reply)))));
            }
            let status = Status::with_metadata(
                sh.grpc_failure.code,
                format!("{} fails this call", sh.name),
                metadata.clone(),
            );
            match sh.grpc_failure.status_in {
                GrpcStatusIn::Headers => Err(status),
                GrpcStatusIn::Trailers => {
                    Ok(answer(metadata, Box::pin(tokio_stream::once(Err(status)))))
                }
            }
        })
    }
}

/// `Watch`: the response headers at once, then one reply per latency sample. Streams are not
/// counted as served requests (they are counted by path).
struct Watch(Arc<Shared>);

impl ServerStreamingService<WatchRequest> for Watch {
    type Response = WorkReply;
    type ResponseStream = Replies;
    type Future = Answer;

    fn call(&mut self, request: tonic::Request<WatchRequest>) -> Answer {
        let sh = self.0.clone();
        Box::pin(async move {
            let metadata = named(&sh, seen_override(&request).as_ref());
            let messages = request.get_ref().messages.min(MAX_STREAM_MESSAGES);
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tokio::spawn(async move {
                for seq in 0..messages {
                    let delay = sh.current_latency().sample(&mut rand::rng());
                    crate::timer::sleep(delay).await;
                    if tx
                        .send(Ok(WorkReply {
                            backend: sh.name.clone(),
                            seq,
                        }))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
            Ok(answer(metadata, Box::pin(ReceiverStream::new(rx))))
        })
    }
}
