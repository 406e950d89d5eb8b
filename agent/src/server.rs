//! The accept loop: one task per admitted connection, tracked so that shutdown
//! can tell each peer and wait (bounded by the drain time) for them, then for
//! the lease layer's own tasks, then the stores', to finish; a connection over
//! the limits is told the agent is busy and closed.

use crate::backend::StoreContext;
use crate::connection::serve_connection;
use crate::lease::{PeerCred, Registry};
use crate::limits::Admission;
use crate::listener::next_connection;
use crate::metrics::Metrics;
use futures::SinkExt;
use runlock_protocol::{AgentCodec, AgentMessage, Envelope, ErrorCode, WireError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Refusals in progress at once; past this a connection is closed unanswered,
/// so a flood of connects cannot turn refusals into a cost of their own.
const MAX_REFUSING: usize = 64;
/// How long a refused peer has to read its answer before the close.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// Serves `listener` until `shutdown` is cancelled, counting into `metrics`,
/// then waits at most `drain` for its connections, the registry's tasks and
/// the `stores`' to finish.
pub async fn serve(
    listener: UnixListener,
    registry: Arc<Registry>,
    admission: Arc<Admission>,
    metrics: Arc<Metrics>,
    stores: StoreContext,
    drain: Duration,
    shutdown: CancellationToken,
) {
    let tracker = TaskTracker::new();
    // Connections stop only after the leases are handed over, or the first to
    // close would release its leases before the registry knew to keep them.
    let stopping = CancellationToken::new();
    let refusing = Arc::new(AtomicUsize::new(0));
    let mut refusals = RefusalLog::default();
    loop {
        let Some(stream) = next_connection(|| listener.accept(), "client", &shutdown).await else {
            break;
        };
        let peer = match peer_cred(&stream) {
            Ok(peer) => peer,
            Err(err) => {
                tracing::warn!(error = %err, "cannot read peer credentials; closing");
                continue;
            }
        };
        match admission.admit(peer.uid) {
            Ok(ticket) => {
                tracker.spawn(serve_connection(
                    stream,
                    peer,
                    ticket,
                    registry.clone(),
                    metrics.clone(),
                    stopping.clone(),
                ));
            }
            Err(limit) => {
                metrics.refused();
                refusals.note(peer, &limit);
                if refusing.fetch_add(1, Ordering::Relaxed) < MAX_REFUSING {
                    let refusing = refusing.clone();
                    tracker.spawn(async move {
                        refuse(stream, limit).await;
                        refusing.fetch_sub(1, Ordering::Relaxed);
                    });
                } else {
                    refusing.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }
    drop(listener);
    registry.hand_over();
    stopping.cancel();
    tracker.close();
    let deadline = tokio::time::Instant::now() + drain;
    if tokio::time::timeout_at(deadline, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            connections = tracker.len(),
            "connections still open after the drain period"
        );
    }
    // Only once the connections are gone: until then their leases are renewed.
    let left = registry.close(deadline).await;
    if left > 0 {
        tracing::warn!(
            tasks = left,
            "lease tasks still running after the drain period"
        );
    }
    // Only once no lease needs the store: until then it is written to.
    let left = stores.close(deadline).await;
    if left > 0 {
        tracing::warn!(
            tasks = left,
            "store tasks still running after the drain period"
        );
    }
}

/// Refusals are logged at most once a second, with how many went unlogged:
/// a peer flooding the socket must not flood the journal too.
#[derive(Default)]
struct RefusalLog {
    last: Option<tokio::time::Instant>,
    unlogged: u64,
}

impl RefusalLog {
    fn note(&mut self, peer: PeerCred, limit: &str) {
        let now = tokio::time::Instant::now();
        if self
            .last
            .is_some_and(|at| now - at < Duration::from_secs(1))
        {
            self.unlogged += 1;
            return;
        }
        self.last = Some(now);
        let unlogged = std::mem::take(&mut self.unlogged);
        tracing::warn!(uid = peer.uid, pid = peer.pid, %limit, unlogged, "agent busy; refusing a connection");
    }
}

fn peer_cred(stream: &UnixStream) -> std::io::Result<PeerCred> {
    let cred = stream.peer_cred()?;
    Ok(PeerCred {
        pid: cred.pid().unwrap_or(0) as u32,
        uid: cred.uid(),
        gid: cred.gid(),
    })
}

/// Tells a peer over the limits why, before it has said anything (so that
/// it learns the agent is there and busy, not gone), then closes.
async fn refuse(stream: UnixStream, limit: String) {
    let mut transport = Framed::new(stream, AgentCodec::new());
    let busy = WireError::new(ErrorCode::Unavailable, format!("agent busy: {limit}"));
    let told = tokio::time::timeout(
        REFUSAL_LINGER,
        transport.send(Envelope::event(AgentMessage::Error(busy))),
    );
    if !matches!(told.await, Ok(Ok(()))) {
        return;
    }
    // Closing with the peer's hello unread would reset the connection, and a
    // reset may reach the peer before our answer: read what it sends, briefly.
    let mut stream = transport.into_inner();
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 1024];
    let drained = async {
        let mut left = crate::limits::HELLO_FRAME_LEN;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(REFUSAL_LINGER, drained).await;
}
