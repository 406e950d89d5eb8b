//! The JSON record a key's lock is kept in where the store holds documents
//! (the object stores, `file://`): one shape, readable with the store's own
//! tools, with what only one store needs flattened in beside it. etcd keeps
//! its own (the token there is the key's revision, not a field), and
//! PostgreSQL keeps columns.

use super::history::{self, Stamp};
use super::Ending;
use runlock_protocol::{Holder, KeyEvent, KeyState};
use serde::{Deserialize, Serialize};

/// One key's record, as stored; `S` is what only its store needs. An unset
/// field is left out (and reads back as unset).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRecord<S> {
    /// The key.
    pub key: String,
    /// `held` or `free`.
    pub state: KeyState,
    /// The last fencing token issued for the key.
    pub token: u64,
    /// The holder, while held.
    pub holder: Option<Holder>,
    /// The holding lease's id, while held, so that the next agent can adopt it.
    pub lease_id: Option<String>,
    /// The token this holder took the key from with `force`.
    pub forced_from: Option<u64>,
    /// The key's latest events, oldest first, at most `MAX_HISTORY_EVENTS`
    /// (`backend::history`); absent from records written before it was kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<KeyEvent>,
    /// The store's own fields.
    #[serde(flatten)]
    pub store: S,
}

impl<S> LockRecord<S> {
    /// Frees the record as its holder's lease ends: the ending goes into
    /// the key's history, the holder and its lease out of the record (the
    /// token stays, the next holder's is one more). The store's own fields
    /// are the caller's.
    pub fn end(&mut self, ending: &Ending) {
        if let Some(holder) = &self.holder {
            if let Some(event) = ending.event(holder, Stamp::agent_now()) {
                history::push(&mut self.history, event);
            }
        }
        self.state = KeyState::Free;
        self.holder = None;
        self.lease_id = None;
        self.forced_from = None;
    }

    /// Whether the record is held by the lease `lease_id` with `token`.
    pub fn held_by(&self, lease_id: &str, token: u64) -> bool {
        self.state == KeyState::Held
            && self.lease_id.as_deref() == Some(lease_id)
            && self.token == token
    }
}

impl<S: Serialize> LockRecord<S> {
    /// The record as indented JSON, for a person reading the store.
    pub fn to_json(&self) -> Vec<u8> {
        // invariant: a record always serializes (plain strings, numbers and maps)
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }
}
