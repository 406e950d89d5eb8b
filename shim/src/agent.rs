//! The agent as the shim talks to it: connections that introduce themselves
//! as `runlock` and tell the user of forced takeovers, and the agent's
//! answers worded as the shim's failures.

use crate::exit::{self, Failure};
use runlock_client::{escape, CallError, Client, ClientInfo, ConnectError};
use runlock_protocol::{AgentMessage, ClientMessage, ErrorCode, Holder, WireError};
use std::path::Path;

/// Connects to the agent at `socket` and says hello.
pub async fn connect(socket: &Path) -> Result<Client, Failure> {
    let mut client = Client::connect(socket, &info())
        .await
        .map_err(connect_failure)?;
    client.on_forcing(tell_forcing);
    Ok(client)
}

/// Like [`connect`], with `first` sent right behind hello; returns its id.
pub async fn connect_asking(
    socket: &Path,
    first: ClientMessage,
) -> Result<(Client, u64), ConnectError> {
    let (mut client, id) = Client::connect_asking(socket, &info(), first).await?;
    client.on_forcing(tell_forcing);
    Ok((client, id))
}

/// The shim takes the locks of a `file://` store for the commands it runs.
fn info() -> ClientInfo {
    ClientInfo {
        name: concat!("runlock ", env!("CARGO_PKG_VERSION")).to_string(),
        takes_locks: true,
    }
}

fn tell_forcing(key: &str, holder: Option<&Holder>, wait_ms: Option<u64>) {
    eprintln!("runlock: {}", forcing_notice(key, holder, wait_ms));
}

/// A failed connection as the shim's failure: unavailable only when no agent answered.
pub fn connect_failure(err: ConnectError) -> Failure {
    match err {
        ConnectError::Unreachable(why) => Failure::new(exit::EXIT_UNAVAILABLE, why),
        ConnectError::Refused { code, message } => Failure::new(exit::for_error(code), message),
        ConnectError::Garbled(why) => Failure::new(exit::EXIT_SOFTWARE, why),
    }
}

/// A failed request (`what`) as the shim's failure.
pub fn call_failure(err: CallError, what: &str) -> Failure {
    match err {
        CallError::Agent(err) => Failure::new(exit::for_error(err.code), escape(&err.message)),
        CallError::Gone(why) => Failure::new(exit::EXIT_UNAVAILABLE, format!("{what}: {why}")),
    }
}

/// What the shim says while a forced acquire waits for the run it displaces.
pub fn forcing_notice(key: &str, holder: Option<&Holder>, wait_ms: Option<u64>) -> String {
    let whose = holder.map_or_else(|| "the run it was held by".to_string(), run_of);
    let how_long = match wait_ms {
        Some(ms) => format!("at most {}s", ms.div_ceil(1000)),
        // file://: a kernel lock has no deadline, only an end.
        None => "no deadline, as it holds its own lock (it is stopped once its shim \
                 reaches an agent)"
            .to_string(),
    };
    format!(
        "{:?} is taken over; waiting for {whose} to stop: {how_long}",
        escape(key),
    )
}

/// A holder in one phrase, as the shim's notices name it:
/// `the run of etl@runner-01 (pid 4242, token 7)`.
pub fn run_of(h: &Holder) -> String {
    format!(
        "the run of {}@{} (pid {}, token {})",
        escape(&h.user),
        escape(&h.host),
        h.pid,
        h.token
    )
}

/// An unexpected reply type, as a failure.
pub fn unexpected(what: &str, got: &AgentMessage) -> Failure {
    let got = format!("{got:?}");
    Failure::new(
        exit::EXIT_SOFTWARE,
        format!("unexpected reply to {what}: {}", escape(&got)),
    )
}

/// `held`, `timeout` and `slots_mismatch` failures print who holds the key:
/// for a key with slots, every held slot's holder.
pub fn describe_wire_error(err: &WireError) -> String {
    let mut text = escape(&err.message).into_owned();
    if !matches!(
        err.code,
        ErrorCode::Held | ErrorCode::Timeout | ErrorCode::SlotsMismatch
    ) {
        return text;
    }
    let holders = match (&err.holders[..], &err.holder) {
        ([], Some(holder)) => std::slice::from_ref(&**holder),
        (holders, _) => holders,
    };
    for h in holders {
        let indent = match (h.slot, h.slots) {
            (Some(slot), Some(slots)) => {
                text.push_str(&format!("\n  slot {slot} (of {slots}):"));
                "    "
            }
            (Some(slot), None) => {
                text.push_str(&format!("\n  slot {slot}:"));
                "    "
            }
            (None, _) => "  ",
        };
        text.push_str(&holder_lines(h, indent));
    }
    text
}

/// A holder's fields, each on a line of its own starting with `indent`,
/// every peer-supplied string escaped.
fn holder_lines(h: &Holder, indent: &str) -> String {
    format!(
        "\n{indent}host:    {}\n{indent}pid:     {}\n{indent}user:    {} (uid {})\n{indent}command: {}\n{indent}since:   {}\n{indent}token:   {}",
        escape(&h.host),
        h.pid,
        escape(&h.user),
        h.uid,
        escape(&h.command),
        crate::format::since(h.acquired_at_ms),
        h.token
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// etl@runner-01's run, for the notices' tests.
    pub(crate) fn holder(slot: Option<u32>, pid: u32, token: u64) -> Holder {
        Holder {
            host: "runner-01".into(),
            agent_id: "a".into(),
            pid,
            uid: 1000,
            gid: 1000,
            user: "etl".into(),
            command: "load".into(),
            acquired_at_ms: 0,
            token,
            slot,
            slots: slot.map(|_| 3),
        }
    }

    #[test]
    fn a_refusal_of_a_key_with_slots_names_every_slot_s_holder() {
        let mut err = WireError::new(ErrorCode::Held, "held");
        err.holder = Some(Box::new(holder(Some(0), 10, 4)));
        err.holders = vec![holder(Some(0), 10, 4), holder(Some(2), 12, 7)];
        let text = describe_wire_error(&err);
        for want in [
            "\n  slot 0 (of 3):\n    host:    runner-01\n    pid:     10",
            "    token:   4",
            "\n  slot 2 (of 3):",
            "    pid:     12",
            "    token:   7",
        ] {
            assert!(text.contains(want), "{want:?} not in {text}");
        }
    }

    #[test]
    fn a_refusal_of_a_plain_key_names_its_holder_as_before() {
        let mut err = WireError::new(ErrorCode::Timeout, "held");
        err.holder = Some(Box::new(holder(None, 10, 4)));
        let text = describe_wire_error(&err);
        assert!(text.starts_with("held\n  host:    runner-01\n  pid:     10\n"));
        assert!(!text.contains("slot"));
    }
}
