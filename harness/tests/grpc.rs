//! The backends speak HTTP/2 (h2c) and gRPC as they speak HTTP/1.1: the same name in every
//! answer, the same latency and failures; a failed gRPC call's status travels where the spec
//! says (response headers of a trailers-only response, or trailers), checked on the wire.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Version;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tonic::Code;

use harness::backend::{BACKEND_HEADER, OVERRIDE_HEADER};
use harness::grpc::{self, WorkRequest, STREAM_PATH, UNARY_PATH};
use harness::load::LoadSpec;
use harness::{Backend, BackendSpec, GrpcStatusIn, Latency, Summary};

/// What came back on an HTTP/2 stream: status, headers, trailers.
struct H2Answer {
    status: u16,
    version: Version,
    headers: hyper::HeaderMap,
    trailers: Option<hyper::HeaderMap>,
    body: Bytes,
}

/// One request over a fresh h2c (prior knowledge) connection.
fn h2c(b: &Backend, req: hyper::Request<Full<Bytes>>) -> H2Answer {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = b.addr();
    rt.block_on(async move {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let resp = sender.send_request(req).await.unwrap();
        let (status, version, headers) = (
            resp.status().as_u16(),
            resp.version(),
            resp.headers().clone(),
        );
        let collected = resp.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned();
        H2Answer {
            status,
            version,
            headers,
            trailers,
            body: collected.to_bytes(),
        }
    })
}

/// A raw gRPC `Work` call: the length-prefixed message, `content-type: application/grpc`.
fn raw_work(b: &Backend) -> H2Answer {
    let message = WorkRequest {
        payload: "x".into(),
    }
    .encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    let req = hyper::Request::post(format!("http://{}{UNARY_PATH}", b.addr()))
        .version(Version::HTTP_2)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from(frame)))
        .unwrap();
    h2c(b, req)
}

fn text(map: Option<&hyper::HeaderMap>, name: &str) -> Option<String> {
    map?.get(name).map(|v| v.to_str().unwrap().to_string())
}

#[test]
fn plain_http2_is_answered_like_http1() {
    let b = Backend::start_local(BackendSpec::new("h2", Latency::Fixed(0))).unwrap();
    let req = hyper::Request::get(format!("http://{}/x", b.addr()))
        .version(Version::HTTP_2)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let r = h2c(&b, req);
    assert_eq!((r.status, r.version), (200, Version::HTTP_2));
    assert_eq!(
        text(Some(&r.headers), BACKEND_HEADER).as_deref(),
        Some("h2")
    );
    assert_eq!(&r.body[..], b"h2\n");
    assert_eq!(b.served_path("/x"), 1);
}

#[test]
fn a_failed_call_puts_its_status_where_the_spec_says() {
    let cases = [
        (GrpcStatusIn::Headers, Code::Unavailable),
        (GrpcStatusIn::Trailers, Code::Unavailable),
        (GrpcStatusIn::Trailers, Code::Internal),
    ];
    for (status_in, code) in cases {
        let spec = BackendSpec::new("f", Latency::Fixed(0))
            .fail_rate(1.0)
            .grpc_failure(code, status_in);
        let b = Backend::start_local(spec).unwrap();
        let r = raw_work(&b);
        let want = (code as i32).to_string();
        assert_eq!(r.status, 200, "gRPC errors travel with HTTP 200");
        assert_eq!(
            text(Some(&r.headers), "content-type").as_deref(),
            Some("application/grpc")
        );
        assert_eq!(
            text(Some(&r.headers), BACKEND_HEADER).as_deref(),
            Some("f"),
            "the name in the headers"
        );
        match status_in {
            GrpcStatusIn::Headers => {
                assert_eq!(
                    text(Some(&r.headers), "grpc-status"),
                    Some(want),
                    "trailers-only"
                );
                assert!(r.trailers.is_none() && r.body.is_empty());
            }
            GrpcStatusIn::Trailers => {
                assert_eq!(text(Some(&r.headers), "grpc-status"), None);
                assert_eq!(
                    text(r.trailers.as_ref(), "grpc-status"),
                    Some(want),
                    "in the trailers"
                );
                assert_eq!(
                    text(r.trailers.as_ref(), BACKEND_HEADER).as_deref(),
                    Some("f"),
                    "and the name again"
                );
            }
        }
        assert_eq!((b.served(), b.failed()), (1, 1));
    }
    // A success: status 0 in the trailers after one message.
    let b = Backend::start_local(BackendSpec::new("ok", Latency::Fixed(0))).unwrap();
    let r = raw_work(&b);
    assert_eq!(
        text(r.trailers.as_ref(), "grpc-status").as_deref(),
        Some("0")
    );
    assert!(r.body.len() > 5);
}

#[test]
fn grpc_calls_get_the_latency_the_name_and_the_override_echo() {
    let b = Backend::start_local(BackendSpec::new("alpha", Latency::Fixed(100))).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _in_runtime = rt.enter();
    let channel = grpc::channel(&b.url()).unwrap();
    let headers = vec![(OVERRIDE_HEADER.to_string(), "127.0.0.1:9".to_string())];
    let t = Instant::now();
    let r = rt.block_on(grpc::unary(channel.clone(), &headers));
    let took = t.elapsed();
    assert_eq!(r.code, Some(Code::Ok));
    assert_eq!(r.backend.as_deref(), Some("alpha"));
    assert_eq!(r.seen_override.as_deref(), Some("127.0.0.1:9"));
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_millis(1000),
        "{took:?}"
    );
    // A stream: the headers at once, one reply per latency sample.
    let t = Instant::now();
    let s = rt.block_on(grpc::watch(channel, 3, &[]));
    assert_eq!(
        (s.code, s.replies, s.backend.as_deref(), s.seen_override),
        (Some(Code::Ok), 3, Some("alpha"), None)
    );
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(
        (
            b.served(),
            b.served_path(UNARY_PATH),
            b.served_path(STREAM_PATH)
        ),
        (1, 1, 1)
    );
}

#[test]
fn the_grpc_load_records_codes_and_names_and_a_dead_target_is_no_answer() {
    let ok = Backend::start_local(BackendSpec::new("ok", Latency::Fixed(5))).unwrap();
    let records = grpc::run(&LoadSpec::new(ok.url(), 100.0, Duration::from_millis(500))).unwrap();
    let s = Summary::of(&records);
    assert_eq!((s.count, s.errors, s.share("ok")), (50, 0, 1.0), "{s}");
    assert!(records
        .iter()
        .all(|r| r.status == 200 && r.grpc_status == Some(0)));
    assert_eq!(ok.served(), 50);

    let failing =
        Backend::start_local(BackendSpec::new("bad", Latency::Fixed(1)).fail_rate(1.0)).unwrap();
    let records = grpc::run(&LoadSpec::new(
        failing.url(),
        100.0,
        Duration::from_millis(200),
    ))
    .unwrap();
    assert!(
        records
            .iter()
            .all(|r| r.grpc_status == Some(Code::Unavailable as i32)
                && r.backend.as_deref() == Some("bad")
                && r.is_error()),
        "{records:?}"
    );

    failing.stop();
    let records = grpc::run(&LoadSpec::new(
        failing.url(),
        50.0,
        Duration::from_millis(200),
    ))
    .unwrap();
    assert!(
        records
            .iter()
            .all(|r| r.status == 0 && r.grpc_status.is_none()),
        "{records:?}"
    );
}
