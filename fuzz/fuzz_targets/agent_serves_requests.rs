//! The agent's request handling: a peer that has said hello, then sends any
//! bytes, served by the real connection code over a registry on memory://.
//! The agent must never panic or hang on them: it answers and closes within
//! its bounds once the peer has finished sending, and once the peer is gone
//! it holds none of the peer's leases.
//!
//! The peer is `nobody` (its pid this process's, which nobody does not own),
//! so that no input can make the agent signal a process: it may not attach
//! to one, force or break.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use runlock_agent::backend::MemoryBackend;
use runlock_agent::connection::serve_connection;
use runlock_agent::limits::{Admission, Limits};
use runlock_agent::metrics::Metrics;
use runlock_agent::lease::{Identity, PeerCred, Policy, Registry};
use runlock_protocol::{ClientMessage, Envelope, ShimCodec, PROTOCOL_VERSION};
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio_util::codec::Encoder;
use tokio_util::sync::CancellationToken;

/// Far above anything an answer should take; reaching it is a hang.
const HANG: Duration = Duration::from_secs(20);
const NOBODY: u32 = 65534;

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
});

/// One registry for every input, as one agent serves every peer: a lease an
/// input leaves behind would show in the next.
static REGISTRY: LazyLock<Arc<Registry>> = LazyLock::new(|| {
    let _entered = RUNTIME.enter();
    let identity = Identity {
        host: "fuzz".into(),
        agent_id: "fuzz".into(),
        uid: 0,
    };
    Registry::new(
        Arc::new(MemoryBackend::default()),
        identity,
        Policy::with_ttl(Duration::from_secs(30)),
    )
});

/// One set of series for every input, as one agent counts every peer's.
static METRICS: LazyLock<Arc<Metrics>> = LazyLock::new(|| Arc::new(Metrics::new()));

static HELLO: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let hello = Envelope::event(ClientMessage::Hello {
        version: PROTOCOL_VERSION,
        client: "fuzz".into(),
        pid: 1,
        takes_locks: false,
    });
    let mut frame = BytesMut::new();
    ShimCodec::new()
        .encode(hello, &mut frame)
        .expect("hello encodes");
    frame.to_vec()
});

fuzz_target!(|data: &[u8]| {
    RUNTIME.block_on(serve(data));
});

async fn serve(data: &[u8]) {
    let registry = REGISTRY.clone();
    let (mut peer, agent_end) = UnixStream::pair().expect("a socket pair");
    let cred = PeerCred {
        pid: std::process::id(),
        uid: NOBODY,
        gid: NOBODY,
    };
    // An admission of its own for each input: no input's connection counts
    // against the next's.
    let ticket = Admission::new(Limits::default(), 1 << 20, 0)
        .admit(NOBODY)
        .expect("a first connection is admitted");
    let served = tokio::spawn(serve_connection(
        agent_end,
        cred,
        ticket,
        registry.clone(),
        METRICS.clone(),
        CancellationToken::new(),
    ));
    let (mut from_agent, mut to_agent) = peer.split();
    let talk = async {
        // A send may fail once the agent has closed on bad input: that is its answer.
        let sent = async {
            if to_agent.write_all(&HELLO).await.is_ok() && to_agent.write_all(data).await.is_ok() {
                let _ = to_agent.shutdown().await;
            }
        };
        let mut answers = Vec::new();
        let read = from_agent.read_to_end(&mut answers);
        let (_, read) = tokio::join!(sent, read);
        read.map(|_| answers)
    };
    match tokio::time::timeout(HANG, talk).await {
        Ok(_) => {}
        Err(_) => panic!("the agent neither answered nor closed within {HANG:?}"),
    }
    drop(peer);
    match tokio::time::timeout(HANG, served).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => panic!("the connection task failed: {err}"),
        Err(_) => panic!("the connection was not closed within {HANG:?} of the peer leaving"),
    }
    assert_eq!(
        registry.lease_count(),
        0,
        "a lease outlived the connection that held it"
    );
}
