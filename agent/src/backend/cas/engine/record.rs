//! The object stores' record: what it keeps beside the common fields, and
//! the record each grant writes.

use crate::backend::history::{self, Before, Stamp};
use crate::backend::record::LockRecord;
use crate::backend::{AcquireSpec, Displaced};
use runlock_protocol::{Holder, KeyEvent, KeyState};
use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What an object store's record keeps beside the common fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lapse {
    /// The holder's TTL in milliseconds.
    pub ttl_ms: u64,
    /// When the writer last wrote the record, by its own wall clock: for people only.
    pub renewed_at_ms: u64,
    /// A forced record: the TTL of the lease it took over (`forced_from`),
    /// whose run the forced run waits for (invariant 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forced_ttl_ms: Option<u64>,
}

/// One key's record in an object store: readable with the cloud's own CLI.
pub type CasRecord = LockRecord<Lapse>;

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The record granting `spec` with `token`, keeping `history` (to which
/// the caller has added the grant's events).
pub(super) fn held(
    spec: &AcquireSpec,
    token: u64,
    forced: Option<(u64, u64)>,
    history: Vec<KeyEvent>,
) -> CasRecord {
    CasRecord {
        key: spec.key.to_string(),
        state: KeyState::Held,
        token,
        holder: Some(Holder {
            token,
            ..spec.holder.clone()
        }),
        lease_id: Some(spec.lease_id.clone()),
        forced_from: forced.map(|(token, _)| token),
        history,
        store: Lapse {
            ttl_ms: spec.ttl.as_millis() as u64,
            renewed_at_ms: now_ms(),
            forced_ttl_ms: forced.map(|(_, ttl_ms)| ttl_ms),
        },
    }
}

/// The record granting `spec` with `token` after `history`, what the
/// record held before, and the store's time where a read just gave it.
pub(super) fn granting(
    spec: &AcquireSpec,
    token: u64,
    forced: Option<(u64, u64)>,
    mut history: Vec<KeyEvent>,
    before: Before<'_>,
    date: Option<SystemTime>,
) -> CasRecord {
    history::granted(
        &mut history,
        spec,
        token,
        before,
        Stamp::store_or_agent(date),
    );
    held(spec, token, forced, history)
}

/// The lease a forced `record` took over, once written: the holder as read
/// (unknown when a retried write found its own record).
pub(super) fn forced_over(record: &CasRecord, holder: Option<Holder>) -> Option<Displaced> {
    let (token, ttl_ms) = record.forced_from.zip(record.store.forced_ttl_ms)?;
    Some(Displaced {
        token,
        holder,
        ttl: Duration::from_millis(ttl_ms),
        lock: None,
    })
}
