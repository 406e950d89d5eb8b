//! A key's record file: the shared JSON record with the token block it
//! reserves, read while another process may be writing it and written in
//! place under the key's lock.

use super::super::record::LockRecord;
use crate::backend::history::{self, Before, Stamp};
use crate::backend::AcquireSpec;
use runlock_protocol::{Holder, KeyState};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::time::Duration;

/// What a key's record file keeps beside the common fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct TokenBlock {
    /// The holder's TTL, kept for the agent that adopts the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) ttl_ms: Option<u64>,
    /// Every token up to this one may have been handed out: it is durable,
    /// `token` may not be.
    #[serde(default)]
    pub(super) reserved: u64,
    /// The boot `token` was written in.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(super) boot_id: String,
}

/// The record each key's file holds, as JSON a person can read.
pub(super) type FileRecord = LockRecord<TokenBlock>;

/// Tokens reserved by one durable write.
pub(super) const TOKEN_BLOCK: u64 = 1024;

/// The token after `previous`, the block it falls in, and whether that block
/// must be written durably before the token is handed out.
pub(super) fn next_token(previous: Option<&FileRecord>, boot_id: &str) -> (u64, u64, bool) {
    let (token, reserved, same_boot) = match previous {
        Some(r) => (r.token, r.store.reserved, r.store.boot_id == boot_id),
        None => (0, 0, false),
    };
    if same_boot && token < reserved {
        return (token + 1, reserved, false);
    }
    // A reboot may have lost any unsynced token up to `reserved`: start above it.
    let next = token.max(reserved) + 1;
    (next, next + TOKEN_BLOCK - 1, true)
}

/// This boot's id: a record written in another boot may have lost its last tokens.
pub(super) fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| id.trim().to_string())
        .unwrap_or_default()
}

pub(super) fn read_bytes(mut file: &File) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    file.rewind()?;
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Writes the record in place (the lock belongs to this inode, so no rename).
pub(super) fn write_record(mut file: &File, record: &FileRecord, durable: bool) -> io::Result<()> {
    let mut bytes = record.to_json();
    bytes.push(b'\n');
    file.rewind()?;
    file.write_all(&bytes)?;
    file.set_len(bytes.len() as u64)?;
    if durable {
        // The token must never go backwards, even across a power loss.
        file.sync_data()?;
    }
    Ok(())
}

/// The record (and its holder) that grants `spec` after `previous`, and
/// whether it must be written durably. `forced_from`: the live holder's
/// token it takes the key over from.
pub(super) fn held_record(
    spec: &AcquireSpec,
    previous: Option<&FileRecord>,
    forced_from: Option<u64>,
    boot_id: &str,
) -> (Holder, FileRecord, bool) {
    let (token, reserved, durable) = next_token(previous, boot_id);
    let mut events = previous.map(|p| p.history.clone()).unwrap_or_default();
    let dead_holder = previous
        .filter(|p| p.state == KeyState::Held)
        .and_then(|p| p.holder.as_ref());
    let before = match (forced_from, dead_holder) {
        (Some(from), _) => Before::Live(from),
        // The lock was free (we hold it now), yet the record says held.
        (None, Some(holder)) => Before::Expired {
            holder,
            why: "its run ended without a release: the key's lock was free",
        },
        (None, None) => Before::Free,
    };
    history::granted(&mut events, spec, token, before, Stamp::agent_now());
    let holder = Holder {
        token,
        ..spec.holder.clone()
    };
    let record = FileRecord {
        key: spec.key.to_string(),
        state: KeyState::Held,
        token,
        holder: Some(holder.clone()),
        forced_from,
        lease_id: Some(spec.lease_id.clone()),
        history: events,
        store: TokenBlock {
            ttl_ms: Some(spec.ttl.as_millis() as u64),
            reserved,
            boot_id: boot_id.to_string(),
        },
    };
    (holder, record, durable)
}

/// Reads a record another process may be writing this instant: a torn read
/// (a short or mixed file) is retried briefly. `Ok(None)` means it stayed
/// empty or unreadable.
pub(super) fn read_record_settled(
    file: &File,
    mut wanted: impl FnMut(&FileRecord) -> bool,
) -> io::Result<Option<FileRecord>> {
    for _ in 0..50 {
        let bytes = read_bytes(file)?;
        if let Ok(record) = serde_json::from_slice::<FileRecord>(&bytes) {
            if wanted(&record) {
                return Ok(Some(record));
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(None)
}
