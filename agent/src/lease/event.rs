//! What the lease layer tells a connection unasked: a lease renewed, a lease
//! lost and why. connection.rs turns each into the event a peer reads.

use crate::shown::{cut, MAX_NAME_LEN};
use runlock_protocol::{Holder, Key, LostReason};
use std::fmt;
use tokio::time::Instant;

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
    /// A lease is gone.
    Lost {
        /// The lease.
        lease_id: String,
        /// Its key.
        key: Key,
        /// How it was lost.
        loss: Loss,
        /// Who took the key, as the peer may see them, where known.
        holder: Option<Holder>,
    },
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
