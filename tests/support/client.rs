//! `RawClient`: runlock-client's connection, for tests that need to see what
//! the agent says as it is (its errors as replies, any message), or to send
//! bytes no real client would.

use super::{within, WAIT};
use anyhow::{bail, ensure, Context};
use futures::{SinkExt, StreamExt};
use runlock_client::{CallError, Client, ClientInfo};
use runlock_protocol::{
    AcquireRequest, AgentMessage, ClientMessage, Envelope, ReleaseRequest, PROTOCOL_VERSION,
};
use serde::Serialize;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

/// The bound on waiting for a reply, whatever `forcing` events promise: a
/// forced acquire on `file://` waits for the displaced run with no deadline.
const REPLY_WAIT: Duration = Duration::from_secs(60);

/// What the tests' connections call themselves in `hello`.
const CLIENT_NAME: &str = "runlock-tests";

/// One connection to an agent.
pub struct RawClient {
    client: Client,
    /// The `forcing` events its forced acquires were sent, in order.
    pub forcing: Vec<AgentMessage>,
}

/// A frame: the 4-byte big-endian length, then `body`.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(body);
    bytes
}

/// Any serializable value as a MessagePack body, maps with named fields.
pub fn encode(value: &impl Serialize) -> anyhow::Result<Vec<u8>> {
    rmp_serde::to_vec_named(value).context("encoding a test message")
}

/// The `hello` a version-1 client sends.
pub fn hello() -> ClientMessage {
    ClientMessage::Hello {
        version: PROTOCOL_VERSION,
        client: CLIENT_NAME.to_string(),
        pid: std::process::id(),
        takes_locks: false,
    }
}

/// A minimal `acquire` of `keys` that does not wait.
pub fn acquire(keys: &[&str]) -> ClientMessage {
    let mut request = AcquireRequest::new(keys.iter().copied());
    request.command = "runlock-tests raw client".to_string();
    ClientMessage::Acquire(request)
}

/// A `release` of the leases `lease_ids`, by id (not a break of a key).
pub fn release(lease_ids: Vec<String>) -> ClientMessage {
    ClientMessage::Release(ReleaseRequest::leases(lease_ids))
}

/// A `release` that breaks `key`'s lease, whoever holds it.
pub fn break_lease(key: &str) -> ClientMessage {
    ClientMessage::Release(ReleaseRequest::break_key(key, None))
}

impl RawClient {
    /// Connects without saying hello.
    pub async fn connect(socket: &Path) -> anyhow::Result<RawClient> {
        let stream = within(WAIT, "connecting to the agent", UnixStream::connect(socket))
            .await?
            .with_context(|| format!("connecting to {}", socket.display()))?;
        Ok(RawClient::new(stream))
    }

    fn new(stream: UnixStream) -> RawClient {
        RawClient {
            client: Client::new(stream),
            forcing: Vec::new(),
        }
    }

    /// Connects as `uid`:`gid` with the supplementary `groups`, through a
    /// process that exits at once: the agent sees a peer of that user whose
    /// own process (a real client's shim) is gone, while the connection lives
    /// on here, as it does in a run whose shim was killed.
    pub async fn connect_as(
        socket: &Path,
        uid: u32,
        gid: u32,
        groups: &[u32],
    ) -> anyhow::Result<RawClient> {
        // python3's standard library can pass a descriptor back (send_fds).
        // The system's: a per-user one (pyenv's shims) may be closed to others.
        const CONNECT: &str = "import socket, sys\n\
            s = socket.socket(socket.AF_UNIX)\n\
            s.connect(sys.argv[1])\n\
            socket.send_fds(socket.socket(fileno=0), [b'x'], [s.fileno()])\n";
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let mut command = super::setpriv(uid, gid, groups);
        command
            .args(["/usr/bin/python3", "-c", CONNECT])
            .arg(socket)
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .kill_on_drop(true);
        let out = within(WAIT, "python3 to connect", command.output()).await??;
        ensure!(
            out.status.success(),
            "connecting as uid {uid}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stream = std::os::unix::net::UnixStream::from(receive_fd(&ours)?);
        stream.set_nonblocking(true)?;
        Ok(RawClient::new(UnixStream::from_std(stream)?))
    }

    /// Says hello; returns the `welcome`.
    pub async fn hello(&mut self) -> anyhow::Result<AgentMessage> {
        self.greet(false).await
    }

    /// Says hello as a client that takes its runs' locks (SPEC 5.4), as
    /// the shim does; returns the `welcome`.
    pub async fn hello_taking_locks(&mut self) -> anyhow::Result<AgentMessage> {
        self.greet(true).await
    }

    async fn greet(&mut self, takes_locks: bool) -> anyhow::Result<AgentMessage> {
        let info = ClientInfo {
            name: CLIENT_NAME.to_string(),
            takes_locks,
        };
        Ok(within(WAIT, "the agent's welcome", self.client.hello(&info)).await??)
    }

    /// The `count` lock descriptors that came with the last `acquired`.
    pub fn take_locks(&mut self, count: u32) -> anyhow::Result<Vec<OwnedFd>> {
        Ok(self.client.take_locks(count)?)
    }

    /// The `agent_id` of a `welcome`.
    pub fn agent_id(welcome: &AgentMessage) -> anyhow::Result<String> {
        match welcome {
            AgentMessage::Welcome { agent_id, .. } => Ok(agent_id.clone()),
            other => bail!("not a welcome: {other:?}"),
        }
    }

    /// Sends one message as it is.
    pub async fn send_envelope(&mut self, message: Envelope<ClientMessage>) -> anyhow::Result<()> {
        within(
            WAIT,
            "sending a message",
            self.client.framed().send(message),
        )
        .await?
        .context("sending a message")
    }

    /// Sends a request with a fresh id; returns the id.
    pub async fn send(&mut self, body: ClientMessage) -> anyhow::Result<u64> {
        Ok(within(WAIT, "sending a request", self.client.send(body)).await??)
    }

    /// Writes raw bytes to the socket, bypassing the codec.
    pub async fn write_raw(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        within(WAIT, "flushing", self.client.framed().flush()).await??;
        let stream = self.client.framed().get_mut();
        within(WAIT, "writing raw bytes", stream.write_all(bytes))
            .await?
            .context("writing raw bytes")
    }

    /// Writes `bytes` in one `sendmsg` that also passes `fds` (SCM_RIGHTS).
    pub async fn write_with_fds(
        &mut self,
        bytes: &[u8],
        fds: &[std::os::fd::RawFd],
    ) -> anyhow::Result<()> {
        use nix::errno::Errno;
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
        within(WAIT, "flushing", self.client.framed().flush()).await??;
        let socket = self.client.as_raw_fd();
        let iov = [std::io::IoSlice::new(bytes)];
        let rights = [ControlMessage::ScmRights(fds)];
        let send = async {
            loop {
                match sendmsg::<()>(socket, &iov, &rights, MsgFlags::MSG_DONTWAIT, None) {
                    Err(Errno::EAGAIN) => tokio::time::sleep(Duration::from_millis(10)).await,
                    sent => return sent,
                }
            }
        };
        let sent = within(WAIT, "the socket to take bytes", send)
            .await?
            .context("sendmsg")?;
        ensure!(sent == bytes.len(), "sent {sent} of {} bytes", bytes.len());
        Ok(())
    }

    /// The next message, whatever it is; an error if the connection ends.
    pub async fn recv(&mut self) -> anyhow::Result<Envelope<AgentMessage>> {
        let next = self.client.framed().next();
        match within(WAIT, "a message from the agent", next).await? {
            Some(Ok(Ok(message))) => Ok(message),
            Some(Ok(Err(bad))) => bail!("undecodable message from the agent: {bad:?}"),
            Some(Err(err)) => Err(err).context("reading from the agent"),
            None => bail!("the agent closed the connection"),
        }
    }

    /// Reads until the reply to `id` (an error as `AgentMessage::Error`),
    /// setting events aside: `forcing` ones in [`RawClient::forcing`], what
    /// a forced acquire waits for, apart from the events a holder is told.
    pub async fn reply(&mut self, id: u64) -> anyhow::Result<AgentMessage> {
        self.reply_within(id, WAIT).await
    }

    /// [`RawClient::reply`], for a request the agent may take up to `limit`
    /// to answer (an acquire of hundreds of keys writes each in turn).
    pub async fn reply_within(&mut self, id: u64, limit: Duration) -> anyhow::Result<AgentMessage> {
        let reply = self.client.reply_within(id, limit);
        let reply = match within(limit.max(REPLY_WAIT), "the agent's reply", reply).await? {
            Ok(body) => body,
            Err(CallError::Agent(err)) => AgentMessage::Error(err),
            Err(gone @ CallError::Gone(_)) => return Err(gone.into()),
        };
        let (forcing, events): (VecDeque<_>, _) = std::mem::take(&mut self.client.events)
            .into_iter()
            .partition(|event| matches!(event, AgentMessage::Forcing { .. }));
        self.client.events = events;
        self.forcing.extend(forcing);
        Ok(reply)
    }

    /// Sends a request and waits for its reply.
    pub async fn call(&mut self, body: ClientMessage) -> anyhow::Result<AgentMessage> {
        self.call_within(WAIT, body).await
    }

    /// Sends a request and waits up to `limit` for its reply.
    pub async fn call_within(
        &mut self,
        limit: Duration,
        body: ClientMessage,
    ) -> anyhow::Result<AgentMessage> {
        let id = self.send(body).await?;
        self.reply_within(id, limit).await
    }

    /// Whether the agent's backend records `key` as held.
    pub async fn is_held(&mut self, key: &str) -> anyhow::Result<bool> {
        let inspect = ClientMessage::Inspect {
            key: key.to_string(),
        };
        match self.call(inspect).await? {
            AgentMessage::Record(record) => Ok(record.state == runlock_protocol::KeyState::Held),
            other => bail!("expected a record, got {other:?}"),
        }
    }

    /// The next event (a message without `id`).
    pub async fn next_event(&mut self) -> anyhow::Result<AgentMessage> {
        if let Some(event) = self.client.events.pop_front() {
            return Ok(event);
        }
        match self.recv().await? {
            Envelope { id: None, body } => Ok(body),
            other => bail!("expected an event, got {other:?}"),
        }
    }

    /// Succeeds once the agent has closed the connection (end of file, or a
    /// reset when the agent left bytes of ours unread); fails on any message.
    pub async fn expect_closed(&mut self) -> anyhow::Result<()> {
        let next = self.client.framed().next();
        match within(WAIT, "the agent to close the connection", next).await? {
            None => Ok(()),
            Some(Err(runlock_protocol::ProtocolError::Io(err)))
                if err.kind() == std::io::ErrorKind::ConnectionReset =>
            {
                Ok(())
            }
            Some(other) => bail!("expected the connection to close, got {other:?}"),
        }
    }
}

/// The one descriptor sent over `socket` (SCM_RIGHTS), already there.
fn receive_fd(socket: &std::os::unix::net::UnixStream) -> anyhow::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: byte.len(),
    };
    // Room for one descriptor's control message; u64s align it for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data, and all zeros is an empty one.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: the buffers msg points to live across the call, with their true lengths.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    ensure!(n >= 0, "recvmsg: {}", std::io::Error::last_os_error());
    // SAFETY: msg was filled in by recvmsg; the header, if any, lies in `control`.
    let header = unsafe { libc::CMSG_FIRSTHDR(&msg).as_ref() };
    let rights =
        header.filter(|h| h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS);
    let header = rights.context("no descriptor came with the message")?;
    // SAFETY: an SCM_RIGHTS message holds at least one int, maybe unaligned.
    let fd = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>()) };
    // SAFETY: the kernel installed this descriptor for us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
