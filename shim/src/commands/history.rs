//! `runlock history KEY [--limit N] [--json]`: the latest events of a key,
//! as its record in the backend keeps them, from whichever host asks.

use crate::agent::{self, unexpected};
use crate::exit::Failure;
use crate::format;
use runlock_client::escape;
use runlock_client::BACKEND_ANSWER_TIMEOUT;
use runlock_protocol::{AgentMessage, ClientMessage, Clock, EventKind, KeyEvent};
use std::path::Path;
use std::process::ExitCode;

fn clock_name(clock: Clock) -> &'static str {
    match clock {
        Clock::Store => "store",
        Clock::Agent => "agent",
        Clock::Unknown => "unknown",
    }
}

/// An event as the JSON outputs print it: the instant as RFC 3339.
pub fn event_json(e: &KeyEvent) -> serde_json::Value {
    serde_json::json!({
        "kind": e.kind.name(),
        "at": format::rfc3339(e.at_ms),
        "at_ms": e.at_ms,
        "clock": clock_name(e.clock),
        "token": e.token,
        "from_token": e.from_token,
        "host": e.host,
        "agent_id": e.agent_id,
        "pid": e.pid,
        "uid": e.uid,
        "user": e.user,
        "reason": e.reason,
        "slot": e.slot,
    })
}

/// One event on one line, every string escaped: "granted token 3 to
/// etl@runner-01 (pid 42)"; of a key with slots, "slot 1: granted …".
pub fn event_line(e: &KeyEvent) -> String {
    match e.slot {
        Some(slot) => format!("slot {slot}: {}", what_happened(e)),
        None => what_happened(e),
    }
}

fn what_happened(e: &KeyEvent) -> String {
    let who = format!("{}@{}", escape(&e.user), escape(&e.host));
    let pid = match e.pid {
        0 => String::new(),
        pid => format!(" (pid {pid})"),
    };
    let token = e.token;
    let mut line = match (e.kind, e.from_token) {
        (EventKind::Granted, _) => format!("granted token {token} to {who}{pid}"),
        (EventKind::Released, _) => format!("released token {token} by {who}{pid}"),
        (EventKind::Forced, Some(from)) => {
            format!("forced: token {token} taken over from {from} by {who}{pid}")
        }
        (EventKind::Broken, Some(from)) => {
            format!("broken: token {from} ended by {who}{pid} (token {token})")
        }
        (EventKind::Broken, None) => format!("broken: token {token} ended by {who}{pid}"),
        (EventKind::Expired, _) => format!("expired: token {token} of {who}{pid}"),
        (EventKind::Lost, _) => format!("lost: token {token} of {who}{pid}"),
        (EventKind::Adopted, _) => format!("adopted: token {token} by {who}'s new agent"),
        (kind, _) => format!("{}: token {token} by {who}{pid}", kind.name()),
    };
    if !e.reason.is_empty() {
        line.push_str(&format!(": {}", escape(&e.reason)));
    }
    line
}

pub async fn run(socket: &Path, key: &str, limit: u32, json: bool) -> Result<ExitCode, Failure> {
    super::valid_key(key)?;
    let mut client = agent::connect(socket).await?;
    let request = ClientMessage::History {
        key: key.to_string(),
        limit: Some(limit),
    };
    let events = match client.call_within(BACKEND_ANSWER_TIMEOUT, request).await {
        Ok(AgentMessage::Events { events, .. }) => events,
        Ok(other) => return Err(unexpected("history", &other)),
        Err(err) => return Err(agent::call_failure(err, "reading the history")),
    };
    if json {
        let rows: Vec<_> = events.iter().map(event_json).collect();
        println!("{}", serde_json::Value::Array(rows));
        return Ok(ExitCode::SUCCESS);
    }
    if events.is_empty() {
        println!("no history recorded for {}", escape(key));
        return Ok(ExitCode::SUCCESS);
    }
    for e in &events {
        println!(
            "{} ({} clock)  {}",
            format::rfc3339(e.at_ms),
            clock_name(e.clock),
            event_line(e)
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind, user: &str, from_token: Option<u64>) -> KeyEvent {
        KeyEvent {
            slot: None,
            kind,
            at_ms: 0,
            clock: Clock::Store,
            token: 9,
            from_token,
            host: "h".into(),
            agent_id: "a".into(),
            pid: 7,
            uid: 0,
            user: user.into(),
            reason: String::new(),
        }
    }

    #[test]
    fn each_event_reads_as_one_line_with_peer_text_escaped() {
        assert_eq!(
            event_line(&event(EventKind::Forced, "ann", Some(8))),
            "forced: token 9 taken over from 8 by ann@h (pid 7)"
        );
        let hostile = event(EventKind::Granted, "x\x1b[2J\ny", None);
        let line = event_line(&hostile);
        assert_eq!(line, r"granted token 9 to x\x1b[2J\ny@h (pid 7)");
        let json = event_json(&hostile);
        assert_eq!(json["kind"], "granted");
        assert_eq!(json["at"], "1970-01-01T00:00:00.000Z");
        assert!(json["slot"].is_null());
    }

    #[test]
    fn an_event_of_a_slot_names_it() {
        let mut e = event(EventKind::Released, "ann", None);
        e.slot = Some(2);
        assert_eq!(event_line(&e), "slot 2: released token 9 by ann@h (pid 7)");
        assert_eq!(event_json(&e)["slot"], 2);
    }
}
