//! An in-memory compare-and-swap store: for fast engine tests and the
//! simulation. Its clock is tokio's, so paused-time tests control it, and like
//! S3 it reports times in whole seconds.

use super::{CasError, CasResult, CasStore, Names, Precondition, Read, Site, Stored};
use crate::unpoisoned::Unpoisoned;
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Objects in a map, versioned by a counter.
pub struct MemoryCasStore {
    objects: Mutex<HashMap<String, Stored>>,
    versions: AtomicU64,
    epoch: Instant,
    clock: bool,
    site: Site,
}

impl MemoryCasStore {
    /// A store that reports its clock (as S3 does).
    pub fn new() -> MemoryCasStore {
        MemoryCasStore::with_clock(true)
    }

    /// A store that reports a clock or, with `false`, none at all.
    pub fn with_clock(clock: bool) -> MemoryCasStore {
        MemoryCasStore {
            objects: Mutex::new(HashMap::new()),
            versions: AtomicU64::new(0),
            epoch: Instant::now(),
            clock,
            site: Site::in_process("memory-cas://"),
        }
    }

    /// The store's clock, truncated to whole seconds like HTTP dates.
    pub fn now(&self) -> SystemTime {
        let since = Instant::now() - self.epoch;
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + since.as_secs())
    }

    fn write(&self, name: &str, body: Vec<u8>, expect: Option<&str>) -> CasResult<String> {
        let mut objects = self.objects.locked();
        let current = objects.get(name).map(|o| o.version.as_str());
        if current != expect {
            return Err(CasError::Conflict);
        }
        Ok(self.store(&mut objects, name, body))
    }

    /// A write whatever the object's version: what a store that checks a
    /// condition apart from its write ends with ([`super::racy`]).
    pub fn overwrite(&self, name: &str, body: Vec<u8>) -> String {
        let mut objects = self.objects.locked();
        self.store(&mut objects, name, body)
    }

    fn store(&self, objects: &mut HashMap<String, Stored>, name: &str, body: Vec<u8>) -> String {
        let version = format!("v{}", self.versions.fetch_add(1, Ordering::Relaxed) + 1);
        let stored = Stored {
            body,
            version: version.clone(),
            last_modified: Some(self.now()),
        };
        objects.insert(name.to_string(), stored);
        version
    }
}

#[cfg(test)]
impl MemoryCasStore {
    /// The names of the objects held now.
    pub fn names(&self) -> Vec<String> {
        let objects = self.objects.locked();
        objects.keys().cloned().collect()
    }
}

impl Default for MemoryCasStore {
    fn default() -> Self {
        MemoryCasStore::new()
    }
}

#[async_trait]
impl CasStore for MemoryCasStore {
    fn site(&self) -> &Site {
        &self.site
    }

    async fn probe(&self) -> CasResult<()> {
        Ok(())
    }

    async fn get(&self, name: &str) -> CasResult<Read> {
        let objects = self.objects.locked();
        let mut object = objects.get(name).cloned();
        if !self.clock {
            if let Some(o) = object.as_mut() {
                o.last_modified = None;
            }
        }
        Ok(Read {
            object,
            date: self.clock.then(|| self.now()),
        })
    }

    async fn put(&self, name: &str, body: Vec<u8>, when: Precondition<'_>) -> CasResult<String> {
        self.write(name, body, when.version())
    }

    async fn list(&self, prefix: &str, page: Option<&str>, limit: usize) -> CasResult<Names> {
        let objects = self.objects.locked();
        let mut names: Vec<(&String, &Stored)> = objects
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .filter(|(name, _)| page.is_none_or(|after| name.as_str() > after))
            .collect();
        names.sort_unstable_by_key(|(name, _)| *name);
        let more = names.len() > limit;
        let names: Vec<(String, Option<String>)> = names
            .into_iter()
            .take(limit)
            .map(|(name, stored)| (name.clone(), Some(stored.version.clone())))
            .collect();
        let next = more
            .then(|| names.last().map(|(name, _)| name.clone()))
            .flatten();
        Ok(Names { names, next })
    }

    async fn delete(&self, name: &str) -> CasResult<()> {
        self.objects.locked().remove(name);
        Ok(())
    }
}
