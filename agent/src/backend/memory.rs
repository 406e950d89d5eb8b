//! `memory://`: keys in this process only, for tests and benchmarks.

use super::{
    AcquireSpec, Adopted, Backend, BackendError, Capabilities, Grant, LeaseRef, Profile, Profiled,
};
use async_trait::async_trait;
use runlock_protocol::{Holder, Key, KeyRecord, KeyState, Scope};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Default)]
struct Record {
    token: u64,
    held: Option<(String, Holder)>,
}

/// An in-process lock table.
#[derive(Default)]
pub struct MemoryBackend {
    keys: Mutex<HashMap<Key, Record>>,
}

impl MemoryBackend {
    fn with_record<T>(&self, key: &Key, f: impl FnOnce(&mut Record) -> T) -> T {
        // invariant: no code panics while holding this lock, so it is never poisoned
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        f(keys.entry(key.clone()).or_default())
    }
}

impl Profiled for MemoryBackend {
    fn profile(&self) -> Profile {
        Profile {
            capabilities: Capabilities {
                scope: Scope::Host,
                survives_agent: false,
                needs_renewal: false,
                lease_expires: false,
                run_holds_lock: false,
            },
            min_ttl: Duration::ZERO,
            description: "memory://".to_string(),
            releases: None,
        }
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    async fn adopt(&self, _: &LeaseRef, _: &str) -> Result<Adopted, BackendError> {
        Err(BackendError::Unsupported(
            "memory:// does not keep locks beyond the agent that took them".to_string(),
        ))
    }

    async fn acquire(&self, spec: &AcquireSpec) -> Result<Grant, BackendError> {
        self.with_record(&spec.key, |record| {
            if let (Some((_, holder)), false) = (&record.held, spec.force) {
                return Err(BackendError::Held(Some(Box::new(holder.clone()))));
            }
            record.token += 1;
            let holder = Holder {
                token: record.token,
                ..spec.holder.clone()
            };
            record.held = Some((spec.lease_id.clone(), holder.clone()));
            Ok(Grant {
                holder,
                sent: tokio::time::Instant::now(),
                lock: None,
            })
        })
    }

    async fn renew(&self, lease: &LeaseRef, _ttl: Duration) -> Result<(), BackendError> {
        self.with_record(&lease.key, |record| match &record.held {
            Some((id, _)) if *id == lease.lease_id => Ok(()),
            _ => Err(BackendError::LeaseMismatch),
        })
    }

    async fn release(&self, lease: &LeaseRef) -> Result<(), BackendError> {
        self.with_record(&lease.key, |record| {
            if matches!(&record.held, Some((id, _)) if *id == lease.lease_id) {
                record.held = None;
            }
            Ok(())
        })
    }

    async fn inspect(&self, key: &Key) -> Result<KeyRecord, BackendError> {
        self.with_record(key, |record| {
            Ok(KeyRecord {
                key: key.to_string(),
                state: if record.held.is_some() {
                    KeyState::Held
                } else {
                    KeyState::Free
                },
                token: record.token,
                holder: record.held.as_ref().map(|(_, h)| h.clone()),
                expires_in_ms: None,
                scope: Scope::Host,
            })
        })
    }
}
