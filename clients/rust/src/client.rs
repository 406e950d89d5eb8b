//! One connection to the agent: connect, `hello`, and requests matched to
//! their replies by id, with events set aside for whoever wants them.

use crate::error::{describe, CallError, ConnectError, MissingLocks};
use crate::escape;
use crate::fd_stream::FdStream;
use futures::Stream;
use futures::{SinkExt, StreamExt};
use runlock_protocol::{
    AgentMessage, ClientMessage, Envelope, Holder, OnUnavailable, ShimCodec, WireError,
    PROTOCOL_VERSION,
};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::UnixStream;
use tokio_util::codec::Framed;

/// How long the agent has to accept a connection and answer `hello`, and to
/// answer a request that does not wait for keys or touch the backend: a live
/// agent does both at once, so past this it is stopped or overloaded.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the agent has to answer a request that reads or writes the
/// backend (`inspect`, breaking a lease): it bounds each backend operation at
/// 5 s itself and may need a few, so this leaves it room to say why it failed.
pub const BACKEND_ANSWER_TIMEOUT: Duration = Duration::from_secs(15);

/// How a client introduces itself in `hello`.
#[derive(Debug, Clone)]
pub struct ClientInfo {
    /// Its name and version, which the agent logs.
    pub name: String,
    /// Whether it takes the lock descriptors that come with `acquired` (SPEC
    /// 5.4) and hands them to the processes it protects, with
    /// [`Client::take_locks`]. Such a client must drop its copies before it
    /// releases, or the agent cannot take the lock back.
    pub takes_locks: bool,
}

/// Told of each `forcing` event: the key, who held it, and how long the
/// agent may wait for that run to stop (`None`: until it has).
type ForcingHook = Box<dyn FnMut(&str, Option<&Holder>, Option<u64>) + Send>;

/// A connection to the agent. Requests are numbered here; replies are
/// matched to them, and events that arrive meanwhile wait in [`Client::events`].
///
/// Between requests, a client is a [`Stream`] of what the agent sends
/// unasked ([`Incoming`]): read it (with `futures::StreamExt::next`) while
/// the work a lease protects goes on, to learn at once of a `lost` lease.
pub struct Client {
    /// Where the agent listens, for messages.
    socket: PathBuf,
    transport: Framed<FdStream, ShimCodec>,
    next_id: u64,
    on_forcing: Option<ForcingHook>,
    /// Events (messages without an id) that arrived while a reply was
    /// awaited, oldest first; the client's [`Stream`] yields them first.
    pub events: VecDeque<AgentMessage>,
    /// The agent's policy when its backend cannot be reached.
    pub on_unavailable: OnUnavailable,
    /// Whether leases outlive the agent (so a run may wait for the next one).
    pub leases_survive_agent: bool,
    /// The agent's id, from its welcome.
    pub agent_id: String,
    /// The agent's backend (secrets removed), from its welcome.
    pub backend: String,
}

/// What one read brought, while a reply is awaited.
// Returned once per message and matched at once: boxing the reply buys nothing.
#[allow(clippy::large_enum_variant)]
enum Read {
    /// The reply, or why there is none.
    Reply(Result<AgentMessage, CallError>),
    /// A `forcing` event, with the agent's `wait_ms`.
    Forcing(Option<u64>),
    /// Anything else: another event, or a late reply.
    Other,
}

/// What the agent sends unasked, as a [`Client`]'s [`Stream`] yields it.
#[derive(Debug)]
pub enum Incoming {
    /// An event, a message without an id: `renewed`, `lost`, `forcing` or
    /// `restarting` (SPEC.md says what each means).
    Event(AgentMessage),
    /// The reply to the request [`Client::send`] sent with this id and
    /// nothing awaited; an `error` reply is `Err`.
    Reply(u64, Result<AgentMessage, WireError>),
    /// A message that does not decode, and why (escaped, safe to print);
    /// the connection goes on.
    Undecodable(String),
}

impl Client {
    /// Connects to the agent at `socket` and says hello, within [`ANSWER_TIMEOUT`].
    pub async fn connect(socket: &Path, info: &ClientInfo) -> Result<Client, ConnectError> {
        Client::connect_within(socket, info, None)
            .await
            .map(|(client, _)| client)
    }

    /// Like [`Client::connect`], sending `first` right behind `hello`, before
    /// the welcome, to save a round trip; returns its id, for [`Client::reply`].
    pub async fn connect_asking(
        socket: &Path,
        info: &ClientInfo,
        first: ClientMessage,
    ) -> Result<(Client, u64), ConnectError> {
        match Client::connect_within(socket, info, Some(first)).await? {
            (client, Some(id)) => Ok((client, id)),
            (_, None) => Err(ConnectError::Unreachable(format!(
                "cannot send to the agent at {}",
                socket.display()
            ))),
        }
    }

    /// A connection that has said nothing yet, for a caller that connects
    /// its own way (a socket passed from another process, say): [`Client::hello`] comes next.
    pub fn new(stream: UnixStream) -> Client {
        let socket = stream
            .peer_addr()
            .ok()
            .and_then(|addr| addr.as_pathname().map(Path::to_path_buf))
            .unwrap_or_default();
        Client {
            socket,
            transport: Framed::new(FdStream::new(stream), ShimCodec::new()),
            next_id: 1,
            on_forcing: None,
            events: VecDeque::new(),
            on_unavailable: OnUnavailable::Fail,
            leases_survive_agent: false,
            agent_id: String::new(),
            backend: String::new(),
        }
    }

    /// Says hello on a [`Client::new`] connection; returns the agent's
    /// `welcome`. Unbounded: the caller bounds it.
    pub async fn hello(&mut self, info: &ClientInfo) -> Result<AgentMessage, ConnectError> {
        self.handshake(info, None).await.map(|(welcome, _)| welcome)
    }

    /// Has `tell` called with each `forcing` event as it arrives while a
    /// reply is awaited (a forced acquire or a break waiting for the run it
    /// displaces), in place of setting it aside in [`Client::events`].
    pub fn on_forcing(
        &mut self,
        tell: impl FnMut(&str, Option<&Holder>, Option<u64>) + Send + 'static,
    ) {
        self.on_forcing = Some(Box::new(tell));
    }

    async fn connect_within(
        socket: &Path,
        info: &ClientInfo,
        first: Option<ClientMessage>,
    ) -> Result<(Client, Option<u64>), ConnectError> {
        let connect = async {
            let stream = connect_stream(socket)
                .await
                .map_err(|err| unreachable(socket, format!("{err} (is runlockd running?)")))?;
            let mut client = Client::new(stream);
            client.socket = socket.to_path_buf();
            let (_, first_id) = client.handshake(info, first).await?;
            Ok((client, first_id))
        };
        tokio::time::timeout(ANSWER_TIMEOUT, connect)
            .await
            .unwrap_or_else(|_| Err(ConnectError::Unreachable(silent(socket, ANSWER_TIMEOUT))))
    }

    /// Sends hello (and `first`, if any, right behind it) and reads until
    /// the welcome; returns it, and the id `first` was sent with.
    async fn handshake(
        &mut self,
        info: &ClientInfo,
        first: Option<ClientMessage>,
    ) -> Result<(AgentMessage, Option<u64>), ConnectError> {
        let hello = ClientMessage::Hello {
            version: PROTOCOL_VERSION,
            client: info.name.clone(),
            pid: std::process::id(),
            takes_locks: info.takes_locks,
        };
        // An agent at its limits says so and closes before it reads anything,
        // so hello may find the socket closed with that answer waiting to be read.
        // With `first` behind it, hello is only queued: both leave in one
        // write, and the agent wakes once to read them.
        let hello = match first.is_some() {
            true => self.feed(hello).await,
            false => self.send(hello).await,
        };
        let mut sent = hello.err();
        let mut first_id = None;
        if let (None, Some(first)) = (&sent, first) {
            match self.send(first).await {
                Ok(id) => first_id = Some(id),
                Err(err) => sent = Some(err),
            }
        }
        let sent = sent.map(|err| format!("sending hello: {err}"));
        loop {
            match self.transport.next().await {
                Some(Ok(Ok(Envelope {
                    body: welcome @ AgentMessage::Welcome { .. },
                    ..
                }))) => {
                    self.welcomed(&welcome);
                    return Ok((welcome, first_id));
                }
                // Whether or not it carries hello's id, nothing but hello can be answered yet.
                Some(Ok(Ok(Envelope {
                    body: AgentMessage::Error(err),
                    ..
                }))) => {
                    let message = format!(
                        "the agent at {} refused the connection: {}",
                        self.socket.display(),
                        escape(&err.message)
                    );
                    return Err(ConnectError::Refused {
                        code: err.code,
                        message,
                    });
                }
                Some(Ok(Ok(Envelope { id: None, .. }))) => {} // an event: nothing to act on yet
                Some(Ok(Ok(Envelope { body, .. }))) => {
                    let got = format!("{body:?}");
                    let message = format!("unexpected reply to hello: {}", escape(&got));
                    return Err(ConnectError::Garbled(message));
                }
                Some(Ok(Err(bad))) => {
                    let message = format!(
                        "cannot decode the agent's answer to hello: {}",
                        escape(&bad.reason)
                    );
                    return Err(ConnectError::Garbled(message));
                }
                // Without an answer, why hello could not be sent says most.
                Some(Err(err)) => {
                    return Err(unreachable(
                        &self.socket,
                        sent.unwrap_or_else(|| describe(&err)),
                    ))
                }
                None => {
                    let closed = "the agent closed the connection during the handshake";
                    return Err(unreachable(
                        &self.socket,
                        sent.unwrap_or_else(|| closed.into()),
                    ));
                }
            }
        }
    }

    /// Keeps what the agent's `welcome` says of it.
    fn welcomed(&mut self, welcome: &AgentMessage) {
        if let AgentMessage::Welcome {
            on_unavailable,
            leases_survive_agent,
            agent_id,
            backend,
            ..
        } = welcome
        {
            self.on_unavailable = *on_unavailable;
            self.leases_survive_agent = *leases_survive_agent;
            self.agent_id = agent_id.clone();
            self.backend = backend.clone();
        }
    }

    /// The `count` lock descriptors that came with the last `acquired`, in
    /// order (SPEC 5.4); any others that arrived are closed.
    pub fn take_locks(&mut self, count: u32) -> Result<Vec<OwnedFd>, MissingLocks> {
        let received = &mut self.transport.get_mut().received;
        let count = count as usize;
        if received.len() < count {
            return Err(MissingLocks {
                announced: count,
                arrived: received.len(),
            });
        }
        let locks = received.drain(..count).collect();
        received.clear();
        Ok(locks)
    }

    /// The connection itself, to write what no request would, or read
    /// frames as they come (tests that check what the agent sends).
    pub fn framed(&mut self) -> &mut Framed<FdStream, ShimCodec> {
        &mut self.transport
    }

    /// Sends a request without waiting; returns its id.
    pub async fn send(&mut self, body: ClientMessage) -> Result<u64, CallError> {
        let id = self.feed(body).await?;
        self.transport
            .flush()
            .await
            .map_err(|e| CallError::Gone(describe(&e)))?;
        Ok(id)
    }

    /// Queues a request for the next send; returns its id.
    async fn feed(&mut self, body: ClientMessage) -> Result<u64, CallError> {
        let id = self.next_id;
        self.next_id += 1;
        self.transport
            .feed(Envelope::request(id, body))
            .await
            .map_err(|e| CallError::Gone(describe(&e)))?;
        Ok(id)
    }

    /// Reads until the reply to `id`, setting events aside.
    pub async fn reply(&mut self, id: u64) -> Result<AgentMessage, CallError> {
        loop {
            if let Read::Reply(reply) = self.read_one(id).await {
                return reply;
            }
        }
    }

    /// Sends a request and waits for its reply.
    pub async fn call(&mut self, body: ClientMessage) -> Result<AgentMessage, CallError> {
        let id = self.send(body).await?;
        self.reply(id).await
    }

    /// Like [`Client::call`], for a request that must be answered within `limit`.
    pub async fn call_within(
        &mut self,
        limit: Duration,
        body: ClientMessage,
    ) -> Result<AgentMessage, CallError> {
        let id = self.send(body).await?;
        self.reply_within(id, limit).await
    }

    /// Like [`Client::reply`], for a reply that must come within `limit`: past
    /// it the agent is stopped or wedged, and is treated as unreachable.
    /// A forced acquire (or a break) that waits for the run it displaces
    /// says so (`forcing`): the agent then has that much longer, or as long
    /// as it takes where that run holds its own lock.
    pub async fn reply_within(
        &mut self,
        id: u64,
        limit: Duration,
    ) -> Result<AgentMessage, CallError> {
        let mut deadline = Some(tokio::time::Instant::now() + limit);
        let mut allowed = limit;
        loop {
            let read = match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, self.read_one(id)).await,
                None => Ok(self.read_one(id).await),
            };
            match read {
                Err(_) => return Err(CallError::Gone(silent(&self.socket, allowed))),
                Ok(Read::Reply(reply)) => return reply,
                Ok(Read::Forcing(Some(wait_ms))) => {
                    let longer = Duration::from_millis(wait_ms);
                    deadline = deadline.map(|d| d + longer);
                    allowed += longer;
                }
                Ok(Read::Forcing(None)) => deadline = None,
                Ok(Read::Other) => {}
            }
        }
    }

    /// Reads one message: the reply to `id`, or something else (an event is
    /// set aside). Cancel-safe: a frame is read whole or not at all.
    async fn read_one(&mut self, id: u64) -> Read {
        match self.transport.next().await {
            None => Read::Reply(Err(CallError::Gone(
                "the agent closed the connection".into(),
            ))),
            Some(Err(err)) => Read::Reply(Err(CallError::Gone(describe(&err)))),
            Some(Ok(Err(bad))) => Read::Reply(Err(CallError::Gone(format!(
                "cannot decode the agent's message: {}",
                escape(&bad.reason)
            )))),
            Some(Ok(Ok(Envelope {
                id: Some(got),
                body,
            }))) if got == id => Read::Reply(match body {
                AgentMessage::Error(err) => Err(CallError::Agent(err)),
                body => Ok(body),
            }),
            Some(Ok(Ok(Envelope { id: None, body }))) => self.set_aside(body),
            Some(Ok(Ok(Envelope { id: Some(_), .. }))) => Read::Other, // a reply to a request given up on
        }
    }

    /// Queues an event, or tells the hook of a `forcing` one.
    fn set_aside(&mut self, event: AgentMessage) -> Read {
        let AgentMessage::Forcing {
            key,
            holder,
            wait_ms,
        } = &event
        else {
            self.events.push_back(event);
            return Read::Other;
        };
        let wait_ms = *wait_ms;
        match &mut self.on_forcing {
            Some(tell) => tell(key, holder.as_ref(), wait_ms),
            None => self.events.push_back(event),
        }
        Read::Forcing(wait_ms)
    }
}

/// Events set aside while replies were awaited, then each message as it
/// arrives; `Err` once the connection fails, `None` once the agent closed it.
/// Cancel-safe: a message is read whole or not at all.
impl Stream for Client {
    type Item = Result<Incoming, CallError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(event) = self.events.pop_front() {
            return Poll::Ready(Some(Ok(Incoming::Event(event))));
        }
        let incoming = match futures::ready!(self.transport.poll_next_unpin(cx)) {
            None => return Poll::Ready(None),
            Some(Err(err)) => Err(CallError::Gone(describe(&err))),
            Some(Ok(Err(bad))) => Ok(Incoming::Undecodable(escape(&bad.reason).into_owned())),
            Some(Ok(Ok(Envelope { id: None, body }))) => Ok(Incoming::Event(body)),
            Some(Ok(Ok(Envelope { id: Some(id), body }))) => Ok(Incoming::Reply(
                id,
                match body {
                    AgentMessage::Error(err) => Err(err),
                    body => Ok(body),
                },
            )),
        };
        Poll::Ready(Some(incoming))
    }
}

/// The socket's descriptor, for a command that should inherit the
/// connection (its lock then lasts as long as the command's processes).
impl AsRawFd for Client {
    fn as_raw_fd(&self) -> RawFd {
        self.transport.get_ref().as_raw_fd()
    }
}

/// Connects to `socket`. A full listen queue (`EAGAIN` on a Unix socket) is
/// an agent slow to accept, not a missing one, so it is retried; the caller
/// bounds the whole handshake.
async fn connect_stream(socket: &Path) -> std::io::Result<UnixStream> {
    let mut pause = Duration::from_millis(10);
    loop {
        match UnixStream::connect(socket).await {
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            result => return result,
        }
    }
}

fn unreachable(socket: &Path, why: String) -> ConnectError {
    ConnectError::Unreachable(format!(
        "cannot reach the agent at {}: {why}",
        socket.display()
    ))
}

/// What to say of an agent that stayed silent for `limit`.
fn silent(socket: &Path, limit: Duration) -> String {
    format!(
        "the agent at {} did not answer within {}s (is runlockd stopped or overloaded?)",
        socket.display(),
        limit.as_secs()
    )
}
