//! The command line, as DESIGN's shim contract writes it.

use clap::{Parser, Subcommand, ValueEnum};
use runlock_protocol::MAX_SLOTS;
use std::path::PathBuf;
use std::time::Duration;

/// runlock: run a command only while holding a lock that runlockd keeps for it.
#[derive(Debug, Parser)]
#[command(name = "runlock", version, about, after_help = crate::exit::help(true))]
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
    #[command(after_help = crate::exit::help(true))]
    Run(RunArgs),
    /// Show the leases held through this host's agent
    #[command(after_help = crate::exit::help(false))]
    Status {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// List the keys held in the store, from every host that shares it
    #[command(after_help = crate::exit::help(false))]
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
    #[command(after_help = crate::exit::help(false))]
    Inspect {
        /// The key
        key: String,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Show the latest grants, releases, forces, breaks, expiries and losses of KEY
    #[command(after_help = crate::exit::help(false))]
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
    #[command(after_help = crate::exit::help(false))]
    Ui {
        /// Where to serve: a loopback address only (127.0.0.1:PORT or [::1]:PORT)
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
    },
    /// Break the lease on KEY, whoever holds it (root and the agent's user only)
    #[command(after_help = crate::exit::help(false))]
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
    /// Wait up to DUR for held keys instead of failing at once: seconds as
    /// flock's -w takes them (5, 0.5), a duration (30s, 10m), or `infinity`
    /// to wait as long as it takes
    #[arg(long, value_name = "DUR", value_parser = parse_wait, default_value = "0")]
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

/// The wait that has no bound: the longest the protocol carries (some 584
/// million years), so that an agent of any version waits it as it is.
pub const WAIT_FOREVER: Duration = Duration::from_millis(u64::MAX);

/// `--wait`: plain seconds as flock(1)'s `-w` (`5`, `0.5`), a duration as
/// `--ttl` takes (`30s`, `10m`), or `infinity` (systemd's word for a time
/// span without end; `inf` too, as a float reads it).
fn parse_wait(text: &str) -> Result<Duration, String> {
    let seconds = match text.trim().parse::<f64>() {
        Ok(seconds) => seconds,
        Err(_) => return parse_duration(text),
    };
    if seconds == f64::INFINITY {
        return Ok(WAIT_FOREVER);
    }
    if seconds.is_nan() || seconds < 0.0 {
        return Err("a wait is 0 or more seconds, or infinity".to_string());
    }
    // Whole milliseconds, as the wire counts them; past its range it is refused.
    let millis = (seconds * 1000.0).round();
    if millis >= u64::MAX as f64 {
        return Err(format!(
            "too long: the protocol carries at most {}ms (write infinity to wait without bound)",
            u64::MAX
        ));
    }
    Ok(Duration::from_millis(millis as u64))
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
    fn a_wait_is_seconds_as_flock_takes_them_a_duration_or_infinity() {
        for (text, want) in [
            ("5", Duration::from_secs(5)),
            ("0.5", Duration::from_millis(500)),
            ("0", Duration::ZERO),
            ("5s", Duration::from_secs(5)),
            ("2m", Duration::from_secs(120)),
            ("1500ms", Duration::from_millis(1500)),
            ("infinity", WAIT_FOREVER),
            ("inf", WAIT_FOREVER),
        ] {
            assert_eq!(parse_wait(text), Ok(want), "{text}");
        }
        for bad in ["-1", "NaN", "-inf", "1e30", "soon", "5 parsecs"] {
            assert!(parse_wait(bad).is_err(), "{bad} accepted");
        }
    }

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
