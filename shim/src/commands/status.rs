//! `runlock status [--json]`: the leases held through this host's agent.

use crate::client::{unexpected, Client};
use crate::exit::Failure;
use crate::format;
use runlock_protocol::{AgentMessage, ClientMessage};
use std::path::Path;
use std::process::ExitCode;

pub async fn run(socket: &Path, json: bool) -> Result<ExitCode, Failure> {
    let mut client = Client::connect(socket).await?;
    let leases = match client.call(ClientMessage::List).await {
        Ok(AgentMessage::Leases { leases, omitted }) => {
            if omitted > 0 {
                eprintln!("runlock: {omitted} more leases are held than one reply lists");
            }
            leases
        }
        Ok(other) => return Err(unexpected("list", &other)),
        Err(err) => return Err(err.into_failure("listing leases")),
    };
    if json {
        let rows: Vec<_> = leases
            .iter()
            .map(|l| {
                serde_json::json!({
                    "key": l.key,
                    "lease_id": l.lease_id,
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
    println!(
        "{:<40} {:>8} {:>8} {:<10} {:<26} COMMAND",
        "KEY", "TOKEN", "PID", "USER", "SINCE"
    );
    for l in &leases {
        println!(
            "{:<40} {:>8} {:>8} {:<10} {:<26} {}",
            l.key,
            l.holder.token,
            l.child_pid.unwrap_or(l.holder.pid),
            l.holder.user,
            format::rfc3339(l.holder.acquired_at_ms),
            l.holder.command
        );
    }
    Ok(ExitCode::SUCCESS)
}
