//! Every message: what clients send ([`ClientMessage`]) and what the agent
//! sends ([`AgentMessage`]: replies and events), inside an [`Envelope`].

use crate::error::WireError;
use crate::types::{
    Holder, KeyEvent, KeyListing, KeyRecord, Lease, LeaseInfo, LostReason, OnLost, OnUnavailable,
    Scope,
};
use serde::{Deserialize, Serialize};

/// A message body with its request id. Replies echo the id of the request
/// they answer; events carry none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope<T> {
    /// The client-chosen request id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    /// The message.
    #[serde(flatten)]
    pub body: T,
}

impl<T> Envelope<T> {
    /// A message with an id.
    pub fn request(id: u64, body: T) -> Envelope<T> {
        Envelope { id: Some(id), body }
    }

    /// A message without an id (events, and errors about undecodable input).
    pub fn event(body: T) -> Envelope<T> {
        Envelope { id: None, body }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// What a client sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientMessage {
    /// Opens the connection; must be the first message.
    Hello {
        /// The protocol version the client speaks.
        version: u16,
        /// The client's name and version, for logs.
        client: String,
        /// The client's pid, for logs (the agent trusts SO_PEERCRED instead).
        pid: u32,
        /// The client receives lock descriptors with `acquired` (SCM_RIGHTS)
        /// and hands them to the processes it protects, so that a kernel
        /// lock lives as long as they do, agent or no agent.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        takes_locks: bool,
    },
    /// Takes every key in `keys`, all or nothing, in sorted order.
    Acquire(AcquireRequest),
    /// Releases leases this connection holds, or breaks whoever holds a key.
    Release(ReleaseRequest),
    /// Names the run's process, so the agent can stop it when a lease is lost
    /// after the client itself is gone. Applies to every lease of the connection.
    Attach {
        /// The run's pid.
        pid: u32,
        /// The run's process group.
        pgid: u32,
    },
    /// Adopts leases taken through an agent that has since stopped, after the
    /// backend confirms they are still held with these ids and tokens. Answered
    /// with `acquired`, like `acquire`.
    Reattach {
        /// The leases, as `acquired` gave them.
        leases: Vec<Lease>,
        /// What the agent does to an attached run whose client is gone when a lease is lost.
        #[serde(default)]
        on_lost: OnLost,
    },
    /// Lists the leases held through this agent.
    List,
    /// Reads a key's record from the backend.
    Inspect {
        /// The key.
        key: String,
    },
    /// Reads the latest events of a key's history from the backend.
    History {
        /// The key.
        key: String,
        /// At most this many of the latest events; all the record keeps when absent or 0.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
    },
    /// Lists the keys recorded in the backend, from every host, a page at a
    /// time: held ones, and with `free` the others too.
    ListKeys(ListKeysRequest),
    /// Asks for a `pong`.
    Ping,
    /// A `type` this build does not know: answered with `unsupported`.
    #[serde(other)]
    Unknown,
}

/// `acquire`: every key in `keys`, all or nothing, in sorted order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AcquireRequest {
    /// The keys to take.
    pub keys: Vec<String>,
    /// Time to live of the leases; the agent's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// How long to wait for held keys; 0 answers `held` at once.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub wait_ms: u64,
    /// Take the keys over from their holders.
    #[serde(default, skip_serializing_if = "is_false")]
    pub force: bool,
    /// The command line the leases protect, for the holder record.
    #[serde(default)]
    pub command: String,
    /// What the agent does to an attached run whose client is gone when a lease is lost.
    #[serde(default)]
    pub on_lost: OnLost,
    /// How many holders each key admits at once (1: a plain key).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub slots: u32,
}

impl AcquireRequest {
    /// Takes `keys` at once or not at all, with the agent's default TTL:
    /// no waiting, no force, plain keys. Set the other fields to change that.
    pub fn new(keys: impl IntoIterator<Item = impl Into<String>>) -> AcquireRequest {
        AcquireRequest {
            keys: keys.into_iter().map(Into::into).collect(),
            ttl_ms: None,
            wait_ms: 0,
            force: false,
            command: String::new(),
            on_lost: OnLost::default(),
            slots: 1,
        }
    }
}

/// `release`: leases of this connection (`lease_ids`), or a break of whoever
/// holds `key` (subject to force rights); one or the other.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReleaseRequest {
    /// Leases of this connection to release.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lease_ids: Vec<String>,
    /// A key to break, whoever holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// With `key`: the slot to break, for a key with slots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
}

impl ReleaseRequest {
    /// Releases the leases `lease_ids` of this connection.
    pub fn leases(lease_ids: impl IntoIterator<Item = impl Into<String>>) -> ReleaseRequest {
        ReleaseRequest {
            lease_ids: lease_ids.into_iter().map(Into::into).collect(),
            ..ReleaseRequest::default()
        }
    }

    /// Breaks whoever holds `key`: its holder, or with `slot` that slot's.
    pub fn break_key(key: impl Into<String>, slot: Option<u32>) -> ReleaseRequest {
        ReleaseRequest {
            key: Some(key.into()),
            slot,
            ..ReleaseRequest::default()
        }
    }
}

/// `list_keys`: one page of the keys recorded in the backend.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ListKeysRequest {
    /// Only keys that start with this.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefix: String,
    /// Where the previous `keys` reply said to go on; absent: from the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// List free keys too (released, expired, never held since).
    #[serde(default, skip_serializing_if = "is_false")]
    pub free: bool,
    /// Include each key's events at or after this time (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events_since_ms: Option<u64>,
}

/// What the agent sends: replies (with the request's id) and events (without).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentMessage {
    /// Answers `hello`.
    Welcome {
        /// The protocol version the agent speaks.
        version: u16,
        /// The agent's name and version.
        agent: String,
        /// The agent's id, also recorded in every holder it writes.
        agent_id: String,
        /// The backend, as a URI with any secret removed.
        backend: String,
        /// The backend's scope.
        scope: Scope,
        /// The time to live used when `acquire` gives none.
        default_ttl_ms: u64,
        /// What runs do when the backend (or the agent) cannot be reached.
        #[serde(default)]
        on_unavailable: OnUnavailable,
        /// Whether leases outlive this agent process, so a client that loses
        /// the agent may keep its run going until the lease's deadline and
        /// `reattach` to the next agent.
        #[serde(default, skip_serializing_if = "is_false")]
        leases_survive_agent: bool,
    },
    /// Answers `acquire`: every key was taken.
    Acquired {
        /// One lease per key, in sorted key order.
        leases: Vec<Lease>,
        /// The leases' time to live.
        ttl_ms: u64,
        /// How long the leases stay guaranteed without another renewal: by then
        /// a client that lost its agent must have stopped its run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        valid_for_ms: Option<u64>,
        /// How many lock descriptors came with this frame, one per lease in
        /// order: the kernel locks themselves, for the run to hold.
        #[serde(default, skip_serializing_if = "is_zero_u32")]
        locks: u32,
    },
    /// Answers `release`.
    Released {
        /// How many leases ended.
        count: u32,
    },
    /// Answers `attach`.
    Attached,
    /// Answers `list`.
    Leases {
        /// The leases held through this agent, as many as fit one frame.
        leases: Vec<LeaseInfo>,
        /// How many more are held and were left out to fit.
        #[serde(default, skip_serializing_if = "is_zero_u32")]
        omitted: u32,
    },
    /// Answers `list_keys`: one page of keys, in the store's order.
    Keys {
        /// The keys of this page.
        keys: Vec<KeyListing>,
        /// Where the next page starts, for the next `list_keys`; absent on the last page.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cursor: Option<String>,
    },
    /// Answers `inspect`.
    Record(KeyRecord),
    /// Answers `history`.
    Events {
        /// The key.
        key: String,
        /// Its latest events, oldest first.
        events: Vec<KeyEvent>,
    },
    /// Answers `ping`.
    Pong,
    /// Answers any request that failed, or input that could not be read.
    Error(WireError),
    /// Event: a lease of this connection is no longer held.
    Lost {
        /// The lost lease.
        lease_id: String,
        /// Its key.
        key: String,
        /// Why.
        reason: LostReason,
        /// For people.
        message: String,
        /// The new holder, when someone took the key.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        holder: Option<Holder>,
    },
    /// Event: a forced `acquire` (or a break) has taken `key` and waits,
    /// before it answers, for the run it took the key from to stop (its
    /// agent says so through the store) or for that run's deadline to pass.
    Forcing {
        /// The key (a key with slots: its name, the slot is the holder's).
        key: String,
        /// The run's holder, as this peer may see it, where known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        holder: Option<Holder>,
        /// How long at most it waits, in milliseconds; absent where the run
        /// holds a kernel lock of its own (`file://`), which has no
        /// deadline: the wait lasts until that run has stopped.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ms: Option<u64>,
    },
    /// Event: a lease was renewed; sent only when leases survive the agent.
    Renewed {
        /// The renewed lease.
        lease_id: String,
        /// How long it stays guaranteed without another renewal.
        valid_for_ms: u64,
    },
    /// Event: the agent is stopping. Where leases survive the agent they are
    /// not released and the client should `reattach` to the next agent;
    /// elsewhere every lease of the connection is about to be released.
    Restarting,
    /// A `type` this build does not know.
    #[serde(other)]
    Unknown,
}
