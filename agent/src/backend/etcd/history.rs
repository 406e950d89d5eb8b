//! A key's history on etcd. The held key is deleted at release and when its
//! etcd lease runs out, so its history lives beside it in a key of its own,
//! under `.history/` and on no lease, written in the same transaction as
//! each grant and release, on condition that it is as this agent last saw
//! it (its mod revision): no operation needs a request of its own.
//!
//! A grant's token is the revision of the transaction that writes it, known
//! only once written, so the events a write appends carry token 0 and read
//! as the revision of the write that made the history key's value (its mod
//! revision): only the latest write's events can carry 0.
//!
//! A released key has no record left to say its name, so the history of a
//! key too long to spell (named by its hash) names its key in its first
//! event, for `list` to show. Agents that know no such field ignore it.

use super::rpc::KeyValue;
use crate::backend::history::{self, Stamp};
use crate::backend::key_name;
use runlock_protocol::{EventKind, Key, KeyEvent};
use serde::{Deserialize, Serialize};

/// A history as read: the history key's mod revision (0: absent) and its
/// events, tokens filled in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Kept {
    pub(super) revision: i64,
    pub(super) events: Vec<KeyEvent>,
    /// The key the history names (as its record would), if it names one.
    pub(super) key: Option<String>,
}

/// An event as the history key's value holds it.
#[derive(Serialize, Deserialize)]
struct Written {
    #[serde(flatten)]
    event: KeyEvent,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<String>,
}

impl Kept {
    /// The history as this agent's write at `revision` left it.
    pub(super) fn written(revision: i64, events: Vec<KeyEvent>) -> Kept {
        Kept {
            revision,
            events,
            key: None,
        }
    }

    /// The history in `kv` (absent: empty); `None` when it cannot be read.
    pub(super) fn read(kv: Option<&KeyValue>) -> Option<Kept> {
        let Some(kv) = kv else {
            return Some(Kept::default());
        };
        let written: Vec<Written> = serde_json::from_slice(kv.value()).ok()?;
        let key = written.first().and_then(|w| w.key.clone());
        let events = written.into_iter().map(|w| w.event).collect();
        Some(Kept {
            revision: kv.mod_revision(),
            events: filled(events, kv.mod_revision() as u64),
            key,
        })
    }

    /// The events after the grant of a key found absent: an `expired` one
    /// first when the last recorded lease has no recorded end (its etcd
    /// lease ran out, and etcd deleted the key), then `grant` (token 0).
    pub(super) fn after_grant(&self, grant: KeyEvent) -> Vec<KeyEvent> {
        let mut events = self.events.clone();
        let open = events.last().filter(|e| {
            matches!(
                e.kind,
                EventKind::Granted | EventKind::Forced | EventKind::Adopted
            )
        });
        if let Some(open) = open.cloned() {
            let mut expired = KeyEvent {
                kind: EventKind::Expired,
                pid: 0,
                from_token: None,
                reason: "its etcd lease ran out with no release recorded".to_string(),
                ..open
            };
            let now = Stamp::agent_now();
            (expired.at_ms, expired.clock) = (now.at_ms, now.clock);
            history::push(&mut events, expired);
        }
        history::push(&mut events, grant);
        events
    }
}

impl Kept {
    /// The event that began the lease with `token` here (its grant, the
    /// force or break that took the key, or its adoption): its holder, as
    /// its end is recorded. Nobody else writes a key's history while it is
    /// held, so it is there whenever this history is current.
    pub(super) fn began(&self, token: u64) -> Option<&KeyEvent> {
        self.events.iter().rev().find(|e| {
            e.token == token
                && matches!(
                    e.kind,
                    EventKind::Granted | EventKind::Forced | EventKind::Broken | EventKind::Adopted
                )
        })
    }
}

/// `events` with the tokens a write left to its own revision filled in.
pub(super) fn filled(mut events: Vec<KeyEvent>, revision: u64) -> Vec<KeyEvent> {
    for event in events.iter_mut().filter(|e| e.token == 0) {
        event.token = revision;
    }
    events
}

/// The value of `key`'s history key: its events, the first naming the key
/// if its name is a hash.
pub(super) fn body(key: &Key, events: &[KeyEvent]) -> Vec<u8> {
    let named = key_name::is_hashed(&key_name::escaped(key)).then(|| key.to_string());
    let written: Vec<Written> = events
        .iter()
        .enumerate()
        .map(|(i, event)| Written {
            event: event.clone(),
            key: named.clone().filter(|_| i == 0),
        })
        .collect();
    // invariant: events are plain strings and numbers, which always serialize
    serde_json::to_vec(&written).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fixtures::spec;
    use std::time::Duration;

    fn grant(token: u64) -> KeyEvent {
        let spec = spec("k", "l", false, Duration::from_secs(30));
        history::event(EventKind::Granted, &spec.holder, token, Stamp::agent_now())
    }

    #[test]
    fn a_grant_after_a_lease_with_no_recorded_end_records_its_expiry() {
        let kept = Kept {
            revision: 9,
            events: vec![grant(9)],
            key: None,
        };
        let events = filled(kept.after_grant(grant(0)), 12);
        let got: Vec<_> = events.iter().map(|e| (e.kind, e.token, e.pid)).collect();
        assert_eq!(
            got,
            [
                (EventKind::Granted, 9, 7),
                (EventKind::Expired, 9, 0),
                (EventKind::Granted, 12, 7),
            ]
        );
        let mut released = grant(9);
        released.kind = EventKind::Released;
        let ended = Kept {
            revision: 10,
            events: vec![grant(9), released],
            key: None,
        };
        assert_eq!(
            ended.after_grant(grant(0)).len(),
            3,
            "no expiry after a release"
        );
        assert_eq!(Kept::read(None), Some(Kept::default()));
    }
}
