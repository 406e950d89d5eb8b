//! A key's history: the bounded list of its latest events that the key's
//! own record carries. Every grant and release rewrites that record anyway,
//! so keeping the history costs no request of its own, and its size is
//! bounded by [`MAX_HISTORY_EVENTS`] whatever happens to the key.

use super::AcquireSpec;
use runlock_protocol::{Clock, EventKind, Holder, KeyEvent, MAX_HISTORY_EVENTS};
use std::time::{SystemTime, UNIX_EPOCH};

/// When an event happened, and by whose clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Whose clock.
    pub clock: Clock,
}

impl Stamp {
    /// Now, by this agent's wall clock: for stores that give no time.
    pub fn agent_now() -> Stamp {
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Stamp {
            at_ms,
            clock: Clock::Agent,
        }
    }

    /// A time the store gave (an HTTP `Date`), else now by this agent's clock.
    pub fn store_or_agent(store: Option<SystemTime>) -> Stamp {
        let at_ms = store
            .and_then(|at| at.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64);
        match at_ms {
            Some(at_ms) => Stamp {
                at_ms,
                clock: Clock::Store,
            },
            None => Stamp::agent_now(),
        }
    }
}

/// `kind` about the lease with `token`, done by `who` (whose command line
/// is never kept: it may hold secrets, and the history outlives the lease).
pub fn event(kind: EventKind, who: &Holder, token: u64, at: Stamp) -> KeyEvent {
    KeyEvent {
        kind,
        at_ms: at.at_ms,
        clock: at.clock,
        token,
        from_token: None,
        host: who.host.clone(),
        agent_id: who.agent_id.clone(),
        pid: who.pid,
        uid: who.uid,
        user: who.user.clone(),
        reason: String::new(),
        slot: who.slot,
    }
}

/// Appends `event`, dropping the oldest events beyond the bound.
pub fn push(history: &mut Vec<KeyEvent>, event: KeyEvent) {
    // One key's history is kept for as long as the agent runs, and most keys
    // have a short one: room for exactly what is there, not for doubling
    // (a first push would keep room for four events, ~1 KiB, per key).
    history.reserve_exact(1);
    history.push(event);
    if history.len() > MAX_HISTORY_EVENTS {
        let excess = history.len() - MAX_HISTORY_EVENTS;
        history.drain(..excess);
    }
}

/// The latest force, break, expiry or loss.
pub fn last_incident(history: &[KeyEvent]) -> Option<Box<KeyEvent>> {
    let incident = history.iter().rev().find(|e| e.kind.is_incident());
    incident.cloned().map(Box::new)
}

/// What a key's record held before a grant, as far as its history cares.
#[derive(Debug, Clone, Copy)]
pub enum Before<'a> {
    /// Free, absent, or already ours (nothing to say about a previous holder).
    Free,
    /// A holder whose lease ran out without a release: `why` says how it was seen.
    Expired {
        /// The holder whose lease ran out, with its token.
        holder: &'a Holder,
        /// How the store shows it.
        why: &'a str,
    },
    /// A live holder, taken over with `force`: its token.
    Live(u64),
}

/// Records the grant of `spec` with `token` over what the record held.
pub fn granted(
    history: &mut Vec<KeyEvent>,
    spec: &AcquireSpec,
    token: u64,
    before: Before<'_>,
    at: Stamp,
) {
    let mut grant = event(EventKind::Granted, &spec.holder, token, at);
    match before {
        Before::Free => {}
        Before::Expired { holder, why } => {
            let mut expired = event(EventKind::Expired, holder, holder.token, at);
            expired.pid = 0;
            expired.reason = why.to_string();
            push(history, expired);
        }
        Before::Live(previous) => {
            grant.kind = if spec.breaking {
                EventKind::Broken
            } else {
                EventKind::Forced
            };
            grant.from_token = Some(previous);
        }
    }
    push(history, grant);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fixtures::spec;
    use std::time::Duration;

    fn at(ms: u64) -> Stamp {
        Stamp {
            at_ms: ms,
            clock: Clock::Agent,
        }
    }

    #[test]
    fn the_history_keeps_only_the_latest_events_in_order() {
        let mut history = Vec::new();
        let spec = spec("k", "l", false, Duration::from_secs(30));
        for token in 1..=(MAX_HISTORY_EVENTS as u64 + 5) {
            granted(&mut history, &spec, token, Before::Free, at(token));
        }
        assert_eq!(history.len(), MAX_HISTORY_EVENTS);
        assert_eq!(history[0].token, 6, "the oldest were dropped");
        assert!(history.windows(2).all(|w| w[0].token + 1 == w[1].token));
        assert_eq!(
            history.last().map(|e| e.token),
            Some(MAX_HISTORY_EVENTS as u64 + 5)
        );
    }

    #[test]
    fn a_grant_over_a_live_holder_is_a_force_or_a_break_and_over_a_dead_one_an_expiry() {
        let mut history = Vec::new();
        let mut taker = spec("k", "l2", true, Duration::from_secs(30));
        granted(&mut history, &taker, 8, Before::Live(7), at(1));
        assert_eq!(
            (history[0].kind, history[0].from_token),
            (EventKind::Forced, Some(7))
        );
        taker.breaking = true;
        granted(&mut history, &taker, 9, Before::Live(8), at(2));
        assert_eq!(history[1].kind, EventKind::Broken);
        let old = Holder {
            token: 9,
            ..spec("k", "l1", false, Duration::from_secs(30)).holder
        };
        let why = "not renewed";
        granted(
            &mut history,
            &taker,
            10,
            Before::Expired { holder: &old, why },
            at(3),
        );
        let kinds: Vec<_> = history.iter().map(|e| (e.kind, e.token)).collect();
        assert_eq!(
            kinds[2..],
            [(EventKind::Expired, 9), (EventKind::Granted, 10)]
        );
        assert_eq!(history[2].host, "host-of-l1");
        assert_eq!(
            last_incident(&history).map(|e| e.kind),
            Some(EventKind::Expired)
        );
        assert!(last_incident(&history[..0]).is_none());
    }

    #[test]
    fn no_command_line_is_kept() {
        let spec = spec("k", "l", false, Duration::from_secs(30));
        let kept = serde_json::to_string(&event(EventKind::Granted, &spec.holder, 1, at(1)))
            .expect("json");
        assert!(!kept.contains("meltano"), "{kept}");
    }
}
