//! What `history`, `inspect` and `list` show of the keys in the lock
//! directory: records read under a shared lock, never one held open.

use super::*;

impl Inner {
    pub(super) fn history(&self, key: &Key) -> BackendResult<Vec<KeyEvent>> {
        let name = file_name(key);
        let dir = self.dir()?;
        let Some(file) = self.try_open(&dir, &name, OFlag::O_RDONLY)? else {
            return Ok(Vec::new());
        };
        let record =
            read_record_settled(&file, |_| true).map_err(|e| self.io_error("reading", &name, e))?;
        Ok(record.map(|r| r.history).unwrap_or_default())
    }

    pub(super) fn inspect(&self, key: &Key) -> BackendResult<KeyRecord> {
        let name = file_name(key);
        let dir = self.dir()?;
        let Some(file) = self.try_open(&dir, &name, OFlag::O_RDONLY)? else {
            return Ok(KeyRecord::free(key, Scope::Host));
        };
        match read_record_settled(&file, |_| true)
            .map_err(|e| self.io_error("reading", &name, e))?
        {
            Some(record) => self.shown(&dir, key, record),
            None => Ok(KeyRecord::free(key, Scope::Host)),
        }
    }

    /// `record`, the record of `key`, as `inspect` reports it.
    pub(super) fn shown(
        &self,
        dir: &File,
        key: &Key,
        record: FileRecord,
    ) -> BackendResult<KeyRecord> {
        let mut answer = KeyRecord::free(key, Scope::Host);
        answer.token = record.token;
        answer.incident = history::last_incident(&record.history);
        if record.state != KeyState::Held {
            return Ok(answer);
        }
        // A record left held by a run that ended with no agent to tell: the
        // lock says whether anyone still holds the key. Shared, and only for
        // an instant, so it never stands in a holder's way for long.
        let lock_name = lock_name(key);
        let lock = self.try_open(dir, &lock_name, OFlag::O_RDONLY)?;
        let named = lock.as_ref().map(RunFile::of).transpose();
        let named = named.map_err(|e| self.io_error("checking", &lock_name, e))?;
        let locked = match (record.store.run, lock) {
            // Its lock file was removed or replaced while it ran (a cleanup job).
            (Some(run), _) if named != Some(run) => {
                (record.holder.as_ref()).is_some_and(|h| self.run_lives(run, h.pid))
            }
            (_, Some(lock)) => {
                let free = flock(&lock, libc::LOCK_SH | libc::LOCK_NB)
                    .map_err(|e| self.io_error("checking", &lock_name, e))?;
                !free
            }
            (_, None) => false,
        };
        if locked {
            answer.state = KeyState::Held;
            answer.holder = record.holder;
        }
        Ok(answer)
    }

    /// A page of the records whose names `from` lists, in name order (a
    /// key's name without `.lock`, so that its slots follow it). The
    /// directory is read on a listing's first page; its later pages go on
    /// through the names read then (`ListedNames`).
    pub(super) fn list(&self, ask: PageAsk<'_>) -> BackendResult<ListPage> {
        let (prefix, from, limit) = (ask.prefix, ask.from, ask.limit);
        let Some(wanted) = key_name::listed_names(prefix, from.hashed) else {
            return Ok(ListPage::default());
        };
        let dir = self.dir()?;
        let (names, token) = self.listed_names.names(from.page.as_deref(), &wanted, || {
            self.record_names(&dir, &wanted)
        })?;
        let start = match from.after.as_deref() {
            Some(after) => names.partition_point(|name| name.as_str() <= after),
            None => 0,
        };
        let mut records = Vec::new();
        let mut last = None;
        for name in &names[start..] {
            if records.len() == limit {
                let next = ListFrom {
                    page: Some(token),
                    after: last,
                    hashed: from.hashed,
                };
                return Ok(ListPage {
                    records,
                    next: Some(next),
                });
            }
            let read = self.read_listed(&dir, name);
            last = Some(name.clone());
            let listed = match read {
                Ok(None) => continue, // removed since the directory was read
                Ok(Some(view)) => Listed {
                    name: name.clone(),
                    read: Ok(view),
                },
                Err(why) => Listed {
                    name: name.clone(),
                    read: Err(why),
                },
            };
            if listed.belongs_under(prefix) {
                records.push(listed);
            }
        }
        let next = (!from.hashed && !prefix.is_empty()).then(|| ListFrom {
            hashed: true,
            ..ListFrom::default()
        });
        Ok(ListPage { records, next })
    }

    /// The names (without `.lock`) of the records that start with `wanted`,
    /// unsorted.
    pub(super) fn record_names(&self, dir: &File, wanted: &str) -> BackendResult<Vec<String>> {
        let names = self.names_in(dir)?.into_iter().filter_map(|name| {
            let stem = name.strip_suffix(".lock")?;
            // Our own dot files (the force gate) are no key's.
            let record = !stem.starts_with('.') && stem.starts_with(wanted);
            record.then(|| stem.to_string())
        });
        Ok(names.collect())
    }

    /// The record named `name` as `inspect` reports it, with its history;
    /// `Ok(None)` when it is gone; `Err` says why it cannot be read.
    pub(super) fn read_listed(
        &self,
        dir: &File,
        name: &str,
    ) -> Result<Option<(KeyRecord, Vec<KeyEvent>)>, String> {
        let file_name = format!("{name}.lock");
        let Some(file) = self
            .try_open(dir, &file_name, OFlag::O_RDONLY)
            .map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        let record = read_record_settled(&file, |_| true)
            .map_err(|e| self.io_error("reading", &file_name, e).to_string())?
            .ok_or_else(|| format!("{} is not a lock record", self.path(&file_name).display()))?;
        let key = Key::parse_record(&record.key).map_err(|e| {
            format!(
                "{} names no valid key: {e}",
                self.path(&file_name).display()
            )
        })?;
        if transport::file_name(&key) != file_name {
            return Err(format!(
                "{} holds the record of another key, {:?}",
                self.path(&file_name).display(),
                key.logged()
            ));
        }
        let history = record.history.clone();
        let shown = self.shown(dir, &key, record).map_err(|e| e.to_string())?;
        Ok(Some((shown, history)))
    }
}
