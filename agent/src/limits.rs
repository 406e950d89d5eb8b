//! How much of the agent one peer may take: connections in all and per user,
//! the time it has to say hello or finish a frame, the store reads it may
//! have in flight, and the descriptors kept back for the backend. A peer
//! over a limit is told the agent is busy and which limit it hit, or waits
//! its turn; it never makes the agent fail another user's request.

use crate::unpoisoned::Unpoisoned;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The operator's limits (`[limits]` in the configuration file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections from users other than root and the agent's own, in all.
    pub connections: usize,
    /// Connections from any one such user.
    pub connections_per_user: usize,
    /// How long a peer has to send `hello`, and to finish a frame it began.
    pub handshake_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            connections: 1024,
            connections_per_user: 128,
            handshake_timeout: Duration::from_secs(5),
        }
    }
}

/// The largest frame read before `hello`: a hello is a few dozen bytes.
pub const HELLO_FRAME_LEN: usize = 4096;
/// Descriptors kept back from connections: the backend's sockets and files,
/// the listener, refusals, logs.
pub const DESCRIPTOR_HEADROOM: usize = 256;
/// Requests that read the store for a peer (`list_keys`, `inspect`,
/// `history`) one user (root and the agent's own not counted) has answered
/// at once; the user's others wait their turn. However many connections a
/// user's loop opens, it then costs the store one such request at a time,
/// and the renewals of every other user's runs keep the store's capacity
/// they need.
pub const STORE_READS_PER_USER: usize = 1;

/// Raises the soft descriptor limit to the hard one; returns the soft limit
/// now in force. Where raising is refused (a seccomp filter such as
/// systemd's `~@resources`, which `LimitNOFILE=` makes moot), the limit stays
/// and a warning says so.
pub fn raise_descriptor_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    if soft >= hard {
        return soft;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => hard,
        Err(err) => {
            tracing::warn!(soft, hard, error = %err, "cannot raise the descriptor limit");
            soft
        }
    }
}

/// Counts connections and decides, at accept, whether one more may be served.
pub struct Admission {
    limits: Limits,
    /// Connections of every user together, privileged ones included, may not
    /// use the descriptors the backend needs.
    descriptor_cap: usize,
    privileged: [u32; 2],
    counts: Mutex<Counts>,
    /// Each user's turns at having the store read, while any is taken or awaited.
    store_reads: Mutex<HashMap<u32, Arc<Semaphore>>>,
}

#[derive(Default)]
struct Counts {
    all: usize,
    unprivileged: usize,
    by_uid: HashMap<u32, usize>,
}

/// One admitted connection; dropping it frees its place.
pub struct Ticket {
    admission: Arc<Admission>,
    uid: u32,
    privileged: bool,
}

impl Admission {
    /// Admission under `limits`, with `descriptors` the soft descriptor limit;
    /// root and `agent_uid` are privileged (not counted against the user caps).
    pub fn new(limits: Limits, descriptors: u64, agent_uid: u32) -> Arc<Admission> {
        let descriptors = usize::try_from(descriptors).unwrap_or(usize::MAX);
        let descriptor_cap = descriptors.saturating_sub(DESCRIPTOR_HEADROOM).max(1);
        Arc::new(Admission {
            limits,
            descriptor_cap,
            privileged: [0, agent_uid],
            counts: Mutex::new(Counts::default()),
            store_reads: Mutex::new(HashMap::new()),
        })
    }

    /// The connection limit the descriptors leave, when it is below the
    /// configured one (worth a warning at start).
    pub fn descriptor_bound(&self) -> Option<usize> {
        (self.descriptor_cap < self.limits.connections).then_some(self.descriptor_cap)
    }

    /// A place for a connection of `uid`, or which limit it would break.
    pub fn admit(self: &Arc<Self>, uid: u32) -> Result<Ticket, String> {
        let privileged = self.privileged.contains(&uid);
        let mut counts = self.counts.locked();
        if counts.all >= self.descriptor_cap {
            return Err(format!(
                "{} connections use every descriptor the agent may spend on them (raise LimitNOFILE)",
                counts.all
            ));
        }
        if !privileged {
            let mine = counts.by_uid.get(&uid).copied().unwrap_or(0);
            if mine >= self.limits.connections_per_user {
                return Err(format!(
                    "uid {uid} has {mine} connections open, the most one user may have \
                     (limits.connections_per_user)"
                ));
            }
            if counts.unprivileged >= self.limits.connections {
                return Err(format!(
                    "{} connections are open, the most the agent serves (limits.connections)",
                    counts.unprivileged
                ));
            }
            counts.unprivileged += 1;
            *counts.by_uid.entry(uid).or_default() += 1;
        }
        counts.all += 1;
        Ok(Ticket {
            admission: self.clone(),
            uid,
            privileged,
        })
    }
}

impl Ticket {
    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.admission.limits
    }

    /// Waits for this user's turn to have the store read for it
    /// ([`STORE_READS_PER_USER`]), which lasts until the permit is dropped.
    /// Turns are handed out in the order they were asked for; root and the
    /// agent's user take theirs at once (`None`).
    pub async fn store_read_turn(&self) -> Option<OwnedSemaphorePermit> {
        if self.privileged {
            return None;
        }
        let turns = {
            let mut reads = self.admission.store_reads.locked();
            reads
                .entry(self.uid)
                .or_insert_with(|| Arc::new(Semaphore::new(STORE_READS_PER_USER)))
                .clone()
        };
        // invariant: these semaphores are never closed, so this is always Some.
        turns.acquire_owned().await.ok()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // A user's turns with none taken or awaited are as good as new ones.
        self.admission
            .store_reads
            .locked()
            .retain(|_, turns| Arc::strong_count(turns) > 1);
        let mut counts = self.admission.counts.locked();
        counts.all -= 1;
        if !self.privileged {
            counts.unprivileged -= 1;
            if let Some(n) = counts.by_uid.get_mut(&self.uid) {
                *n -= 1;
                if *n == 0 {
                    counts.by_uid.remove(&self.uid);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(connections: usize, per_user: usize) -> Limits {
        Limits {
            connections,
            connections_per_user: per_user,
            ..Limits::default()
        }
    }

    #[test]
    fn one_user_cannot_take_every_place() {
        let admission = Admission::new(limits(3, 2), 10_000, 999);
        let a = admission.admit(1000).expect("first");
        let _b = admission.admit(1000).expect("second");
        let err = admission.admit(1000).err().expect("third refused");
        assert!(err.contains("connections_per_user"), "{err}");
        let _c = admission.admit(1001).expect("another user");
        let err = admission.admit(1002).err().expect("all taken");
        assert!(err.contains("limits.connections"), "{err}");
        // Root and the agent's user are never refused for the users' caps.
        let _root = admission.admit(0).expect("root");
        let _agent = admission.admit(999).expect("agent user");
        drop(a);
        admission.admit(1000).expect("a place was freed");
    }

    #[tokio::test]
    async fn a_user_s_store_reads_take_turns_and_leave_other_users_alone() {
        let admission = Admission::new(limits(16, 8), 10_000, 999);
        let (a1, a2) = (
            admission.admit(1000).expect("a"),
            admission.admit(1000).expect("a"),
        );
        let b = admission.admit(1001).expect("b");
        let first = a1.store_read_turn().await.expect("a turn");
        let mut second = Box::pin(a2.store_read_turn());
        assert!(
            futures::poll!(second.as_mut()).is_pending(),
            "a user's second read waits for the first"
        );
        let _other = b
            .store_read_turn()
            .await
            .expect("another user is not held up");
        let root = admission.admit(0).expect("root");
        let _held = root.store_read_turn().await;
        assert!(
            futures::poll!(Box::pin(root.store_read_turn())).is_ready(),
            "root takes its turns at once"
        );
        drop(first);
        drop(second.await.expect("its turn comes once the first is done"));
        drop((a1, a2));
        assert_eq!(
            admission.store_reads.lock().expect("lock").len(),
            1,
            "only a user with a read in flight keeps its turns"
        );
    }

    #[test]
    fn descriptors_bound_everyone() {
        let admission = Admission::new(limits(1024, 128), DESCRIPTOR_HEADROOM as u64 + 2, 999);
        assert_eq!(admission.descriptor_bound(), Some(2));
        let _a = admission.admit(0).expect("first");
        let _b = admission.admit(0).expect("second");
        let err = admission.admit(0).err().expect("no descriptor left");
        assert!(err.contains("LimitNOFILE"), "{err}");
    }
}
