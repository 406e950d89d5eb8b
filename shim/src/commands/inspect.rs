//! `runlock inspect KEY [--json]`: the backend's record of one key.

use crate::agent::{self, unexpected};
use crate::exit::Failure;
use crate::format;
use runlock_client::escape;
use runlock_client::BACKEND_ANSWER_TIMEOUT;
use runlock_protocol::{AgentMessage, ClientMessage, Holder, KeyState, Scope};
use std::path::Path;
use std::process::ExitCode;

/// A holder as the JSON outputs print it: the instant as RFC 3339; `slot`
/// and `slots` only for a key with slots.
pub fn holder_json(h: &Holder) -> serde_json::Value {
    let mut value = serde_json::json!({
        "host": h.host,
        "agent_id": h.agent_id,
        "pid": h.pid,
        "uid": h.uid,
        "gid": h.gid,
        "user": h.user,
        "command": h.command,
        "acquired_at": format::rfc3339(h.acquired_at_ms),
        "token": h.token,
    });
    for (name, n) in [("slot", h.slot), ("slots", h.slots)] {
        if let Some(n) = n {
            value[name] = n.into();
        }
    }
    value
}

/// A holder's lines in `inspect`'s text, each starting with `indent`.
fn print_holder(h: &Holder, indent: &str) {
    println!("{indent}host:    {}", escape(&h.host));
    println!("{indent}agent:   {}", escape(&h.agent_id));
    println!("{indent}pid:     {}", h.pid);
    println!("{indent}user:    {} (uid {})", escape(&h.user), h.uid);
    println!("{indent}command: {}", escape(&h.command));
    println!("{indent}since:   {}", format::since(h.acquired_at_ms));
}

fn state_name(state: KeyState) -> &'static str {
    match state {
        KeyState::Free => "free",
        KeyState::Held => "held",
        KeyState::Unknown => "unknown",
    }
}

pub async fn run(socket: &Path, key: &str, json: bool) -> Result<ExitCode, Failure> {
    super::valid_key(key)?;
    let mut client = agent::connect(socket).await?;
    let request = ClientMessage::Inspect {
        key: key.to_string(),
    };
    let record = match client.call_within(BACKEND_ANSWER_TIMEOUT, request).await {
        Ok(AgentMessage::Record(record)) => record,
        Ok(other) => return Err(unexpected("inspect", &other)),
        Err(err) => return Err(agent::call_failure(err, "inspecting")),
    };
    let scope = match record.scope {
        Scope::Host => "host",
        Scope::Global => "global",
        Scope::Unknown => "unknown",
    };
    if json {
        let mut value = serde_json::json!({
            "key": record.key,
            "state": state_name(record.state),
            "token": record.token,
            "holder": record.holder.as_ref().map(holder_json),
            "expires_in_ms": record.expires_in_ms,
            "scope": scope,
            "incident": record.incident.as_deref().map(super::history::event_json),
        });
        if let Some(slots) = record.slots {
            value["slots"] = slots.into();
            value["holders"] = record.holders.iter().map(holder_json).collect();
        }
        println!("{value}");
        return Ok(ExitCode::SUCCESS);
    }
    println!("key:     {}", escape(&record.key));
    println!("state:   {}", state_name(record.state));
    match record.slots {
        Some(slots) => print_slots(slots, &record.holders),
        None => {
            println!("token:   {}", record.token);
            if let Some(h) = &record.holder {
                print_holder(h, "");
            }
        }
    }
    // Of a key with slots, the record carries the lowest held slot's.
    let first_held = record.holders.first().and_then(|h| h.slot);
    match record.expires_in_ms {
        Some(ms) => println!(
            "expires: in {} unless renewed{}",
            humantime::format_duration(std::time::Duration::from_millis(ms)),
            first_held.map_or_else(String::new, |slot| format!(" (slot {slot})"))
        ),
        None if record.state == KeyState::Held => {
            println!("expires: when its holder's agent lets go (kernel lock)")
        }
        None => {}
    }
    if let Some(incident) = &record.incident {
        println!(
            "last:    {} at {}",
            super::history::event_line(incident),
            format::since(incident.at_ms)
        );
    }
    println!(
        "scope:   {scope}{}",
        if scope == "host" {
            " (excludes runs on this host only)"
        } else {
            ""
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// Every slot of a key with `slots`: its holder and token, or free.
fn print_slots(slots: u32, holders: &[Holder]) {
    println!("slots:   {slots} ({} held)", holders.len());
    for slot in 0..slots {
        match holders.iter().find(|h| h.slot == Some(slot)) {
            Some(h) => {
                println!("slot {slot}:  held, token {}", h.token);
                print_holder(h, "  ");
            }
            None => println!("slot {slot}:  free"),
        }
    }
}
