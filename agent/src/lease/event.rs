//! What the lease layer tells a connection unasked: a lease renewed, a lease
//! lost and why. connection.rs turns each into the event a peer reads.

use crate::shown::{cut, MAX_NAME_LEN};
use runlock_protocol::{Holder, Key, LostReason};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// At most this many `renewed` events wait for one peer to read them.
pub const RENEWED_BACKLOG: usize = 64;

/// An event for one connection.
#[derive(Debug)]
pub enum Event {
    /// A lease was renewed: it stays guaranteed until `valid_until` (sent
    /// only where leases outlive the agent).
    Renewed {
        /// The lease.
        lease_id: String,
        /// Until when it is guaranteed without another renewal.
        valid_until: Instant,
    },
    /// A forced acquire waits for the run it took `key` from to stop.
    Forcing {
        /// The key.
        key: Key,
        /// That run's holder, as the peer may see it, where known.
        holder: Option<Box<Holder>>,
        /// How long at most; `None`: until the run has stopped.
        wait: Option<std::time::Duration>,
    },
    /// A lease is gone.
    Lost {
        /// The lease.
        lease_id: String,
        /// Its key.
        key: Key,
        /// How it was lost.
        loss: Loss,
        /// Who took the key, as the peer may see them, where known.
        holder: Option<Box<Holder>>,
    },
}

/// A connection's event channel: the registry's end and the connection's.
pub(super) fn channel() -> (EventSender, Events) {
    let (events, received) = mpsc::unbounded_channel();
    let renewed_backlog = Arc::new(AtomicUsize::new(0));
    let sender = EventSender {
        events,
        renewed_backlog: renewed_backlog.clone(),
    };
    let receiver = Events {
        received,
        renewed_backlog,
    };
    (sender, receiver)
}

/// Where the registry sends one connection's events.
#[derive(Clone)]
pub(super) struct EventSender {
    events: mpsc::UnboundedSender<Event>,
    /// `renewed` events sent and not yet read by the connection.
    renewed_backlog: Arc<AtomicUsize>,
}

impl EventSender {
    /// Sends `lost`, which is never dropped.
    pub(super) fn lost(&self, lease_id: &str, key: Key, loss: Loss, holder: Option<Holder>) {
        let lease_id = lease_id.to_string();
        let _ = self.events.send(Event::Lost {
            lease_id,
            key,
            loss,
            holder: holder.map(Box::new),
        });
    }

    /// Sends `forcing`.
    pub(super) fn forcing(
        &self,
        key: Key,
        holder: Option<Holder>,
        wait: Option<std::time::Duration>,
    ) {
        let _ = self.events.send(Event::Forcing {
            key,
            holder: holder.map(Box::new),
            wait,
        });
    }

    /// Sends `renewed`, unless [`RENEWED_BACKLOG`] of them wait unread: a peer
    /// that does not read would otherwise make the queue grow without end, and
    /// skipping one only leaves it an earlier, safe deadline.
    pub(super) fn renewed(&self, lease_id: &str, valid_until: Instant) {
        if self.renewed_backlog.fetch_add(1, Ordering::Relaxed) >= RENEWED_BACKLOG {
            self.renewed_backlog.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        let lease_id = lease_id.to_string();
        let _ = self.events.send(Event::Renewed {
            lease_id,
            valid_until,
        });
    }
}

/// One connection's events, in the order they happened.
pub struct Events {
    received: mpsc::UnboundedReceiver<Event>,
    renewed_backlog: Arc<AtomicUsize>,
}

impl Events {
    /// The next event; `None` once the registry has forgotten the connection.
    /// Cancel-safe, as `mpsc::UnboundedReceiver::recv` is.
    pub async fn recv(&mut self) -> Option<Event> {
        let event = self.received.recv().await?;
        Some(self.read(event))
    }

    /// The next event if one is waiting.
    pub fn try_recv(&mut self) -> Result<Event, mpsc::error::TryRecvError> {
        self.received.try_recv().map(|event| self.read(event))
    }

    fn read(&self, event: Event) -> Event {
        if matches!(event, Event::Renewed { .. }) {
            self.renewed_backlog.fetch_sub(1, Ordering::Relaxed);
        }
        event
    }
}

/// How a lease was lost; its text is what the run is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loss {
    /// A run on this agent took the key with `--force`.
    ForcedHere {
        /// The new holder's user.
        user: String,
        /// Its host.
        host: String,
        /// Its shim's pid.
        pid: u32,
    },
    /// `runlock release --key` on this agent.
    BrokenHere {
        /// Who released it.
        uid: u32,
        /// Its pid.
        pid: u32,
    },
    /// No renewal succeeded before the lease's deadline.
    NotRenewed,
    /// The store names another holder.
    TakenOver {
        /// Its user, as recorded.
        user: String,
        /// Its host, as recorded.
        host: String,
        /// Its shim's pid.
        pid: u32,
        /// Its fencing token.
        token: u64,
    },
    /// The store has it free at a later token: someone took it and let it go
    /// before we looked, a `runlock release` or a forced run already ended.
    FreedSince(u64),
    /// The store no longer holds it, and nothing says who took it.
    Gone,
}

impl Loss {
    /// The reason a program reads.
    pub fn reason(&self) -> LostReason {
        match self {
            Loss::ForcedHere { .. } | Loss::TakenOver { .. } => LostReason::Forced,
            Loss::BrokenHere { .. } | Loss::FreedSince(_) => LostReason::Broken,
            Loss::NotRenewed | Loss::Gone => LostReason::Expired,
        }
    }
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loss::ForcedHere { user, host, pid } => {
                write!(f, "taken over with --force by {user}@{host} (pid {pid})")
            }
            Loss::BrokenHere { uid, pid } => write!(f, "released by uid {uid} (pid {pid})"),
            Loss::NotRenewed => f.write_str("the lease could not be renewed before its deadline"),
            Loss::TakenOver {
                user,
                host,
                pid,
                token,
            } => {
                // A record from a store: bounded, whatever another agent wrote.
                let (user, host) = (cut(user, MAX_NAME_LEN), cut(host, MAX_NAME_LEN));
                write!(f, "taken over by {user}@{host} (pid {pid}, token {token})")
            }
            Loss::FreedSince(token) => write!(
                f,
                "taken by another run since (a --force or runlock release), which has \
                 already let it go at token {token}"
            ),
            Loss::Gone => f.write_str("the lease is no longer held in the backend"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_loss_reads_as_it_did_on_the_wire() {
        let long = "u".repeat(MAX_NAME_LEN + 10);
        for (loss, reason, text) in [
            (
                Loss::ForcedHere {
                    user: "ann".into(),
                    host: "h".into(),
                    pid: 7,
                },
                LostReason::Forced,
                "taken over with --force by ann@h (pid 7)".to_string(),
            ),
            (
                Loss::BrokenHere { uid: 0, pid: 9 },
                LostReason::Broken,
                "released by uid 0 (pid 9)".to_string(),
            ),
            (
                Loss::NotRenewed,
                LostReason::Expired,
                "the lease could not be renewed before its deadline".to_string(),
            ),
            (
                Loss::TakenOver {
                    user: long.clone(),
                    host: "h".into(),
                    pid: 3,
                    token: 12,
                },
                LostReason::Forced,
                format!(
                    "taken over by {}@h (pid 3, token 12)",
                    cut(&long, MAX_NAME_LEN)
                ),
            ),
            (
                Loss::FreedSince(4),
                LostReason::Broken,
                "taken by another run since (a --force or runlock release), which has already \
                 let it go at token 4"
                    .to_string(),
            ),
            (
                Loss::Gone,
                LostReason::Expired,
                "the lease is no longer held in the backend".to_string(),
            ),
        ] {
            assert_eq!(loss.reason(), reason, "{loss:?}");
            assert_eq!(loss.to_string(), text);
        }
    }
}
