//! Wire requests as the lease layer takes them, and the lease layer's
//! answers, errors and events as wire messages: the only place they are
//! worded for a peer.

use crate::backend::BackendError;
use crate::lease::{AcquireRequest, Event, Granted, LeaseError};
use runlock_protocol::{AgentMessage, Key, WireError};
use std::time::Duration;

/// An `acquire` as sent, its times as durations.
impl From<runlock_protocol::AcquireRequest> for AcquireRequest {
    fn from(req: runlock_protocol::AcquireRequest) -> AcquireRequest {
        AcquireRequest {
            ttl: req.ttl_ms.map(Duration::from_millis),
            wait: Duration::from_millis(req.wait_ms),
            keys: req.keys,
            force: req.force,
            command: req.command,
            on_lost: req.on_lost,
            slots: req.slots,
        }
    }
}

/// A grant as the peer reads it, with `locks` lock descriptors alongside.
pub(super) fn acquired(granted: Granted, locks: usize) -> AgentMessage {
    AgentMessage::Acquired {
        locks: locks as u32,
        leases: granted.leases,
        ttl_ms: granted.ttl.as_millis() as u64,
        valid_for_ms: granted.valid_until.map(millis_left),
    }
}

/// How long from now until `at`, in whole milliseconds.
fn millis_left(at: tokio::time::Instant) -> u64 {
    at.saturating_duration_since(tokio::time::Instant::now())
        .as_millis() as u64
}

/// The error as the peer reads it.
pub(super) fn wire_error(err: LeaseError) -> WireError {
    match err {
        // The backend's own wording, about the key.
        LeaseError::Backend { key, source } => backend_error(&source, &key.base()),
        err => WireError {
            code: err.code(),
            message: err.to_string(),
            key: err.key(),
            holder: err.holder().cloned().map(Box::new),
            holders: err.holders().to_vec(),
        },
    }
}

/// The event as the peer reads it.
pub(super) fn event_message(event: Event) -> AgentMessage {
    match event {
        Event::Renewed {
            lease_id,
            valid_until,
        } => AgentMessage::Renewed {
            lease_id,
            valid_for_ms: millis_left(valid_until),
        },
        Event::Forcing { key, holder, wait } => AgentMessage::Forcing {
            key: key.split_slot().0.to_string(),
            holder: holder.map(|h| *h),
            wait_ms: wait.map(|wait| wait.as_millis() as u64),
        },
        Event::Lost {
            lease_id,
            key,
            loss,
            holder,
        } => AgentMessage::Lost {
            lease_id,
            key: key.split_slot().0.to_string(),
            reason: loss.reason(),
            message: loss.to_string(),
            holder: holder.map(|h| *h),
        },
    }
}

/// The backend's error as the peer reads it, about `key`: the store's own
/// wording, with the holder where one is known.
fn backend_error(err: &BackendError, key: &Key) -> WireError {
    let mut wire = WireError::new(err.code(), err.to_string());
    wire.key = Some(key.to_string());
    match err {
        BackendError::Held(holder, _) => wire.holder = holder.clone(),
        BackendError::HeldOutside(outsider) => {
            wire.holder = Some(Box::new(outsider.holder.clone()))
        }
        BackendError::HeldUnrecorded(why) => {
            wire.message = format!("key {key:?} is held: {why}");
            return wire;
        }
        _ => return wire,
    }
    wire.message = format!("key {key:?} is held");
    wire
}
