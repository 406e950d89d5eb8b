//! Prometheus metrics on `--metrics ADDR`: the counters, gauges and
//! histograms the lease layer, the connection (acquisitions, by wire code)
//! and the renewal scheduler record where outcomes are decided, a timing
//! decorator around the backend, and a tiny HTTP server for `GET /metrics`.
//! docs/src/metrics.md (the book) describes each series for the people who chart them.
//!
//! The metrics live in one process-wide instance, set by [`start`], so that
//! each hook is a one-line call that needs no handle threaded through the
//! registry; without `--metrics` every hook is a single atomic load.

use crate::backend::{
    AcquireSpec, Adopted, Adopter, Backend, BackendError, Displaced, Ending, Grant, LeaseRef,
    ListFrom, ListPage, ProfiledBackend, Renewed,
};
use anyhow::Context;
use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use runlock_protocol::{ErrorCode, Key, KeyEvent, KeyRecord, LostReason, WireError};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Upper bounds of the backend request histogram in seconds: 0.1 ms (an
/// in-memory store) to 10 s (a store past its 5 s request timeout), in 1-2.5-5 steps.
const BUCKETS_S: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
/// Upper bounds of the wait before a grant in seconds: an uncontended grant
/// (a store request or two) to an hour in line behind other runs.
const WAIT_BUCKETS_S: [f64; 14] = [
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];
/// Upper bounds of a lease's hold time in seconds: a command that exits at
/// once to a day-long run (a run may hold longer than any TTL, by renewing).
const HOLD_BUCKETS_S: [f64; 14] = [
    0.1, 1.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 43200.0,
    86400.0,
];
/// Upper bounds of a renewal's lateness in seconds: 1 ms (a busy scheduler) to
/// 10 s (the whole renewal period at the default 30 s TTL; 5/6 of the TTL
/// late, a lease is lost).
const LATENESS_BUCKETS_S: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Scrapes served at once; more connections are closed unanswered.
const MAX_CONNECTIONS: usize = 16;
/// A scrape (headers in, exposition out) may take this long before it is cut off.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// After a failed accept (out of descriptors, say), wait before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The error codes an acquire ends with, so each series exists from the start
/// (any other code still gets its series the first time it happens).
const ACQUIRE_ERRORS: [ErrorCode; 7] = [
    ErrorCode::Held,
    ErrorCode::Timeout,
    ErrorCode::Unavailable,
    ErrorCode::InvalidKey,
    ErrorCode::Forbidden,
    ErrorCode::BadRequest,
    ErrorCode::Internal,
];

type Labels = [(&'static str, &'static str); 1];
type Labels2 = [(&'static str, &'static str); 2];

/// How a renewal attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The store extended the lease.
    Ok,
    /// It failed in a way worth retrying before the lease's deadline.
    Retry,
    /// The lease is gone: taken, or not renewed before its deadline.
    Lost,
}

/// How a lease held on this agent ended, as the hold histogram's `ended`
/// label names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Its client released it (or its acquire failed on a later key).
    Released,
    /// Its client's connection closed without a release: the shim was
    /// killed, a client closed its connection, or a reattached run's last
    /// process exited.
    Closed,
    /// It was lost while held.
    Lost(LostReason),
}

impl Ended {
    /// Each label value, the ones [`Metrics::new`] creates up front.
    const KNOWN: [Ended; 5] = [
        Ended::Released,
        Ended::Closed,
        Ended::Lost(LostReason::Forced),
        Ended::Lost(LostReason::Broken),
        Ended::Lost(LostReason::Expired),
    ];

    fn label(self) -> &'static str {
        match self {
            Ended::Released => "released",
            Ended::Closed => "closed",
            Ended::Lost(reason) => lost_reason(reason),
        }
    }
}

fn lost_reason(reason: LostReason) -> &'static str {
    match reason {
        LostReason::Forced => "forced",
        LostReason::Broken => "broken",
        LostReason::Expired => "expired",
        LostReason::Unknown => "unknown",
    }
}

/// How this agent took a key from a live holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeover {
    /// An acquire with `--force`.
    Force,
    /// `runlock release --key`.
    Break,
}

/// A backend operation, as the histogram's `operation` label names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `Backend::acquire`.
    Acquire,
    /// `Backend::renew`.
    Renew,
    /// `Backend::release`.
    Release,
    /// `Backend::inspect`.
    Inspect,
    /// `Backend::adopt` (a run reattaching after an agent restart).
    Adopt,
    /// `Backend::history`.
    History,
    /// `Backend::list`: one page of a listing.
    List,
    /// `Backend::confirm_stopped` and `Backend::displaced_stopped`: a
    /// forced run waiting for the run it took the key from.
    Displaced,
}

const OPERATIONS: [&str; 8] = [
    "acquire",
    "renew",
    "release",
    "inspect",
    "adopt",
    "history",
    "list",
    "displaced",
];

fn backend_result<T>(result: &Result<T, BackendError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(
            BackendError::Held(..)
            | BackendError::HeldUnrecorded(_)
            | BackendError::HeldByLegacyRun(_),
        ) => "held",
        Err(BackendError::LeaseMismatch) => "lease_mismatch",
        Err(BackendError::Unavailable(_)) => "unavailable",
        Err(BackendError::Corrupt(_)) => "corrupt",
        Err(BackendError::Unsupported(_)) => "unsupported",
    }
}

/// The agent's metrics. Hot-path series are created up front and kept here, so
/// recording one is an atomic add (a short lock for a histogram), never a lookup.
pub struct Metrics {
    registry: prometheus_client::registry::Registry,
    leases_held: Gauge,
    waiters: Gauge,
    acquisitions: Family<Labels, Counter>,
    granted: Counter,
    forced: Counter,
    cancelled: Counter,
    /// From an acquire request to its grant.
    wait: Histogram,
    /// From a grant to the lease's end, by how it ended ([`Ended::KNOWN`] kept here).
    held: Family<Labels, Histogram, fn() -> Histogram>,
    held_known: [Histogram; Ended::KNOWN.len()],
    takeovers: [Counter; 2],
    renewals: [Counter; 3],
    renewal_lateness: Histogram,
    losses: Family<Labels, Counter>,
    refused: Counter,
    backend: Family<Labels2, Histogram, fn() -> Histogram>,
    /// The `result="ok"` histogram of each operation, the common case.
    backend_ok: [Histogram; OPERATIONS.len()],
    /// Answers of a store that throttles, by store (one of [`STORES`]).
    throttled: Family<Labels, Counter>,
}

/// The stores that can throttle, as the `store` label names them.
const STORES: [&str; 4] = ["s3", "gcs", "azure", "postgresql"];

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Every series at zero.
    pub fn new() -> Metrics {
        let mut registry = prometheus_client::registry::Registry::default();
        let leases_held = Gauge::default();
        registry.register(
            "runlock_leases_held",
            "Leases this agent holds now",
            leases_held.clone(),
        );
        let waiters = Gauge::default();
        registry.register(
            "runlock_waiters",
            "Acquires on this agent waiting now for a key held by another run (here or on \
             another host), or in line behind another waiter here",
            waiters.clone(),
        );
        registry.register(
            "runlock_build",
            "This agent's version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );

        let acquisitions = Family::<Labels, Counter>::default();
        let result = |value| acquisitions.get_or_create_owned(&[("result", value)]);
        let (granted, forced, cancelled) =
            (result("granted"), result("forced"), result("cancelled"));
        for code in ACQUIRE_ERRORS {
            result(code.as_str());
        }
        registry.register(
            "runlock_acquisitions",
            "Acquire requests by outcome: granted, forced (granted to a request with --force, \
             whether or not the key was held), cancelled (the client left while waiting), or the \
             error code (held: refused because another run held a key until the wait ran out)",
            acquisitions.clone(),
        );

        let wait = Histogram::new(WAIT_BUCKETS_S);
        registry.register(
            "runlock_wait_duration_seconds",
            "Time from an acquire request to its grant, in seconds: the store's requests, any \
             wait for holders, and for a force the wait for the displaced run to stop",
            wait.clone(),
        );

        let held = Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(|| {
            Histogram::new(HOLD_BUCKETS_S)
        });
        let held_known =
            Ended::KNOWN.map(|ended| held.get_or_create_owned(&[("ended", ended.label())]));
        registry.register(
            "runlock_hold_duration_seconds",
            "Time from a grant to the lease's end on this agent, in seconds, by how it ended: \
             released, closed (the client's connection closed without a release), or lost as \
             forced, broken or expired",
            held.clone(),
        );

        let takeover_family = Family::<Labels, Counter>::default();
        let takeovers =
            ["force", "break"].map(|how| takeover_family.get_or_create_owned(&[("how", how)]));
        registry.register(
            "runlock_takeovers",
            "Keys this agent took from a live holder: force (runlock run --force) or break \
             (runlock release --key)",
            takeover_family,
        );

        let renewal_family = Family::<Labels, Counter>::default();
        let renewals =
            ["ok", "retry", "lost"].map(|r| renewal_family.get_or_create_owned(&[("result", r)]));
        registry.register(
            "runlock_renewals",
            "Lease renewals by outcome: ok, retry (failed, retried until the lease's deadline) or lost",
            renewal_family,
        );
        let renewal_lateness = Histogram::new(LATENESS_BUCKETS_S);
        registry.register(
            "runlock_renewal_lateness_seconds",
            "How long after it was due each renewal (or retry) went out, in seconds",
            renewal_lateness.clone(),
        );

        let losses = Family::<Labels, Counter>::default();
        for reason in ["forced", "broken", "expired"] {
            losses.get_or_create_owned(&[("reason", reason)]);
        }
        registry.register(
            "runlock_losses",
            "Leases lost while held: forced (taken with --force), broken (runlock release) \
             or expired (not renewed before its deadline)",
            losses.clone(),
        );

        let refused = Counter::default();
        registry.register(
            "runlock_connections_refused",
            "Connections refused as busy because they were over a limit of [limits] or of descriptors",
            refused.clone(),
        );

        // Failures get their series when they first happen: listing every
        // operation × error up front would bury the exposition in empty buckets.
        let backend = Family::<Labels2, Histogram, fn() -> Histogram>::new_with_constructor(|| {
            Histogram::new(BUCKETS_S)
        });
        let backend_ok = OPERATIONS.map(|operation| {
            backend.get_or_create_owned(&[("operation", operation), ("result", "ok")])
        });
        registry.register(
            "runlock_backend_request_duration_seconds",
            "Backend requests by operation and result (ok, held, lease_mismatch, unavailable, \
             corrupt), in seconds",
            backend.clone(),
        );

        let throttled = Family::<Labels, Counter>::default();
        for store in STORES {
            throttled.get_or_create_owned(&[("store", store)]);
        }
        registry.register(
            "runlock_store_throttled",
            "Store answers that said slow down (S3 503 SlowDown or 429, GCS 429 or 503, Azure \
             503 ServerBusy or 429, PostgreSQL SQLSTATE class 53 such as too many clients), \
             by store: each is retried with backoff within the caller's wait",
            throttled.clone(),
        );

        Metrics {
            registry,
            throttled,
            leases_held,
            waiters,
            acquisitions,
            granted,
            forced,
            cancelled,
            wait,
            held,
            held_known,
            takeovers,
            renewals,
            renewal_lateness,
            losses,
            refused,
            backend,
            backend_ok,
        }
    }

    /// The exposition in Prometheus text format 0.0.4.
    pub fn render(&self) -> String {
        let mut text = String::with_capacity(8 * 1024);
        // invariant: writing to a String cannot fail
        let _ = prometheus_text::encode(&mut text, &self.registry);
        text
    }

    fn acquisition<T>(
        &self,
        force: bool,
        result: &Result<T, WireError>,
        cancelled: bool,
        started: Instant,
    ) {
        if result.is_ok() {
            self.wait.observe(started.elapsed().as_secs_f64());
        }
        match result {
            Ok(_) if force => self.forced.inc(),
            Ok(_) => self.granted.inc(),
            Err(_) if cancelled => self.cancelled.inc(),
            Err(err) => self
                .acquisitions
                .get_or_create(&[("result", err.code.as_str())])
                .inc(),
        };
    }

    fn lost(&self, reason: LostReason) {
        self.losses
            .get_or_create(&[("reason", lost_reason(reason))])
            .inc();
    }

    fn waiting(&self) -> Waiting {
        self.waiters.inc();
        Waiting(Some(self.waiters.clone()))
    }

    /// A lease granted at `acquired_at_ms` ended at `now_ms` (both wall clock,
    /// so that a run reattached after an agent restart counts from its grant).
    fn hold_ended(&self, acquired_at_ms: u64, now_ms: u64, ended: Ended) {
        // 0: a holder that does not say when it was granted.
        if acquired_at_ms == 0 {
            return;
        }
        let seconds = now_ms.saturating_sub(acquired_at_ms) as f64 / 1000.0;
        match Ended::KNOWN.iter().position(|known| *known == ended) {
            Some(at) => self.held_known[at].observe(seconds),
            None => self
                .held
                .get_or_create(&[("ended", ended.label())])
                .observe(seconds),
        }
    }

    fn backend_request<T>(
        &self,
        operation: Operation,
        started: Instant,
        result: &Result<T, BackendError>,
    ) {
        let seconds = started.elapsed().as_secs_f64();
        match backend_result(result) {
            "ok" => self.backend_ok[operation as usize].observe(seconds),
            failure => self
                .backend
                .get_or_create(&[
                    ("operation", OPERATIONS[operation as usize]),
                    ("result", failure),
                ])
                .observe(seconds),
        }
    }
}

static GLOBAL: OnceLock<Arc<Metrics>> = OnceLock::new();

/// Counts one acquire request, made at `started`, by how it ended (`cancelled`
/// when its client left), and times it if it was granted.
pub fn acquisition<T>(
    force: bool,
    result: &Result<T, WireError>,
    cancelled: bool,
    started: Instant,
) {
    if let Some(metrics) = GLOBAL.get() {
        metrics.acquisition(force, result, cancelled, started);
    }
}

/// Counts one acquire as waiting, for as long as it is kept ([`waiting`]).
#[must_use = "the acquire counts as waiting only while this is kept"]
pub struct Waiting(Option<Gauge>);

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(waiters) = &self.0 {
            waiters.dec();
        }
    }
}

/// An acquire starts waiting for a held key; it stops when the guard is dropped.
pub fn waiting() -> Waiting {
    GLOBAL
        .get()
        .map_or(Waiting(None), |metrics| metrics.waiting())
}

/// Records how long a lease granted at `acquired_at_ms` (its holder's wall
/// clock) was held, by how it ended.
pub fn hold_ended(acquired_at_ms: u64, ended: Ended) {
    if let Some(metrics) = GLOBAL.get() {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        metrics.hold_ended(acquired_at_ms, now_ms, ended);
    }
}

/// Counts one key taken from a live holder.
pub fn takeover(how: Takeover) {
    if let Some(metrics) = GLOBAL.get() {
        metrics.takeovers[how as usize].inc();
    }
}

/// Records how late a renewal went out.
pub fn renewal_lateness(late: Duration) {
    if let Some(metrics) = GLOBAL.get() {
        metrics.renewal_lateness.observe(late.as_secs_f64());
    }
}

/// Sets how many leases the agent holds.
pub fn leases_held(count: usize) {
    if let Some(metrics) = GLOBAL.get() {
        metrics
            .leases_held
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }
}

/// Counts one renewal attempt.
pub fn renewal(result: Renewal) {
    if let Some(metrics) = GLOBAL.get() {
        metrics.renewals[result as usize].inc();
    }
}

/// Counts one lease lost while held.
pub fn lost(reason: LostReason) {
    if let Some(metrics) = GLOBAL.get() {
        metrics.lost(reason);
    }
}

/// Counts one answer of `store` (one of [`STORES`]) that said slow down.
pub fn throttled(store: &'static str) {
    if let Some(metrics) = GLOBAL.get() {
        metrics.throttled.get_or_create(&[("store", store)]).inc();
    }
}

/// Counts one connection refused as busy.
pub fn refused() {
    if let Some(metrics) = GLOBAL.get() {
        metrics.refused.inc();
    }
}

/// Wraps `store`'s backend so every request is timed, once [`start`] has run;
/// otherwise returns it as it is. What the store is stays as it was.
pub fn instrument(store: ProfiledBackend) -> ProfiledBackend {
    match GLOBAL.get() {
        Some(metrics) => ProfiledBackend {
            backend: Arc::new(TimedBackend {
                inner: store.backend,
                metrics: metrics.clone(),
            }),
            profile: store.profile,
        },
        None => store,
    }
}

/// A backend that times each request of the one inside it: every `Backend`
/// method is an operation, so the compiler sees that each is passed on.
pub struct TimedBackend {
    inner: Arc<dyn Backend>,
    metrics: Arc<Metrics>,
}

impl TimedBackend {
    /// Times `inner`'s requests into `metrics`.
    pub fn new(inner: Arc<dyn Backend>, metrics: Arc<Metrics>) -> TimedBackend {
        TimedBackend { inner, metrics }
    }
}

#[async_trait]
impl Backend for TimedBackend {
    async fn acquire(&self, spec: &AcquireSpec) -> Result<Grant, BackendError> {
        let started = Instant::now();
        let result = self.inner.acquire(spec).await;
        self.metrics
            .backend_request(Operation::Acquire, started, &result);
        result
    }

    async fn renew(&self, lease: &LeaseRef, ttl: Duration) -> Result<Renewed, BackendError> {
        let started = Instant::now();
        let result = self.inner.renew(lease, ttl).await;
        self.metrics
            .backend_request(Operation::Renew, started, &result);
        result
    }

    async fn end(&self, lease: &LeaseRef, ending: &Ending) -> Result<(), BackendError> {
        let started = Instant::now();
        let result = self.inner.end(lease, ending).await;
        self.metrics
            .backend_request(Operation::Release, started, &result);
        result
    }

    async fn inspect(&self, key: &Key) -> Result<KeyRecord, BackendError> {
        let started = Instant::now();
        let result = self.inner.inspect(key).await;
        self.metrics
            .backend_request(Operation::Inspect, started, &result);
        result
    }

    async fn history(&self, key: &Key) -> Result<Vec<KeyEvent>, BackendError> {
        let started = Instant::now();
        let result = self.inner.history(key).await;
        self.metrics
            .backend_request(Operation::History, started, &result);
        result
    }

    async fn list(
        &self,
        prefix: &str,
        from: &ListFrom,
        limit: usize,
    ) -> Result<ListPage, BackendError> {
        let started = Instant::now();
        let result = self.inner.list(prefix, from, limit).await;
        self.metrics
            .backend_request(Operation::List, started, &result);
        result
    }

    async fn adopt(&self, lease: &LeaseRef, by: &Adopter) -> Result<Adopted, BackendError> {
        let started = Instant::now();
        let result = self.inner.adopt(lease, by).await;
        self.metrics
            .backend_request(Operation::Adopt, started, &result);
        result
    }

    async fn confirm_stopped(&self, lease: &LeaseRef) -> Result<(), BackendError> {
        let started = Instant::now();
        let result = self.inner.confirm_stopped(lease).await;
        self.metrics
            .backend_request(Operation::Displaced, started, &result);
        result
    }

    async fn displaced_stopped(
        &self,
        key: &Key,
        displaced: &Displaced,
    ) -> Result<bool, BackendError> {
        let started = Instant::now();
        let result = self.inner.displaced_stopped(key, displaced).await;
        self.metrics
            .backend_request(Operation::Displaced, started, &result);
        result
    }
}

/// Turns metrics on for this process and serves them on `addr` until
/// `shutdown`; returns the address bound (the port is chosen when `addr`'s is 0).
pub async fn start(addr: SocketAddr, shutdown: CancellationToken) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot serve metrics on {addr}"))?;
    let bound = listener
        .local_addr()
        .with_context(|| format!("reading the address of the metrics listener on {addr}"))?;
    let metrics = GLOBAL.get_or_init(|| Arc::new(Metrics::new())).clone();
    tracing::info!(addr = %bound, "metrics listening on {bound}");
    tokio::spawn(serve(listener, metrics, shutdown));
    Ok(bound)
}

async fn serve(listener: TcpListener, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot accept a metrics connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        // Too many scrapes at once: closing the extra ones keeps this bounded.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let (metrics, shutdown) = (metrics.clone(), shutdown.clone());
        tokio::spawn(async move {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemoryBackend;
    use runlock_protocol::Holder;

    /// The value of one series in an exposition, e.g. `runlock_leases_held`.
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    }

    #[test]
    fn every_series_exists_at_zero_before_anything_happens() {
        let text = Metrics::new().render();
        for series in [
            "runlock_leases_held",
            r#"runlock_acquisitions_total{result="granted"}"#,
            r#"runlock_acquisitions_total{result="forced"}"#,
            r#"runlock_acquisitions_total{result="held"}"#,
            r#"runlock_acquisitions_total{result="timeout"}"#,
            r#"runlock_renewals_total{result="ok"}"#,
            r#"runlock_renewals_total{result="retry"}"#,
            r#"runlock_renewals_total{result="lost"}"#,
            r#"runlock_losses_total{reason="forced"}"#,
            r#"runlock_losses_total{reason="broken"}"#,
            r#"runlock_losses_total{reason="expired"}"#,
            r#"runlock_backend_request_duration_seconds_count{operation="renew",result="ok"}"#,
            "runlock_waiters",
            "runlock_wait_duration_seconds_count",
            r#"runlock_hold_duration_seconds_count{ended="released"}"#,
            r#"runlock_hold_duration_seconds_count{ended="closed"}"#,
            r#"runlock_hold_duration_seconds_count{ended="forced"}"#,
            r#"runlock_hold_duration_seconds_count{ended="broken"}"#,
            r#"runlock_hold_duration_seconds_count{ended="expired"}"#,
            r#"runlock_takeovers_total{how="force"}"#,
            r#"runlock_takeovers_total{how="break"}"#,
            "runlock_renewal_lateness_seconds_count",
        ] {
            assert_eq!(value(&text, series), Some(0.0), "{series} in\n{text}");
        }
        let build = format!(
            r#"runlock_build_info{{version="{}"}}"#,
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(value(&text, &build), Some(1.0), "{text}");
        assert!(text.contains("# TYPE runlock_backend_request_duration_seconds histogram"));
        assert!(
            text.contains(r#"le="0.0001""#) && text.contains(r#"le="10""#),
            "{text}"
        );
    }

    #[test]
    fn outcomes_land_in_their_series() {
        let metrics = Metrics::new();
        let granted: Result<(), WireError> = Ok(());
        let held: Result<(), WireError> = Err(WireError::new(ErrorCode::Held, "held"));
        let started = Instant::now();
        metrics.acquisition(false, &granted, false, started);
        metrics.acquisition(true, &granted, false, started);
        metrics.acquisition(false, &held, false, started);
        metrics.acquisition(false, &held, true, started);
        metrics.lost(LostReason::Forced);
        metrics.renewals[Renewal::Retry as usize].inc();
        metrics.leases_held.set(3);
        let text = metrics.render();
        for (series, want) in [
            (r#"runlock_acquisitions_total{result="granted"}"#, 1.0),
            (r#"runlock_acquisitions_total{result="forced"}"#, 1.0),
            (r#"runlock_acquisitions_total{result="held"}"#, 1.0),
            (r#"runlock_acquisitions_total{result="cancelled"}"#, 1.0),
            (r#"runlock_losses_total{reason="forced"}"#, 1.0),
            (r#"runlock_renewals_total{result="retry"}"#, 1.0),
            (r#"runlock_renewals_total{result="ok"}"#, 0.0),
            ("runlock_leases_held", 3.0),
            // Only grants are timed.
            ("runlock_wait_duration_seconds_count", 2.0),
        ] {
            assert_eq!(value(&text, series), Some(want), "{series} in\n{text}");
        }
    }

    #[test]
    fn a_hold_is_timed_from_its_grant_by_how_it_ended() {
        let metrics = Metrics::new();
        metrics.hold_ended(1_000, 91_000, Ended::Lost(LostReason::Forced));
        metrics.hold_ended(1_000, 1_050, Ended::Released);
        // A holder that does not say when it was granted is not timed.
        metrics.hold_ended(0, 91_000, Ended::Closed);
        metrics.hold_ended(1_000, 2_000, Ended::Lost(LostReason::Unknown));
        let text = metrics.render();
        for (series, want) in [
            (r#"runlock_hold_duration_seconds_sum{ended="forced"}"#, 90.0),
            (
                r#"runlock_hold_duration_seconds_bucket{ended="forced",le="60"}"#,
                0.0,
            ),
            (
                r#"runlock_hold_duration_seconds_bucket{ended="forced",le="300"}"#,
                1.0,
            ),
            (
                r#"runlock_hold_duration_seconds_bucket{ended="released",le="0.1"}"#,
                1.0,
            ),
            (
                r#"runlock_hold_duration_seconds_count{ended="closed"}"#,
                0.0,
            ),
            (
                r#"runlock_hold_duration_seconds_count{ended="unknown"}"#,
                1.0,
            ),
        ] {
            assert_eq!(value(&text, series), Some(want), "{series} in\n{text}");
        }
    }

    #[test]
    fn waiters_takeovers_and_lateness_land_in_their_series() {
        let metrics = Metrics::new();
        let (first, second) = (metrics.waiting(), metrics.waiting());
        assert_eq!(value(&metrics.render(), "runlock_waiters"), Some(2.0));
        drop(first);
        assert_eq!(value(&metrics.render(), "runlock_waiters"), Some(1.0));
        drop(second);
        metrics.takeovers[Takeover::Break as usize].inc();
        metrics
            .renewal_lateness
            .observe(Duration::from_millis(1500).as_secs_f64());
        let text = metrics.render();
        for (series, want) in [
            ("runlock_waiters", 0.0),
            (r#"runlock_takeovers_total{how="force"}"#, 0.0),
            (r#"runlock_takeovers_total{how="break"}"#, 1.0),
            (r#"runlock_renewal_lateness_seconds_bucket{le="1"}"#, 0.0),
            (r#"runlock_renewal_lateness_seconds_bucket{le="2.5"}"#, 1.0),
        ] {
            assert_eq!(value(&text, series), Some(want), "{series} in\n{text}");
        }
    }

    #[tokio::test]
    async fn the_decorator_times_each_backend_request_by_result() {
        let metrics = Arc::new(Metrics::new());
        let backend = TimedBackend::new(Arc::new(MemoryBackend::default()), metrics.clone());
        let key = Key::new("k").expect("valid");
        let spec = AcquireSpec {
            key: key.clone(),
            lease_id: "l1".into(),
            holder: Holder {
                slot: None,
                slots: None,
                host: "h".into(),
                agent_id: "a".into(),
                pid: 1,
                uid: 0,
                gid: 0,
                user: "root".into(),
                command: "test".into(),
                acquired_at_ms: 0,
                token: 0,
            },
            ttl: Duration::from_secs(30),
            force: false,
            breaking: false,
        };
        let grant = backend.acquire(&spec).await.expect("free");
        let again = AcquireSpec {
            lease_id: "l2".into(),
            ..spec
        };
        assert!(matches!(
            backend.acquire(&again).await,
            Err(BackendError::Held(..))
        ));
        backend.inspect(&key).await.expect("inspect");
        let lease = LeaseRef {
            key,
            lease_id: "l1".into(),
            token: grant.holder.token,
        };
        backend.release(&lease).await.expect("release");
        let text = metrics.render();
        let count = |op: &str, result: &str| {
            value(
                &text,
                &format!(
                    r#"runlock_backend_request_duration_seconds_count{{operation="{op}",result="{result}"}}"#
                ),
            )
        };
        assert_eq!(count("acquire", "ok"), Some(1.0), "{text}");
        assert_eq!(count("acquire", "held"), Some(1.0), "{text}");
        assert_eq!(count("inspect", "ok"), Some(1.0), "{text}");
        assert_eq!(count("release", "ok"), Some(1.0), "{text}");
        assert_eq!(count("renew", "ok"), Some(0.0), "{text}");
    }
}
