//! runlock's wire protocol, shared by the agent (`runlockd`), the shim (`runlock`)
//! and the tests. `SPEC.md` beside this crate is the normative description that
//! clients in other languages are written from; this crate implements it.
#![deny(missing_docs)]

pub mod codec;
pub mod error;
pub mod message;
pub mod procfs;
pub mod socket_path;
pub mod strict;
pub mod tcp_peers;
pub mod timing;
pub mod types;

pub use codec::{AgentCodec, BodyError, MessageCodec, ShimCodec};
pub use error::{ErrorCode, ProtocolError, WireError};
pub use message::{
    AcquireRequest, AgentMessage, ClientMessage, Envelope, ListKeysRequest, ReleaseRequest,
};
pub use types::{
    is_invisible, Clock, EventKind, Holder, InvalidKey, Key, KeyEvent, KeyListing, KeyRecord,
    KeyState, Lease, LeaseInfo, LostReason, OnLost, OnUnavailable, Refusal, Scope, Waiter,
    LAST_RFC3339_MS, MAX_LISTED_REFUSALS, MAX_LISTED_WAITERS, MAX_SLOTS,
};

/// The protocol version this build speaks; see SPEC.md for when it changes.
pub const PROTOCOL_VERSION: u16 = 1;

/// The largest frame body either side sends or accepts (SPEC.md: bodies over 1 MiB are refused).
pub const MAX_FRAME_LEN: usize = 1 << 20;

/// The longest holder command line the agent records or shows, in bytes; a
/// longer one is cut with a marker, so that every reply fits a frame.
pub const MAX_COMMAND_LEN: usize = 4096;

/// The most keys one `acquire`, or leases one `reattach`, may name: the
/// reply (up to 512 bytes of key and a lease id each) then fits a frame.
pub const MAX_KEYS_PER_REQUEST: usize = 1000;
/// The most events a key's history keeps, and so the most `history` returns:
/// the record carries them, so this bounds its size (SPEC 8.8).
pub const MAX_HISTORY_EVENTS: usize = 32;
/// The most keys one `keys` reply lists; fewer when their records fill the frame.
pub const MAX_KEYS_PER_PAGE: usize = 1000;
/// The `reason` of a `released` event whose lease's client went away
/// without releasing it (killed, or crashed), as its agent saw it (SPEC 7.6).
pub const REASON_CLIENT_GONE: &str = "client gone";
/// Lock descriptors passed with one `sendmsg` (SPEC 5.4; the kernel takes 253).
pub const MAX_LOCKS_PER_MESSAGE: usize = 250;
