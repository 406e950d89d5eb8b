//! The page's HTTP server: its three assets and `/api/state`, each only for
//! a request that carries the secret token and names our own address as its
//! Host. Bounded like the agent's metrics server: a cap on connections, one
//! request per connection, and timeouts.

use super::state::StateSource;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Requests served at once (a few tabs poll one each); more are closed unanswered.
const MAX_CONNECTIONS: usize = 32;
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
    /// The Host values our own address goes by; any other is a page of
    /// another origin reaching us through DNS rebinding.
    hosts: Vec<String>,
    token: String,
    /// Per port: another `runlock ui` on this host has its own token.
    cookie_name: String,
    state: StateSource,
}

impl Site {
    pub fn new(addr: SocketAddr, token: String, state: StateSource) -> Site {
        let port = addr.port();
        let mut hosts = vec![addr.to_string(), format!("localhost:{port}")];
        if addr.ip().is_ipv4() {
            hosts.push(format!("127.0.0.1:{port}"));
        }
        Site {
            hosts,
            token,
            cookie_name: format!("runlock_ui_{port}"),
            state,
        }
    }
}

/// Serves `site` on `listener` until the future is dropped.
pub async fn serve(listener: TcpListener, site: Arc<Site>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(err) => {
                eprintln!("runlock ui: cannot accept a connection: {err}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let site = site.clone();
        tokio::spawn(async move {
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
    if !host.is_some_and(|h| site.hosts.iter().any(|ours| ours.eq_ignore_ascii_case(h))) {
        return text(
            StatusCode::FORBIDDEN,
            "forbidden: this page answers only to its own address (the Host header names another)\n",
        );
    }
    let from_query = query_token(req.uri().query().unwrap_or(""));
    let presented = from_query.or_else(|| cookie_token(req.headers(), &site.cookie_name));
    if !presented.is_some_and(|t| same_secret(t, &site.token)) {
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
    let mut response = match req.uri().path() {
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
    };
    // The first visit brings the token in its address; the cookie lets the
    // page's own requests (and a reload) in without it.
    if from_query.is_some() {
        let cookie = format!(
            "{}={}; Path=/; HttpOnly; SameSite=Strict",
            site.cookie_name, site.token
        );
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            response.headers_mut().insert(header::SET_COOKIE, value);
        }
    }
    response
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

/// The value of cookie `name`.
fn cookie_token<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(name)?.strip_prefix('='))
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
    fn the_token_is_read_from_the_query_or_our_own_cookie() {
        assert_eq!(query_token("a=1&token=abc"), Some("abc"));
        assert_eq!(query_token("mytoken=abc"), None);
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("runlock_ui_1=other; runlock_ui_8080=abc"),
        );
        assert_eq!(cookie_token(&headers, "runlock_ui_8080"), Some("abc"));
        assert_eq!(cookie_token(&headers, "runlock_ui_80"), None);
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abd", "abc") && !same_secret("ab", "abc"));
    }

    #[test]
    fn the_site_answers_to_its_address_and_localhost_only() {
        let addr: SocketAddr = "127.0.0.1:8080".parse().expect("an address");
        let site = Site::new(addr, "t".into(), StateSource::new("/nonexistent".into()));
        assert!(site.hosts.contains(&"127.0.0.1:8080".to_string()));
        assert!(site.hosts.contains(&"localhost:8080".to_string()));
        assert!(!site.hosts.iter().any(|h| h.contains("evil")));
    }
}
