//! Holds a key: connects to the agent at `$RUNLOCK_SOCKET` (or the default
//! socket), takes KEY, prints its fencing token, keeps it for SECONDS (0 by
//! default) while watching for its loss, then releases it.
//!
//! ```text
//! cargo run -p runlock-client --example hold -- KEY [SECONDS]
//! ```
//!
//! Exits 0 once released, 1 when the key could not be taken or was lost.

use futures::StreamExt;
use runlock_client::protocol::{socket_path, AcquireRequest, AgentMessage};
use runlock_client::protocol::{ClientMessage, Lease, ReleaseRequest};
use runlock_client::{escape, Client, ClientInfo, Incoming};
use std::process::ExitCode;
use std::time::Duration;

type Error = Box<dyn std::error::Error>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let key = args.next().unwrap_or_else(|| "example:hold".into());
    let seconds = args.next().map_or(Ok(0), |s| s.parse());
    let Ok(seconds) = seconds else {
        eprintln!("hold: usage: hold KEY [SECONDS]");
        return ExitCode::from(64);
    };
    match hold(&key, Duration::from_secs(seconds)).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("hold: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn hold(key: &str, how_long: Duration) -> Result<(), Error> {
    let socket = socket_path::resolve(None, None)?;
    let info = ClientInfo {
        name: "runlock-client hold example".into(),
        takes_locks: false,
    };
    let mut client = Client::connect(&socket, &info).await?;
    let mut request = AcquireRequest::new([key]);
    request.command = "cargo run --example hold".into();
    let leases = match client.call(ClientMessage::Acquire(request)).await? {
        AgentMessage::Acquired { leases, .. } => leases,
        other => return Err(format!("unexpected reply to acquire: {other:?}").into()),
    };
    for lease in &leases {
        println!("holding {} with token {}", escape(&lease.key), lease.token);
    }
    // The work the key protects goes here, handing it the token.
    tokio::select! {
        () = tokio::time::sleep(how_long) => {}
        lost = until_lost(&mut client) => return Err(lost.into()),
    }
    release(&mut client, &leases).await?;
    println!("released {}", escape(key));
    Ok(())
}

/// Reads what the agent says until a lease is lost or the connection ends.
async fn until_lost(client: &mut Client) -> String {
    while let Some(incoming) = client.next().await {
        match incoming {
            Ok(Incoming::Event(AgentMessage::Lost { key, message, .. })) => {
                return format!("lost {}: {}", escape(&key), escape(&message));
            }
            Ok(_) => {} // a renewal, a notice, a late reply
            Err(gone) => return gone.to_string(),
        }
    }
    "the agent closed the connection".into()
}

async fn release(client: &mut Client, leases: &[Lease]) -> Result<(), Error> {
    let lease_ids = leases.iter().map(|lease| lease.lease_id.clone());
    let release = ClientMessage::Release(ReleaseRequest::leases(lease_ids));
    match client.call(release).await? {
        AgentMessage::Released { .. } => Ok(()),
        other => Err(format!("unexpected reply to release: {other:?}").into()),
    }
}
