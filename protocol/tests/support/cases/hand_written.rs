//! The hand-written vectors: bytes no Rust value encodes to (other field
//! orders, wider integers, unknown fields and types) that a decoder must accept.

use super::{agent, client, plain_acquire, DecodeOnly};
use runlock_protocol::{AgentMessage, ClientMessage, ErrorCode, WireError};

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
                plain_acquire("dev:a"),
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
