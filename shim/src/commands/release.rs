//! `runlock release KEY [--slot N]`: break the lease on a key (or on one
//! slot of it), whoever holds it.

use crate::agent::{self, unexpected};
use crate::exit::Failure;
use runlock_client::BACKEND_ANSWER_TIMEOUT;
use runlock_protocol::{AgentMessage, ClientMessage, ReleaseRequest};
use std::path::Path;
use std::process::ExitCode;

pub async fn run(socket: &Path, key: &str, slot: Option<u32>) -> Result<ExitCode, Failure> {
    super::valid_key(key)?;
    let mut client = agent::connect(socket).await?;
    let request = ClientMessage::Release(ReleaseRequest::break_key(key, slot));
    let what = match slot {
        Some(slot) => format!("slot {slot} of {key:?}"),
        None => format!("{key:?}"),
    };
    match client.call_within(BACKEND_ANSWER_TIMEOUT, request).await {
        Ok(AgentMessage::Released { count: 0 }) => println!("{what} was not held"),
        Ok(AgentMessage::Released { .. }) => println!("released {what}"),
        Ok(other) => return Err(unexpected("release", &other)),
        Err(err) => return Err(agent::call_failure(err, "releasing")),
    }
    Ok(ExitCode::SUCCESS)
}
