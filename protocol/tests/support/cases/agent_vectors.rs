//! The canonical vectors of agent → client messages: answers and events.

use super::{agent, event, forcing, holder, key_error, lease, Vector, AGENT_ID};
use runlock_protocol::{
    AgentMessage, Clock, ErrorCode, EventKind, Holder, KeyEvent, KeyListing, KeyRecord, KeyState,
    Lease, LeaseInfo, LostReason, OnUnavailable, Refusal, Scope, Waiter, WireError,
};

/// `dev:a` held with token 12 by the fixture holder, expiring in 21.5 s
/// unless renewed, global scope: the record several vectors show.
fn dev_a_held() -> KeyRecord {
    KeyRecord {
        slots: None,
        holders: Vec::new(),
        key: "dev:a".into(),
        state: KeyState::Held,
        token: 12,
        holder: Some(holder(4242, 12)),
        expires_in_ms: Some(21_500),
        scope: Scope::Global,
        incident: None,
    }
}

/// The agent's canonical vectors, in the order the README lists them.
pub(super) fn vectors() -> Vec<Vector> {
    vec![
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
                AgentMessage::Record(dev_a_held()),
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
                            record: Some(dev_a_held()),
                            unreadable: None,
                            events: vec![event(EventKind::Granted, 4242, 12, "etl")],
                            events_omitted: 0,
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
                            events_omitted: 0,
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
            name: "agent-keys-events-omitted",
            meaning: "Answers request 12, the last page: `dev:a`'s events since the time asked \
                      would not fit one frame, so only the newest is sent and `events_omitted` \
                      says how many older ones were left out (2047).",
            message: agent(
                Some(12),
                AgentMessage::Keys {
                    keys: vec![KeyListing {
                        key: "dev:a".into(),
                        record: Some(dev_a_held()),
                        unreadable: None,
                        events: vec![event(EventKind::Granted, 4242, 12, "etl")],
                        events_omitted: 2047,
                        waiting_here: 0,
                        waiters: Vec::new(),
                        refused: Vec::new(),
                    }],
                    cursor: None,
                },
            ),
        },
        Vector {
            name: "agent-record-held-file",
            meaning: "Answers request 7 on a `file://` backend: held, but kernel locks do not expire, \
                      so expires_in_ms is absent; host scope.",
            message: agent(
                Some(7),
                AgentMessage::Record(KeyRecord {
                    expires_in_ms: None,
                    scope: Scope::Host,
                    ..dev_a_held()
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
                key_error(
                    ErrorCode::Held,
                    "key dev:tap-x-to-target-y is held by etl (pid 4242) on runner-01",
                    "dev:tap-x-to-target-y",
                    Some(holder(4242, 41)),
                ),
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
                key_error(
                    ErrorCode::Timeout,
                    "key dev:a still held after waiting 60s",
                    "dev:a",
                    Some(holder(4242, 12)),
                ),
            ),
        },
        Vector {
            name: "agent-error-invalid-key",
            meaning: "Answers request 9: the key broke a key rule; the message names the rule, `key` is the offending key.",
            message: agent(
                Some(9),
                key_error(
                    ErrorCode::InvalidKey,
                    "invalid key: a key must not contain control characters (found U+000A at byte 3)",
                    "dev\nx",
                    None,
                ),
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
