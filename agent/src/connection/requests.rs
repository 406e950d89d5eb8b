//! A peer's requests after `hello`: each one handed to the lease layer and
//! answered, one handler per request.

use super::wire::wire_error;
use super::{AcquireResult, Connection};
use crate::lease::{ConnId, Events, Registry};
use crate::metrics::Metrics;
use runlock_protocol::{
    AcquireRequest, AgentMessage, ClientMessage, ErrorCode, Lease, ListKeysRequest, OnLost,
    ProtocolError, ReleaseRequest, WireError,
};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The answer to a request that is answered at once.
type Reply = Result<AgentMessage, WireError>;

impl Connection {
    /// Answers one request; an acquire that waits is answered later, by [`Connection::grant`].
    pub(super) async fn request(
        &mut self,
        conn: ConnId,
        id: Option<u64>,
        body: ClientMessage,
        acquire: &mut AcquireSlot,
        events: &mut Events,
    ) -> Result<(), ProtocolError> {
        tracing::debug!(?id, request = ?body, "request");
        let reply = match body {
            ClientMessage::Hello { .. } => Err(bad_request("hello was already received")),
            ClientMessage::Acquire(req) => return self.acquire(conn, id, req, acquire).await,
            ClientMessage::Reattach { leases, on_lost } => {
                return self.reattach(conn, id, leases, on_lost, acquire).await
            }
            ClientMessage::Release(req) => self.release(conn, req, events).await?,
            ClientMessage::Attach { pid, pgid } => self.attach(conn, pid, pgid),
            ClientMessage::List => Ok(self.list(conn)),
            ClientMessage::ListKeys(query) => self.list_keys(conn, query).await,
            ClientMessage::Inspect { key } => self.inspect(conn, &key).await,
            ClientMessage::History { key, limit } => self.history(key, limit).await,
            ClientMessage::Ping => Ok(AgentMessage::Pong),
            ClientMessage::Unknown => Err(WireError::new(
                ErrorCode::Unsupported,
                "this agent does not know that message type",
            )),
        };
        self.send(id, reply.unwrap_or_else(AgentMessage::Error))
            .await
    }

    /// Takes the keys at once, or in a task of its own when it may wait.
    async fn acquire(
        &mut self,
        conn: ConnId,
        id: Option<u64>,
        req: AcquireRequest,
        acquire: &mut AcquireSlot,
    ) -> Result<(), ProtocolError> {
        if acquire.task.is_some() {
            let err = bad_request("an acquire is already in progress on this connection");
            return self.reply_error(id, err).await;
        }
        // A force waits for the run it displaces (telling the peer so).
        if req.wait_ms == 0 && !req.force {
            // Nothing to wait for, so nothing to abandon: no task needed,
            // and the store write is awaited to its end like any other.
            let result = take(&self.registry, &self.metrics, conn, req, &acquire.cancel).await;
            return self.grant(conn, id, result).await;
        }
        acquire.spawn(self.registry.clone(), self.metrics.clone(), conn, id, req);
        Ok(())
    }

    /// Adopts leases taken through an agent that has since stopped.
    async fn reattach(
        &mut self,
        conn: ConnId,
        id: Option<u64>,
        leases: Vec<Lease>,
        on_lost: OnLost,
        acquire: &AcquireSlot,
    ) -> Result<(), ProtocolError> {
        if acquire.task.is_some() {
            let err = bad_request("an acquire is in progress on this connection");
            return self.reply_error(id, err).await;
        }
        let result = self.registry.reattach(conn, leases, on_lost).await;
        self.grant(conn, id, result.map_err(wire_error)).await
    }

    /// Releases this connection's leases, or breaks a key whoever holds it.
    /// `Err` only when the connection failed meanwhile.
    async fn release(
        &mut self,
        conn: ConnId,
        req: ReleaseRequest,
        events: &mut Events,
    ) -> Result<Reply, ProtocolError> {
        let count = match (req.lease_ids.is_empty(), req.key) {
            (false, None) => self.registry.release(conn, &req.lease_ids).await,
            (true, Some(key)) => return self.break_key(conn, key, req.slot, events).await,
            _ => return Ok(Err(bad_request("release takes either lease_ids or key"))),
        };
        Ok(count
            .map(|count| AgentMessage::Released { count })
            .map_err(wire_error))
    }

    /// A break waits for the run it ends to stop, and says so (`forcing`)
    /// meanwhile, as a force does. Its own task: a break once begun ends the
    /// key it took, peer or no peer.
    async fn break_key(
        &mut self,
        conn: ConnId,
        key: String,
        slot: Option<u32>,
        events: &mut Events,
    ) -> Result<Reply, ProtocolError> {
        let registry = self.registry.clone();
        let slot = slot.unwrap_or(0);
        let mut breaking = self
            .registry
            .tasks()
            .spawn(async move { registry.break_key(conn, &key, slot).await }.in_current_span());
        let broken = loop {
            tokio::select! {
                biased;
                Some(event) = events.recv() => self.send_events(event, events).await?,
                broken = &mut breaking => break broken,
            }
        };
        Ok(match broken {
            Ok(broken) => broken
                .map(|count| AgentMessage::Released { count })
                .map_err(wire_error),
            Err(err) => Err(WireError::new(
                ErrorCode::Internal,
                format!("the break failed: {err}"),
            )),
        })
    }

    /// Names the run the agent stops should a lease be lost once the peer is gone.
    fn attach(&mut self, conn: ConnId, pid: u32, pgid: u32) -> Reply {
        self.registry
            .attach(conn, pid, pgid)
            .map(|()| AgentMessage::Attached)
            .map_err(wire_error)
    }

    /// The leases held through this agent, as this peer may see them.
    fn list(&mut self, conn: ConnId) -> AgentMessage {
        let (leases, omitted) = self.registry.list_for(conn);
        AgentMessage::Leases { leases, omitted }
    }

    /// One page of the store's keys, in the user's turn at store reads.
    async fn list_keys(&mut self, conn: ConnId, query: ListKeysRequest) -> Reply {
        let _turn = self.ticket.store_read_turn().await;
        let page = self.registry.list_keys_for(conn, query).await;
        page.map(|page| AgentMessage::Keys {
            keys: page.keys,
            cursor: page.cursor,
        })
        .map_err(wire_error)
    }

    /// A key's record, in the user's turn at store reads.
    async fn inspect(&mut self, conn: ConnId, key: &str) -> Reply {
        let _turn = self.ticket.store_read_turn().await;
        let record = self.registry.inspect_for(conn, key).await;
        record.map(AgentMessage::Record).map_err(wire_error)
    }

    /// A key's latest events (`limit` absent or 0: all it keeps), in the
    /// user's turn at store reads.
    async fn history(&mut self, key: String, limit: Option<u32>) -> Reply {
        let limit = usize::try_from(limit.unwrap_or(0)).unwrap_or(usize::MAX);
        let _turn = self.ticket.store_read_turn().await;
        let events = self.registry.history(&key, limit).await;
        events
            .map(|events| AgentMessage::Events { key, events })
            .map_err(wire_error)
    }
}

fn bad_request(message: &str) -> WireError {
    WireError::new(ErrorCode::BadRequest, message)
}

/// The one acquire a connection may have in flight: it runs as its own task so
/// that a store write, once started, completes even if the peer goes away.
pub(super) struct AcquireSlot {
    pub(super) task: Option<JoinHandle<()>>,
    pub(super) cancel: CancellationToken,
    done_tx: mpsc::UnboundedSender<(Option<u64>, AcquireResult)>,
    pub(super) done: mpsc::UnboundedReceiver<(Option<u64>, AcquireResult)>,
}

impl AcquireSlot {
    pub(super) fn new() -> AcquireSlot {
        let (done_tx, done) = mpsc::unbounded_channel();
        AcquireSlot {
            task: None,
            cancel: CancellationToken::new(),
            done_tx,
            done,
        }
    }

    fn spawn(
        &mut self,
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
        conn: ConnId,
        id: Option<u64>,
        req: AcquireRequest,
    ) {
        let (cancel, done) = (self.cancel.clone(), self.done_tx.clone());
        let tasks = registry.tasks().clone();
        let task = async move {
            let result = take(&registry, &metrics, conn, req, &cancel).await;
            let _ = done.send((id, result));
        };
        self.task = Some(tasks.spawn(task.in_current_span()));
    }
}

/// Takes the keys `req` names, counted by how the request ended.
async fn take(
    registry: &Registry,
    metrics: &Metrics,
    conn: ConnId,
    req: AcquireRequest,
    cancel: &CancellationToken,
) -> AcquireResult {
    let (force, started) = (req.force, std::time::Instant::now());
    let result = registry
        .acquire(conn, req.into(), cancel)
        .await
        .map_err(wire_error);
    metrics.acquisition(force, &result, cancel.is_cancelled(), started);
    result
}
