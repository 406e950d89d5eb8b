//! The page's HTTP server: its three assets and `/api/state`, each only for
//! a request that names our own address as its Host, and the page and its
//! state only for one that carries the secret token. Bounded like the agent's
//! metrics server: a cap on connections and a share of it per local user,
//! one request per connection, and timeouts.

use super::state::StateSource;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use runlock_protocol::tcp_peers::{Peer, PeerSlots};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Requests served at once (a few tabs poll one each); more are closed unanswered.
const MAX_CONNECTIONS: usize = 32;
/// Requests served at once to one local user: any user of the host can
/// connect, token or not, and one must not hold every connection while the
/// page's own user is turned away. A browser opens at most 6 to one host.
const MAX_CONNECTIONS_PER_USER: usize = 8;
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A request waits for the listing that runs, which pages through the store
/// (each page bounded at 60 s by the shim); past this it is cut off.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(300);
/// After a failed accept (out of descriptors, say), wait before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

/// Nothing but our own assets and API: no inline script, no other origin.
const CSP: &str = "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Who may be answered, and with what.
pub struct Site {
    /// The host names our own address goes by; any other is a page of
    /// another origin reaching us through DNS rebinding.
    names: Vec<String>,
    port: u16,
    token: String,
    state: StateSource,
}

impl Site {
    pub fn new(addr: SocketAddr, token: String, state: StateSource) -> Site {
        let port = addr.port();
        let ip = match addr.ip() {
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            ip => ip.to_string(),
        };
        let mut names = vec![ip, "localhost".to_string()];
        if addr.ip().is_ipv4() {
            names.push("127.0.0.1".to_string());
        }
        Site {
            names,
            port,
            token,
            state,
        }
    }
}

impl Site {
    /// Whether a Host header names our address. A browser leaves out the
    /// scheme's own port, so `127.0.0.1` is port 80.
    fn is_ours(&self, host: &str) -> bool {
        let (name, port) = match host.rsplit_once(':') {
            Some((name, port)) if !port.contains(']') => (name, port.parse().ok()),
            _ => (host, Some(80)),
        };
        port == Some(self.port) && self.names.iter().any(|n| n.eq_ignore_ascii_case(name))
    }
}

/// Serves `site` on `listener` until the future is dropped, which ends
/// every connection with it: they are its own tasks, none detached.
pub async fn serve(listener: TcpListener, site: Arc<Site>) {
    let slots = PeerSlots::new(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_USER);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let (stream, remote) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                eprintln!("runlock ui: cannot accept a connection: {err}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(local) = stream.local_addr() else {
            continue;
        };
        let Some(slot) = slots.take(Peer::of(local, remote)) else {
            continue;
        };
        let site = site.clone();
        connections.spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req| {
                let site = site.clone();
                async move { Ok::<_, Infallible>(respond(&req, &site).await) }
            });
            // One request per connection: no idle keep-alive can hold a slot.
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, connection).await;
        });
    }
}

async fn respond(req: &Request<Incoming>, site: &Site) -> Response<Full<Bytes>> {
    secure(route(req, site).await)
}

async fn route(req: &Request<Incoming>, site: &Site) -> Response<Full<Bytes>> {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    if !host.is_some_and(|h| site.is_ours(h)) {
        return text(
            StatusCode::FORBIDDEN,
            "forbidden: this page answers only to its own address (the Host header names another)\n",
        );
    }
    // The script and style are the same for everyone, and the page's own
    // script carries the token from its address to `/api/state`. No cookie:
    // a browser sends a cookie of 127.0.0.1 to every port of it, whoever
    // listens there.
    let path = req.uri().path();
    let presented = query_token(req.uri().query().unwrap_or(""));
    let public = matches!(path, "/app.js" | "/style.css");
    if !public && !presented.is_some_and(|t| same_secret(t, &site.token)) {
        return text(
            StatusCode::FORBIDDEN,
            "forbidden: open the address runlock ui printed, with its token\n",
        );
    }
    if req.method() != Method::GET {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "only GET is served\n");
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET"));
        return response;
    }
    match path {
        "/" => asset(INDEX_HTML, "text/html; charset=utf-8"),
        "/app.js" => asset(APP_JS, "text/javascript; charset=utf-8"),
        "/style.css" => asset(STYLE_CSS, "text/css; charset=utf-8"),
        "/api/state" => {
            let answer = site.state.answer().await;
            let mut response = Response::new(Full::new(answer.body));
            *response.status_mut() =
                StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn asset(body: &'static str, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Every answer: no caching (the state changes; the address holds the
/// token), no sniffing, no referrer carrying the token away, our CSP.
fn secure(mut response: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = asset(body, "text/plain; charset=utf-8");
    *response.status_mut() = status;
    response
}

/// The `token` parameter of a query string.
fn query_token(query: &str) -> Option<&str> {
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix("token="))
}

/// Compares in time that does not depend on where they differ, so the token
/// cannot be guessed a byte at a time.
fn same_secret(presented: &str, token: &str) -> bool {
    presented.len() == token.len()
        && presented
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_read_from_the_query() {
        assert_eq!(query_token("a=1&token=abc"), Some("abc"));
        assert_eq!(query_token("mytoken=abc"), None);
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abd", "abc") && !same_secret("ab", "abc"));
    }

    #[test]
    fn the_site_answers_to_its_address_and_localhost_only() {
        let site = |addr: &str| {
            let addr: SocketAddr = addr.parse().expect("an address");
            Site::new(addr, "t".into(), StateSource::new("/nonexistent".into()))
        };
        let ours = site("127.0.0.1:8080");
        for host in ["127.0.0.1:8080", "localhost:8080", "LocalHost:8080"] {
            assert!(ours.is_ours(host), "{host}");
        }
        for host in [
            "127.0.0.1:8081",
            "127.0.0.1",
            "evil.example:8080",
            "127.0.0.1:8080x",
        ] {
            assert!(!ours.is_ours(host), "{host}");
        }
        // Port 80 is the one a browser leaves out of the Host header.
        let on_80 = site("127.0.0.1:80");
        for host in ["127.0.0.1", "localhost", "127.0.0.1:80"] {
            assert!(on_80.is_ours(host), "{host}");
        }
        let v6 = site("[::1]:80");
        for host in ["[::1]", "[::1]:80", "localhost"] {
            assert!(v6.is_ours(host), "{host}");
        }
        assert!(!v6.is_ours("[::2]"));
        assert!(site("[::1]:8080").is_ours("[::1]:8080"));
    }
}
