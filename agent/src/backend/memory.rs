//! `memory://`: keys in this process only, for tests and benchmarks.

use super::history::{self, Before, Stamp};
use super::{
    AcquireSpec, Adopted, Adopter, Backend, BackendError, BackendResult, Capabilities, Displaced,
    Ending, Grant, LeaseRef, ListFrom, ListPage, Listed, PageAsk, Profile, Profiled, Renewed,
    ReportName, Reports, StoredReport,
};
use crate::unpoisoned::Unpoisoned;
use async_trait::async_trait;
use runlock_protocol::{Holder, Key, KeyEvent, KeyRecord, KeyState, Scope};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Default)]
struct Record {
    token: u64,
    /// The lease id and holder, while held; boxed, as most of a large
    /// agent's keys are free, and a free key's record is then small.
    held: Option<Box<(String, Holder)>>,
    /// The holder's TTL.
    ttl: Duration,
    history: Vec<KeyEvent>,
    /// Tokens whose runs were taken over and have since stopped.
    stopped: std::collections::BTreeSet<u64>,
}

/// An in-process lock table.
#[derive(Default)]
pub struct MemoryBackend {
    keys: Mutex<HashMap<Key, Record>>,
    reports: Mutex<BTreeMap<ReportName, Vec<u8>>>,
}

impl MemoryBackend {
    fn with_record<T>(&self, key: &Key, f: impl FnOnce(&mut Record) -> T) -> T {
        let mut keys = self.keys.locked();
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
    async fn adopt(&self, _: &LeaseRef, _: &Adopter) -> BackendResult<Adopted> {
        Err(BackendError::Unsupported(
            "memory:// does not keep locks beyond the agent that took them".to_string(),
        ))
    }

    async fn acquire(&self, spec: &AcquireSpec) -> BackendResult<Grant> {
        self.with_record(&spec.key, |record| {
            if let (Some((_, holder)), false) = (record.held.as_deref(), spec.force) {
                let incident = history::last_incident(&record.history);
                return Err(BackendError::Held(Some(Box::new(holder.clone())), incident));
            }
            let before = match &record.held {
                Some(_) => Before::Live(record.token),
                None => Before::Free,
            };
            let displaced = record
                .held
                .take()
                .map(|held| (*held).1)
                .map(|holder| Displaced {
                    token: holder.token,
                    holder: Some(holder),
                    ttl: record.ttl,
                    lock: None,
                });
            record.token += 1;
            history::granted(
                &mut record.history,
                spec,
                record.token,
                before,
                Stamp::agent_now(),
            );
            let holder = Holder {
                token: record.token,
                ..spec.holder.clone()
            };
            record.held = Some(Box::new((spec.lease_id.clone(), holder.clone())));
            record.ttl = spec.ttl;
            Ok(Grant {
                holder,
                sent: tokio::time::Instant::now(),
                lock: None,
                displaced,
            })
        })
    }

    async fn renew(&self, lease: &LeaseRef, _ttl: Duration) -> BackendResult<Renewed> {
        self.with_record(&lease.key, |record| match record.held.as_deref() {
            Some((id, _)) if *id == lease.lease_id => Ok(Renewed::ByThisCall),
            _ => Err(BackendError::LeaseMismatch),
        })
    }

    async fn end(&self, lease: &LeaseRef, ending: &Ending) -> BackendResult<()> {
        self.with_record(&lease.key, |record| {
            let Some(held) = record.held.take_if(|held| held.0 == lease.lease_id) else {
                return Ok(());
            };
            let (_, holder) = *held;
            if let Some(event) = ending.event(&holder, Stamp::agent_now()) {
                history::push(&mut record.history, event);
            }
            Ok(())
        })
    }

    async fn history(&self, key: &Key) -> BackendResult<Vec<KeyEvent>> {
        self.with_record(key, |record| Ok(record.history.clone()))
    }

    async fn confirm_stopped(&self, lease: &LeaseRef) -> BackendResult<()> {
        self.with_record(&lease.key, |record| record.stopped.insert(lease.token));
        Ok(())
    }

    async fn displaced_stopped(&self, key: &Key, displaced: &Displaced) -> BackendResult<bool> {
        Ok(self.with_record(key, |record| record.stopped.remove(&displaced.token)))
    }

    async fn inspect(&self, key: &Key) -> BackendResult<KeyRecord> {
        self.with_record(key, |record| Ok(record.to_key_record(key)))
    }

    async fn list(&self, ask: PageAsk<'_>) -> BackendResult<ListPage> {
        let (prefix, from, limit) = (ask.prefix, ask.from, ask.limit);
        let keys = self.keys.locked();
        let after = from.after.as_deref().unwrap_or("");
        let mut names: Vec<&Key> = keys
            .iter()
            // A key only ever inspected has a record here, but was never taken.
            .filter(|(key, record)| record.token > 0 && key.split_slot().0.starts_with(prefix))
            .filter(|(key, _)| from.after.is_none() || key.as_str() > after)
            .map(|(key, _)| key)
            .collect();
        names.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
        let more = names.len() > limit;
        let records: Vec<Listed> = names
            .into_iter()
            .take(limit)
            .map(|key| {
                let record = &keys[key];
                Listed {
                    name: key.to_string(),
                    read: Ok((record.to_key_record(key), record.history.clone())),
                }
            })
            .collect();
        let next = match (more, records.last()) {
            (true, Some(last)) => Some(ListFrom {
                after: Some(last.name.clone()),
                ..ListFrom::default()
            }),
            _ => None,
        };
        Ok(ListPage { records, next })
    }
}

#[async_trait]
impl Reports for MemoryBackend {
    async fn put_report(&self, agent: &ReportName, body: Vec<u8>) -> BackendResult<()> {
        self.reports.locked().insert(agent.clone(), body);
        Ok(())
    }

    async fn reports(&self) -> BackendResult<Vec<StoredReport>> {
        let reports = self.reports.locked();
        Ok(reports
            .iter()
            .map(|(agent, body)| StoredReport::read(agent.clone(), body.clone()))
            .collect())
    }

    async fn remove_report(&self, agent: &ReportName) -> BackendResult<()> {
        self.reports.locked().remove(agent);
        Ok(())
    }
}

impl Record {
    fn to_key_record(&self, key: &Key) -> KeyRecord {
        let mut record = KeyRecord::free(key, Scope::Host);
        record.token = self.token;
        record.incident = history::last_incident(&self.history);
        if let Some(held) = &self.held {
            record.state = KeyState::Held;
            record.holder = Some(held.1.clone());
        }
        record
    }
}
