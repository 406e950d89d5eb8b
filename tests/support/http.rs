//! One HTTP client for the tests and the bench, in place of curl: hyper-util's
//! client over plain TCP, every request bounded in time. It reads the agent's
//! metrics, probes emulators and talks to the stores' JSON APIs.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// The bound on one request and its answer.
const REQUEST_TIME: Duration = Duration::from_secs(10);

/// An answer: its status code and its body as text.
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The body (invalid UTF-8 replaced).
    pub body: String,
}

impl Response {
    /// The body of a 2xx answer; an error naming `what`, the status and the body otherwise.
    pub fn success(self, what: &str) -> Result<String> {
        if !(200..300).contains(&self.status) {
            bail!("{what}: HTTP {}: {}", self.status, self.body);
        }
        Ok(self.body)
    }
}

/// `GET url`.
pub async fn get(url: &str) -> Result<Response> {
    request("GET", url, &[], Bytes::new()).await
}

/// `method url` with `headers` and `body`; any status is an answer, only a
/// failure to get one (refused, reset, timed out) is an error.
pub async fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Result<Response> {
    let mut request = hyper::Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(body.into()))
        .with_context(|| format!("building {method} {url}"))?;
    // A client per request: a test's runtime ends with the test, and a pooled
    // connection must not outlive the runtime it was made on.
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let exchange = async {
        let response = client.request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok(Response {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    super::within(REQUEST_TIME, &format!("{method} {url}"), exchange)
        .await?
        .with_context(|| format!("{method} {url}"))
}

/// Whether `url` answers a `GET` within 2 s with a status `ready` accepts:
/// how a test knows a server it started is up.
pub async fn answers(url: &str, ready: fn(u16) -> bool) -> bool {
    let probe = tokio::time::timeout(Duration::from_secs(2), get(url));
    matches!(probe.await, Ok(Ok(response)) if ready(response.status))
}
