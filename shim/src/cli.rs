//! The command line, as DESIGN's shim contract writes it.

use clap::{Parser, Subcommand, ValueEnum};
use runlock_protocol::MAX_SLOTS;
use std::path::PathBuf;
use std::time::Duration;

/// runlock: run a command only while holding a lock that runlockd keeps for it.
#[derive(Debug, Parser)]
#[command(name = "runlock", version, about)]
pub struct Cli {
    /// Agent socket [default: $RUNLOCK_SOCKET, else /run/runlock/agent.sock for
    /// root, else $XDG_RUNTIME_DIR/runlock/agent.sock]
    #[arg(long, global = true, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run COMMAND while holding every --key; the lock ends when the run's last process exits
    Run(RunArgs),
    /// Show the leases held through this host's agent
    Status {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// List the keys held in the store, from every host that shares it
    List {
        /// Only keys that start with this
        #[arg(value_name = "PREFIX", default_value = "")]
        prefix: String,
        /// Free keys too (released, expired), with their last incident
        #[arg(long)]
        all: bool,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Show a key's record in the backend: free or held, holder, token, expiry
    Inspect {
        /// The key
        key: String,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Show the latest grants, releases, forces, breaks, expiries and losses of KEY
    History {
        /// The key
        key: String,
        /// Show at most the latest N events (the record keeps 32)
        #[arg(long, value_name = "N", default_value_t = 32)]
        limit: u32,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Serve a live page of the fleet on 127.0.0.1: keys held now, with their
    /// holders and waiters, and each key's runs over the last 24 hours
    ///
    /// The page reads the store through this host's agent, with your rights,
    /// as `runlock list` does, and updates itself every few seconds. Its
    /// address carries a secret token (other users on this host can reach a
    /// loopback port): open the address printed, as it is. When the agent or
    /// this server stops answering, the page says since when its data is stale.
    Ui {
        /// Where to serve: a loopback address only (127.0.0.1:PORT or [::1]:PORT)
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
    },
    /// Break the lease on KEY, whoever holds it (root and the agent's user only)
    Release {
        /// The key
        key: String,
        /// Of a key with slots, the slot to break (0-based, as RUNLOCK_SLOT
        /// and `inspect` number them) [default: 0, the key's own record]
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..i64::from(MAX_SLOTS)))]
        slot: Option<u32>,
    },
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// A key to hold (repeat for several; they are taken all or nothing)
    #[arg(
        long = "key",
        short = 'k',
        value_name = "KEY",
        required_unless_present = "meltano"
    )]
    pub keys: Vec<String>,
    /// Also hold the state ID of every extract-load block of COMMAND, a
    /// `meltano run` (or `meltano el`/`elt --state-id`), derived as Meltano
    /// derives it from the project, its .env and the environment; its
    /// --force/-f (or MELTANO_RUN_FORCE) becomes runlock's --force
    #[arg(long)]
    pub meltano: bool,
    /// With --meltano: print the keys, one a line, and exit without running
    /// COMMAND or asking the agent
    #[arg(long, requires = "meltano")]
    pub print_keys: bool,
    /// Wait up to DUR for held keys (e.g. 30s, 10m) instead of failing at once
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "0s")]
    pub wait: Duration,
    /// Lease time to live [default: the agent's]
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub ttl: Option<Duration>,
    /// Let up to N runs hold each key at once, across every host sharing the
    /// backend (1 to 64); every holder of a key must ask the same N
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SLOTS))
    )]
    pub slots: u32,
    /// Take the keys over from their holders, who are stopped and exit 76
    /// (of a key with slots: one slot, a free one if any, else the oldest holder's)
    #[arg(long)]
    pub force: bool,
    /// What to do to the command if its lease is lost
    #[arg(long, value_enum, default_value = "term")]
    pub on_lost: OnLostArg,
    /// The command and its arguments
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnLostArg {
    /// SIGTERM to the command's process group, SIGKILL 5 s (or TTL/6) later
    Term,
    /// SIGKILL to the command's process group
    Kill,
    /// Let it run (the exit status is still 76)
    Ignore,
}

impl From<OnLostArg> for runlock_protocol::OnLost {
    fn from(arg: OnLostArg) -> Self {
        match arg {
            OnLostArg::Term => runlock_protocol::OnLost::Term,
            OnLostArg::Kill => runlock_protocol::OnLost::Kill,
            OnLostArg::Ignore => runlock_protocol::OnLost::Ignore,
        }
    }
}

/// A duration the protocol can carry: whole milliseconds in a u64 (a longer
/// one is refused here, so that it cannot wrap to a short one on the wire).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text)
        .map_err(|e| format!("{e} (write durations like 500ms, 30s, 10m)"))?;
    match u64::try_from(duration.as_millis()) {
        Ok(_) => Ok(duration),
        Err(_) => Err(format!(
            "too long: the protocol carries at most {}ms",
            u64::MAX
        )),
    }
}

/// A parsed duration in the wire's milliseconds.
pub fn millis(duration: Duration) -> u64 {
    // invariant: parse_duration refused every duration whose milliseconds overflow
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_the_wire_cannot_carry_is_refused_not_wrapped() {
        let max = Duration::from_millis(u64::MAX);
        assert_eq!(
            parse_duration(&humantime::format_duration(max).to_string()),
            Ok(max)
        );
        let over = parse_duration("584542046years 33days 2h 26min 21s 616ms");
        assert!(over.is_err_and(|why| why.contains("too long")));
    }
}
