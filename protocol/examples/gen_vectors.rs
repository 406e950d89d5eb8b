//! Writes `protocol/vectors/`: every vector's body bytes, `frame-ping.bin` and
//! the README that states what each one means. Run it after changing a message
//! (and then bump the protocol version if SPEC.md says so):
//!
//! ```text
//! cargo run -p runlock-protocol --example gen_vectors
//! ```
//!
//! The list of vectors lives in `tests/support/cases/`, shared with the test.

#[path = "../tests/support/cases/mod.rs"]
mod cases;

use cases::{canonical, decode_only, Message, FRAME_PING_ID};
use runlock_protocol::{ClientMessage, Envelope, ShimCodec};
use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use tokio_util::codec::Encoder;

fn hex(bytes: &[u8]) -> String {
    bytes
        .chunks(16)
        .map(|line| {
            line.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Removes the `.msgpack` files of `dir`, so a renamed vector leaves no orphan.
fn clear(dir: &Path) -> std::io::Result<()> {
    fs::create_dir_all(dir)?;
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "msgpack") {
            fs::remove_file(path)?;
        }
    }
    Ok(())
}

fn direction(message: &Message) -> &'static str {
    match message {
        Message::Client(_) => "client → agent",
        Message::Agent(_) => "agent → client",
    }
}

fn section(readme: &mut String, file: &str, dir: &str, meaning: &str, json: &str, bytes: &[u8]) {
    let _ = write!(
        readme,
        "### `{file}`\n\n{dir}. {meaning}\n\n```json\n{json}\n```\n\n```text\n{}\n```\n\n",
        hex(bytes)
    );
}

const HEADER: &str = r#"# Test vectors

Each message of the runlock protocol as exact bytes, beside its meaning.
`../SPEC.md` is the specification; these files are examples of it that every
client's tests should decode and, where stated, re-encode byte for byte.

This file and every `.msgpack` file here are generated; do not edit them by
hand. To regenerate after changing a message or `tests/support/cases/`:

```text
cargo run -p runlock-protocol --example gen_vectors
cargo test -p runlock-protocol --test vectors
```

A change that alters the bytes of an existing vector is a wire change: see
"Versioning" in SPEC.md before committing it.

## Files

- `NAME.msgpack`: one message body, **without** the 4-byte length prefix.
  Names start with `client-` (sent by clients, decode as a client message) or
  `agent-` (sent by the agent); the next word is the message `type`.
  Each one is exactly what the reference encoder writes: decoding it and
  encoding the result gives the same bytes. (Field order inside the map is the
  reference encoder's; other encoders may order fields differently and still be
  correct, since a map's order carries no meaning.)
- `decode-only/NAME.msgpack`: bodies written by hand to show what a decoder
  must accept: fields in another order, integers wider than needed, unknown
  fields, unknown types and error codes. Decode them and compare; re-encoding
  gives the canonical form, not these bytes.
- `frame-ping.bin`: one whole frame as it travels on the socket: the 4-byte
  big-endian body length, then the body of a `ping` with id 1.

JSON below is the same value for reading; JSON is not used on the wire.
Absent optional fields are absent in both.

"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("vectors");
    let loose = root.join("decode-only");
    clear(&root)?;
    clear(&loose)?;

    let mut readme = String::from(HEADER);
    readme.push_str("## Canonical vectors\n\n");
    for vector in canonical() {
        let bytes = vector.message.encode();
        let file = format!("{}.msgpack", vector.name);
        fs::write(root.join(&file), &bytes)?;
        let dir = direction(&vector.message);
        section(
            &mut readme,
            &file,
            dir,
            vector.meaning,
            &vector.message.json(),
            &bytes,
        );
    }

    readme.push_str("## Decode-only vectors (`decode-only/`)\n\n");
    for vector in decode_only() {
        let file = format!("{}.msgpack", vector.name);
        fs::write(loose.join(&file), &vector.bytes)?;
        let dir = direction(&vector.message);
        let name = format!("decode-only/{file}");
        section(
            &mut readme,
            &name,
            dir,
            vector.meaning,
            vector.json,
            &vector.bytes,
        );
    }

    let mut frame = bytes::BytesMut::new();
    ShimCodec::new().encode(
        Envelope::request(FRAME_PING_ID, ClientMessage::Ping),
        &mut frame,
    )?;
    fs::write(root.join("frame-ping.bin"), &frame)?;
    readme.push_str("## Frame\n\n");
    section(
        &mut readme,
        "frame-ping.bin",
        "client → agent",
        &format!(
            "A whole frame: the length {:02x} {:02x} {:02x} {:02x} ({} bytes), then the body of a `ping` with id 1.",
            frame[0],
            frame[1],
            frame[2],
            frame[3],
            frame.len() - 4
        ),
        &Message::Client(Envelope::request(FRAME_PING_ID, ClientMessage::Ping)).json(),
        &frame,
    );

    fs::write(root.join("README.md"), readme.trim_end().to_string() + "\n")?;
    println!("wrote {}", root.display());
    Ok(())
}
