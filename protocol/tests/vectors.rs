//! Golden test: every file in `vectors/` decodes to the value it stands for and
//! re-encodes to the same bytes, and every message type has a vector. The list
//! of vectors is `support/cases/`; `examples/gen_vectors.rs` writes the files.

#[path = "support/cases/mod.rs"]
mod cases;

use cases::{canonical, decode_only, Message, FRAME_PING_ID};
use runlock_protocol::codec::decode_body;
use runlock_protocol::types::MAX_KEY_LEN;
use runlock_protocol::{
    AgentCodec, AgentMessage, ClientMessage, Envelope, ShimCodec, MAX_FRAME_LEN, PROTOCOL_VERSION,
};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use tokio_util::codec::{Decoder, Encoder};

const REGENERATE: &str = "regenerate with `cargo run -p runlock-protocol --example gen_vectors`";

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("vectors")
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("{}: {e}; {REGENERATE}", path.display()))
}

/// Decodes `bytes` as the direction the name's prefix says.
fn decode(name: &str, bytes: &[u8]) -> Message {
    if name.starts_with("client-") {
        Message::Client(
            decode_body::<ClientMessage>(bytes)
                .unwrap_or_else(|e| panic!("{name}: does not decode: {e:?}")),
        )
    } else if name.starts_with("agent-") {
        Message::Agent(
            decode_body::<AgentMessage>(bytes)
                .unwrap_or_else(|e| panic!("{name}: does not decode: {e:?}")),
        )
    } else {
        panic!("{name}: a vector's name starts with `client-` or `agent-`")
    }
}

/// The wire `type` of a client message. Adding a variant breaks this match on
/// purpose: add its name to [`CLIENT_TYPES`] and a vector to `support/cases/`.
fn client_type(message: &ClientMessage) -> &'static str {
    match message {
        ClientMessage::Hello { .. } => "hello",
        ClientMessage::Acquire { .. } => "acquire",
        ClientMessage::Release { .. } => "release",
        ClientMessage::Attach { .. } => "attach",
        ClientMessage::Reattach { .. } => "reattach",
        ClientMessage::List => "list",
        ClientMessage::ListKeys { .. } => "list_keys",
        ClientMessage::Inspect { .. } => "inspect",
        ClientMessage::History { .. } => "history",
        ClientMessage::Ping => "ping",
        ClientMessage::Unknown => "unknown",
    }
}

/// The wire `type` of an agent message; see [`client_type`].
fn agent_type(message: &AgentMessage) -> &'static str {
    match message {
        AgentMessage::Welcome { .. } => "welcome",
        AgentMessage::Acquired { .. } => "acquired",
        AgentMessage::Released { .. } => "released",
        AgentMessage::Attached => "attached",
        AgentMessage::Leases { .. } => "leases",
        AgentMessage::Keys { .. } => "keys",
        AgentMessage::Record(_) => "record",
        AgentMessage::Events { .. } => "events",
        AgentMessage::Pong => "pong",
        AgentMessage::Error(_) => "error",
        AgentMessage::Lost { .. } => "lost",
        AgentMessage::Forcing { .. } => "forcing",
        AgentMessage::Renewed { .. } => "renewed",
        AgentMessage::Restarting => "restarting",
        AgentMessage::Unknown => "unknown",
    }
}

const CLIENT_TYPES: &[&str] = &[
    "hello",
    "acquire",
    "release",
    "attach",
    "reattach",
    "list",
    "list_keys",
    "inspect",
    "history",
    "ping",
];
const AGENT_TYPES: &[&str] = &[
    "welcome",
    "acquired",
    "released",
    "attached",
    "leases",
    "keys",
    "record",
    "events",
    "pong",
    "error",
    "lost",
    "forcing",
    "renewed",
    "restarting",
];

fn wire_type(message: &Message) -> &'static str {
    match message {
        Message::Client(m) => client_type(&m.body),
        Message::Agent(m) => agent_type(&m.body),
    }
}

/// `client-acquire-full` → `acquire`.
fn type_in_name(name: &str) -> &str {
    let rest = name.split_once('-').map_or("", |(_, rest)| rest);
    rest.split('-').next().unwrap_or_default()
}

#[test]
fn every_vector_decodes_to_its_value_and_reencodes_byte_for_byte() {
    for vector in canonical() {
        let path = vectors_dir().join(format!("{}.msgpack", vector.name));
        let bytes = read(&path);
        let decoded = decode(vector.name, &bytes);
        assert_eq!(
            decoded, vector.message,
            "{}: decodes to another value",
            vector.name
        );
        assert_eq!(
            decoded.encode(),
            bytes,
            "{}: re-encodes differently; {REGENERATE}",
            vector.name
        );
        assert_eq!(
            type_in_name(vector.name),
            wire_type(&decoded),
            "{}: name and type differ",
            vector.name
        );
    }
}

#[test]
fn decode_only_vectors_decode_to_their_values() {
    for vector in decode_only() {
        let path = vectors_dir()
            .join("decode-only")
            .join(format!("{}.msgpack", vector.name));
        let bytes = read(&path);
        assert_eq!(
            bytes, vector.bytes,
            "{}: file differs from support/cases; {REGENERATE}",
            vector.name
        );
        assert_eq!(
            decode(vector.name, &bytes),
            vector.message,
            "{}: decodes to another value",
            vector.name
        );
    }
}

#[test]
fn type_names_are_the_wire_names() {
    for vector in canonical() {
        let json: serde_json::Value =
            serde_json::from_str(&vector.message.json()).expect("vector JSON parses");
        assert_eq!(json["type"], wire_type(&vector.message), "{}", vector.name);
    }
}

#[test]
fn every_message_type_has_a_vector() {
    let covered: BTreeSet<(bool, &str)> = canonical()
        .iter()
        .map(|v| {
            (
                matches!(v.message, Message::Client(_)),
                wire_type(&v.message),
            )
        })
        .collect();
    for name in CLIENT_TYPES {
        assert!(
            covered.contains(&(true, *name)),
            "client message `{name}` has no vector"
        );
    }
    for name in AGENT_TYPES {
        assert!(
            covered.contains(&(false, *name)),
            "agent message `{name}` has no vector"
        );
    }
    // And the catch-alls, which only a hand-written body can produce.
    let loose: BTreeSet<&str> = decode_only()
        .iter()
        .map(|v| wire_type(&v.message))
        .collect();
    assert!(loose.contains("unknown"), "no vector of an unknown type");
}

fn envelope_id(message: &Message) -> Option<u64> {
    match message {
        Message::Client(m) => m.id,
        Message::Agent(m) => m.id,
    }
}

#[test]
fn decode_only_json_matches_the_bytes_header() {
    for vector in decode_only() {
        let json: serde_json::Value = serde_json::from_str(vector.json).expect("JSON parses");
        assert_eq!(
            json["id"].as_u64(),
            envelope_id(&vector.message),
            "{}",
            vector.name
        );
        let kind = json["type"].as_str().expect("a type");
        match wire_type(&vector.message) {
            "unknown" => assert!(!CLIENT_TYPES.contains(&kind) && !AGENT_TYPES.contains(&kind)),
            known => assert_eq!(kind, known, "{}", vector.name),
        }
    }
}

#[test]
fn every_file_is_a_listed_vector_and_documented() {
    let readme = fs::read_to_string(vectors_dir().join("README.md")).expect("vectors/README.md");
    let meanings = canonical()
        .iter()
        .map(|v| v.meaning)
        .chain(decode_only().iter().map(|v| v.meaning))
        .collect::<Vec<_>>();
    for meaning in meanings {
        assert!(
            readme.contains(meaning),
            "README.md lacks `{meaning}`; {REGENERATE}"
        );
    }
    for (dir, names) in [
        (
            vectors_dir(),
            canonical().iter().map(|v| v.name).collect::<BTreeSet<_>>(),
        ),
        (
            vectors_dir().join("decode-only"),
            decode_only()
                .iter()
                .map(|v| v.name)
                .collect::<BTreeSet<_>>(),
        ),
    ] {
        let mut present = BTreeSet::new();
        for entry in fs::read_dir(&dir).expect("vectors directory") {
            let path = entry.expect("directory entry").path();
            if path.extension().is_some_and(|e| e == "msgpack") {
                let stem = path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .expect("UTF-8 name");
                present.insert(stem.to_owned());
            }
        }
        let listed: BTreeSet<String> = names.iter().map(|n| (*n).to_owned()).collect();
        assert_eq!(
            present,
            listed,
            "{}: files and support/cases differ; {REGENERATE}",
            dir.display()
        );
        for name in names {
            assert!(
                readme.contains(&format!("{name}.msgpack`")),
                "README.md lacks {name}; {REGENERATE}"
            );
        }
    }
}

#[test]
fn frame_ping_is_a_big_endian_length_then_the_body() {
    let frame = read(&vectors_dir().join("frame-ping.bin"));
    let (len, body) = frame.split_at(4);
    let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
    assert_eq!(len, body.len());
    let ping = Envelope::request(FRAME_PING_ID, ClientMessage::Ping);
    assert_eq!(Message::Client(ping.clone()).encode(), body);

    let mut encoded = bytes::BytesMut::new();
    ShimCodec::new()
        .encode(ping.clone(), &mut encoded)
        .expect("encodes");
    assert_eq!(&encoded[..], &frame[..]);

    let mut buf = bytes::BytesMut::from(&frame[..]);
    let decoded = AgentCodec::new()
        .decode(&mut buf)
        .expect("frame")
        .expect("whole")
        .expect("body");
    assert_eq!(decoded, ping);
}

/// SPEC.md states these numbers; a change to them is a protocol change.
#[test]
fn spec_constants_match_the_crate() {
    assert_eq!(PROTOCOL_VERSION, 1);
    assert_eq!(MAX_FRAME_LEN, 1_048_576);
    assert_eq!(MAX_KEY_LEN, 512);
    assert_eq!(runlock_protocol::MAX_LOCKS_PER_MESSAGE, 250);
}
