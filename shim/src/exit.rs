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

/// One exit status as `--help` and the man pages list it.
pub struct Documented {
    /// The status, as written: `75`, `128+N`.
    pub status: &'static str,
    /// What it means, in a line.
    pub meaning: &'static str,
    /// Whether only `runlock run` exits so (a command of its own, a wait, a lease).
    pub run_only: bool,
}

/// Every status the shim exits with besides 0 (DESIGN's shim contract; the
/// README's table says the same at more length).
pub const DOCUMENTED: &[Documented] = &[
    Documented {
        status: "128+N",
        meaning: "the command was killed by signal N",
        run_only: true,
    },
    Documented {
        status: "64",
        meaning: "usage error, or an invalid key",
        run_only: false,
    },
    Documented {
        status: "69",
        meaning: "the agent or its backend cannot be reached (on_unavailable = fail)",
        run_only: false,
    },
    Documented {
        status: "70",
        meaning: "the agent or the shim failed internally",
        run_only: false,
    },
    Documented {
        status: "75",
        meaning: "the key is held, and was not acquired within --wait",
        run_only: true,
    },
    Documented {
        status: "76",
        meaning: "the lease was lost while the command ran",
        run_only: true,
    },
    Documented {
        status: "77",
        meaning: "not allowed: --force or release without force rights",
        run_only: false,
    },
    Documented {
        status: "126",
        meaning: "the command cannot be run",
        run_only: true,
    },
    Documented {
        status: "127",
        meaning: "the command was not found",
        run_only: true,
    },
];

/// What `runlock run` exits with when its command ran, before the table.
pub const COMMAND_STATUS: &str =
    "runlock run exits with the command's own status when the command ran; else with one of these.";

/// The statuses a command may exit with: `run` (and the shim as a whole)
/// every one, the other commands those that are not `run`'s alone.
pub fn statuses(run: bool) -> impl Iterator<Item = &'static Documented> {
    DOCUMENTED.iter().filter(move |d| run || !d.run_only)
}

/// The exit statuses, for the end of `--help`.
pub fn help(run: bool) -> String {
    let mut text = String::from("Exit status:\n");
    if run {
        text.push_str(&format!("  {COMMAND_STATUS}\n"));
    } else {
        text.push_str("  0 on success; else one of these.\n");
    }
    for d in statuses(run) {
        text.push_str(&format!("  {:<6} {}\n", d.status, d.meaning));
    }
    text
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_statuses_are_every_code_the_shim_exits_with() {
        let documented: Vec<&str> = DOCUMENTED.iter().map(|d| d.status).collect();
        for code in [
            EXIT_USAGE,
            EXIT_UNAVAILABLE,
            EXIT_SOFTWARE,
            EXIT_HELD,
            EXIT_LEASE_LOST,
            EXIT_FORBIDDEN,
            EXIT_CANNOT_EXECUTE,
            EXIT_NOT_FOUND,
        ] {
            assert!(documented.contains(&code.to_string().as_str()), "{code}");
        }
        assert!(!help(false).contains("75"));
        assert!(help(true).contains("75     the key is held"));
    }
}
