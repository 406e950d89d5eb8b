//! A connection to the agent: connect, `hello`, and requests matched to their
//! replies by id, with events set aside for whoever wants them.

use crate::display;
use crate::exit::{self, Failure};
use crate::fd_stream::FdStream;
use futures::{SinkExt, StreamExt};
use runlock_protocol::{
    AgentMessage, ClientMessage, Envelope, ErrorCode, Holder, OnUnavailable, ProtocolError,
    ShimCodec, WireError, PROTOCOL_VERSION,
};
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::UnixStream;
use tokio_util::codec::Framed;

pub struct Client {
    /// Where the agent listens, for messages.
    socket: PathBuf,
    pub transport: Framed<FdStream, ShimCodec>,
    next_id: u64,
    /// Events that arrived while waiting for a reply.
    pub events: VecDeque<AgentMessage>,
    /// The agent's policy when its backend cannot be reached.
    pub on_unavailable: OnUnavailable,
    /// Whether leases outlive the agent (so a run may wait for the next one).
    pub leases_survive_agent: bool,
    /// The agent's id and its backend (secrets removed), from its welcome.
    pub agent_id: String,
    pub backend: String,
}

/// What a request can come back with, besides its reply.
pub enum CallError {
    /// The agent answered with an error.
    Agent(WireError),
    /// The connection failed or closed.
    Gone(String),
}

impl CallError {
    pub fn into_failure(self, what: &str) -> Failure {
        match self {
            CallError::Agent(err) => {
                Failure::new(exit::for_error(err.code), display::escape(&err.message))
            }
            CallError::Gone(why) => Failure::new(exit::EXIT_UNAVAILABLE, format!("{what}: {why}")),
        }
    }
}

/// How long the agent has to accept a connection and answer `hello`, and to
/// answer a request that does not wait for keys or touch the backend: a live
/// agent does both at once, so past this it is stopped or overloaded.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the agent has to answer a request that reads or writes the
/// backend (`inspect`, breaking a lease): it bounds each backend operation at
/// 5 s itself and may need a few, so this leaves it room to say why it failed.
pub const BACKEND_ANSWER_TIMEOUT: Duration = Duration::from_secs(15);

/// Why there is no connection to the agent.
#[derive(Debug)]
pub enum ConnectError {
    /// No agent answered: none listens there, the connection failed, or it
    /// stayed silent past [`ANSWER_TIMEOUT`]. `on_unavailable` applies.
    Unreachable(Failure),
    /// An agent answered `hello` with an error (at its limits, or not
    /// speaking our version), or with nonsense. It was reached and said no,
    /// so this is never a reason to run without a lock: otherwise any member
    /// of the socket group could unlock other users' runs by filling the
    /// agent's connection limits.
    Refused(Failure),
}

impl From<ConnectError> for Failure {
    fn from(err: ConnectError) -> Failure {
        match err {
            ConnectError::Unreachable(failure) | ConnectError::Refused(failure) => failure,
        }
    }
}

impl Client {
    /// Connects and says hello, within [`ANSWER_TIMEOUT`].
    pub async fn connect(socket: &Path) -> Result<Client, ConnectError> {
        Client::connect_within(socket, None)
            .await
            .map(|(client, _)| client)
    }

    /// Like [`Client::connect`], sending `first` right behind `hello`, before
    /// the welcome, to save a round trip; returns its id, for [`Client::reply`].
    pub async fn connect_asking(
        socket: &Path,
        first: ClientMessage,
    ) -> Result<(Client, u64), ConnectError> {
        match Client::connect_within(socket, Some(first)).await? {
            (client, Some(id)) => Ok((client, id)),
            (_, None) => Err(ConnectError::Unreachable(Failure::new(
                exit::EXIT_UNAVAILABLE,
                format!("cannot send to the agent at {}", socket.display()),
            ))),
        }
    }

    async fn connect_within(
        socket: &Path,
        first: Option<ClientMessage>,
    ) -> Result<(Client, Option<u64>), ConnectError> {
        tokio::time::timeout(ANSWER_TIMEOUT, Client::handshake(socket, first))
            .await
            .unwrap_or_else(|_| {
                let why = silent(socket, ANSWER_TIMEOUT);
                let failure = Failure::new(exit::EXIT_UNAVAILABLE, why);
                Err(ConnectError::Unreachable(failure))
            })
    }

    async fn handshake(
        socket: &Path,
        first: Option<ClientMessage>,
    ) -> Result<(Client, Option<u64>), ConnectError> {
        let unreachable = |why: String| {
            ConnectError::Unreachable(Failure::new(
                exit::EXIT_UNAVAILABLE,
                format!("cannot reach the agent at {}: {why}", socket.display()),
            ))
        };
        let stream = connect_stream(socket)
            .await
            .map_err(|err| unreachable(format!("{err} (is runlockd running?)")))?;
        let mut client = Client {
            socket: socket.to_path_buf(),
            transport: Framed::new(FdStream::new(stream), ShimCodec::new()),
            next_id: 1,
            events: VecDeque::new(),
            on_unavailable: OnUnavailable::Fail,
            leases_survive_agent: false,
            agent_id: String::new(),
            backend: String::new(),
        };
        let hello = ClientMessage::Hello {
            version: PROTOCOL_VERSION,
            client: concat!("runlock ", env!("CARGO_PKG_VERSION")).to_string(),
            pid: std::process::id(),
            takes_locks: true,
        };
        // An agent at its limits says so and closes before it reads anything,
        // so hello may find the socket closed with that answer waiting to be read.
        let mut sent = client.send(hello).await.err();
        let mut first_id = None;
        if let (None, Some(first)) = (&sent, first) {
            match client.send(first).await {
                Ok(id) => first_id = Some(id),
                Err(err) => sent = Some(err),
            }
        }
        let sent = sent.map(|err| err.into_failure("sending hello").message);
        let refused =
            |code: u8, message: String| ConnectError::Refused(Failure::new(code, message));
        loop {
            match client.transport.next().await {
                Some(Ok(Ok(Envelope {
                    body:
                        AgentMessage::Welcome {
                            on_unavailable,
                            leases_survive_agent,
                            agent_id,
                            backend,
                            ..
                        },
                    ..
                }))) => {
                    client.on_unavailable = on_unavailable;
                    client.leases_survive_agent = leases_survive_agent;
                    client.agent_id = agent_id;
                    client.backend = backend;
                    return Ok((client, first_id));
                }
                // Whether or not it carries hello's id, nothing but hello can be answered yet.
                Some(Ok(Ok(Envelope {
                    body: AgentMessage::Error(err),
                    ..
                }))) => {
                    let message = format!(
                        "the agent at {} refused the connection: {}",
                        socket.display(),
                        display::escape(&err.message)
                    );
                    return Err(refused(exit::for_error(err.code), message));
                }
                Some(Ok(Ok(Envelope { id: None, .. }))) => {} // an event: nothing to act on yet
                Some(Ok(Ok(Envelope { body, .. }))) => {
                    return Err(ConnectError::Refused(unexpected("hello", &body)))
                }
                Some(Ok(Err(bad))) => {
                    let message = format!(
                        "cannot decode the agent's answer to hello: {}",
                        display::escape(&bad.reason)
                    );
                    return Err(refused(exit::EXIT_SOFTWARE, message));
                }
                // Without an answer, why hello could not be sent says most.
                Some(Err(err)) => return Err(unreachable(sent.unwrap_or_else(|| describe(&err)))),
                None => {
                    let closed = "the agent closed the connection during the handshake";
                    return Err(unreachable(sent.unwrap_or_else(|| closed.into())));
                }
            }
        }
    }

    /// The `count` lock descriptors that came with the last `acquired`, in
    /// order (SPEC 5.4); any others that arrived are closed.
    pub fn take_locks(&mut self, count: u32) -> Result<Vec<OwnedFd>, Failure> {
        let received = &mut self.transport.get_mut().received;
        let count = count as usize;
        if received.len() < count {
            return Err(Failure::new(
                exit::EXIT_SOFTWARE,
                format!(
                    "the agent announced {count} lock descriptors but {} arrived",
                    received.len()
                ),
            ));
        }
        let locks = received.drain(..count).collect();
        received.clear();
        Ok(locks)
    }

    /// Sends a request without waiting; returns its id.
    pub async fn send(&mut self, body: ClientMessage) -> Result<u64, CallError> {
        let id = self.next_id;
        self.next_id += 1;
        self.transport
            .send(Envelope::request(id, body))
            .await
            .map_err(|e| CallError::Gone(describe(&e)))?;
        Ok(id)
    }

    /// Reads until the reply to `id`, setting events aside.
    pub async fn reply(&mut self, id: u64) -> Result<AgentMessage, CallError> {
        loop {
            if let Some(reply) = self.read_one(id).await {
                return reply;
            }
        }
    }

    /// Reads one message: the reply to `id`, or `None` for anything else
    /// (an event is set aside). Cancel-safe: a frame is read whole or not at all.
    async fn read_one(&mut self, id: u64) -> Option<Result<AgentMessage, CallError>> {
        match self.transport.next().await {
            None => Some(Err(CallError::Gone(
                "the agent closed the connection".into(),
            ))),
            Some(Err(err)) => Some(Err(CallError::Gone(describe(&err)))),
            Some(Ok(Err(bad))) => Some(Err(CallError::Gone(format!(
                "cannot decode the agent's message: {}",
                display::escape(&bad.reason)
            )))),
            Some(Ok(Ok(Envelope {
                id: Some(got),
                body,
            }))) if got == id => Some(match body {
                AgentMessage::Error(err) => Err(CallError::Agent(err)),
                body => Ok(body),
            }),
            Some(Ok(Ok(Envelope { id: None, body }))) => {
                self.events.push_back(body);
                None
            }
            Some(Ok(Ok(Envelope { id: Some(_), .. }))) => None, // a reply to a request we gave up on
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
    /// says so (`forcing`): the user is told, and the agent has that much
    /// longer, or as long as it takes where that run holds its own lock.
    pub async fn reply_within(
        &mut self,
        id: u64,
        limit: Duration,
    ) -> Result<AgentMessage, CallError> {
        let mut deadline = Some(tokio::time::Instant::now() + limit);
        let mut allowed = limit;
        loop {
            match self.tell_forcing() {
                Some(longer) => {
                    deadline = deadline.map(|d| d + longer);
                    allowed += longer;
                }
                None => deadline = None,
            }
            let reply = match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, self.read_one(id)).await,
                None => Ok(self.read_one(id).await),
            };
            match reply {
                Err(_) => return Err(CallError::Gone(silent(&self.socket, allowed))),
                Ok(Some(reply)) => {
                    self.tell_forcing();
                    return reply;
                }
                Ok(None) => {}
            }
        }
    }

    /// Tells the user of every `forcing` event set aside, and takes them out;
    /// returns how much longer they said the agent needs (`None`: until the
    /// run it waits for has stopped, however long).
    fn tell_forcing(&mut self) -> Option<Duration> {
        let mut longer = Some(Duration::ZERO);
        self.events.retain(|event| match event {
            AgentMessage::Forcing {
                key,
                holder,
                wait_ms,
            } => {
                eprintln!(
                    "runlock: {}",
                    forcing_notice(key, holder.as_ref(), *wait_ms)
                );
                longer = longer
                    .zip(*wait_ms)
                    .map(|(l, w)| l + Duration::from_millis(w));
                false
            }
            _ => true,
        });
        longer
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

pub fn describe(err: &ProtocolError) -> String {
    match err {
        ProtocolError::Io(io) => format!("connection to the agent failed: {io}"),
        other => other.to_string(),
    }
}

/// What the shim says while a forced acquire waits for the run it displaces.
pub fn forcing_notice(key: &str, holder: Option<&Holder>, wait_ms: Option<u64>) -> String {
    let whose = match holder {
        Some(h) => format!(
            "the run of {}@{} (pid {}, token {})",
            display::escape(&h.user),
            display::escape(&h.host),
            h.pid,
            h.token
        ),
        None => "the run it was held by".to_string(),
    };
    let how_long = match wait_ms {
        Some(ms) => format!("at most {}s", ms.div_ceil(1000)),
        // file://: a kernel lock has no deadline, only an end.
        None => "no deadline, as it holds its own lock (it is stopped once its shim \
                 reaches an agent)"
            .to_string(),
    };
    format!(
        "{:?} is taken over; waiting for {whose} to stop: {how_long}",
        display::escape(key),
    )
}

/// What the shim says of an agent that stayed silent for `limit`.
fn silent(socket: &Path, limit: Duration) -> String {
    format!(
        "the agent at {} did not answer within {}s (is runlockd stopped or overloaded?)",
        socket.display(),
        limit.as_secs()
    )
}

/// An unexpected reply type, as a failure.
pub fn unexpected(what: &str, got: &AgentMessage) -> Failure {
    let got = format!("{got:?}");
    Failure::new(
        exit::EXIT_SOFTWARE,
        format!("unexpected reply to {what}: {}", display::escape(&got)),
    )
}

/// `held`, `timeout` and `slots_mismatch` failures print who holds the key:
/// for a key with slots, every held slot's holder.
pub fn describe_wire_error(err: &WireError) -> String {
    let mut text = display::escape(&err.message).into_owned();
    if !matches!(
        err.code,
        ErrorCode::Held | ErrorCode::Timeout | ErrorCode::SlotsMismatch
    ) {
        return text;
    }
    let holders = match (&err.holders[..], &err.holder) {
        ([], Some(holder)) => std::slice::from_ref(&**holder),
        (holders, _) => holders,
    };
    for h in holders {
        let indent = match (h.slot, h.slots) {
            (Some(slot), Some(slots)) => {
                text.push_str(&format!("\n  slot {slot} (of {slots}):"));
                "    "
            }
            (Some(slot), None) => {
                text.push_str(&format!("\n  slot {slot}:"));
                "    "
            }
            (None, _) => "  ",
        };
        text.push_str(&holder_lines(h, indent));
    }
    text
}

/// A holder's fields, each on a line of its own starting with `indent`,
/// every peer-supplied string escaped.
fn holder_lines(h: &Holder, indent: &str) -> String {
    format!(
        "\n{indent}host:    {}\n{indent}pid:     {}\n{indent}user:    {} (uid {})\n{indent}command: {}\n{indent}since:   {}\n{indent}token:   {}",
        display::escape(&h.host),
        h.pid,
        display::escape(&h.user),
        h.uid,
        display::escape(&h.command),
        crate::format::since(h.acquired_at_ms),
        h.token
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(slot: Option<u32>, pid: u32, token: u64) -> Holder {
        Holder {
            host: "runner-01".into(),
            agent_id: "a".into(),
            pid,
            uid: 1000,
            gid: 1000,
            user: "etl".into(),
            command: "load".into(),
            acquired_at_ms: 0,
            token,
            slot,
            slots: slot.map(|_| 3),
        }
    }

    #[test]
    fn a_refusal_of_a_key_with_slots_names_every_slot_s_holder() {
        let mut err = WireError::new(ErrorCode::Held, "held");
        err.holder = Some(Box::new(holder(Some(0), 10, 4)));
        err.holders = vec![holder(Some(0), 10, 4), holder(Some(2), 12, 7)];
        let text = describe_wire_error(&err);
        for want in [
            "\n  slot 0 (of 3):\n    host:    runner-01\n    pid:     10",
            "    token:   4",
            "\n  slot 2 (of 3):",
            "    pid:     12",
            "    token:   7",
        ] {
            assert!(text.contains(want), "{want:?} not in {text}");
        }
    }

    #[test]
    fn a_refusal_of_a_plain_key_names_its_holder_as_before() {
        let mut err = WireError::new(ErrorCode::Timeout, "held");
        err.holder = Some(Box::new(holder(None, 10, 4)));
        let text = describe_wire_error(&err);
        assert!(text.starts_with("held\n  host:    runner-01\n  pid:     10\n"));
        assert!(!text.contains("slot"));
    }
}
