//! Prometheus metrics on `--metrics ADDR`: the counters, gauges and
//! histograms (here), filled from what the lease layer reports to its
//! [`Observer`] (this file maps it to series), from the connection
//! (acquisitions, by wire code) and the stores (throttling); a timing
//! decorator around the backend (`timed.rs`); and a tiny HTTP server for
//! `GET /metrics` (`http.rs`). docs/src/metrics.md (the book) describes each
//! series for the people who chart them.
//!
//! `main.rs` makes one [`Metrics`] and hands it down: to the server and its
//! connections, to the lease layer (as its `Observer`) and to the stores (as
//! their `StoreObserver`); [`start`] serves it. There is no global.

#[cfg(any(test, feature = "test-support"))]
pub mod exposition;
mod http;
mod timed;

pub use http::start;
pub use timed::{instrument, TimedBackend};

use crate::backend::{BackendError, BackendResult, Ending, StoreObserver};
use crate::lease::{Observer, Renewal, Takeover};
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use runlock_protocol::{ErrorCode, LostReason, WireError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

/// How a lease held on this agent ended, as the hold histogram's `ended`
/// label names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
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
    /// `Backend::put_report`, `reports` and `remove_report`: the agents'
    /// reports of their waiters and refusals.
    Report,
}

const OPERATIONS: [&str; 9] = [
    "acquire",
    "renew",
    "release",
    "inspect",
    "adopt",
    "history",
    "list",
    "displaced",
    "report",
];

fn backend_result<T>(result: &BackendResult<T>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(
            BackendError::Held(..) | BackendError::HeldUnrecorded(_) | BackendError::HeldOutside(_),
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

    /// Counts one connection refused as busy.
    pub fn refused(&self) {
        self.refused.inc();
    }

    /// The exposition in Prometheus text format 0.0.4.
    pub fn render(&self) -> String {
        let mut text = String::with_capacity(8 * 1024);
        // invariant: writing to a String cannot fail
        let _ = prometheus_text::encode(&mut text, &self.registry);
        text
    }

    /// Counts one acquire request, made at `started`, by how it ended
    /// (`cancelled` when its client left), and times it if it was granted.
    pub fn acquisition<T>(
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

    pub(super) fn backend_request<T>(
        &self,
        operation: Operation,
        started: Instant,
        result: &BackendResult<T>,
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

/// What the stores report, as series.
impl StoreObserver for Metrics {
    fn throttled(&self, store: &'static str) {
        self.throttled.get_or_create(&[("store", store)]).inc();
    }
}

/// What happened to leases, as series.
impl Observer for Metrics {
    fn leases_held(&self, count: usize) {
        self.leases_held
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    fn waiting(&self, began: bool) {
        if began {
            self.waiters.inc();
        } else {
            self.waiters.dec();
        }
    }

    fn taken_over(&self, how: Takeover) {
        let at = match how {
            Takeover::Force => 0,
            Takeover::Break => 1,
        };
        self.takeovers[at].inc();
    }

    fn renewal_sent(&self, late: Duration) {
        self.renewal_lateness.observe(late.as_secs_f64());
    }

    fn renewal_ended(&self, outcome: Renewal) {
        let at = match outcome {
            Renewal::Ok => 0,
            Renewal::Retry => 1,
            Renewal::Lost => 2,
        };
        self.renewals[at].inc();
    }

    fn released(&self, acquired_at_ms: u64, ending: &Ending) {
        let ended = match ending {
            Ending::ClientGone => Ended::Closed,
            _ => Ended::Released,
        };
        self.hold_ended(acquired_at_ms, now_ms(), ended);
    }

    fn lost(&self, acquired_at_ms: u64, reason: LostReason) {
        self.losses
            .get_or_create(&[("reason", lost_reason(reason))])
            .inc();
        self.hold_ended(acquired_at_ms, now_ms(), Ended::Lost(reason));
    }
}

/// The wall clock in milliseconds, as holders record their grant.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::exposition::{differences, value};
    use super::*;

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
        Observer::lost(&metrics, 0, LostReason::Forced);
        metrics.renewal_ended(Renewal::Retry);
        Observer::leases_held(&metrics, 3);
        let text = metrics.render();
        let wrong = differences(
            &text,
            r#"
            runlock_acquisitions_total{result="granted"} 1
            runlock_acquisitions_total{result="forced"} 1
            runlock_acquisitions_total{result="held"} 1
            runlock_acquisitions_total{result="cancelled"} 1
            runlock_losses_total{reason="forced"} 1
            runlock_renewals_total{result="retry"} 1
            runlock_renewals_total{result="ok"} 0
            runlock_leases_held 3
            # Only grants are timed.
            runlock_wait_duration_seconds_count 2
            "#,
        );
        assert!(wrong.is_empty(), "{wrong:?} in\n{text}");
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
        let wrong = differences(
            &text,
            r#"
            runlock_hold_duration_seconds_sum{ended="forced"} 90
            runlock_hold_duration_seconds_bucket{ended="forced",le="60"} 0
            runlock_hold_duration_seconds_bucket{ended="forced",le="300"} 1
            runlock_hold_duration_seconds_bucket{ended="released",le="0.1"} 1
            runlock_hold_duration_seconds_count{ended="closed"} 0
            runlock_hold_duration_seconds_count{ended="unknown"} 1
            "#,
        );
        assert!(wrong.is_empty(), "{wrong:?} in\n{text}");
    }

    #[test]
    fn waiters_takeovers_and_lateness_land_in_their_series() {
        let metrics = Metrics::new();
        Observer::waiting(&metrics, true);
        Observer::waiting(&metrics, true);
        assert_eq!(value(&metrics.render(), "runlock_waiters"), Some(2.0));
        Observer::waiting(&metrics, false);
        assert_eq!(value(&metrics.render(), "runlock_waiters"), Some(1.0));
        Observer::waiting(&metrics, false);
        metrics.taken_over(Takeover::Break);
        metrics.renewal_sent(Duration::from_millis(1500));
        let text = metrics.render();
        let wrong = differences(
            &text,
            r#"
            runlock_waiters 0
            runlock_takeovers_total{how="force"} 0
            runlock_takeovers_total{how="break"} 1
            runlock_renewal_lateness_seconds_bucket{le="1"} 0
            runlock_renewal_lateness_seconds_bucket{le="2.5"} 1
            "#,
        );
        assert!(wrong.is_empty(), "{wrong:?} in\n{text}");
    }
}
