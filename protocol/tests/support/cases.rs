//! The test vectors: each one's name, meaning and Rust value. Shared by the
//! golden test (`tests/vectors.rs`) and the generator (`examples/gen_vectors.rs`),
//! so the files and the test can never describe two different lists.
//!
//! Names start with `client-` (decode as `Envelope<ClientMessage>`) or `agent-`
//! (decode as `Envelope<AgentMessage>`); the next word is the wire `type`.

use runlock_protocol::codec::encode_body;
use runlock_protocol::{
    AgentMessage, ClientMessage, Clock, Envelope, ErrorCode, EventKind, Holder, KeyEvent,
    KeyListing, KeyRecord, KeyState, Lease, LeaseInfo, LostReason, OnLost, OnUnavailable, Refusal,
    Scope, Waiter, WireError,
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

/// Every canonical vector, in the order the README lists them.
pub fn canonical() -> Vec<Vector> {
    vec![
        // client → agent
        Vector {
            name: "client-hello",
            meaning: "Opens the connection: the client speaks protocol version 1, names itself and gives its pid.",
            message: client(
                None,
                ClientMessage::Hello { version: 1, client: "runlock 0.1.0".into(), pid: 4242, takes_locks: false },
            ),
        },
        Vector {
            name: "client-hello-takes-locks",
            meaning: "As `client-hello`, from a client that receives lock descriptors with `acquired` \
                      and hands them to the processes it protects (`takes_locks`, 5.4).",
            message: client(
                None,
                ClientMessage::Hello { version: 1, client: "runlock 0.1.0".into(), pid: 4242, takes_locks: true },
            ),
        },
        Vector {
            name: "client-acquire-minimal",
            meaning: "Request 1: take key `dev:tap-x-to-target-y` with the agent's default TTL, no waiting, no force. \
                      The encoder always writes `command` and `on_lost`, here at their defaults (empty, `term`).",
            message: client(
                Some(1),
                ClientMessage::Acquire { slots: 1,
                    keys: vec!["dev:tap-x-to-target-y".into()],
                    ttl_ms: None,
                    wait_ms: 0,
                    force: false,
                    command: String::new(),
                    on_lost: OnLost::Term,
                },
            ),
        },
        Vector {
            name: "client-acquire-full",
            meaning: "Request 2: take keys `dev:b` and `dev:a` (the agent takes them in sorted order, all or nothing), \
                      TTL 30 s, wait up to 60 s, take over from any holder (force), describe the command, \
                      SIGKILL the run if a lease is lost while the client is gone.",
            message: client(
                Some(2),
                ClientMessage::Acquire { slots: 1,
                    keys: vec!["dev:b".into(), "dev:a".into()],
                    ttl_ms: Some(30_000),
                    wait_ms: 60_000,
                    force: true,
                    command: COMMAND.into(),
                    on_lost: OnLost::Kill,
                },
            ),
        },
        Vector {
            name: "client-acquire-slots",
            meaning: "Request 11: take one of the 3 slots of `warehouse` (at most 3 holders at once across \
                      every agent sharing the backend), waiting up to 60 s for one to be free.",
            message: client(
                Some(11),
                ClientMessage::Acquire {
                    keys: vec!["warehouse".into()],
                    ttl_ms: None,
                    wait_ms: 60_000,
                    force: false,
                    command: COMMAND.into(),
                    on_lost: OnLost::Term,
                    slots: 3,
                },
            ),
        },
        Vector {
            name: "client-release-key-slot",
            meaning: "Request 12: break whoever holds slot 2 of `warehouse` (needs force rights).",
            message: client(
                Some(12),
                ClientMessage::Release { lease_ids: Vec::new(), key: Some("warehouse".into()), slot: Some(2) },
            ),
        },
        Vector {
            name: "client-release-lease-ids",
            meaning: "Request 3: release two leases this connection holds.",
            message: client(
                Some(3),
                ClientMessage::Release { slot: None,
                    lease_ids: vec!["lease-0001".into(), "lease-0002".into()],
                    key: None,
                },
            ),
        },
        Vector {
            name: "client-release-key",
            meaning: "Request 4: break whoever holds `dev:a` (needs force rights).",
            message: client(
                Some(4),
                ClientMessage::Release { slot: None, lease_ids: Vec::new(), key: Some("dev:a".into()) },
            ),
        },
        Vector {
            name: "client-attach",
            meaning: "Request 5: the run is pid 4300 in process group 4300; applies to every lease of the connection.",
            message: client(Some(5), ClientMessage::Attach { pid: 4300, pgid: 4300 }),
        },
        Vector {
            name: "client-reattach",
            meaning: "Request 9, to a new agent after the old one stopped: adopt lease `lease-0001` on `dev:a` \
                      with token 12, and SIGTERM the run if it is lost while the client is gone. \
                      Answered with `acquired`.",
            message: client(
                Some(9),
                ClientMessage::Reattach {
                    leases: vec![lease("dev:a", "lease-0001", 12)],
                    on_lost: OnLost::Term,
                },
            ),
        },
        Vector {
            name: "client-list",
            meaning: "Request 6: list every lease held through this agent.",
            message: client(Some(6), ClientMessage::List),
        },
        Vector {
            name: "client-inspect",
            meaning: "Request 7: read the backend's record of key `dev:a`.",
            message: client(Some(7), ClientMessage::Inspect { key: "dev:a".into() }),
        },
        Vector {
            name: "client-history",
            meaning: "Request 10: read the latest 3 events of `dev:a`'s history.",
            message: client(Some(10), ClientMessage::History { key: "dev:a".into(), limit: Some(3) }),
        },
        Vector {
            name: "client-list_keys",
            meaning: "Request 11: list the store's keys that start with `dev:`, free ones too, each \
                      with its events since 2023-11-14T22:13:20Z (ms 1700000000000), going on from the cursor a \
                      `keys` reply gave.",
            message: client(
                Some(11),
                ClientMessage::ListKeys {
                    prefix: "dev:".into(),
                    cursor: Some(r#"{"page":"token-2"}"#.into()),
                    free: true,
                    events_since_ms: Some(1_700_000_000_000),
                },
            ),
        },
        Vector {
            name: "client-ping",
            meaning: "Request 8: ask for a pong.",
            message: client(Some(8), ClientMessage::Ping),
        },
        // agent → client
        Vector {
            name: "agent-welcome",
            meaning: "Answers hello: the agent speaks version 1, its id, its backend (secrets removed), \
                      global scope, default TTL 60 s; runs fail when the backend cannot be reached; \
                      leases outlive the agent, so a client that loses it may reattach. Welcome carries no id.",
            message: agent(
                None,
                AgentMessage::Welcome {
                    version: 1,
                    agent: "runlockd 0.1.0".into(),
                    agent_id: AGENT_ID.into(),
                    backend: "s3://bucket/runlock/".into(),
                    scope: Scope::Global,
                    default_ttl_ms: 60_000,
                    on_unavailable: OnUnavailable::Fail,
                    leases_survive_agent: true,
                },
            ),
        },
        Vector {
            name: "agent-acquired",
            meaning: "Answers request 2: both keys taken, one lease per key in sorted key order, \
                      each with its fencing token; TTL 30 s; guaranteed for 25 s without another renewal.",
            message: agent(
                Some(2),
                AgentMessage::Acquired {
                    leases: vec![lease("dev:a", "lease-0001", 12), lease("dev:b", "lease-0002", 3)],
                    ttl_ms: 30_000,
                    valid_for_ms: Some(25_000),
                    locks: 0,
                },
            ),
        },
        Vector {
            name: "agent-acquired-slot",
            meaning: "Answers request 11: slot 1 of `warehouse` taken, with slot 1's own fencing token.",
            message: agent(
                Some(11),
                AgentMessage::Acquired {
                    leases: vec![Lease { slot: Some(1), ..lease("warehouse", "lease-0007", 5) }],
                    ttl_ms: 30_000,
                    valid_for_ms: Some(25_000),
                    locks: 0,
                },
            ),
        },
        Vector {
            name: "agent-acquired-locks",
            meaning: "Answers request 2 on `file://` to a client that takes locks: one lease, with no \
                      `valid_for_ms` (a kernel lock cannot expire while held), and one descriptor \
                      passed with the frame (`locks`, SCM_RIGHTS) holding its lock.",
            message: agent(
                Some(2),
                AgentMessage::Acquired {
                    leases: vec![lease("dev:a", "lease-0001", 12)],
                    ttl_ms: 30_000,
                    valid_for_ms: None,
                    locks: 1,
                },
            ),
        },
        Vector {
            name: "agent-released",
            meaning: "Answers request 3: two leases ended.",
            message: agent(Some(3), AgentMessage::Released { count: 2 }),
        },
        Vector {
            name: "agent-attached",
            meaning: "Answers request 5.",
            message: agent(Some(5), AgentMessage::Attached),
        },
        Vector {
            name: "agent-leases",
            meaning: "Answers request 6: two leases; the first one's run is attached (child_pid), \
                      the second's is not (child_pid absent).",
            message: agent(
                Some(6),
                AgentMessage::Leases {
                    leases: vec![
                        LeaseInfo {
                            key: "dev:a".into(),
                            lease_id: "lease-0001".into(),
                            ttl_ms: 30_000,
                            holder: holder(4242, 12),
                            child_pid: Some(4300),
                        },
                        LeaseInfo {
                            key: "prod:tap-z-to-target-w".into(),
                            lease_id: "lease-0003".into(),
                            ttl_ms: 60_000,
                            holder: Holder { pid: 5150, uid: 0, user: "root".into(), ..holder(5150, 99) },
                            child_pid: None,
                        },
                    ],
                    omitted: 0,
                },
            ),
        },
        Vector {
            name: "agent-leases-omitted",
            meaning: "Answers request 6 on an agent holding more leases than one frame lists: \
                      the one that fit, and `omitted`: 2499 more were left out. Another user's \
                      command shows only its program name.",
            message: agent(
                Some(6),
                AgentMessage::Leases {
                    leases: vec![LeaseInfo {
                        key: "dev:a".into(),
                        lease_id: "lease-0001".into(),
                        ttl_ms: 30_000,
                        holder: Holder {
                            command: "meltano [arguments hidden]".into(),
                            ..holder(4242, 12)
                        },
                        child_pid: Some(4300),
                    }],
                    omitted: 2499,
                },
            ),
        },
        Vector {
            name: "agent-record-free",
            meaning: "Answers request 7: `dev:a` is free; the last token issued was 12; global scope. \
                      No holder and no expires_in_ms.",
            message: agent(
                Some(7),
                AgentMessage::Record(KeyRecord { slots: None, holders: Vec::new(),
                    key: "dev:a".into(),
                    state: KeyState::Free,
                    token: 12,
                    holder: None,
                    expires_in_ms: None,
                    scope: Scope::Global,
                    incident: None,
                }),
            ),
        },
        Vector {
            name: "agent-record-held",
            meaning: "Answers request 7: `dev:a` is held with token 12 by the holder shown; \
                      the lease expires in 21.5 s unless renewed; global scope.",
            message: agent(
                Some(7),
                AgentMessage::Record(KeyRecord { slots: None, holders: Vec::new(),
                    key: "dev:a".into(),
                    state: KeyState::Held,
                    token: 12,
                    holder: Some(holder(4242, 12)),
                    expires_in_ms: Some(21_500),
                    scope: Scope::Global,
                    incident: None,
                }),
            ),
        },
        Vector {
            name: "agent-keys",
            meaning: "Answers request 11: one page of keys. `dev:a` is held with token 12 (its \
                      grant among its events), a run waits for it through this agent, and \
                      this agent refused etl's run 4300 at once 10 s after the grant; \
                      `dev:b`'s record could not be read. `cursor` is where the next page starts.",
            message: agent(
                Some(11),
                AgentMessage::Keys {
                    keys: vec![
                        KeyListing {
                            key: "dev:a".into(),
                            record: Some(KeyRecord { slots: None, holders: Vec::new(),
                                key: "dev:a".into(),
                                state: KeyState::Held,
                                token: 12,
                                holder: Some(holder(4242, 12)),
                                expires_in_ms: Some(21_500),
                                scope: Scope::Global,
                                incident: None,
                            }),
                            unreadable: None,
                            events: vec![event(EventKind::Granted, 4242, 12, "etl")],
                            waiting_here: 1,
                            waiters: vec![Waiter {
                                host: "runner-02".into(),
                                uid: 1000,
                                user: "etl".into(),
                                pid: 4310,
                                since_ms: 1_700_000_065_000,
                            }],
                            refused: vec![Refusal {
                                at_ms: 1_700_000_070_000,
                                host: "runner-01".into(),
                                uid: 1000,
                                user: "etl".into(),
                                pid: 4300,
                                waited_ms: 0,
                            }],
                        },
                        KeyListing {
                            key: "dev%3Ab.json".into(),
                            record: None,
                            unreadable: Some("dev%3Ab.json is not a runlock record".into()),
                            events: Vec::new(),
                            waiting_here: 0,
                            waiters: Vec::new(),
                            refused: Vec::new(),
                        },
                    ],
                    cursor: Some(r#"{"page":"token-3"}"#.into()),
                },
            ),
        },
        Vector {
            name: "agent-record-held-file",
            meaning: "Answers request 7 on a `file://` backend: held, but kernel locks do not expire, \
                      so expires_in_ms is absent; host scope.",
            message: agent(
                Some(7),
                AgentMessage::Record(KeyRecord { slots: None, holders: Vec::new(),
                    key: "dev:a".into(),
                    state: KeyState::Held,
                    token: 12,
                    holder: Some(holder(4242, 12)),
                    expires_in_ms: None,
                    scope: Scope::Host,
                    incident: None,
                }),
            ),
        },
        Vector {
            name: "agent-record-held-incident",
            meaning: "Answers request 7: `dev:a` is held with token 13 by root, who took it over with \
                      `force` from token 12; `incident` is that force, the key's last force, break, \
                      expiry or loss, timed by the store's clock.",
            message: agent(
                Some(7),
                AgentMessage::Record(KeyRecord { slots: None, holders: Vec::new(),
                    key: "dev:a".into(),
                    state: KeyState::Held,
                    token: 13,
                    holder: Some(Holder { pid: 5150, uid: 0, user: "root".into(), ..holder(5150, 13) }),
                    expires_in_ms: Some(29_000),
                    scope: Scope::Global,
                    incident: Some(Box::new(KeyEvent {
                        from_token: Some(12),
                        ..event(EventKind::Forced, 5150, 13, "root")
                    })),
                }),
            ),
        },
        Vector {
            name: "agent-record-slots",
            meaning: "Answers request 7 for a key with 3 slots: slots 0 and 2 are held; `holders` lists \
                      them with their slots and tokens; `state`, `token`, `holder` and `expires_in_ms` \
                      are the lowest held slot's, as a client that knows nothing of slots reads a key.",
            message: agent(
                Some(7),
                AgentMessage::Record(KeyRecord {
                    key: "warehouse".into(),
                    state: KeyState::Held,
                    token: 9,
                    holder: Some(Holder { slot: Some(0), slots: Some(3), ..holder(4242, 9) }),
                    expires_in_ms: Some(29_000),
                    scope: Scope::Global,
                    incident: None,
                    slots: Some(3),
                    holders: vec![
                        Holder { slot: Some(0), slots: Some(3), ..holder(4242, 9) },
                        Holder { slot: Some(2), slots: Some(3), ..holder(4250, 4) },
                    ],
                }),
            ),
        },
        Vector {
            name: "agent-events",
            meaning: "Answers request 10: the latest three events of `dev:a`, oldest first: etl was \
                      granted token 12, root forced it (token 13 over 12), root released it. The \
                      first was timed by the writing agent's clock, the others by the store's.",
            message: agent(
                Some(10),
                AgentMessage::Events {
                    key: "dev:a".into(),
                    events: vec![
                        KeyEvent {
                            at_ms: 1_700_000_000_000,
                            clock: Clock::Agent,
                            ..event(EventKind::Granted, 4242, 12, "etl")
                        },
                        KeyEvent {
                            from_token: Some(12),
                            ..event(EventKind::Forced, 5150, 13, "root")
                        },
                        KeyEvent {
                            at_ms: 1_700_000_090_000,
                            reason: "its run ended".into(),
                            ..event(EventKind::Released, 5150, 13, "root")
                        },
                    ],
                },
            ),
        },
        Vector {
            name: "agent-pong",
            meaning: "Answers request 8.",
            message: agent(Some(8), AgentMessage::Pong),
        },
        Vector {
            name: "agent-error-held",
            meaning: "Answers request 1: `dev:tap-x-to-target-y` is held (wait_ms was 0); holder says by whom.",
            message: agent(
                Some(1),
                AgentMessage::Error(WireError { holders: Vec::new(),
                    code: ErrorCode::Held,
                    message: "key dev:tap-x-to-target-y is held by etl (pid 4242) on runner-01".into(),
                    key: Some("dev:tap-x-to-target-y".into()),
                    holder: Some(Box::new(holder(4242, 41))),
                }),
            ),
        },
        Vector {
            name: "agent-error-held-slots",
            meaning: "Answers request 11 (wait_ms 0): every slot of `warehouse` is held; `holders` names \
                      each slot's holder, `holder` the first of them.",
            message: agent(
                Some(11),
                AgentMessage::Error(WireError {
                    code: ErrorCode::Held,
                    message: "key \"warehouse\" has all 2 slots held".into(),
                    key: Some("warehouse".into()),
                    holder: Some(Box::new(Holder { slot: Some(0), slots: Some(2), ..holder(4242, 9) })),
                    holders: vec![
                        Holder { slot: Some(0), slots: Some(2), ..holder(4242, 9) },
                        Holder { slot: Some(1), slots: Some(2), ..holder(4250, 5) },
                    ],
                }),
            ),
        },
        Vector {
            name: "agent-error-slots-mismatch",
            meaning: "Answers request 11: `warehouse` is held by a run that took it with 5 slots, and \
                      this acquire asked 3; nothing was taken.",
            message: agent(
                Some(11),
                AgentMessage::Error(WireError {
                    code: ErrorCode::SlotsMismatch,
                    message: "key \"warehouse\" is held with 5 slots, and this acquire asks 3 slots: \
                              a key's slots are one count for every holder; held by etl@runner-01 \
                              (pid 4242, 5 slots, slot 0)".into(),
                    key: Some("warehouse".into()),
                    holder: Some(Box::new(Holder { slot: Some(0), slots: Some(5), ..holder(4242, 9) })),
                    holders: vec![Holder { slot: Some(0), slots: Some(5), ..holder(4242, 9) }],
                }),
            ),
        },
        Vector {
            name: "agent-error-timeout",
            meaning: "Answers request 2: `dev:a` stayed held for the whole wait; holder says by whom.",
            message: agent(
                Some(2),
                AgentMessage::Error(WireError { holders: Vec::new(),
                    code: ErrorCode::Timeout,
                    message: "key dev:a still held after waiting 60s".into(),
                    key: Some("dev:a".into()),
                    holder: Some(Box::new(holder(4242, 12))),
                }),
            ),
        },
        Vector {
            name: "agent-error-invalid-key",
            meaning: "Answers request 9: the key broke a key rule; the message names the rule, `key` is the offending key.",
            message: agent(
                Some(9),
                AgentMessage::Error(WireError { holders: Vec::new(),
                    code: ErrorCode::InvalidKey,
                    message: "invalid key: a key must not contain control characters (found U+000A at byte 3)".into(),
                    key: Some("dev\nx".into()),
                    holder: None,
                }),
            ),
        },
        Vector {
            name: "agent-error-bad-request-no-id",
            meaning: "A body that could not be decoded and had no readable id: bad_request without id.",
            message: agent(
                None,
                AgentMessage::Error(WireError::new(
                    ErrorCode::BadRequest,
                    "cannot decode message: not a MessagePack map",
                )),
            ),
        },
        Vector {
            name: "agent-lost-forced",
            meaning: "Event: lease `lease-0001` on `dev:a` was taken over with force; holder is the new holder, \
                      whose token (13) is larger than the lost lease's (12).",
            message: agent(
                None,
                AgentMessage::Lost {
                    lease_id: "lease-0001".into(),
                    key: "dev:a".into(),
                    reason: LostReason::Forced,
                    message: "dev:a was taken over by root (pid 5150) on runner-02".into(),
                    holder: Some(Holder { slot: None, slots: None,
                        host: "runner-02".into(),
                        agent_id: "9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a".into(),
                        pid: 5150,
                        uid: 0,
                        gid: 0,
                        user: "root".into(),
                        command: "runlock run --force".into(),
                        acquired_at_ms: 1_700_000_060_000,
                        token: 13,
                    }),
                },
            ),
        },
        Vector {
            name: "agent-lost-expired",
            meaning: "Event: lease `lease-0002` on `dev:b` could not be renewed before its deadline; no holder.",
            message: agent(
                None,
                AgentMessage::Lost {
                    lease_id: "lease-0002".into(),
                    key: "dev:b".into(),
                    reason: LostReason::Expired,
                    message: "dev:b could not be renewed before its deadline".into(),
                    holder: None,
                },
            ),
        },
        Vector {
            name: "agent-forcing",
            meaning: "Event: a forced acquire has taken `dev:a` from the run of token 12 and waits, at most \
                      33 s, for that run to stop before it answers `acquired`.",
            message: agent(None, forcing(Some(33_000))),
        },
        Vector {
            name: "agent-forcing-no-deadline",
            meaning: "Event: a forced acquire has taken `dev:a` from the run of token 12, which holds a \
                      kernel lock of its own (`file://`), and waits until that run has stopped, however \
                      long, before it answers `acquired`.",
            message: agent(None, forcing(None)),
        },
        Vector {
            name: "agent-renewed",
            meaning: "Event: lease `lease-0001` was renewed and stays guaranteed for 25 s without another renewal.",
            message: agent(
                None,
                AgentMessage::Renewed { lease_id: "lease-0001".into(), valid_for_ms: 25_000 },
            ),
        },
        Vector {
            name: "agent-restarting",
            meaning: "Event: the agent is stopping. Where leases outlive it they are not released and the \
                      client should reattach to the next agent; elsewhere they are about to be released.",
            message: agent(None, AgentMessage::Restarting),
        },
    ]
}

/// A MessagePack str of up to 31 bytes (fixstr).
fn s(text: &str) -> Vec<u8> {
    assert!(text.len() < 32, "fixstr only");
    let mut out = vec![0xa0 | text.len() as u8];
    out.extend_from_slice(text.as_bytes());
    out
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Every hand-written vector.
pub fn decode_only() -> Vec<DecodeOnly> {
    vec![
        DecodeOnly {
            name: "client-acquire-bare",
            meaning: "Request 5 with only `keys`, fields in another order: every absent optional field takes \
                      its default (ttl_ms: agent's default, wait_ms 0, force false, command empty, on_lost term).",
            json: r#"{"keys":["dev:a"],"type":"acquire","id":5}"#,
            bytes: cat(&[
                &[0x83],
                &s("keys"),
                &[0x91],
                &s("dev:a"),
                &s("type"),
                &s("acquire"),
                &s("id"),
                &[0x05],
            ]),
            message: client(
                Some(5),
                ClientMessage::Acquire { slots: 1,
                    keys: vec!["dev:a".into()],
                    ttl_ms: None,
                    wait_ms: 0,
                    force: false,
                    command: String::new(),
                    on_lost: OnLost::Term,
                },
            ),
        },
        DecodeOnly {
            name: "client-hello-wide-ints",
            meaning: "A hello whose integers use wider formats than needed: version as uint16 (cd), \
                      pid as uint32 (ce), id as int64 (d3). Decoders accept any integer format holding a \
                      non-negative value in range.",
            json: r#"{"type":"hello","version":1,"client":"py","pid":4242,"id":1}"#,
            bytes: cat(&[
                &[0x85],
                &s("type"),
                &s("hello"),
                &s("version"),
                &[0xcd, 0x00, 0x01],
                &s("client"),
                &s("py"),
                &s("pid"),
                &[0xce, 0x00, 0x00, 0x10, 0x92],
                &s("id"),
                &[0xd3, 0, 0, 0, 0, 0, 0, 0, 0x01],
            ]),
            message: client(
                Some(1),
                ClientMessage::Hello { version: 1, client: "py".into(), pid: 4242, takes_locks: false },
            ),
        },
        DecodeOnly {
            name: "client-ping-unknown-fields",
            meaning: "Request 7 (id as uint64, cf) with fields this version does not define; they are ignored.",
            json: r#"{"type":"ping","id":7,"trace":{"span":12},"extra":[null,true]}"#,
            bytes: cat(&[
                &[0x84],
                &s("type"),
                &s("ping"),
                &s("id"),
                &[0xcf, 0, 0, 0, 0, 0, 0, 0, 0x07],
                &s("trace"),
                &[0x81],
                &s("span"),
                &[0x0c],
                &s("extra"),
                &[0x92, 0xc0, 0xc3],
            ]),
            message: client(Some(7), ClientMessage::Ping),
        },
        DecodeOnly {
            name: "client-unknown-type",
            meaning: "Request 3 of a type the agent does not know; it decodes (as Unknown) and the agent \
                      answers error{code: unsupported} with id 3.",
            json: r#"{"id":3,"type":"teleport","to":"mars"}"#,
            bytes: cat(&[
                &[0x83],
                &s("id"),
                &[0x03],
                &s("type"),
                &s("teleport"),
                &s("to"),
                &s("mars"),
            ]),
            message: client(Some(3), ClientMessage::Unknown),
        },
        DecodeOnly {
            name: "agent-pong-unknown-fields",
            meaning: "Answers request 8 with a field a later agent might add; clients ignore it.",
            json: r#"{"id":8,"type":"pong","load":0}"#,
            bytes: cat(&[&[0x83], &s("id"), &[0x08], &s("type"), &s("pong"), &s("load"), &[0x00]]),
            message: agent(Some(8), AgentMessage::Pong),
        },
        DecodeOnly {
            name: "agent-unknown-event",
            meaning: "An event type this client does not know (no id); clients ignore it.",
            json: r#"{"type":"moved","lease_id":"lease-0001"}"#,
            bytes: cat(&[&[0x82], &s("type"), &s("moved"), &s("lease_id"), &s("lease-0001")]),
            message: agent(None, AgentMessage::Unknown),
        },
        DecodeOnly {
            name: "agent-error-unknown-code",
            meaning: "Answers request 4 with an error code this client does not know; it is still a failure.",
            json: r#"{"id":4,"type":"error","code":"quota_exceeded","message":"too many"}"#,
            bytes: cat(&[
                &[0x84],
                &s("id"),
                &[0x04],
                &s("type"),
                &s("error"),
                &s("code"),
                &s("quota_exceeded"),
                &s("message"),
                &s("too many"),
            ]),
            message: agent(
                Some(4),
                AgentMessage::Error(WireError::new(ErrorCode::Unknown, "too many")),
            ),
        },
    ]
}
