//! What `inspect` and `list` show of the keys under the prefix: a key's
//! record and history as one view, and the pages of `list`, each one
//! read-only transaction and one time-to-live request per etcd lease.

use super::*;

/// The most names a page of `list` reads. Its answer holds up to twice as
/// many records (two ranges, each read one past the page), each with a
/// command line of up to 4 KiB, and as many histories of 32 events: it must
/// stay well within the client's 4 MiB message limit.
const MOST_NAMES_PER_PAGE: usize = 100;
/// The etcd leases a page of `list` asks the time left of at once.
const LEASES_ASKED_AT_ONCE: usize = 8;

impl EtcdBackend {
    /// [`Backend::list`]: see there.
    pub(super) async fn list_page(&self, ask: PageAsk<'_>) -> BackendResult<ListPage> {
        let (prefix, from, limit) = (ask.prefix, ask.from, ask.limit);
        let Some(spelled) = key_name::listed_names(prefix, from.hashed) else {
            return Ok(ListPage::default());
        };
        let limit = limit.min(MOST_NAMES_PER_PAGE);
        let past = match from.page.as_deref().map(listing::from_hex) {
            Some(None) => {
                return Err(BackendError::Unsupported(
                    "the listing's cursor was not made by an etcd backend".to_string(),
                ))
            }
            past => past.flatten(),
        };
        let names = listing::Names::new(&spelled, from.after.as_deref(), past.as_deref());
        let (records_under, histories_under) = (self.connection.prefix.as_str(), self.histories());
        let ranges: Vec<listing::Range> = names
            .record_ranges(records_under)
            .into_iter()
            .chain([names.range(&histories_under)])
            .collect();
        // One more than the page, to tell whether another follows.
        let within = |(start, end): &listing::Range| {
            let page = Get::key(start.clone())
                .with_range(end.clone())
                .with_limit(limit as i64 + 1);
            TxnOp::get(page)
        };
        let read = Txn::new().and_then(ranges.iter().map(within).collect::<Vec<_>>());
        self.bounded(async {
            let answer = self.transact(read).await?;
            let mut got: Vec<Vec<KeyValue>> = answer.reads().collect();
            // The histories read are not kept (`keep`) as the condition of
            // this agent's next write: that would hold every key's here.
            let histories = got.pop().unwrap_or_default();
            let named = |under: &str, kvs: Vec<KeyValue>| {
                let under = under.as_bytes().to_vec();
                kvs.into_iter().filter_map(move |kv| {
                    Some((kv.key().strip_prefix(under.as_slice())?.to_vec(), kv))
                })
            };
            let listing::Page { names: page, last } = listing::page(
                got.into_iter().flat_map(|kvs| named(records_under, kvs)),
                named(&histories_under, histories),
                limit,
            );
            let leases: HashSet<i64> = page
                .iter()
                .filter_map(|(_, found)| Some(found.record.as_ref()?.lease()))
                .filter(|&id| id != 0)
                .collect();
            let left: HashMap<i64, Option<u64>> = futures::stream::iter(leases)
                .map(|id| async move { (id, self.lease_left(id).await) })
                .buffer_unordered(LEASES_ASKED_AT_ONCE)
                .collect()
                .await;
            let records = page
                .into_iter()
                .filter_map(|(name, found)| {
                    let read = self.read_listed(&name, &found, &left).transpose()?;
                    Some(Listed { name, read })
                })
                .filter(|listed| listed.belongs_under(prefix))
                .collect();
            let next = if let Some(last) = last {
                // After the page's last name, as bytes: it may be no record's.
                Some(ListFrom {
                    page: Some(listing::to_hex(&last)),
                    after: None,
                    hashed: from.hashed,
                })
            } else {
                (!from.hashed && !prefix.is_empty()).then(|| ListFrom {
                    hashed: true,
                    ..ListFrom::default()
                })
            };
            Ok(ListPage { records, next })
        })
        .await
    }

    /// `kv`, the key of `key` named `name` (absent: free), with its history,
    /// as `inspect` reports it; `left`: the seconds its etcd lease has left,
    /// if etcd said.
    pub(super) fn shown(
        &self,
        key: &Key,
        name: &str,
        kv: Option<&KeyValue>,
        kept: &Kept,
        left: Option<u64>,
    ) -> BackendResult<KeyRecord> {
        let mut answer = KeyRecord::free(key, Scope::Global);
        answer.incident = shared::last_incident(&kept.events);
        let Some(kv) = kv else {
            // A key once held says so by its history's last token: a
            // reader looking for the slot records ever written (SPEC 13)
            // must not take a released slot for one never taken.
            answer.token = kept.events.iter().map(|e| e.token).max().unwrap_or(0);
            return Ok(answer);
        };
        let record = self.parse(name, kv)?;
        let holder = self.holder_of(name, kv)?;
        answer.state = KeyState::Held;
        answer.token = holder.token;
        answer.holder = Some(holder);
        // Whole seconds by etcd's clock, less the grace the lease was given
        // (as the object stores report it).
        if let Some(left) = left {
            let ttl = Duration::from_millis(record.ttl_ms);
            let grace = lease_seconds(ttl) as u64 * 1000 - record.ttl_ms;
            answer.expires_in_ms = Some((left * 1000).saturating_sub(grace));
        }
        Ok(answer)
    }

    /// The seconds the etcd lease `id` has left by etcd's clock; unknown,
    /// rather than an error, if etcd cannot say (or the key is on none).
    pub(super) async fn lease_left(&self, id: i64) -> Option<u64> {
        if id == 0 {
            return None;
        }
        let left = self
            .connection
            .call(|c| async move { c.lease_time_to_live(id).await })
            .await;
        left.ok().map(|l| l.max(0) as u64)
    }

    /// The record and history a listing read of `name` (below the prefix),
    /// as `inspect` and `history` report them; `Ok(None)`: a released key
    /// too long to spell whose history does not name it; `Err`: why it
    /// cannot be read. `left`: what each etcd lease has left.
    fn read_listed(
        &self,
        name: &str,
        found: &listing::Found<KeyValue>,
        left: &HashMap<i64, Option<u64>>,
    ) -> Result<Option<(KeyRecord, Vec<KeyEvent>)>, String> {
        let (record_key, history_key) = (
            format!("{}{name}", self.connection.prefix),
            format!("{}{name}", self.histories()),
        );
        let kept = self
            .read_history(&history_key, found.history.as_ref())
            .map_err(|e| e.to_string())?;
        let key = match &found.record {
            Some(kv) => self.key_of(&record_key, name, kv)?,
            // Named by the history a hashed name's grant wrote (older
            // agents wrote none: that key cannot be named).
            None if key_name::is_hashed(name) => match kept.key.as_deref().map(Key::parse_record) {
                Some(Ok(key)) if key_name::escaped(&key) == name => key,
                _ => return Ok(None),
            },
            None => key_name::unescaped(name).ok_or_else(|| {
                format!(
                    "{history_key} in {} is no key's history: runlock names no key so",
                    self.description
                )
            })?,
        };
        let left = found
            .record
            .as_ref()
            .and_then(|kv| left.get(&kv.lease()).copied().flatten());
        let shown = self
            .shown(&key, &record_key, found.record.as_ref(), &kept, left)
            .map_err(|e| e.to_string())?;
        Ok(Some((shown, kept.events)))
    }

    /// The key whose record `kv` (at `record_key`, listed as `name`) is.
    fn key_of(&self, record_key: &str, name: &str, kv: &KeyValue) -> Result<Key, String> {
        let record = self.parse(record_key, kv).map_err(|e| e.to_string())?;
        let key = Key::parse_record(&record.key).map_err(|e| {
            format!(
                "{record_key} in {} names no valid key: {e}",
                self.description
            )
        })?;
        if key_name::escaped(&key) != name {
            return Err(format!(
                "{record_key} in {} holds the record of another key, {:?}",
                self.description,
                key.logged()
            ));
        }
        Ok(key)
    }
}
