//! One peer: the handshake, its requests, its events, and at its end (EOF)
//! the release of every lease it held. The one place where the lease layer's
//! errors and events become wire messages (`wire.rs`).

mod requests;
mod wire;

use crate::lease::{ConnId, Event, Events, Granted, PeerCred, Registry};
use crate::limits::{Limits, Ticket, HELLO_FRAME_LEN};
use crate::metrics::Metrics;
use crate::process::Peer;
use bytes::BytesMut;
use futures::{SinkExt, StreamExt};
use requests::AcquireSlot;
use runlock_protocol::{
    AgentCodec, AgentMessage, BodyError, ClientMessage, Envelope, ErrorCode, ProtocolError,
    WireError, MAX_FRAME_LEN, PROTOCOL_VERSION,
};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::net::UnixStream;
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use wire::{acquired, event_message};

type Transport = Framed<UnixStream, AgentCodec>;
type AcquireResult = Result<Granted, WireError>;
/// What reading the next frame gives: none at EOF, a body or why it is not one.
type Frame = Option<Result<Result<Envelope<ClientMessage>, BodyError>, ProtocolError>>;

/// Serves one accepted connection from `peer`, admitted with `ticket`, until
/// the peer goes or `shutdown` (cancelled by the server once it has handed
/// the leases over).
pub async fn serve_connection(
    stream: UnixStream,
    peer: PeerCred,
    ticket: Ticket,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let limits = ticket.limits();
    let groups = peer_groups(&stream);
    // The process that connected, by pidfd: whatever later reuses its pid is not it.
    let shim = Peer::of(&stream, peer.pid);
    let span = tracing::info_span!("conn", pid = peer.pid, uid = peer.uid);
    let mut codec = AgentCodec::new();
    codec.set_max_frame_len(HELLO_FRAME_LEN);
    Connection {
        transport: Framed::new(stream, codec),
        registry,
        metrics,
        peer,
        shim,
        groups,
        limits,
        ticket,
        frame_timer: FrameTimer::new(limits.handshake_timeout),
        takes_locks: false,
    }
    .run(shutdown)
    .instrument(span)
    .await
}

/// The peer's supplementary groups when it connected (SO_PEERGROUPS): the
/// groups it really had, not the ones the user database lists. Empty if the
/// kernel cannot say.
fn peer_groups(stream: &UnixStream) -> Vec<u32> {
    use std::os::fd::AsRawFd;
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: the buffer is valid for `len` bytes, and the kernel writes at
        // most `len` bytes and sets `len` to what it wrote or needs.
        let rc = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let count = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(count);
            return groups;
        }
        let too_small = std::io::Error::last_os_error().raw_os_error() == Some(libc::ERANGE);
        if !too_small || count <= groups.len() {
            return Vec::new();
        }
        groups.resize(count, 0);
    }
}

struct Connection {
    transport: Transport,
    registry: Arc<Registry>,
    /// Counts its acquires.
    metrics: Arc<Metrics>,
    peer: PeerCred,
    shim: Peer,
    groups: Vec<u32>,
    limits: Limits,
    /// Its place among the connections, and its user's turns at store reads.
    ticket: Ticket,
    frame_timer: FrameTimer,
    /// The peer said `takes_locks`: its grants carry the locks for its run.
    takes_locks: bool,
}

/// The bound on a frame that has begun to arrive: a peer that sends part of
/// a frame and stops is closed, not kept holding what it sent.
struct FrameTimer {
    limit: Duration,
    expiry: Pin<Box<tokio::time::Sleep>>,
    armed: bool,
}

impl FrameTimer {
    fn new(limit: Duration) -> FrameTimer {
        FrameTimer {
            limit,
            expiry: Box::pin(tokio::time::sleep(limit)),
            armed: false,
        }
    }
}

/// Buffers grown past this by one large frame are given back once it is done,
/// so an idle connection holds little whatever it sent before.
const KEEP_BUFFER: usize = 64 * 1024;

/// At most this many events go out in one write (about 4 KiB of `renewed`).
const EVENT_BATCH: usize = 64;

fn shrink(buffer: &mut BytesMut) {
    if buffer.capacity() > KEEP_BUFFER && buffer.len() <= KEEP_BUFFER {
        *buffer = BytesMut::from(&buffer[..]);
    }
}

impl Connection {
    async fn send(&mut self, id: Option<u64>, body: AgentMessage) -> Result<(), ProtocolError> {
        let sent = self.feed(id, body).await;
        sent.and(self.flush().await)
    }

    /// Writes what [`feed`](Self::feed) queued, then gives back a buffer
    /// grown past [`KEEP_BUFFER`].
    async fn flush(&mut self) -> Result<(), ProtocolError> {
        let flushed = self.transport.flush().await;
        shrink(self.transport.write_buffer_mut());
        flushed
    }

    /// Queues one frame for the next flush.
    async fn feed(&mut self, id: Option<u64>, body: AgentMessage) -> Result<(), ProtocolError> {
        match self.transport.feed(Envelope { id, body }).await {
            Err(ProtocolError::FrameTooLarge(n)) => {
                // Replies are bounded to fit (SPEC 10), so this is a bug: say so
                // rather than close.
                tracing::error!(bytes = n, "a reply exceeded the frame limit");
                let message = format!("the reply ({n} bytes) exceeds the 1 MiB frame limit");
                let body = AgentMessage::Error(WireError::new(ErrorCode::Internal, message));
                self.transport.feed(Envelope { id, body }).await
            }
            other => other,
        }
    }

    /// Sends `first` and the events already queued behind it, up to
    /// [`EVENT_BATCH`], in one write: an agent holding many leases renews
    /// thousands a second, and a write for each `renewed` cost more than the
    /// renewal itself.
    async fn send_events(
        &mut self,
        first: Event,
        events: &mut Events,
    ) -> Result<(), ProtocolError> {
        self.feed(None, event_message(first)).await?;
        for _ in 1..EVENT_BATCH {
            let Ok(event) = events.try_recv() else { break };
            self.feed(None, event_message(event)).await?;
        }
        self.flush().await
    }

    /// The next frame, or an error once a frame begun stays unfinished past
    /// the handshake timeout.
    fn poll_frame(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Frame> {
        if let Poll::Ready(frame) = self.transport.poll_next_unpin(cx) {
            self.frame_timer.armed = false;
            shrink(self.transport.read_buffer_mut());
            return Poll::Ready(frame);
        }
        let timer = &mut self.frame_timer;
        if self.transport.read_buffer().is_empty() {
            timer.armed = false;
            return Poll::Pending;
        }
        if !timer.armed {
            timer.armed = true;
            let at = tokio::time::Instant::now() + timer.limit;
            timer.expiry.as_mut().reset(at);
        }
        match timer.expiry.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(ProtocolError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "a frame was begun and not finished within {}",
                    humantime::format_duration(timer.limit)
                ),
            ))))),
            Poll::Pending => Poll::Pending,
        }
    }

    async fn next_frame(&mut self) -> Frame {
        std::future::poll_fn(|cx| self.poll_frame(cx)).await
    }

    async fn reply_error(&mut self, id: Option<u64>, err: WireError) -> Result<(), ProtocolError> {
        self.send(id, AgentMessage::Error(err)).await
    }

    /// Waits (bounded) for `hello`; anything else is refused and closes the connection.
    async fn handshake(&mut self) -> Result<bool, ProtocolError> {
        let limit = self.limits.handshake_timeout;
        // The handshake's own deadline bounds a partial hello too: the frame
        // timer would race it and name the wrong limit.
        let Ok(frame) = tokio::time::timeout(limit, self.transport.next()).await else {
            let message = format!(
                "no hello within {}; closing the connection",
                humantime::format_duration(limit)
            );
            tracing::debug!("no hello in time; closing");
            self.reply_error(None, WireError::new(ErrorCode::BadRequest, message))
                .await?;
            return Ok(false);
        };
        let Some(frame) = frame else {
            return Ok(false);
        };
        let (id, version) = match frame {
            Ok(Ok(Envelope {
                id,
                body:
                    ClientMessage::Hello {
                        version,
                        client,
                        pid,
                        takes_locks,
                    },
            })) => {
                // Debug, not Display: the peer's text is escaped in the log.
                tracing::debug!(?client, client_pid = pid, version, takes_locks, "hello");
                self.takes_locks = takes_locks;
                (id, version)
            }
            Ok(Ok(Envelope { id, .. })) => {
                let err = WireError::new(ErrorCode::BadRequest, "the first message must be hello");
                self.reply_error(id, err).await?;
                return Ok(false);
            }
            Ok(Err(bad)) => {
                let err = WireError::new(
                    ErrorCode::BadRequest,
                    format!("cannot decode message: {}", bad.reason),
                );
                self.reply_error(bad.id, err).await?;
                return Ok(false);
            }
            Err(err) => return self.frame_failed(err).await.map(|_| false),
        };
        if version != PROTOCOL_VERSION {
            let err = WireError::new(
                ErrorCode::UnsupportedVersion,
                format!("this agent speaks protocol version {PROTOCOL_VERSION}, not {version}"),
            );
            self.reply_error(id, err).await?;
            return Ok(false);
        }
        let welcome = AgentMessage::Welcome {
            version: PROTOCOL_VERSION,
            agent: concat!("runlockd ", env!("CARGO_PKG_VERSION")).to_string(),
            agent_id: self.registry.identity().agent_id.clone(),
            backend: self.registry.backend_description(),
            scope: self.registry.capabilities().scope,
            default_ttl_ms: self.registry.policy().default_ttl.as_millis() as u64,
            on_unavailable: self.registry.policy().on_unavailable,
            leases_survive_agent: self.leases_survive_agent(),
        };
        self.send(id, welcome).await?;
        self.transport.codec_mut().set_max_frame_len(MAX_FRAME_LEN);
        Ok(true)
    }

    /// Whether this peer's leases outlive the agent: where the run holds the
    /// lock itself, only if it takes the lock.
    fn leases_survive_agent(&self) -> bool {
        let capabilities = self.registry.capabilities();
        capabilities.survives_agent && (self.takes_locks || !capabilities.run_holds_lock)
    }

    /// A frame that breaks the framing: say why if we can, then close.
    async fn frame_failed(&mut self, err: ProtocolError) -> Result<(), ProtocolError> {
        if let ProtocolError::FrameTooLarge(n) = err {
            tracing::warn!(bytes = n, "oversized frame; closing");
            let limit = self.transport.codec().max_frame_len();
            let message = if limit < MAX_FRAME_LEN {
                format!("a frame of {n} bytes before hello (the limit is {limit}); closing the connection")
            } else {
                format!("frame of {n} bytes exceeds the 1 MiB limit; closing the connection")
            };
            self.reply_error(None, WireError::new(ErrorCode::BadRequest, message))
                .await?;
        } else if let ProtocolError::Io(io) = &err {
            if io.kind() == std::io::ErrorKind::TimedOut {
                tracing::warn!(error = %io, "unfinished frame; closing");
                let message = format!("{io}; closing the connection");
                self.reply_error(None, WireError::new(ErrorCode::BadRequest, message))
                    .await?;
            } else {
                tracing::debug!(error = %err, "connection failed");
            }
        } else {
            tracing::debug!(error = %err, "connection failed");
        }
        Ok(())
    }

    async fn run(mut self, shutdown: CancellationToken) {
        // A peer that never says hello must not hold up shutdown.
        let greeted = tokio::select! {
            greeted = self.handshake() => greeted,
            _ = shutdown.cancelled() => return,
        };
        match greeted {
            Ok(true) => {}
            Ok(false) => return,
            Err(err) => {
                tracing::debug!(error = %err, "handshake failed");
                return;
            }
        }
        let groups = std::mem::take(&mut self.groups);
        let shim = std::mem::take(&mut self.shim);
        let (conn, mut events) = self.registry.open_connection(self.peer, shim, &groups);
        let mut acquire = AcquireSlot::new();
        let result: Result<(), ProtocolError> = async {
            loop {
                tokio::select! {
                    // In this order: an event the registry sent before a reply
                    // (`forcing` before `acquired`) reaches the peer before it.
                    biased;
                    _ = shutdown.cancelled() => {
                        // The server has handed the leases over (where they outlive the agent).
                        self.send(None, AgentMessage::Restarting).await?;
                        return Ok(());
                    }
                    Some(event) = events.recv() => self.send_events(event, &mut events).await?,
                    Some((id, result)) = acquire.done.recv() => {
                        acquire.task = None;
                        self.grant(conn, id, result).await?;
                    }
                    frame = self.next_frame() => match frame {
                        None => return Ok(()),
                        Some(Err(err)) => return self.frame_failed(err).await,
                        Some(Ok(Err(bad))) => {
                            tracing::debug!(reason = %bad.reason, "undecodable message");
                            let err = WireError::new(ErrorCode::BadRequest, format!("cannot decode message: {}", bad.reason));
                            self.reply_error(bad.id, err).await?;
                        }
                        Some(Ok(Ok(Envelope { id, body }))) => self.request(conn, id, body, &mut acquire, &mut events).await?,
                    },
                }
            }
        }
        .await;
        if let Err(err) = result {
            tracing::debug!(error = %err, "connection ended with an error");
        }
        // An acquire still waiting is abandoned; one already writing to the store finishes first.
        acquire.cancel.cancel();
        if let Some(task) = acquire.task {
            let _ = task.await;
        }
        // A reattached run does not hold this connection: its leases last until
        // its process group is empty, not until its shim is gone.
        if let Some(pgid) = self.registry.run_outliving(conn) {
            tracing::info!(
                pgid,
                "the shim of a reattached run is gone; holding until the run ends"
            );
            tokio::select! {
                _ = self.registry.run_ended(conn) => {}
                _ = shutdown.cancelled() => {}
            }
        }
        self.registry.close_connection(conn).await;
    }

    /// Answers an `acquire` or `reattach`. A grant whose reply cannot be sent
    /// is given back, so the peer never holds keys it was not told of.
    async fn grant(
        &mut self,
        conn: ConnId,
        id: Option<u64>,
        result: AcquireResult,
    ) -> Result<(), ProtocolError> {
        let mut granted = match result {
            Ok(granted) => granted,
            Err(err) => return self.reply_error(id, err).await,
        };
        let lease_ids: Vec<String> = granted.leases.iter().map(|l| l.lease_id.clone()).collect();
        let locks = match self.takes_locks {
            true => std::mem::take(&mut granted.locks),
            false => Vec::new(), // the agent's own copies hold the locks: they end with it
        };
        let reply = Envelope {
            id,
            body: acquired(granted, locks.len()),
        };
        let sent = if locks.is_empty() {
            self.transport.send(reply).await
        } else {
            self.send_with_locks(reply, &locks).await
        };
        match sent {
            Ok(()) => Ok(()),
            Err(err) => {
                let _ = self.registry.release(conn, &lease_ids).await;
                if let ProtocolError::FrameTooLarge(n) = err {
                    tracing::error!(bytes = n, "a grant's reply exceeded the frame limit");
                    let message = format!(
                        "the reply ({n} bytes) exceeds the 1 MiB frame limit; nothing was taken"
                    );
                    return self
                        .reply_error(id, WireError::new(ErrorCode::Internal, message))
                        .await;
                }
                Err(err)
            }
        }
    }

    /// Sends `reply` with the run's locks riding on its bytes (SPEC 5.4),
    /// after everything queued before it.
    async fn send_with_locks(
        &mut self,
        reply: Envelope<AgentMessage>,
        locks: &[std::os::fd::OwnedFd],
    ) -> Result<(), ProtocolError> {
        use tokio_util::codec::Encoder;
        self.transport.flush().await?;
        let mut frame = BytesMut::new();
        self.transport.codec_mut().encode(reply, &mut frame)?;
        crate::handoff::send_with_fds(self.transport.get_ref(), &frame, locks).await?;
        Ok(())
    }
}
