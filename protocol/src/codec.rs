//! Framing: a 4-byte big-endian length, then a MessagePack body of at most
//! [`MAX_FRAME_LEN`] bytes (or a smaller limit the reader sets), enforced in
//! both directions. The only place that turns bytes into messages and back.

use crate::error::ProtocolError;
use crate::message::{AgentMessage, ClientMessage, Envelope};
use crate::MAX_FRAME_LEN;
use bytes::{Buf, BufMut, BytesMut};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::marker::PhantomData;
use tokio_util::codec::{Decoder, Encoder};

/// The length prefix of every frame.
const HEADER_LEN: usize = 4;

/// A frame whose body could not be decoded. The stream is still in step, so
/// the reader answers `bad_request` (echoing `id` when it could be read) and goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError {
    /// The `id` field, when the body was a map with one.
    pub id: Option<u64>,
    /// What was wrong, for people.
    pub reason: String,
}

/// Reads `In` and writes `Out`, each in an [`Envelope`].
pub struct MessageCodec<In, Out> {
    max_frame_len: usize,
    _direction: PhantomData<fn(Out) -> In>,
}

/// The agent's side: reads client messages, writes agent messages.
pub type AgentCodec = MessageCodec<ClientMessage, AgentMessage>;
/// A client's side: reads agent messages, writes client messages.
pub type ShimCodec = MessageCodec<AgentMessage, ClientMessage>;

impl<In, Out> Default for MessageCodec<In, Out> {
    fn default() -> Self {
        MessageCodec {
            max_frame_len: MAX_FRAME_LEN,
            _direction: PhantomData,
        }
    }
}

impl<In, Out> MessageCodec<In, Out> {
    /// A codec with the protocol's framing and limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// Refuses frames read from now on whose body exceeds `len` bytes (at most
    /// [`MAX_FRAME_LEN`]): the agent reads a small `hello` before trusting a
    /// peer with a megabyte.
    pub fn set_max_frame_len(&mut self, len: usize) {
        self.max_frame_len = len.min(MAX_FRAME_LEN);
    }

    /// The largest body read now.
    pub fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }
}

/// Encodes one message body the way every frame is encoded: a named-field map.
pub fn encode_body<T: Serialize>(message: &Envelope<T>) -> Result<Vec<u8>, ProtocolError> {
    Ok(rmp_serde::to_vec_named(message)?)
}

/// Decodes one message body, which must have the shape SPEC 3.1 gives (see
/// [`crate::strict`]); on failure, recovers what it can of the header.
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<Envelope<T>, BodyError> {
    let decoded = crate::strict::check(body)
        .and_then(|()| rmp_serde::from_slice(body).map_err(|err| err.to_string()));
    decoded.map_err(|reason| {
        #[derive(Deserialize)]
        struct Header {
            #[serde(default)]
            id: Option<u64>,
            // Not kept, but read: a header whose `type` is not a string is
            // not one, and its `id` is not echoed.
            #[serde(default, rename = "type")]
            _type: Option<String>,
        }
        let header: Option<Header> = rmp_serde::from_slice(body).ok();
        BodyError {
            id: header.and_then(|h| h.id),
            reason,
        }
    })
}

impl<In: DeserializeOwned, Out> Decoder for MessageCodec<In, Out> {
    type Item = Result<Envelope<In>, BodyError>;
    type Error = ProtocolError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Self::Item>, ProtocolError> {
        let Some(header) = src.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if len > self.max_frame_len {
            return Err(ProtocolError::FrameTooLarge(len));
        }
        // Nothing is reserved for the body: the buffer grows only with bytes
        // that arrived, so a frame announced and never sent costs nothing.
        if src.len() < HEADER_LEN + len {
            return Ok(None);
        }
        src.advance(HEADER_LEN);
        let body = src.split_to(len);
        Ok(Some(decode_body(&body)))
    }
}

impl<In, Out: Serialize> Encoder<Envelope<Out>> for MessageCodec<In, Out> {
    type Error = ProtocolError;

    fn encode(&mut self, message: Envelope<Out>, dst: &mut BytesMut) -> Result<(), ProtocolError> {
        let body = encode_body(&message)?;
        if body.len() > MAX_FRAME_LEN {
            return Err(ProtocolError::FrameTooLarge(body.len()));
        }
        dst.reserve(HEADER_LEN + body.len());
        dst.put_u32(body.len() as u32);
        dst.extend_from_slice(&body);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ErrorCode, WireError};

    fn frame(body: &[u8]) -> BytesMut {
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
        buf.extend_from_slice(body);
        buf
    }

    #[test]
    fn round_trips_a_request_with_its_id() {
        let mut codec = ShimCodec::new();
        let mut buf = BytesMut::new();
        codec
            .encode(Envelope::request(7, ClientMessage::Ping), &mut buf)
            .expect("encode");
        let mut agent = AgentCodec::new();
        let got = agent
            .decode(&mut buf)
            .expect("frame")
            .expect("complete")
            .expect("body");
        assert_eq!(got, Envelope::request(7, ClientMessage::Ping));
        assert!(buf.is_empty());
    }

    #[test]
    fn waits_for_a_whole_frame() {
        let mut agent = AgentCodec::new();
        let full = frame(&encode_body(&Envelope::request(1, ClientMessage::Ping)).expect("encode"));
        let mut partial = BytesMut::from(&full[..full.len() - 1]);
        assert!(agent.decode(&mut partial).expect("no error").is_none());
    }

    #[test]
    fn oversized_length_is_refused_before_the_body_arrives() {
        let mut agent = AgentCodec::new();
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&((MAX_FRAME_LEN as u32) + 1).to_be_bytes());
        match agent.decode(&mut buf) {
            Err(ProtocolError::FrameTooLarge(n)) => assert_eq!(n, MAX_FRAME_LEN + 1),
            other => panic!("expected FrameTooLarge, got {other:?}"),
        }
    }

    #[test]
    fn a_frame_arriving_in_pieces_decodes_once_whole() {
        let mut agent = AgentCodec::new();
        let full = frame(&encode_body(&Envelope::request(5, ClientMessage::Ping)).expect("encode"));
        let mut buf = BytesMut::new();
        for (i, byte) in full.iter().enumerate() {
            buf.extend_from_slice(&[*byte]);
            let got = agent
                .decode(&mut buf)
                .expect("no error while the frame arrives");
            assert_eq!(got.is_some(), i == full.len() - 1, "byte {i}");
        }
    }

    #[test]
    fn oversized_message_is_not_sent() {
        let mut agent = AgentCodec::new();
        let huge = AgentMessage::Error(WireError::new(
            ErrorCode::Internal,
            "x".repeat(MAX_FRAME_LEN),
        ));
        let mut buf = BytesMut::new();
        assert!(matches!(
            agent.encode(Envelope::event(huge), &mut buf),
            Err(ProtocolError::FrameTooLarge(_))
        ));
    }

    #[test]
    fn garbage_body_keeps_the_stream_in_step_and_recovers_the_id() {
        let mut agent = AgentCodec::new();
        // {"id": 9, "type": "acquire", "keys": 5}: a map with a bad field
        let bad = rmp_serde::to_vec_named(&serde_json_like(9)).expect("encode");
        let mut buf = frame(&bad);
        buf.extend_from_slice(&frame(&[0xc1])); // 0xc1 is never valid MessagePack
        let first = agent.decode(&mut buf).expect("frame").expect("complete");
        let err = first.expect_err("bad body");
        assert_eq!(err.id, Some(9));
        let second = agent.decode(&mut buf).expect("frame").expect("complete");
        assert_eq!(second.expect_err("garbage").id, None);
    }

    fn serde_json_like(id: u64) -> std::collections::BTreeMap<&'static str, rmpv_like::Value> {
        let mut map = std::collections::BTreeMap::new();
        map.insert("id", rmpv_like::Value::U(id));
        map.insert("type", rmpv_like::Value::S("acquire"));
        map.insert("keys", rmpv_like::Value::U(5));
        map
    }

    mod rmpv_like {
        #[derive(serde::Serialize)]
        #[serde(untagged)]
        pub enum Value {
            U(u64),
            S(&'static str),
        }
    }

    #[test]
    fn unknown_type_decodes_as_unknown() {
        let mut map = std::collections::BTreeMap::new();
        map.insert("id", rmpv_like::Value::U(3));
        map.insert("type", rmpv_like::Value::S("teleport"));
        let body = rmp_serde::to_vec_named(&map).expect("encode");
        let got: Envelope<ClientMessage> = decode_body(&body).expect("decodes");
        assert_eq!(got, Envelope::request(3, ClientMessage::Unknown));
    }
}
