//! What a client reads from an agent: any bytes must decode without a panic
//! to messages, undecodable bodies or a broken stream.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use runlock_protocol::ShimCodec;
use tokio_util::codec::Decoder;

fuzz_target!(|data: &[u8]| {
    let mut codec = ShimCodec::new();
    let mut buffer = BytesMut::from(data);
    while let Ok(Some(_)) = codec.decode(&mut buffer) {}
});
