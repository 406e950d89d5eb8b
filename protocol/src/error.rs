//! Error codes on the wire, and the local errors of speaking the protocol.

use crate::types::Holder;
use serde::{Deserialize, Serialize};

/// The `code` of an `error` message. Codes are API; messages are for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The key is held by someone else; `holder` says who.
    Held,
    /// The key stayed held for the whole `wait_ms`; `holder` says who.
    Timeout,
    /// The backend cannot be reached or refused us.
    Unavailable,
    /// A key breaks the key rules; the message names the rule.
    InvalidKey,
    /// The lease is not held by this connection.
    NotOwner,
    /// The peer may not do this (force, or release another's lease).
    Forbidden,
    /// The message `type` is unknown to this agent, or the backend cannot do it.
    Unsupported,
    /// `hello` asked for a protocol version this agent does not speak.
    UnsupportedVersion,
    /// The message could not be decoded or breaks the protocol.
    BadRequest,
    /// The agent failed; details are in its log.
    Internal,
    /// The key is held with another number of slots than asked; `holders` says who.
    SlotsMismatch,
    /// A code this build does not know.
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Held => "held",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::InvalidKey => "invalid_key",
            ErrorCode::NotOwner => "not_owner",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Internal => "internal",
            ErrorCode::SlotsMismatch => "slots_mismatch",
            ErrorCode::Unknown => "unknown",
        }
    }
}

/// The body of an `error` message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct WireError {
    /// What went wrong, for programs.
    pub code: ErrorCode,
    /// What went wrong, for people.
    pub message: String,
    /// The key the error is about, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Who holds the key, with `held` and `timeout` (boxed: errors stay small).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Box<Holder>>,
    /// For a key with slots: the holder of every held slot (`held`,
    /// `timeout`, `slots_mismatch`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<Holder>,
}

impl WireError {
    /// An error with no key and no holder.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> WireError {
        WireError {
            code,
            message: message.into(),
            key: None,
            holder: None,
            holders: Vec::new(),
        }
    }
}

/// What can go wrong speaking the protocol, on either side.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The socket failed.
    #[error("socket error")]
    Io(#[from] std::io::Error),
    /// A message could not be encoded.
    #[error("cannot encode message")]
    Encode(#[from] rmp_serde::encode::Error),
    /// A frame is larger than [`crate::MAX_FRAME_LEN`]; the stream cannot resync.
    #[error("frame of {0} bytes exceeds the {max} byte limit", max = crate::MAX_FRAME_LEN)]
    FrameTooLarge(usize),
}
