//! The shim's exit codes (DESIGN's shim contract; the README carries the same table).

use runlock_protocol::ErrorCode;
use std::process::ExitCode;

/// A usage error: bad flags, or an invalid key.
pub const EXIT_USAGE: u8 = 64;
/// The agent or the backend is unavailable.
pub const EXIT_UNAVAILABLE: u8 = 69;
/// Something failed inside the agent or the shim.
pub const EXIT_SOFTWARE: u8 = 70;
/// The key is held and was not acquired within `--wait`.
pub const EXIT_HELD: u8 = 75;
/// The lease was lost while the command ran.
pub const EXIT_LEASE_LOST: u8 = 76;
/// The caller may not do this (force or release another's lock).
pub const EXIT_FORBIDDEN: u8 = 77;
/// The command exists but cannot be run (as shells do).
pub const EXIT_CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as shells do).
pub const EXIT_NOT_FOUND: u8 = 127;

/// The status of a command ended by signal `signal`, as shells report it:
/// 128 + N (the shim ends so too when a signal stops it before the command starts).
pub fn for_signal(signal: i32) -> u8 {
    128 + signal as u8
}

/// The exit code for an error the agent sent.
pub fn for_error(code: ErrorCode) -> u8 {
    match code {
        ErrorCode::Held | ErrorCode::Timeout => EXIT_HELD,
        ErrorCode::Unavailable => EXIT_UNAVAILABLE,
        ErrorCode::InvalidKey | ErrorCode::BadRequest | ErrorCode::SlotsMismatch => EXIT_USAGE,
        ErrorCode::Forbidden | ErrorCode::NotOwner => EXIT_FORBIDDEN,
        ErrorCode::Unsupported
        | ErrorCode::UnsupportedVersion
        | ErrorCode::Internal
        | ErrorCode::Unknown => EXIT_SOFTWARE,
    }
}

/// A failure that ends the shim with a message and an exit code.
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: u8,
    /// What to print on stderr (already formatted; may span lines).
    pub message: String,
}

impl Failure {
    pub fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }

    pub fn report(self) -> ExitCode {
        eprintln!("runlock: {}", self.message);
        ExitCode::from(self.code)
    }
}
