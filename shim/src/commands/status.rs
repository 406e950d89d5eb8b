//! `runlock status [--json]`: the leases held through this host's agent.

use crate::agent::{self, unexpected};
use crate::exit::Failure;
use crate::format;
use runlock_client::escape;
use runlock_client::ANSWER_TIMEOUT;
use runlock_protocol::{AgentMessage, ClientMessage};
use std::path::Path;
use std::process::ExitCode;

pub async fn run(socket: &Path, json: bool) -> Result<ExitCode, Failure> {
    let mut client = agent::connect(socket).await?;
    let leases = match client
        .call_within(ANSWER_TIMEOUT, ClientMessage::List)
        .await
    {
        Ok(AgentMessage::Leases { leases, omitted }) => {
            if omitted > 0 {
                eprintln!("runlock: {omitted} more leases are held than one reply lists");
            }
            leases
        }
        Ok(other) => return Err(unexpected("list", &other)),
        Err(err) => return Err(agent::call_failure(err, "listing leases")),
    };
    if json {
        let rows: Vec<_> = leases
            .iter()
            .map(|l| {
                serde_json::json!({
                    "key": l.key,
                    "slot": l.holder.slot,
                    // Empty for another user's lease: the agent shows an id to its owner only.
                    "lease_id": (!l.lease_id.is_empty()).then_some(&l.lease_id),
                    "token": l.holder.token,
                    "ttl_ms": l.ttl_ms,
                    "child_pid": l.child_pid,
                    "holder": super::inspect::holder_json(&l.holder),
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return Ok(ExitCode::SUCCESS);
    }
    if leases.is_empty() {
        println!("no leases held through this agent");
        return Ok(ExitCode::SUCCESS);
    }
    // PID is the holder's, as every host sees it in the backend's record (the
    // shim's, for a `runlock run`); CHILD is the command that the lease
    // protects. SLOT is `-` for a plain key; it comes after the columns
    // that were there before slots, so that they keep their places.
    println!(
        "{:<40} {:>8} {:>8} {:>8} {:>4} {:<10} {:<26} COMMAND",
        "KEY", "TOKEN", "PID", "CHILD", "SLOT", "USER", "SINCE"
    );
    let or_dash = |n: Option<u32>| n.map_or_else(|| "-".to_string(), |n| n.to_string());
    for l in &leases {
        println!(
            "{:<40} {:>8} {:>8} {:>8} {:>4} {:<10} {:<26} {}",
            escape(&l.key),
            l.holder.token,
            l.holder.pid,
            or_dash(l.child_pid),
            or_dash(l.holder.slot),
            escape(&l.holder.user),
            format::rfc3339(l.holder.acquired_at_ms),
            escape(&l.holder.command)
        );
    }
    Ok(ExitCode::SUCCESS)
}
