//! `runlock release KEY`: break the lease on a key, whoever holds it.

use crate::client::{unexpected, Client, BACKEND_ANSWER_TIMEOUT};
use crate::exit::Failure;
use runlock_protocol::{AgentMessage, ClientMessage};
use std::path::Path;
use std::process::ExitCode;

pub async fn run(socket: &Path, key: &str) -> Result<ExitCode, Failure> {
    super::valid_key(key)?;
    let mut client = Client::connect(socket).await?;
    let request = ClientMessage::Release {
        slot: None,
        lease_ids: Vec::new(),
        key: Some(key.to_string()),
    };
    match client.call_within(BACKEND_ANSWER_TIMEOUT, request).await {
        Ok(AgentMessage::Released { count: 0 }) => println!("{key:?} was not held"),
        Ok(AgentMessage::Released { .. }) => println!("released {key:?}"),
        Ok(other) => return Err(unexpected("release", &other)),
        Err(err) => return Err(err.into_failure("releasing")),
    }
    Ok(ExitCode::SUCCESS)
}
