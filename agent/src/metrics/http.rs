//! The tiny HTTP server for `GET /metrics`: bounded connections, a share of
//! them per peer, one request each, cut off after a while.

use super::Metrics;
use crate::listener::next_connection;
use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::prometheus_text;
use runlock_protocol::tcp_peers::{Peer, PeerSlots};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Scrapes served at once; more connections are closed unanswered.
const MAX_CONNECTIONS: usize = 16;
/// Scrapes served at once to one peer (a local user, or another host): any
/// user of the host can connect, and one must not hold every connection
/// while Prometheus is turned away. Prometheus scrapes one at a time.
const MAX_CONNECTIONS_PER_PEER: usize = 4;
/// A scrape (headers in, exposition out) may take this long before it is cut off.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `metrics` on `addr` until `shutdown`, in a task of `tasks`;
/// returns the address bound (the port is chosen when `addr`'s is 0).
pub async fn start(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    tasks: &TaskTracker,
) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot serve metrics on {addr}"))?;
    let bound = listener
        .local_addr()
        .with_context(|| format!("reading the address of the metrics listener on {addr}"))?;
    tracing::info!(addr = %bound, "metrics listening on {bound}");
    if !bound.ip().is_loopback() {
        // Nothing in them is secret, but anyone who reaches the port may
        // scrape them, and take the connections Prometheus needs.
        tracing::warn!(
            addr = %bound,
            "metrics on {bound} are served without authentication to anyone who can reach \
             that address: bind them to loopback (127.0.0.1) or to an interface only \
             Prometheus reaches, or firewall the port"
        );
    }
    tasks.spawn(serve(listener, metrics, shutdown));
    Ok(bound)
}

/// Serves scrapes until `shutdown`, then waits for those begun (each ends
/// at `shutdown` too).
async fn serve(listener: TcpListener, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    let slots = PeerSlots::new(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER);
    let scrapes = TaskTracker::new();
    loop {
        let Some(stream) = next_connection(|| listener.accept(), "metrics", &shutdown).await else {
            break;
        };
        let peer = match (stream.local_addr(), stream.peer_addr()) {
            (Ok(local), Ok(remote)) => Peer::of(local, remote),
            // Gone already.
            _ => continue,
        };
        // Too many scrapes at once, or from that peer: closing the extra
        // ones keeps this bounded and shared.
        let Some(slot) = slots.take(peer) else {
            continue;
        };
        let (metrics, shutdown) = (metrics.clone(), shutdown.clone());
        scrapes.spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req| {
                let metrics = metrics.clone();
                async move { Ok::<_, Infallible>(respond(&req, &metrics)) }
            });
            // One request per connection: no idle keep-alive can hold a slot.
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = tokio::time::timeout(CONNECTION_TIMEOUT, connection) => {}
                _ = shutdown.cancelled() => {}
            }
        });
    }
    scrapes.close();
    scrapes.wait().await;
}

fn respond(req: &Request<Incoming>, metrics: &Metrics) -> Response<Full<Bytes>> {
    let (status, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => (StatusCode::OK, metrics.render()),
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET is served\n".to_string(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "not found: metrics are at /metrics\n".to_string(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let content_type = if status == StatusCode::OK {
        prometheus_text::CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if status == StatusCode::METHOD_NOT_ALLOWED {
        headers.insert(ALLOW, HeaderValue::from_static("GET"));
    }
    response
}
