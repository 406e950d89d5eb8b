//! Object stores (S3, GCS, Azure Blob) share one lease engine, written once
//! over this tiny compare-and-swap trait; each store only adapts it.

#[cfg(feature = "azure")]
mod azure;
mod engine;
#[cfg(feature = "gcs")]
mod gcs;
#[cfg(any(test, feature = "test-support"))]
mod memory;
mod proof;
mod read_cache;
#[cfg(feature = "s3")]
mod s3;
#[cfg(test)]
mod simulation;
#[cfg(test)]
pub(crate) mod testing;

pub use crate::backend::options::{AzureOptions, GcsOptions, S3Options};
#[cfg(feature = "azure")]
pub use azure::AzureStore;
pub use engine::{CasEngine, CasRecord, Lapse, CLOCK_RESOLUTION};
#[cfg(feature = "gcs")]
pub use gcs::GcsStore;
#[cfg(any(test, feature = "test-support"))]
pub use memory::MemoryCasStore;
pub use proof::Unproven;
#[cfg(feature = "s3")]
pub use s3::S3Store;

use async_trait::async_trait;
use std::time::{Duration, SystemTime};

/// An object as the store returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The object's bytes.
    pub body: Vec<u8>,
    /// The store's version tag (an ETag, a generation).
    pub version: String,
    /// When the store last wrote it, by the store's clock.
    pub last_modified: Option<SystemTime>,
}

/// The answer to a read: the object, if any, and the store's clock at the time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// The object, or `None` when there is none.
    pub object: Option<Stored>,
    /// The store's current date (HTTP `Date`), when it gives one.
    pub date: Option<SystemTime>,
}

/// One page of object names, in name order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Names {
    /// The names, each with its version where the listing gives it (the
    /// same tag a read returns), so that an unchanged object need not be read again.
    pub names: Vec<(String, Option<String>)>,
    /// The store's token for the next page; `None` after the last.
    pub next: Option<String>,
}

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CasError {
    /// The write's precondition did not hold: someone else wrote first.
    #[error("precondition failed")]
    Conflict,
    /// The store could not be reached or failed; trying again may work.
    #[error("{0}")]
    Unavailable(String),
    /// The store refused us for a reason retrying will not fix (no such bucket,
    /// bad credentials); the message names the cause and never a secret.
    #[error("{0}")]
    Refused(String),
}

#[cfg(any(feature = "s3", feature = "azure"))]
/// The retries of a transient HTTP failure (5xx, throttling, a reset
/// connection) within one operation, as the S3 and Azure SDKs make them.
const HTTP_RETRY: crate::backend::retry::RetryBudget = crate::backend::retry::RetryBudget {
    attempts: 3,
    first_pause: Duration::from_millis(50),
    longest_pause: Duration::from_millis(500),
};

#[cfg(object_store)]
impl<A> crate::backend::failure::Failure<A> {
    /// The answer the operation handles, or the store error the failure is.
    fn expected(self) -> Result<A, CasError> {
        match self {
            Self::Expected(answer) => Ok(answer),
            Self::Transient(why) => Err(CasError::Unavailable(why)),
            Self::Refused(why) => Err(CasError::Refused(why)),
        }
    }
}

/// What a write asks of the object it would replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition<'a> {
    /// That there is none (`If-None-Match: *`).
    Absent,
    /// That it is at this version (`If-Match`).
    Matches(&'a str),
}

impl<'a> Precondition<'a> {
    /// The write that replaces `version`, or creates when there is none.
    pub fn replacing(version: Option<&'a str>) -> Precondition<'a> {
        version.map_or(Precondition::Absent, Precondition::Matches)
    }

    /// The version the object must be at; `None`: there must be none.
    pub fn version(self) -> Option<&'a str> {
        match self {
            Precondition::Absent => None,
            Precondition::Matches(version) => Some(version),
        }
    }
}

/// The compare-and-swap operations a lock needs from an object store.
#[async_trait]
pub trait CasStore: Send + Sync + 'static {
    /// The store's URI with any secret removed.
    fn describe(&self) -> String;
    /// How far apart the store wants writes of one object (GCS sustains about
    /// one per second); the engine spaces its own writes of a record by this,
    /// and refuses TTLs too short to renew at that pace. Zero: no limit. No
    /// default: a decorator that forgot to forward it would pace wrongly.
    fn min_write_interval(&self) -> Duration;
    /// The object name prefix the lock records live under: `prefix/.runlock/locks/`
    /// for `SCHEME://PLACE/prefix`, so that they stay apart from Meltano's objects.
    fn records_prefix(&self) -> &str;
    /// Checks that the store answers and lets this agent in (the bucket
    /// exists, the credentials are accepted); the error names the cause.
    async fn probe(&self) -> Result<(), CasError>;
    /// Reads an object.
    async fn get(&self, name: &str) -> Result<Read, CasError>;
    /// Writes an object only if `only_if` holds ([`CasError::Conflict`]
    /// otherwise); returns its new version.
    async fn put(
        &self,
        name: &str,
        body: Vec<u8>,
        only_if: Precondition<'_>,
    ) -> Result<String, CasError>;
    /// Lists, in name order, at most `limit` names of objects that start with
    /// `prefix`, from the page `page` (the store's token from an earlier
    /// page) or the first.
    async fn list(&self, prefix: &str, page: Option<&str>, limit: usize)
        -> Result<Names, CasError>;
    /// Removes an object whatever its version; an absent one is no error. Only
    /// ever asked of an object no other agent writes again (this agent's
    /// probe, a word that a run taken over has stopped, once read).
    async fn delete(&self, name: &str) -> Result<(), CasError>;
}

#[cfg(object_store)]
/// Where the lock records live, below the URI's prefix: apart from Meltano's
/// `prefix/<state_id>/` objects, so one URI serves both.
const RECORDS: &str = ".runlock/locks/";

#[cfg(object_store)]
/// The object name prefix of the records of a store whose URI has `prefix`.
fn records_under(prefix: &str) -> String {
    if prefix.is_empty() {
        RECORDS.to_string()
    } else {
        format!("{prefix}/{RECORDS}")
    }
}

#[cfg(object_store)]
/// `SCHEME://PLACE[/prefix]`, for descriptions.
fn object_uri(scheme: &str, place: &str, prefix: &str) -> String {
    if prefix.is_empty() {
        format!("{scheme}://{place}")
    } else {
        format!("{scheme}://{place}/{prefix}")
    }
}

#[cfg(object_store)]
/// `SCHEME://PLACE/prefix` → (PLACE, the prefix without surrounding slashes):
/// every object store's URI. `place` is what the store calls it ("bucket",
/// "container"); `settings` says where credentials and endpoints come from
/// instead, for the error that refuses a URI carrying them.
fn place_and_prefix(
    uri: &str,
    scheme: &str,
    place: &str,
    settings: &str,
) -> anyhow::Result<(String, String)> {
    let rest = uri
        .strip_prefix(scheme)
        .and_then(|rest| rest.strip_prefix("://"))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{:?} is not a {scheme}:// URI",
                crate::backend::redact_uri(uri)
            )
        })?;
    let (name, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if name.is_empty() {
        anyhow::bail!(
            "backend {scheme}:// needs a {place}, as in {scheme}://my-{place}/meltano-state"
        );
    }
    if name.contains(['@', '?', '#', ':']) || prefix.contains(['?', '#']) {
        anyhow::bail!(
            "backend {:?}: write {scheme}://{}/PREFIX; {settings}",
            crate::backend::redact_uri(uri),
            place.to_uppercase()
        );
    }
    Ok((name.to_string(), prefix.trim_matches('/').to_string()))
}

#[cfg(object_store)]
/// The last error in `err`'s source chain, on one line: the root cause,
/// without a client library's wrapping (which may repeat the URL).
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = err;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause
        .to_string()
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}
