//! A key's record file: the shared JSON record with the token block it
//! reserves, written whole beside its name and exchanged with it under the
//! key's lock (`replace.rs`).

use super::super::record::LockRecord;
use super::displaced::DisplacedRun;
use super::run_file::RunFile;
use crate::backend::history::{self, Before, Stamp};
use crate::backend::AcquireSpec;
use runlock_protocol::{Holder, KeyState};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{self, Read, Seek};
use std::time::Duration;

/// What a key's record file keeps beside the common fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct TokenBlock {
    /// The holder's TTL, kept for the agent that adopts the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) ttl_ms: Option<u64>,
    /// Every token up to this one may have been handed out: it is durable
    /// (in `KEY.tokens`), `token` may not be.
    #[serde(default)]
    pub(super) reserved: u64,
    /// The boot `token` was written in.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(super) boot_id: String,
    /// `reserved` is also in the key's `KEY.tokens`, which only grows and
    /// outlives this record (a record written before it was kept reserves
    /// a new block, and keeps it there).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) kept: bool,
    /// The `KEY.run` the grant locked: another file under that name means
    /// the file was removed or replaced, not that its run let go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) run: Option<RunFile>,
    /// The runs this record's holder took the key from by force that may
    /// still run, the newest first (`displaced.rs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) displaced: Vec<DisplacedRun>,
}

/// The record each key's file holds, as JSON a person can read.
pub(super) type FileRecord = LockRecord<TokenBlock>;

/// Tokens reserved by one durable write.
pub(super) const TOKEN_BLOCK: u64 = 1024;

/// The token after `previous` and the block it falls in, and whether that
/// block is a new one, to be reserved durably before the token is handed
/// out. `kept`: the key's `KEY.tokens`, read only when a block is reserved
/// or there is no record (0 until then): the highest token ever reserved,
/// whatever became of the record.
pub(super) fn next_token(
    previous: Option<&FileRecord>,
    kept: u64,
    boot_id: &str,
) -> (u64, u64, bool) {
    let (token, reserved, same_boot, in_block) = match previous {
        Some(r) => (
            r.token,
            r.store.reserved,
            r.store.boot_id == boot_id,
            r.store.kept,
        ),
        None => (0, 0, false, false),
    };
    if same_boot && in_block && token < reserved {
        return (token + 1, reserved, false);
    }
    // A reboot may have lost any unsynced token up to `reserved`, and a
    // record removed or lost any token at all: start above them.
    let next = token.max(reserved).max(kept) + 1;
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

/// The record as its file holds it.
pub(super) fn record_bytes(record: &FileRecord) -> Vec<u8> {
    let mut bytes = record.to_json();
    bytes.push(b'\n');
    bytes
}

/// The record (and its holder) that grants `spec` after `previous` with
/// `token` from the block up to `reserved`, locked through `run`. `forced_from`: the live
/// holder's token it takes the key over from.
pub(super) fn held_record(
    spec: &AcquireSpec,
    previous: Option<&FileRecord>,
    (token, reserved): (u64, u64),
    run: RunFile,
    forced_from: Option<u64>,
    boot_id: &str,
) -> (Holder, FileRecord) {
    let mut events = previous.map(|p| p.history.clone()).unwrap_or_default();
    let dead = previous.filter(|p| p.state == KeyState::Held);
    let before = match (forced_from, dead.and_then(|p| p.holder.as_ref())) {
        (Some(from), _) => Before::Live(from),
        // The lock was free (we hold it now), yet the record says held.
        (None, Some(holder)) => Before::Expired {
            holder,
            why: match dead.and_then(|p| p.store.run) {
                Some(locked) if locked != run => {
                    "its key's lock file was removed or replaced while it ran; it has ended"
                }
                _ => "its run ended without a release: the key's lock was free",
            },
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
            kept: true,
            run: Some(run),
            displaced: Vec::new(),
        },
    };
    (holder, record)
}

/// Reads a record another process may be writing this instant through
/// `file`: a torn read (a short or mixed file) is retried briefly.
/// `Ok(None)` means it stayed empty or unreadable.
pub(super) fn read_record_settled(
    file: &File,
    wanted: impl FnMut(&FileRecord) -> bool,
) -> io::Result<Option<FileRecord>> {
    settle(|| read_bytes(file).map(Some), wanted)
}

/// Reads a record with `look` (its bytes; `None`: there is none) until
/// `wanted` takes it, for a few milliseconds at most.
pub(super) fn settle<E>(
    mut look: impl FnMut() -> Result<Option<Vec<u8>>, E>,
    mut wanted: impl FnMut(&FileRecord) -> bool,
) -> Result<Option<FileRecord>, E> {
    for _ in 0..50 {
        let Some(bytes) = look()? else {
            return Ok(None);
        };
        if let Ok(record) = serde_json::from_slice::<FileRecord>(&bytes) {
            if wanted(&record) {
                return Ok(Some(record));
            }
        }
        super::pause(Duration::from_millis(1));
    }
    Ok(None)
}
