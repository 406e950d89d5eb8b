//! What the agent reads from a peer: any bytes, split anywhere, before and
//! after hello's smaller frame limit. Decoding must never panic; a body that
//! decodes must encode again to one that decodes to the same message.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use runlock_protocol::{AgentCodec, ClientMessage, Envelope, ProtocolError, ShimCodec};
use tokio_util::codec::{Decoder, Encoder};

fuzz_target!(|data: &[u8]| {
    // The first byte chooses where the stream is split and the frame limit.
    let Some((&shape, stream)) = data.split_first() else {
        return;
    };
    let mut codec = AgentCodec::new();
    if shape & 1 == 0 {
        codec.set_max_frame_len(4096);
    }
    let chunk = usize::from(shape >> 1).max(1);
    let mut buffer = BytesMut::new();
    for piece in stream.chunks(chunk) {
        buffer.extend_from_slice(piece);
        loop {
            match codec.decode(&mut buffer) {
                Ok(Some(Ok(envelope))) => reencodes(envelope),
                Ok(Some(Err(_undecodable))) => {}
                Ok(None) => break,
                // The stream cannot be resynchronised: the agent closes.
                Err(ProtocolError::FrameTooLarge(_)) | Err(_) => return,
            }
        }
    }
});

fn reencodes(envelope: Envelope<ClientMessage>) {
    let mut encoder = ShimCodec::new();
    let mut bytes = BytesMut::new();
    if encoder.encode(envelope.clone(), &mut bytes).is_err() {
        return; // larger than a frame once written out in full: not sent
    }
    let mut decoder = AgentCodec::new();
    match decoder.decode(&mut bytes) {
        Ok(Some(Ok(again))) => assert_eq!(again, envelope),
        other => panic!("{envelope:?} encoded to a frame that decodes to {other:?}"),
    }
}
