//! A Rust client of `runlockd`, the per-host lock agent: it connects to the
//! agent's Unix socket, says `hello`, numbers requests and matches replies to
//! them, and keeps the events (`lost`, `renewed`, `restarting`) that arrive
//! meanwhile. The messages themselves are [`runlock_protocol`]'s, re-exported
//! as [`protocol`]; its `SPEC.md` says what each one means. The `runlock`
//! shim and the tests use this crate.
//!
//! ```no_run
//! use runlock_client::protocol::{socket_path, AcquireRequest, AgentMessage, ClientMessage};
//! use runlock_client::protocol::ReleaseRequest;
//! use runlock_client::{Client, ClientInfo, CallError};
//!
//! # async fn nightly_backup() -> Result<(), Box<dyn std::error::Error>> {
//! let socket = socket_path::resolve(None, None)?;
//! let info = ClientInfo { name: "backup 1.0".into(), takes_locks: false };
//! let mut client = Client::connect(&socket, &info).await?;
//! let acquire = ClientMessage::Acquire(AcquireRequest::new(["backup:nightly"]));
//! match client.call(acquire).await {
//!     Ok(AgentMessage::Acquired { leases, .. }) => {
//!         // ... the work the lock protects; read the client (a Stream) for `lost` ...
//!         let lease_ids = leases.into_iter().map(|lease| lease.lease_id);
//!         client.call(ClientMessage::Release(ReleaseRequest::leases(lease_ids))).await?;
//!     }
//!     Ok(other) => eprintln!("unexpected reply: {other:?}"),
//!     Err(CallError::Agent(refused)) => eprintln!("not acquired: {}", refused.message),
//!     Err(gone) => return Err(gone.into()),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! A lease lasts as long as its connection: dropping the [`Client`] releases
//! whatever it holds.
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
