//! What can go wrong talking to the agent. The text of each error is worded
//! for people and safe to print: what the agent supplied is escaped.

use runlock_protocol::{ErrorCode, ProtocolError, WireError};
use std::fmt;

/// What a request can come back with, besides its reply.
#[derive(Debug)]
pub enum CallError {
    /// The agent answered with an error.
    Agent(WireError),
    /// The connection failed or closed, or the agent stayed silent too long.
    Gone(String),
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Agent(err) => f.write_str(&crate::escape(&err.message)),
            CallError::Gone(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for CallError {}

/// Why there is no connection to the agent.
#[derive(Debug)]
pub enum ConnectError {
    /// No agent answered: none listens there, the connection failed, or it
    /// stayed silent past [`ANSWER_TIMEOUT`](crate::ANSWER_TIMEOUT). Only
    /// this one may be a reason to go on without a lock.
    Unreachable(String),
    /// An agent answered `hello` with an error (at its limits, or not
    /// speaking our version). It was reached and said no, so this is never a
    /// reason to run without a lock: otherwise any member of the socket group
    /// could unlock other users' runs by filling the agent's connection limits.
    Refused {
        /// The agent's error code.
        code: ErrorCode,
        /// What to tell the user.
        message: String,
    },
    /// An agent answered `hello` with nonsense: a message that does not
    /// decode, or one that is neither `welcome` nor `error`.
    Garbled(String),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::Unreachable(why)
            | ConnectError::Refused { message: why, .. }
            | ConnectError::Garbled(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for ConnectError {}

/// A failed read or write, in words.
pub(crate) fn describe(err: &ProtocolError) -> String {
    match err {
        ProtocolError::Io(io) => format!("connection to the agent failed: {io}"),
        other => other.to_string(),
    }
}

/// The agent announced more lock descriptors with `acquired` than arrived.
#[derive(Debug)]
pub struct MissingLocks {
    /// How many `acquired` announced.
    pub announced: usize,
    /// How many came.
    pub arrived: usize,
}

impl fmt::Display for MissingLocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the agent announced {} lock descriptors but {} arrived",
            self.announced, self.arrived
        )
    }
}

impl std::error::Error for MissingLocks {}
