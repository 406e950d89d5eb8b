//! A Rust client of `runlockd`, the per-host lock agent: take a lock from a
//! Rust program instead of wrapping a command in `runlock run`. The `runlock`
//! shim itself and the integration tests are built on it.
//!
//! A [`Client`] is one connection to the agent's Unix socket. It says
//! `hello`, numbers requests and matches each reply to its request, and keeps
//! the events that arrive meanwhile. The messages are [`runlock_protocol`]'s,
//! re-exported as [`protocol`]; its `SPEC.md` says what each one means.
//!
//! # Connecting
//!
//! [`protocol::socket_path::resolve`] finds the socket as the shim does
//! (`RUNLOCK_SOCKET`, else root's `/run/runlock/agent.sock` or
//! `$XDG_RUNTIME_DIR/runlock/agent.sock`). [`Client::connect`] connects and
//! says `hello` within [`ANSWER_TIMEOUT`]. A [`ConnectError::Unreachable`]
//! means no agent answered; [`ConnectError::Refused`] means an agent answered
//! and said no, so it is never a reason to go on without the lock.
//!
//! # Holding a key
//!
//! An `acquire` ([`protocol::AcquireRequest`]) takes every key it names, in
//! sorted order, or none. It can wait (`wait_ms`), take one of a key's slots
//! (`slots`), or take the key over from its holder (`force`). The agent
//! answers `acquired` with one [`protocol::Lease`] per key, and renews the
//! leases while the connection stays open. Release them with a `release`
//! ([`protocol::ReleaseRequest::leases`]). A lease lasts as long as its
//! connection: dropping the [`Client`], or the process dying, frees its keys
//! at once.
//!
//! ```no_run
//! use runlock_client::protocol::{socket_path, AcquireRequest, AgentMessage};
//! use runlock_client::protocol::{ClientMessage, ErrorCode, ReleaseRequest};
//! use runlock_client::{CallError, Client, ClientInfo};
//!
//! # async fn nightly_backup() -> Result<(), Box<dyn std::error::Error>> {
//! let socket = socket_path::resolve(None, None)?;
//! let info = ClientInfo { name: "backup 1.0".into(), takes_locks: false };
//! let mut client = Client::connect(&socket, &info).await?;
//! let mut request = AcquireRequest::new(["backup:nightly"]);
//! request.wait_ms = 30_000;
//! match client.call(ClientMessage::Acquire(request)).await {
//!     Ok(AgentMessage::Acquired { leases, .. }) => {
//!         // ... the work the lock protects, fenced by leases[0].token ...
//!         let lease_ids = leases.into_iter().map(|lease| lease.lease_id);
//!         let release = ReleaseRequest::leases(lease_ids);
//!         client.call(ClientMessage::Release(release)).await?;
//!     }
//!     Ok(other) => eprintln!("unexpected reply: {other:?}"),
//!     Err(CallError::Agent(refused)) if refused.code == ErrorCode::Timeout => {
//!         eprintln!("still held after 30 s: {}", runlock_client::escape(&refused.message))
//!     }
//!     Err(err) => return Err(err.into()),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! `examples/hold.rs` is the same as a program.
//!
//! # The fencing token
//!
//! Each lease has a `token`, a number that grows every time the key is
//! granted: hand it to whatever the lock protects and have that refuse
//! writes with a token lower than one it has seen, so that a holder that
//! lost its lease without knowing (paused, partitioned) cannot overwrite its
//! successor's work. A key's slots count their tokens apart: compare a token
//! only with those of its own slot (`Lease::slot`).
//!
//! # Events
//!
//! Between requests, a [`Client`] is a [`futures::Stream`] of what the agent
//! sends unasked ([`Incoming`]). An event has no request id. `lost` says a
//! lease is gone (forced, broken, expired): stop the work it protects at once.
//! `renewed` says how long a lease stays guaranteed without the agent, and
//! comes only where leases outlive the agent. `forcing` says a forced acquire
//! or a break waits for the run it displaces. `restarting` says the agent is
//! stopping. Events that arrived while a reply was awaited wait in
//! [`Client::events`], and the stream yields them first.
//!
//! ```no_run
//! use futures::StreamExt;
//! use runlock_client::protocol::AgentMessage;
//! use runlock_client::{Client, Incoming};
//!
//! /// Until a lease is lost or the connection ends: the work should stop.
//! async fn until_lost(client: &mut Client) -> String {
//!     while let Some(incoming) = client.next().await {
//!         match incoming {
//!             Ok(Incoming::Event(AgentMessage::Lost { key, message, .. })) => {
//!                 return format!("lost {key:?}: {message}");
//!             }
//!             Ok(_) => {} // a renewal, a late reply, ...
//!             Err(gone) => return gone.to_string(),
//!         }
//!     }
//!     "the agent closed the connection".into()
//! }
//! ```
//!
//! # Errors
//!
//! A request fails with [`CallError::Agent`] when the agent refused it. The
//! refusal is a [`protocol::WireError`], whose `code` is API: for example
//! `held`, `timeout` after a wait, `forbidden`, or `unavailable` when the
//! store cannot be reached. It also names the key's holder where one is
//! known. A request fails with [`CallError::Gone`] when the connection
//! failed or the agent stayed silent. Every error's `Display` is worded for
//! people and safe to print: text that peers supplied (keys, commands,
//! hosts) is escaped ([`escape`]). Print a `WireError`'s own fields through
//! [`escape`] too.
//!
//! ```
//! use runlock_client::protocol::{AcquireRequest, ClientMessage, OnLost};
//!
//! // An acquire of two keys that waits up to a minute, and kills the run
//! // the agent was told of should a lease be lost once this client is gone.
//! let mut request = AcquireRequest::new(["dev:a", "dev:b"]);
//! request.wait_ms = 60_000;
//! request.on_lost = OnLost::Kill;
//! assert_eq!(request.slots, 1);
//! assert_eq!(request.ttl_ms, None); // the agent's default TTL
//! let _ = ClientMessage::Acquire(request);
//!
//! // What a peer wrote cannot give a terminal orders.
//! assert_eq!(runlock_client::escape("etl\u{1b}[31m"), "etl\\x1b[31m");
//! ```
#![deny(missing_docs)]

mod client;
mod error;
mod escape;
mod fd_stream;

pub use client::{Client, ClientInfo, Incoming, ANSWER_TIMEOUT, BACKEND_ANSWER_TIMEOUT};
pub use error::{CallError, ConnectError, MissingLocks};
pub use escape::escape;
pub use fd_stream::FdStream;
pub use runlock_protocol as protocol;
