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
#[cfg(any(test, feature = "test-support"))]
mod racy;
mod read_cache;
#[cfg(feature = "s3")]
mod s3;
#[cfg(test)]
mod simulation;
mod site;
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
pub use proof::{Proof, Unproven};
#[cfg(any(test, feature = "test-support"))]
pub use racy::RacyCasStore;
#[cfg(feature = "s3")]
pub use s3::S3Store;
#[cfg(object_store)]
use site::place_and_prefix;
pub use site::Site;

use async_trait::async_trait;
use std::time::SystemTime;

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

#[cfg(object_store)]
impl<A> crate::backend::failure::Failure<A> {
    /// The answer the operation handles, or the store error the failure is.
    fn expected(self) -> CasResult<A> {
        match self {
            Self::Expected(answer) => Ok(answer),
            Self::Transient(why) => Err(CasError::Unavailable(why)),
            Self::Refused(why) => Err(CasError::Refused(why)),
        }
    }
}

/// What a store operation answers.
pub type CasResult<T> = Result<T, CasError>;

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
    /// Where the records are, how the store is named, the pace it takes
    /// writes at. No default: a decorator must say whose site it shows.
    fn site(&self) -> &Site;
    /// Checks that the store answers and lets this agent in (the bucket
    /// exists, the credentials are accepted); the error names the cause.
    async fn probe(&self) -> CasResult<()>;
    /// Reads an object.
    async fn get(&self, name: &str) -> CasResult<Read>;
    /// Writes an object only if `when` holds ([`CasError::Conflict`]
    /// otherwise); returns its new version.
    async fn put(&self, name: &str, body: Vec<u8>, when: Precondition<'_>) -> CasResult<String>;
    /// Lists, in name order, at most `limit` names of objects that start with
    /// `prefix`, from the page `page` (the store's token from an earlier
    /// page) or the first.
    async fn list(&self, prefix: &str, page: Option<&str>, limit: usize) -> CasResult<Names>;
    /// Removes an object whatever its version; an absent one is no error. Only
    /// ever asked of an object no other agent writes again (this agent's
    /// probe, a word that a run taken over has stopped, once read).
    async fn delete(&self, name: &str) -> CasResult<()>;
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
