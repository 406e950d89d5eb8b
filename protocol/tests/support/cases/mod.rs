//! The test vectors: each one's name, meaning and Rust value. Shared by the
//! golden test (`tests/vectors.rs`) and the generator (`examples/gen_vectors.rs`),
//! so the files and the test can never describe two different lists.
//!
//! Names start with `client-` (decode as `Envelope<ClientMessage>`) or `agent-`
//! (decode as `Envelope<AgentMessage>`); the next word is the wire `type`.
//!
//! The vector types and the values they share are here; the client's and
//! the agent's canonical vectors and the hand-written ones have files of
//! their own.

mod agent_vectors;
mod client_vectors;
mod hand_written;

pub use hand_written::decode_only;

use runlock_protocol::codec::encode_body;
use runlock_protocol::{
    AcquireRequest, AgentMessage, ClientMessage, Clock, Envelope, ErrorCode, EventKind, Holder,
    KeyEvent, Lease, OnLost, WireError,
};

/// A message of either direction.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Client → agent.
    Client(Envelope<ClientMessage>),
    /// Agent → client.
    Agent(Envelope<AgentMessage>),
}

impl Message {
    /// The body as the crate encodes it.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Message::Client(m) => encode_body(m),
            Message::Agent(m) => encode_body(m),
        }
        .expect("every vector encodes")
    }

    /// The same value as JSON, for people.
    pub fn json(&self) -> String {
        match self {
            Message::Client(m) => serde_json::to_string(m),
            Message::Agent(m) => serde_json::to_string(m),
        }
        .expect("every vector converts to JSON")
    }
}

/// A vector whose bytes are exactly what the crate's encoder writes: it must
/// decode to `message` and re-encode to the same bytes.
pub struct Vector {
    /// File name without extension.
    pub name: &'static str,
    /// What it means, in words.
    pub meaning: &'static str,
    /// The value.
    pub message: Message,
}

/// A vector written by hand to show what a decoder must accept (other field
/// orders, wider integers, unknown fields and types). It must decode to
/// `message`; re-encoding it gives the canonical form, not these bytes.
pub struct DecodeOnly {
    /// File name without extension.
    pub name: &'static str,
    /// What it means, in words.
    pub meaning: &'static str,
    /// The bytes, as JSON-ish, since no Rust value encodes to them.
    pub json: &'static str,
    /// The body bytes.
    pub bytes: Vec<u8>,
    /// What they decode to.
    pub message: Message,
}

/// The id of `frame-ping.bin`'s ping.
pub const FRAME_PING_ID: u64 = 1;

fn client(id: Option<u64>, body: ClientMessage) -> Message {
    Message::Client(Envelope { id, body })
}

fn agent(id: Option<u64>, body: AgentMessage) -> Message {
    Message::Agent(Envelope { id, body })
}

const AGENT_ID: &str = "5b0e7c1a-3f4d-4e8a-9c2b-7d1e6f0a4b3c";
const COMMAND: &str = "meltano run tap-x target-y";

fn holder(pid: u32, token: u64) -> Holder {
    Holder {
        slot: None,
        slots: None,
        host: "runner-01".into(),
        agent_id: AGENT_ID.into(),
        pid,
        uid: 1000,
        gid: 1000,
        user: "etl".into(),
        command: COMMAND.into(),
        acquired_at_ms: 1_700_000_000_000,
        token,
    }
}

/// An acquire of the one key `key` with every field at its default: one
/// slot, the agent's TTL, no waiting, no force, no command, `term` on loss.
fn plain_acquire(key: &str) -> ClientMessage {
    ClientMessage::Acquire(AcquireRequest {
        slots: 1,
        keys: vec![key.into()],
        ttl_ms: None,
        wait_ms: 0,
        force: false,
        command: String::new(),
        on_lost: OnLost::Term,
    })
}

/// An error about the one key `key`, naming at most one holder (not a slot
/// key's holders).
fn key_error(code: ErrorCode, message: &str, key: &str, holder: Option<Holder>) -> AgentMessage {
    AgentMessage::Error(WireError {
        code,
        message: message.into(),
        key: Some(key.into()),
        holder: holder.map(Box::new),
        holders: Vec::new(),
    })
}

/// `forcing` of `dev:a`, taken from ann's run of token 12, waiting `wait_ms`.
fn forcing(wait_ms: Option<u64>) -> AgentMessage {
    AgentMessage::Forcing {
        key: "dev:a".into(),
        holder: Some(Holder {
            slot: None,
            slots: None,
            host: "runner-01".into(),
            agent_id: "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0".into(),
            pid: 4242,
            uid: 1000,
            gid: 1000,
            user: "ann".into(),
            command: "meltano run tap target".into(),
            acquired_at_ms: 1_700_000_000_000,
            token: 12,
        }),
        wait_ms,
    }
}

fn event(kind: EventKind, pid: u32, token: u64, user: &str) -> KeyEvent {
    KeyEvent {
        slot: None,
        kind,
        at_ms: 1_700_000_060_000,
        clock: Clock::Store,
        token,
        from_token: None,
        host: "runner-01".into(),
        agent_id: AGENT_ID.into(),
        pid,
        uid: if user == "root" { 0 } else { 1000 },
        user: user.into(),
        reason: String::new(),
    }
}

fn lease(key: &str, lease_id: &str, token: u64) -> Lease {
    Lease {
        slot: None,
        key: key.into(),
        lease_id: lease_id.into(),
        token,
    }
}

/// Every canonical vector, in the order the README lists them: the client's,
/// then the agent's.
pub fn canonical() -> Vec<Vector> {
    let mut all = client_vectors::vectors();
    all.extend(agent_vectors::vectors());
    all
}
