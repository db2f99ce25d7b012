//! One-shot synchronous HTTP/1.1 requests for tests, to loopback addresses only.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Uri;
use hyper_util::rt::TokioIo;

/// Timeout of [`get`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A complete response.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    /// Header names are lower case, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// `GET url` with extra headers, on a fresh connection, with [`DEFAULT_TIMEOUT`].
pub fn get(url: &str, headers: &[(&str, &str)]) -> Result<Response> {
    request("GET", url, headers, "", DEFAULT_TIMEOUT)
}

/// One request on a fresh connection. Safe to call from inside an async runtime: it runs on a
/// thread of its own.
pub fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
    timeout: Duration,
) -> Result<Response> {
    let uri: Uri = url.parse().with_context(|| format!("url {url:?}"))?;
    let authority = loopback_authority(&uri)?;
    let method = hyper::Method::from_bytes(method.as_bytes()).context("method")?;
    let mut builder = hyper::Request::builder()
        .method(method)
        .uri(uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
        .header(hyper::header::HOST, authority.as_str());
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let req = builder
        .body(Full::new(Bytes::from(body.to_string())))
        .context("building the request")?;

    let url_owned = url.to_string();
    let worker = std::thread::Builder::new()
        .name("http-get".into())
        .spawn(move || -> Result<Response> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
                tokio::time::timeout(timeout, send(authority, req))
                    .await
                    .map_err(|_| anyhow!("{url_owned}: no complete answer within {timeout:?}"))?
            })
        })
        .context("spawning the request thread")?;
    worker
        .join()
        .map_err(|_| anyhow!("request thread panicked"))?
}

async fn send(authority: String, req: hyper::Request<Full<Bytes>>) -> Result<Response> {
    let stream = tokio::net::TcpStream::connect(&authority)
        .await
        .with_context(|| format!("connecting to {authority}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let driver = tokio::spawn(conn);
    let resp = sender
        .send_request(req)
        .await
        .context("sending the request")?;
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = resp
        .into_body()
        .collect()
        .await
        .context("reading the body")?
        .to_bytes();
    driver.abort();
    Ok(Response {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// `host:port` of an `http://` URL whose host is a loopback address: all traffic stays local.
pub fn loopback_authority(uri: &Uri) -> Result<String> {
    if uri.scheme_str() != Some("http") {
        bail!("{uri}: only http:// URLs are supported");
    }
    let host = uri.host().context("url without host")?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare == "localhost"
        || bare
            .parse::<std::net::IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(false);
    if !loopback {
        bail!("{uri}: host {host} is not loopback; traffic must stay on this machine");
    }
    Ok(format!("{host}:{}", uri.port_u16().unwrap_or(80)))
}
