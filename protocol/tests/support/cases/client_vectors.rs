//! The canonical vectors of client → agent messages.

use super::{client, lease, plain_acquire, Vector, COMMAND};
use runlock_protocol::{AcquireRequest, ClientMessage, ListKeysRequest, OnLost, ReleaseRequest};

/// The client's canonical vectors, in the order the README lists them.
pub(super) fn vectors() -> Vec<Vector> {
    vec![
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
                plain_acquire("dev:tap-x-to-target-y"),
            ),
        },
        Vector {
            name: "client-acquire-full",
            meaning: "Request 2: take keys `dev:b` and `dev:a` (the agent takes them in sorted order, all or nothing), \
                      TTL 30 s, wait up to 60 s, take over from any holder (force), describe the command, \
                      SIGKILL the run if a lease is lost while the client is gone.",
            message: client(
                Some(2),
                ClientMessage::Acquire(AcquireRequest { slots: 1,
                    keys: vec!["dev:b".into(), "dev:a".into()],
                    ttl_ms: Some(30_000),
                    wait_ms: 60_000,
                    force: true,
                    command: COMMAND.into(),
                    on_lost: OnLost::Kill,
                }),
            ),
        },
        Vector {
            name: "client-acquire-slots",
            meaning: "Request 11: take one of the 3 slots of `warehouse` (at most 3 holders at once across \
                      every agent sharing the backend), waiting up to 60 s for one to be free.",
            message: client(
                Some(11),
                ClientMessage::Acquire(AcquireRequest {
                    keys: vec!["warehouse".into()],
                    ttl_ms: None,
                    wait_ms: 60_000,
                    force: false,
                    command: COMMAND.into(),
                    on_lost: OnLost::Term,
                    slots: 3,
                }),
            ),
        },
        Vector {
            name: "client-release-key-slot",
            meaning: "Request 12: break whoever holds slot 2 of `warehouse` (needs force rights).",
            message: client(
                Some(12),
                ClientMessage::Release(ReleaseRequest { lease_ids: Vec::new(), key: Some("warehouse".into()), slot: Some(2) }),
            ),
        },
        Vector {
            name: "client-release-lease-ids",
            meaning: "Request 3: release two leases this connection holds.",
            message: client(
                Some(3),
                ClientMessage::Release(ReleaseRequest { slot: None,
                    lease_ids: vec!["lease-0001".into(), "lease-0002".into()],
                    key: None,
                }),
            ),
        },
        Vector {
            name: "client-release-key",
            meaning: "Request 4: break whoever holds `dev:a` (needs force rights).",
            message: client(
                Some(4),
                ClientMessage::Release(ReleaseRequest { slot: None, lease_ids: Vec::new(), key: Some("dev:a".into()) }),
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
                ClientMessage::ListKeys(ListKeysRequest {
                    prefix: "dev:".into(),
                    cursor: Some(r#"{"page":"token-2"}"#.into()),
                    free: true,
                    events_since_ms: Some(1_700_000_000_000),
                }),
            ),
        },
        Vector {
            name: "client-ping",
            meaning: "Request 8: ask for a pong.",
            message: client(Some(8), ClientMessage::Ping),
        },
    ]
}
