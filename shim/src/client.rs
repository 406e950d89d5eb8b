//! A connection to the agent: connect, `hello`, and requests matched to their
//! replies by id, with events set aside for whoever wants them.

use crate::exit::{self, Failure};
use futures::{SinkExt, StreamExt};
use runlock_protocol::{
    AgentMessage, ClientMessage, Envelope, ErrorCode, OnUnavailable, ProtocolError, ShimCodec,
    WireError, PROTOCOL_VERSION,
};
use std::collections::VecDeque;
use std::path::Path;
use tokio::net::UnixStream;
use tokio_util::codec::Framed;

pub struct Client {
    pub transport: Framed<UnixStream, ShimCodec>,
    next_id: u64,
    /// Events that arrived while waiting for a reply.
    pub events: VecDeque<AgentMessage>,
    /// The agent's policy when its backend cannot be reached.
    pub on_unavailable: OnUnavailable,
    /// Whether leases outlive the agent (so a run may wait for the next one).
    pub leases_survive_agent: bool,
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
            CallError::Agent(err) => Failure::new(exit::for_error(err.code), err.message),
            CallError::Gone(why) => Failure::new(exit::EXIT_UNAVAILABLE, format!("{what}: {why}")),
        }
    }
}

impl Client {
    /// Connects and says hello; an unreachable agent is `unavailable` (69).
    pub async fn connect(socket: &Path) -> Result<Client, Failure> {
        let stream = UnixStream::connect(socket).await.map_err(|err| {
            Failure::new(
                exit::EXIT_UNAVAILABLE,
                format!(
                    "cannot reach the agent at {}: {err} (is runlockd running?)",
                    socket.display()
                ),
            )
        })?;
        let mut client = Client {
            transport: Framed::new(stream, ShimCodec::new()),
            next_id: 1,
            events: VecDeque::new(),
            on_unavailable: OnUnavailable::Fail,
            leases_survive_agent: false,
        };
        let hello = ClientMessage::Hello {
            version: PROTOCOL_VERSION,
            client: concat!("runlock ", env!("CARGO_PKG_VERSION")).to_string(),
            pid: std::process::id(),
        };
        match client.call(hello).await {
            Ok(AgentMessage::Welcome {
                on_unavailable,
                leases_survive_agent,
                ..
            }) => {
                client.on_unavailable = on_unavailable;
                client.leases_survive_agent = leases_survive_agent;
                Ok(client)
            }
            Ok(other) => Err(Failure::new(
                exit::EXIT_SOFTWARE,
                format!("unexpected answer to hello: {other:?}"),
            )),
            Err(err) => {
                Err(err.into_failure("the agent closed the connection during the handshake"))
            }
        }
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
            match self.transport.next().await {
                None => return Err(CallError::Gone("the agent closed the connection".into())),
                Some(Err(err)) => return Err(CallError::Gone(describe(&err))),
                Some(Ok(Err(bad))) => {
                    return Err(CallError::Gone(format!(
                        "cannot decode the agent's message: {}",
                        bad.reason
                    )))
                }
                Some(Ok(Ok(Envelope {
                    id: Some(got),
                    body,
                }))) if got == id => {
                    return match body {
                        AgentMessage::Error(err) => Err(CallError::Agent(err)),
                        body => Ok(body),
                    };
                }
                Some(Ok(Ok(Envelope { id: None, body }))) => self.events.push_back(body),
                Some(Ok(Ok(Envelope { id: Some(_), .. }))) => {} // a reply to a request we gave up on
            }
        }
    }

    /// Sends a request and waits for its reply.
    pub async fn call(&mut self, body: ClientMessage) -> Result<AgentMessage, CallError> {
        let id = self.send(body).await?;
        self.reply(id).await
    }
}

pub fn describe(err: &ProtocolError) -> String {
    match err {
        ProtocolError::Io(io) => format!("connection to the agent failed: {io}"),
        other => other.to_string(),
    }
}

/// An unexpected reply type, as a failure.
pub fn unexpected(what: &str, got: &AgentMessage) -> Failure {
    Failure::new(
        exit::EXIT_SOFTWARE,
        format!("unexpected reply to {what}: {got:?}"),
    )
}

/// `held`/`timeout` failures print who holds the key.
pub fn describe_wire_error(err: &WireError) -> String {
    let mut text = err.message.clone();
    if let (ErrorCode::Held | ErrorCode::Timeout, Some(h)) = (err.code, &err.holder) {
        text.push_str(&format!(
            "\n  host:    {}\n  pid:     {}\n  user:    {} (uid {})\n  command: {}\n  since:   {}\n  token:   {}",
            h.host,
            h.pid,
            h.user,
            h.uid,
            h.command,
            crate::format::since(h.acquired_at_ms),
            h.token
        ));
    }
    text
}
