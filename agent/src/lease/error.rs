//! What the lease layer refuses, and why, as data. connection.rs turns each
//! into the wire error a peer reads: `code()`, this text, `key()`, `holder()`.

use crate::backend::BackendError;
use crate::process::AttachRefused;
use crate::shown;
use runlock_protocol::timing;
use runlock_protocol::types::{InvalidKey, MAX_KEY_LEN};
use runlock_protocol::{
    ErrorCode, EventKind, Holder, Key, KeyEvent, MAX_KEYS_PER_REQUEST, MAX_SLOTS,
};
use std::fmt;
use std::time::Duration;

/// Why a lease operation was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// A key breaks the key rules; `key` is as sent, cut to fit a reply.
    #[error("{reason}")]
    InvalidKey {
        /// The key as sent, cut to the longest valid length.
        key: String,
        /// The rule it breaks.
        reason: InvalidKey,
    },
    /// An acquire names more keys than one request may take.
    #[error("acquire names {0} keys; at most {MAX_KEYS_PER_REQUEST} may be taken at once")]
    TooManyKeys(usize),
    /// An acquire names no key.
    #[error("acquire needs at least one key")]
    NoKeys,
    /// A reattach names more leases than one request may adopt.
    #[error("reattach names {0} leases; at most {MAX_KEYS_PER_REQUEST} may be adopted at once")]
    TooManyLeases(usize),
    /// A reattach names no lease.
    #[error("reattach needs at least one lease")]
    NoLeases,
    /// The TTL asked for is outside what the agent and its backend keep.
    #[error(
        "ttl_ms must be between {} and {}{}, got {}",
        shortest.as_millis(),
        timing::MAX_TTL.as_millis(),
        OnBackend(backend.as_deref()),
        ttl.as_millis()
    )]
    TtlOutOfRange {
        /// The TTL asked for.
        ttl: Duration,
        /// The shortest this backend keeps.
        shortest: Duration,
        /// The backend, where it is what needs the longer minimum.
        backend: Option<String>,
    },
    /// A reattach names a lease this agent already holds.
    #[error("lease {0} is already held through this agent")]
    AlreadyHeldHere(String),
    /// The peer may not do this (force, break, adopt another's lease).
    #[error("uid {uid} may not {action} (allowed: {allowed})")]
    Forbidden {
        /// The peer's uid.
        uid: u32,
        /// What it tried.
        action: String,
        /// Who may.
        allowed: String,
        /// The key, where the refusal is about one.
        key: Option<Key>,
    },
    /// A release names a lease this connection does not hold.
    #[error("lease {0} is not held by this connection")]
    NotHeldHere(String),
    /// A reattach names a lease the backend no longer holds as it was.
    #[error(
        "lease {lease_id} on {} is no longer held: it expired, was taken over or was released",
        Named(key)
    )]
    NoLongerHeld {
        /// Its key.
        key: Key,
        /// The lease.
        lease_id: String,
    },
    /// `slots` outside 1..=MAX_SLOTS.
    #[error("slots must be between 1 and {MAX_SLOTS}, got {0}")]
    SlotsOutOfRange(u32),
    /// A slot number no key can have.
    #[error("slot {0} does not exist: slots are numbered from 0 to {max}", max = MAX_SLOTS - 1)]
    NoSuchSlot(u32),
    /// The key is held with another count of slots than asked.
    #[error("{}", MismatchText { key, asked: *asked, held_with: *held_with, holders })]
    SlotsMismatch {
        /// The key.
        key: Key,
        /// The count this acquire asked.
        asked: u32,
        /// The count a live holder took it with.
        held_with: u32,
        /// The live holders, as the peer may see them.
        holders: Vec<Holder>,
    },
    /// The key is held: at once, or still after waiting `waited`.
    #[error("{}", HeldText { key, waited: *waited, unrecorded: unrecorded.as_deref(), incident: incident.as_deref(), slots: *slots })]
    Held {
        /// The key.
        key: Key,
        /// How long the request waited (zero: it did not).
        waited: Duration,
        /// Who holds it, as the peer may see it, where known.
        holder: Option<Box<Holder>>,
        /// For a key with slots: the holder of every slot.
        holders: Vec<Holder>,
        /// How many slots the request asked (1: a plain key).
        slots: u32,
        /// The key's last force, break, expiry or loss, as the peer may see it.
        incident: Option<Box<KeyEvent>>,
        /// The holder is no lease (a process on a kernel lock, a run a
        /// guard around the store found): what the backend says of it.
        unrecorded: Option<String>,
    },
    /// The backend failed on `key`.
    #[error("{source}")]
    Backend {
        /// The key.
        key: Key,
        /// What the backend said.
        source: BackendError,
    },
    /// The process named as the run is not the peer's to name.
    #[error(transparent)]
    Attach(#[from] AttachRefused),
    /// The connection is closing.
    #[error("connection is closing")]
    ConnectionClosing,
    /// The connection closed while its acquire was being granted.
    #[error("connection closed during acquire")]
    ClosedDuringAcquire,
    /// The acquire's client went away while it waited.
    #[error("acquire cancelled")]
    Cancelled,
    /// A `list_keys` cursor this agent did not give, or cannot read.
    #[error("the listing cursor is not one this agent gave: {0}")]
    BadCursor(String),
    /// The store failed a page of a listing.
    #[error("the store failed to list its keys: {0}")]
    Listing(BackendError),
}

impl LeaseError {
    /// The code a program reads.
    pub fn code(&self) -> ErrorCode {
        use LeaseError::*;
        match self {
            InvalidKey { .. } => ErrorCode::InvalidKey,
            TooManyKeys(_) | NoKeys | TooManyLeases(_) | NoLeases | TtlOutOfRange { .. } => {
                ErrorCode::BadRequest
            }
            SlotsOutOfRange(_) | NoSuchSlot(_) => ErrorCode::BadRequest,
            SlotsMismatch { .. } => ErrorCode::SlotsMismatch,
            AlreadyHeldHere(_) => ErrorCode::BadRequest,
            Forbidden { .. } => ErrorCode::Forbidden,
            NotHeldHere(_) | NoLongerHeld { .. } => ErrorCode::NotOwner,
            Held { waited, .. } if !waited.is_zero() => ErrorCode::Timeout,
            Held { .. } => ErrorCode::Held,
            Backend { source, .. } | Listing(source) => source.code(),
            BadCursor(_) => ErrorCode::BadRequest,
            Attach(refused) => refused.code(),
            ConnectionClosing | ClosedDuringAcquire | Cancelled => ErrorCode::Internal,
        }
    }

    /// The key the error is about, as the peer is told it.
    pub fn key(&self) -> Option<String> {
        use LeaseError::*;
        match self {
            InvalidKey { key, .. } => Some(key.clone()),
            Forbidden { key, .. } => key.as_ref().map(Key::to_string),
            NoLongerHeld { key, .. }
            | Held { key, .. }
            | Backend { key, .. }
            | SlotsMismatch { key, .. } => Some(key.split_slot().0.to_string()),
            _ => None,
        }
    }

    /// Who holds the key, where the error says.
    pub fn holder(&self) -> Option<&Holder> {
        match self {
            LeaseError::Held { holder, .. } => holder.as_deref(),
            LeaseError::SlotsMismatch { holders, .. } => holders.first(),
            _ => None,
        }
    }

    /// For a key with slots: every slot's holder.
    pub fn holders(&self) -> &[Holder] {
        match self {
            LeaseError::Held { holders, .. } | LeaseError::SlotsMismatch { holders, .. } => holders,
            _ => &[],
        }
    }
}

/// `BackendError` about `key`, as a lease error.
pub(super) fn backend_on(key: &Key) -> impl FnOnce(BackendError) -> LeaseError + '_ {
    |source| LeaseError::Backend {
        key: key.clone(),
        source,
    }
}

/// The record of `slot` of `key`, if the slot can exist.
pub(super) fn valid_slot(key: &Key, slot: u32) -> Result<Key, LeaseError> {
    match slot < MAX_SLOTS {
        true => Ok(key.slot_record(slot)),
        false => Err(LeaseError::NoSuchSlot(slot)),
    }
}

/// The key, or why it is not one; written once for every request that names keys.
pub(super) fn valid_key(key: &str) -> Result<Key, LeaseError> {
    Key::new(key).map_err(|reason| LeaseError::InvalidKey {
        key: shown::cut(key, MAX_KEY_LEN),
        reason,
    })
}

/// " on BACKEND", where a backend is named.
struct OnBackend<'a>(Option<&'a str>);

impl fmt::Display for OnBackend<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(backend) => write!(f, " on {backend}"),
            None => Ok(()),
        }
    }
}

/// A key as a message names it: a slot's record by its key and slot.
struct Named<'a>(&'a Key);

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.split_slot() {
            (key, 0) => write!(f, "key {key:?}"),
            (key, slot) => write!(f, "key {key:?} slot {slot}"),
        }
    }
}

/// The text of [`LeaseError::Held`].
struct HeldText<'a> {
    key: &'a Key,
    waited: Duration,
    unrecorded: Option<&'a str>,
    incident: Option<&'a KeyEvent>,
    slots: u32,
}

impl fmt::Display for HeldText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = Named(self.key);
        let waited = humantime::format_duration(self.waited);
        match (self.slots, self.waited.is_zero()) {
            (0 | 1, true) => write!(f, "{key} is held")?,
            (0 | 1, false) => write!(f, "{key} is still held after waiting {waited}")?,
            (n, true) => write!(f, "{key} has all {n} slots held")?,
            (n, false) => write!(
                f,
                "{key} still has all {n} slots held after waiting {waited}"
            )?,
        }
        if let Some(why) = self.unrecorded {
            write!(f, ": {why}")?;
        }
        match self.incident {
            Some(event) => write!(f, " ({})", Incident(event)),
            None => Ok(()),
        }
    }
}

/// The text of [`LeaseError::SlotsMismatch`].
struct MismatchText<'a> {
    key: &'a Key,
    asked: u32,
    held_with: u32,
    holders: &'a [Holder],
}

impl fmt::Display for MismatchText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural = |n: u32| if n == 1 { "slot" } else { "slots" };
        write!(
            f,
            "{} is held with {} {}, and this acquire asks {} {}: a key's slots are \
             one count for every holder",
            Named(self.key),
            self.held_with,
            plural(self.held_with),
            self.asked,
            plural(self.asked),
        )?;
        for (n, h) in self.holders.iter().enumerate() {
            let sep = if n == 0 { "; held by" } else { "," };
            let slots = h.slots.unwrap_or(1);
            write!(
                f,
                "{sep} {}@{} (pid {}, {slots} {}",
                h.user,
                h.host,
                h.pid,
                plural(slots)
            )?;
            match h.slot {
                Some(slot) => write!(f, ", slot {slot})")?,
                None => write!(f, ")")?,
            }
        }
        Ok(())
    }
}

/// A key's last incident in words: "last forced by ann@h (pid 7, token 9
/// over 8) at 2026-…Z (agent clock)". The event was already cut to fit
/// (`shown::event`); the shim escapes what it prints.
struct Incident<'a>(&'a KeyEvent);

impl fmt::Display for Incident<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = self.0;
        let what = match e.kind {
            EventKind::Forced => "forced by",
            EventKind::Broken => "broken by",
            EventKind::Expired => "expired: the lease of",
            EventKind::Lost => "lost by",
            _ => "changed by",
        };
        write!(f, "last {what} {}@{}", e.user, e.host)?;
        if e.pid != 0 {
            write!(f, " (pid {}, token {}", e.pid, e.token)?;
        } else {
            write!(f, " (token {}", e.token)?;
        }
        if let Some(from) = e.from_token {
            write!(f, " over {from}")?;
        }
        let clock = match e.clock {
            runlock_protocol::Clock::Store => "store clock",
            _ => "agent clock",
        };
        // Any number a record holds: past the year 9999 RFC 3339 has no form.
        if e.at_ms <= runlock_protocol::LAST_RFC3339_MS {
            let at = std::time::UNIX_EPOCH + Duration::from_millis(e.at_ms);
            write!(
                f,
                ") at {} ({clock})",
                humantime::format_rfc3339_seconds(at)
            )?;
        } else {
            write!(f, ") at {} ms after the epoch ({clock})", e.at_ms)?;
        }
        if !e.reason.is_empty() {
            write!(f, ": {}", e.reason)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::new("k").expect("valid")
    }

    fn held(waited: Duration) -> LeaseError {
        LeaseError::Held {
            holders: Vec::new(),
            slots: 1,
            key: key(),
            waited,
            holder: None,
            unrecorded: None,
            incident: None,
        }
    }

    #[test]
    fn held_names_the_last_incident() {
        let event = KeyEvent {
            slot: None,
            kind: EventKind::Forced,
            at_ms: 1_000,
            clock: runlock_protocol::Clock::Agent,
            token: 9,
            from_token: Some(8),
            host: "h".into(),
            agent_id: "a".into(),
            pid: 7,
            uid: 0,
            user: "ann".into(),
            reason: String::new(),
        };
        let err = LeaseError::Held {
            holders: Vec::new(),
            slots: 1,
            key: key(),
            waited: Duration::ZERO,
            holder: None,
            unrecorded: None,
            incident: Some(Box::new(event.clone())),
        };
        let far = KeyEvent {
            at_ms: u64::MAX,
            ..event
        };
        assert!(Incident(&far).to_string().contains("ms after the epoch"));
        assert_eq!(
            err.to_string(),
            "key \"k\" is held (last forced by ann@h (pid 7, token 9 over 8) at \
             1970-01-01T00:00:01Z (agent clock))"
        );
    }

    #[test]
    fn held_reads_as_it_did_on_the_wire() {
        let now = held(Duration::ZERO);
        assert_eq!(now.to_string(), "key \"k\" is held");
        assert_eq!(now.code(), ErrorCode::Held);
        let waited = held(Duration::from_secs(5));
        assert_eq!(
            waited.to_string(),
            "key \"k\" is still held after waiting 5s"
        );
        assert_eq!(waited.code(), ErrorCode::Timeout);
        assert_eq!(waited.key().as_deref(), Some("k"));
    }

    #[test]
    fn a_ttl_out_of_range_names_the_backend_only_where_it_sets_the_minimum() {
        let ttl = LeaseError::TtlOutOfRange {
            ttl: Duration::from_millis(10),
            shortest: timing::MIN_TTL,
            backend: None,
        };
        let want = format!(
            "ttl_ms must be between {} and {}, got 10",
            timing::MIN_TTL.as_millis(),
            timing::MAX_TTL.as_millis()
        );
        assert_eq!(ttl.to_string(), want);
        let on = LeaseError::TtlOutOfRange {
            ttl: Duration::from_millis(10),
            shortest: Duration::from_secs(60),
            backend: Some("gs://b/p".to_string()),
        };
        let want = format!(
            "ttl_ms must be between 60000 and {} on gs://b/p, got 10",
            timing::MAX_TTL.as_millis()
        );
        assert_eq!(on.to_string(), want);
    }

    #[test]
    fn an_invalid_key_is_echoed_cut_to_fit() {
        let long = "k".repeat(MAX_KEY_LEN + 100);
        let err = valid_key(&long).expect_err("too long");
        assert_eq!(err.code(), ErrorCode::InvalidKey);
        assert!(err.key().is_some_and(|k| k.len() <= MAX_KEY_LEN));
        assert_eq!(err.to_string(), InvalidKey::TooLong(long.len()).to_string());
    }
}
