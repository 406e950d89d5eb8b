//! What the engine shows of its records: `inspect`'s view of one, and
//! `list`'s pages of them, read 32 at a time and again only where changed.

use super::{unavailable, CasEngine, CasRecord, LIST_READS_IN_FLIGHT, RECORD_SUFFIX};
use crate::backend::cas::{Read, Stored};
use crate::backend::{history, key_name, BackendResult, ListFrom, ListPage, Listed, PageAsk};
use futures::StreamExt;
use runlock_protocol::{Key, KeyEvent, KeyRecord, KeyState, Scope};
use std::time::{Duration, SystemTime};

impl CasEngine {
    /// [`crate::backend::Backend::list`] of the records under this engine's prefix.
    pub(super) async fn list_page(&self, ask: PageAsk<'_>) -> BackendResult<ListPage> {
        let (prefix, from, limit) = (ask.prefix, ask.from, ask.limit);
        let Some(spelled) = key_name::listed_names(prefix, from.hashed) else {
            return Ok(ListPage::default());
        };
        let listed = format!("{}{spelled}", self.prefix);
        let page = self
            .store
            .list(&listed, from.page.as_deref(), limit)
            .await
            .map_err(unavailable)?;
        let after = from.after.as_deref();
        // Only records: a probe, or a word that a run taken over has stopped, is no key's.
        let names: Vec<(String, Option<String>)> = page
            .names
            .into_iter()
            .filter_map(|(name, version)| {
                let name = name.strip_prefix(self.prefix.as_str())?.to_string();
                Some((name, version))
            })
            // A dot name is ours, never a key's (`key_name`): agents' reports.
            .filter(|(name, _)| name.ends_with(RECORD_SUFFIX) && !name.starts_with('.'))
            .filter(|(name, _)| after.is_none_or(|after| name.as_str() > after))
            .take(limit)
            .collect();
        let records: Vec<Listed> = self
            .read_listed(names)
            .await?
            .into_iter()
            .filter(|listed| listed.belongs_under(prefix))
            .collect();
        let next = match (page.next, from.hashed || prefix.is_empty()) {
            (Some(token), _) => Some(ListFrom {
                page: Some(token),
                after: None,
                hashed: from.hashed,
            }),
            (None, false) => Some(ListFrom {
                hashed: true,
                ..ListFrom::default()
            }),
            (None, true) => None,
        };
        Ok(ListPage { records, next })
    }

    /// [`crate::backend::Backend::list_slots`]: one listing of the names
    /// `key`'s slot records start with (the key's name and `#`, which no
    /// other key's name holds), each read only where changed since.
    pub(super) async fn listed_slots(&self, key: &Key) -> BackendResult<Vec<Listed>> {
        let key_prefix = format!("{}#", key_name::escaped(key));
        let listed = format!("{}{key_prefix}", self.prefix);
        let mut names = Vec::new();
        let mut page = None;
        loop {
            let found = self
                .store
                .list(&listed, page.as_deref(), 1000)
                .await
                .map_err(unavailable)?;
            names.extend(found.names.into_iter().filter_map(|(name, version)| {
                let name = name.strip_prefix(self.prefix.as_str())?;
                name.ends_with(RECORD_SUFFIX)
                    .then(|| (name.to_string(), version))
            }));
            match found.next {
                Some(next) => page = Some(next),
                None => break,
            }
        }
        self.read_listed(names).await
    }

    /// The records `names` (below the records' prefix, each with the
    /// version its listing gave) as a listing shows them, in order, read
    /// [`LIST_READS_IN_FLIGHT`] at once; those gone since are left out.
    async fn read_listed(
        &self,
        names: Vec<(String, Option<String>)>,
    ) -> BackendResult<Vec<Listed>> {
        let reads = names
            .into_iter()
            .map(|(name, version)| async move { self.listed(&name, version.as_deref()).await });
        Ok(futures::stream::iter(reads)
            .buffered(LIST_READS_IN_FLIGHT)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .collect())
    }

    /// The record in `read`, the record of `key` at `name`, as `inspect`
    /// reports it, with its history.
    pub(super) fn shown(
        &self,
        key: &Key,
        name: &str,
        read: Read,
    ) -> BackendResult<(KeyRecord, Vec<KeyEvent>)> {
        let Some(stored) = &read.object else {
            return Ok((KeyRecord::free(key, Scope::Global), Vec::new()));
        };
        let record = self.parse(name, stored)?;
        Ok(self.shown_parsed(key, name, record, stored, read.date))
    }

    /// [`Self::shown`] of a record already parsed.
    fn shown_parsed(
        &self,
        key: &Key,
        name: &str,
        record: CasRecord,
        stored: &Stored,
        date: Option<SystemTime>,
    ) -> (KeyRecord, Vec<KeyEvent>) {
        let mut answer = KeyRecord::free(key, Scope::Global);
        answer.token = record.token;
        answer.incident = history::last_incident(&record.history);
        if record.state == KeyState::Held && !self.expired(name, &record, stored, date) {
            answer.state = KeyState::Held;
            answer.holder = record.holder;
            if let (Some(written), Some(now)) = (stored.last_modified, date) {
                let expires = written + Duration::from_millis(record.store.ttl_ms);
                answer.expires_in_ms = Some(
                    expires
                        .duration_since(now)
                        .map(|d| d.as_millis() as u64)
                        .unwrap_or(0),
                );
            }
        }
        (answer, record.history)
    }

    /// The object `full` as a listing last read it, if the listing's
    /// `version` says it has not changed since; else read again (and kept).
    pub(super) async fn read_unless_unchanged(
        &self,
        full: &str,
        version: Option<&str>,
    ) -> BackendResult<Read> {
        if let Some(read) = version.and_then(|version| self.listed_reads.get(full, version)) {
            return Ok(read);
        }
        let read = self.store.get(full).await.map_err(unavailable)?;
        self.listed_reads.put(full, &read);
        Ok(read)
    }

    /// The record named `name` (below the records' prefix) for a listing,
    /// read again only if the listing's `version` says it changed; `None`
    /// when it is gone. A store that fails the read fails the page.
    async fn listed(&self, name: &str, version: Option<&str>) -> BackendResult<Option<Listed>> {
        let full = format!("{}{name}", self.prefix);
        let read = self.read_unless_unchanged(&full, version).await?;
        let Some(stored) = &read.object else {
            return Ok(None);
        };
        let stem = name.strip_suffix(RECORD_SUFFIX).unwrap_or(name);
        Ok(Some(Listed {
            name: name.to_string(),
            read: self.listed_record(&full, stem, stored, read.date),
        }))
    }

    /// What a listing shows of `stored`, the object `name` whose name spells
    /// `stem`: parsed once, and only if it is the record of the key it spells.
    fn listed_record(
        &self,
        name: &str,
        stem: &str,
        stored: &Stored,
        date: Option<SystemTime>,
    ) -> Result<(KeyRecord, Vec<KeyEvent>), String> {
        let record = self.parse(name, stored).map_err(|e| e.to_string())?;
        let described = || &self.store.site().description;
        let key = Key::parse_record(&record.key)
            .map_err(|e| format!("{name} in {} names no valid key: {e}", described()))?;
        if key_name::escaped(&key) != stem {
            return Err(format!(
                "{name} in {} holds the record of another key, {:?}",
                described(),
                key.logged()
            ));
        }
        Ok(self.shown_parsed(&key, name, record, stored, date))
    }
}
