//! The lease algorithm for object stores, written once over [`CasStore`].
//!
//! A key is one small JSON record. Every acquisition writes it with a larger
//! token (conditionally: create-if-absent or replace-if-version-matches), so
//! exactly one of several racing agents wins. Release writes a `free` record
//! rather than deleting, so tokens keep growing. A holder is stale only when
//! the *store's* clock says its last write is older than TTL + grace; where
//! the store gives no clock, only after this agent has seen the record
//! unchanged for TTL + grace on its own monotonic clock. No agent ever
//! compares its wall clock with another's.

mod listing;
mod pacer;
mod record;
mod reports;

use super::proof::{self, Unproven};
use super::read_cache::ReadCache;
use super::{CasError, CasStore, Precondition, Read, Stored};
use crate::backend::history::{self, Before, Stamp};
use crate::backend::retry::RetryBudget;
use crate::backend::{
    key_name, AcquireSpec, Adopted, Adopter, Backend, BackendError, BackendResult, Capabilities,
    Displaced, Ending, Grant, LeaseRef, ListPage, Listed, PageAsk, Profile, Profiled, Renewed,
    StoreContext,
};
use crate::unpoisoned::Unpoisoned;
use async_trait::async_trait;
use pacer::Pacer;
use record::now_ms;
pub use record::{CasRecord, Lapse};
use runlock_protocol::timing::grace;
use runlock_protocol::{EventKind, Holder, Key, KeyEvent, KeyRecord, KeyState};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// HTTP dates (`Date`, `Last-Modified`) have whole seconds: a write stamped
/// `t` happened in `[t, t + 1 s)`, so expiry waits one second more.
pub const CLOCK_RESOLUTION: Duration = Duration::from_secs(1);

/// How many times one operation re-reads after losing a race or a request,
/// and how long it waits in between.
const RETRY: RetryBudget = RetryBudget {
    attempts: 6,
    first_pause: Duration::from_millis(10),
    longest_pause: Duration::from_millis(320),
};

/// The shortest TTL, in write intervals, on a store that limits writes per
/// record: renewals go out every TTL/3 less 10% jitter, so five intervals keep
/// them 1.5 intervals apart, never slowed by [`Pacer`], with room for a retry.
const MIN_TTL_IN_WRITE_INTERVALS: u32 = 5;
/// How a record's object name ends, after its key's escaped name.
const RECORD_SUFFIX: &str = ".json";
/// The records a listing reads at once: a page of a thousand keys takes
/// about as long as 32 reads one after another, and a store's client keeps
/// this many connections open anyway.
const LIST_READS_IN_FLIGHT: usize = 32;

struct Held {
    version: String,
    record: CasRecord,
}

/// The lease engine over one compare-and-swap store.
pub struct CasEngine {
    store: Arc<dyn CasStore>,
    /// The store's records prefix (its [`super::Site`]'s), kept at hand.
    prefix: String,
    held: Mutex<HashMap<String, Held>>,
    /// Without a store clock: when this agent first saw each record version.
    seen: Mutex<HashMap<String, (String, Instant)>>,
    /// Records this agent last left free: their version and content (token,
    /// history), so that acquiring one takes a single conditional write
    /// instead of a read and a write. A stale entry only fails its
    /// precondition, and a matching version means the content is as kept.
    known_free: Mutex<HashMap<String, (String, CasRecord)>>,
    /// Records this agent has seen at all; one never seen is first tried as absent.
    known: Mutex<std::collections::HashSet<String>>,
    /// What listings read, so that the next reads only what changed.
    listed_reads: ReadCache,
    /// Where agents' reports live, and the version of this agent's as it
    /// last wrote it (held across the write: one write at a time).
    reports: String,
    report_version: tokio::sync::Mutex<Option<String>>,
    pacer: Pacer,
    /// The store's verdict once it has given one (`proof`): `None`, it can
    /// lock; `Some`, the guarantee it lacks. Never trusted before, or after
    /// that.
    verdict: tokio::sync::OnceCell<Option<String>>,
    /// How hard the proof tries.
    proof: proof::Proof,
    /// Where the removal of the proof's probe runs.
    context: StoreContext,
}

fn unavailable(err: CasError) -> BackendError {
    match err {
        CasError::Conflict => BackendError::Unavailable("the store kept changing under us".into()),
        CasError::Unavailable(why) | CasError::Refused(why) => BackendError::Unavailable(why),
    }
}

impl CasEngine {
    /// An engine keeping records where `store`'s site says.
    pub fn new(store: Arc<dyn CasStore>) -> CasEngine {
        let prefix = store.site().records.clone();
        CasEngine {
            reports: reports::reports_under(&prefix),
            report_version: tokio::sync::Mutex::new(None),
            pacer: Pacer {
                interval: store.site().min_write_interval,
                booked: Mutex::new(HashMap::new()),
            },
            store,
            prefix,
            held: Mutex::new(HashMap::new()),
            seen: Mutex::new(HashMap::new()),
            known_free: Mutex::new(HashMap::new()),
            known: Mutex::new(std::collections::HashSet::new()),
            listed_reads: ReadCache::default(),
            verdict: tokio::sync::OnceCell::new(),
            proof: proof::Proof::AT_START,
            context: StoreContext::default(),
        }
    }

    /// The engine, proving its store as hard as `proof` says.
    pub fn proving(self, proof: proof::Proof) -> CasEngine {
        CasEngine { proof, ..self }
    }

    /// The engine, its tasks run in `context`.
    pub fn within(self, context: &StoreContext) -> CasEngine {
        CasEngine {
            context: context.clone(),
            ..self
        }
    }

    /// Whether the store has shown that it refuses the writes this engine
    /// relies on it refusing. Asked once; asked again while the answers are
    /// inconclusive (the store down, say).
    pub async fn prove(&self) -> Result<(), Unproven> {
        let verdict = self
            .verdict
            .get_or_try_init(|| async {
                let (verdict, probes) =
                    proof::prove(self.store.as_ref(), &self.prefix, self.proof).await;
                // Off the start path: the first grant need not wait for it. A
                // probe left at shutdown is harmless (`remove_probe`).
                let store = self.store.clone();
                self.context.spawn_until_closing(async move {
                    proof::remove_probe_later(store.as_ref(), &probes).await
                });
                match verdict {
                    Ok(()) => Ok(None),
                    Err(Unproven::Lacks(what)) => Ok(Some(what)),
                    Err(unanswered) => Err(unanswered),
                }
            })
            .await?;
        match verdict {
            None => Ok(()),
            Some(what) => Err(Unproven::Lacks(what.clone())),
        }
    }

    /// [`prove`](Self::prove), as the answer to an operation that writes a
    /// lease: a store not shown to lock grants none.
    async fn trusted(&self) -> BackendResult<()> {
        self.prove().await.map_err(|unproven| {
            BackendError::Unavailable(match unproven {
                Unproven::Lacks(what) => format!(
                    "{} cannot be trusted to lock, so no lease is granted on it: {what}",
                    self.store.site().description
                ),
                // The store failed as it would for any request: say only why.
                Unproven::Unanswered(why) => why,
            })
        })
    }

    fn name(&self, key: &Key) -> String {
        format!("{}{}{RECORD_SUFFIX}", self.prefix, key_name::escaped(key))
    }

    fn parse(&self, name: &str, stored: &Stored) -> BackendResult<CasRecord> {
        serde_json::from_slice(&stored.body).map_err(|e| {
            BackendError::Corrupt(format!(
                "{name} in {} is not a runlock record ({e}); runlock leaves it as it is: \
                 moved aside or deleted, it would free the key at token 1 again; write in \
                 its place a record of state \"free\" (as another key's free record) whose \
                 token is at least its last",
                self.store.site().description
            ))
        })
    }

    /// Whether a held record's holder has let its lease run out, by the store's clock.
    fn expired(
        &self,
        name: &str,
        record: &CasRecord,
        stored: &Stored,
        date: Option<SystemTime>,
    ) -> bool {
        let ttl = Duration::from_millis(record.store.ttl_ms);
        let wait = ttl + grace(ttl);
        if let (Some(written), Some(now)) = (stored.last_modified, date) {
            return now >= written + wait + CLOCK_RESOLUTION;
        }
        // No clock: the record must stay unchanged for the whole wait, as we saw it.
        let mut seen = self.seen.locked();
        match seen.get(name) {
            Some((version, since)) if *version == stored.version => since.elapsed() >= wait,
            _ => {
                seen.insert(name.to_string(), (stored.version.clone(), Instant::now()));
                false
            }
        }
    }

    /// Notes what a read or a write showed of a record.
    fn learn(&self, name: &str, free: Option<(String, CasRecord)>) {
        self.known.locked().insert(name.to_string());
        let mut known_free = self.known_free.locked();
        match free {
            Some(free) => known_free.insert(name.to_string(), free),
            None => known_free.remove(name),
        };
    }

    /// The write that takes the key if the record is as this agent last knew it
    /// (free, or never seen and so presumably absent); `None` when it needs a read.
    fn guess(&self, spec: &AcquireSpec, name: &str) -> Option<(CasRecord, Option<String>)> {
        if let Some((version, free)) = self.known_free.locked().get(name) {
            let token = free.token + 1;
            let record =
                record::granting(spec, token, None, free.history.clone(), Before::Free, None);
            return Some((record, Some(version.clone())));
        }
        let seen = self.known.locked().contains(name);
        (!seen).then(|| {
            (
                record::granting(spec, 1, None, Vec::new(), Before::Free, None),
                None,
            )
        })
    }

    /// One attempt: read the record (or, with `guess`, trust what this agent
    /// knew of it), decide, and write conditionally. `Ok(None)`: try again.
    async fn try_acquire(
        &self,
        spec: &AcquireSpec,
        name: &str,
        guess: bool,
    ) -> BackendResult<Option<Grant>> {
        let (record, version, displaced_holder) =
            match guess.then(|| self.guess(spec, name)).flatten() {
                Some((record, version)) => (record, version, None),
                None if guess => return Ok(None),
                None => self.decide(spec, name).await?,
            };
        let body = record.to_json();
        let booking = self.pacer.book(name).await;
        let sent = Instant::now();
        let written = self
            .store
            .put(name, body, Precondition::replacing(version.as_deref()))
            .await;
        if written == Err(CasError::Conflict) {
            self.pacer.cancel(name, booking);
        }
        match written {
            Ok(version) => {
                self.seen.locked().remove(name);
                self.learn(name, None);
                let holder = record.holder.clone().unwrap_or_else(|| spec.holder.clone());
                let displaced = record::forced_over(&record, displaced_holder);
                let held = Held { version, record };
                self.held.locked().insert(spec.lease_id.clone(), held);
                Ok(Some(Grant {
                    holder,
                    sent,
                    lock: None,
                    displaced,
                }))
            }
            // Lost a race, or lost the answer: read again to see who won.
            Err(CasError::Conflict) | Err(CasError::Unavailable(_)) => {
                self.learn(name, None);
                Ok(None)
            }
            Err(err) => Err(unavailable(err)),
        }
    }

    /// Reads the record and decides what to write: the record, the version
    /// it replaces (`None`: create it) and the live holder it forces out; or `held`.
    async fn decide(
        &self,
        spec: &AcquireSpec,
        name: &str,
    ) -> BackendResult<(CasRecord, Option<String>, Option<Holder>)> {
        let Read { object, date } = self.store.get(name).await.map_err(unavailable)?;
        let mut displaced = None;
        let decided = match &object {
            None => (
                record::granting(spec, 1, None, Vec::new(), Before::Free, date),
                None,
                None,
            ),
            Some(stored) => {
                let current = self.parse(name, stored)?;
                let ours = current.lease_id.as_deref() == Some(spec.lease_id.as_str());
                let next = current.token + 1;
                let history = current.history.clone();
                let record = if current.state != KeyState::Held {
                    record::granting(spec, next, None, history, Before::Free, date)
                } else if ours {
                    // Our own earlier write landed though its answer was lost: write again,
                    // so the lease's clock starts from a write whose send time we know.
                    // Its events are already in the history.
                    let forced = current.forced_from.zip(current.store.forced_ttl_ms);
                    record::held(spec, current.token, forced, history)
                } else if self.expired(name, &current, stored, date) {
                    let before = match &current.holder {
                        Some(holder) => Before::Expired {
                            holder,
                            why: "not renewed for its TTL and grace, by the store's clock",
                        },
                        None => Before::Free,
                    };
                    record::granting(spec, next, None, history, before, date)
                } else if spec.force {
                    let before = Before::Live(current.token);
                    let forced = Some((current.token, current.store.ttl_ms));
                    displaced = current.holder.clone();
                    record::granting(spec, next, forced, history, before, date)
                } else {
                    self.learn(name, None);
                    let incident = history::last_incident(&current.history);
                    return Err(BackendError::Held(current.holder.map(Box::new), incident));
                };
                (record, Some(stored.version.clone()), displaced)
            }
        };
        Ok(decided)
    }

    /// Writes `record` over our last version; a conflict is resolved by reading:
    /// if the record is still ours (our previous write landed unanswered), write
    /// again at once, over the version read.
    async fn overwrite(&self, lease: &LeaseRef, record: CasRecord) -> BackendResult<String> {
        let name = &self.name(&lease.key);
        let record = &record;
        // What one try leaves the next (mutexes, as the future must be `Send`).
        let version = &Mutex::new(
            self.version_of(&lease.lease_id)
                .ok_or(BackendError::LeaseMismatch)?,
        );
        let last_unavailable = &Mutex::new(None);
        let written = RETRY
            .run_paced(
                None,
                |_| async move {
                    let booking = self.pacer.book(name).await;
                    let over = version.locked().clone();
                    match self
                        .store
                        .put(name, record.to_json(), Precondition::Matches(&over))
                        .await
                    {
                        Ok(new) => return Ok(new),
                        Err(CasError::Refused(why)) => {
                            return Err(Overwrite::Failed(BackendError::Unavailable(why)))
                        }
                        Err(CasError::Unavailable(why)) => {
                            *last_unavailable.locked() = Some(why);
                            return Err(Overwrite::Unavailable);
                        }
                        Err(CasError::Conflict) => self.pacer.cancel(name, booking),
                    }
                    let read = self
                        .store
                        .get(name)
                        .await
                        .map_err(|err| Overwrite::Failed(unavailable(err)))?;
                    let current = match &read.object {
                        Some(stored) => (
                            self.parse(name, stored).map_err(Overwrite::Failed)?,
                            stored.version.clone(),
                        ),
                        None => return Err(Overwrite::Failed(BackendError::LeaseMismatch)),
                    };
                    if !current.0.held_by(&lease.lease_id, lease.token) {
                        return Err(Overwrite::Failed(BackendError::LeaseMismatch));
                    }
                    *version.locked() = current.1;
                    Err(Overwrite::StillOurs)
                },
                |failed, tried| match failed {
                    Overwrite::Unavailable => Some(RETRY.pause(tried)),
                    Overwrite::StillOurs => Some(Duration::ZERO),
                    Overwrite::Failed(_) => None,
                },
            )
            .await;
        written.map_err(|failed| match failed {
            Overwrite::Failed(err) => err,
            Overwrite::Unavailable | Overwrite::StillOurs => BackendError::Unavailable(
                last_unavailable
                    .locked()
                    .take()
                    .unwrap_or_else(|| "the store kept changing".into()),
            ),
        })
    }

    fn version_of(&self, lease_id: &str) -> Option<String> {
        self.held.locked().get(lease_id).map(|h| h.version.clone())
    }

    fn record_of(&self, lease_id: &str) -> Option<CasRecord> {
        self.held.locked().get(lease_id).map(|h| h.record.clone())
    }
}

/// How one try of [`CasEngine::overwrite`] failed.
enum Overwrite {
    /// The store did not answer: pause, then try again.
    Unavailable,
    /// Someone wrote, but the record is still ours: write again at once.
    StillOurs,
    /// No other try will mend it.
    Failed(BackendError),
}

impl CasEngine {
    /// Where the agent of a lease taken over says its run has stopped: one
    /// object per taken-over token, beside the record (never a record's
    /// name, which ends in `.json`).
    fn stopped_name(&self, key: &Key, token: u64) -> String {
        format!("{}{}.stopped-{token}", self.prefix, key_name::escaped(key))
    }

    /// The shortest TTL this store's write pace can keep renewed.
    pub fn min_ttl(&self) -> Duration {
        self.store.site().min_write_interval * MIN_TTL_IN_WRITE_INTERVALS
    }
}

impl Profiled for CasEngine {
    fn profile(&self) -> Profile {
        Profile {
            capabilities: Capabilities::SHARED_LEASES,
            min_ttl: self.min_ttl(),
            description: self.store.site().description.clone(),
            releases: None,
        }
    }
}

#[async_trait]
impl Backend for CasEngine {
    async fn acquire(&self, spec: &AcquireSpec) -> BackendResult<Grant> {
        self.trusted().await?;
        let name = self.name(&spec.key);
        // Uncontended, the first attempt costs one request; a wrong guess, one more.
        if let Some(grant) = self.try_acquire(spec, &name, true).await? {
            return Ok(grant);
        }
        // `Err(None)`: contended, or the store failed; try again.
        let name = &name;
        let acquired = RETRY
            .run(
                |_| async move {
                    match self.try_acquire(spec, name, false).await {
                        Ok(Some(grant)) => Ok(grant),
                        Ok(None) => Err(None),
                        Err(err) => Err(Some(err)),
                    }
                },
                Option::is_none,
            )
            .await;
        acquired.map_err(|failed| {
            failed.unwrap_or_else(|| {
                BackendError::Unavailable(format!(
                    "{name}: too much contention, or the store keeps failing"
                ))
            })
        })
    }

    async fn renew(&self, lease: &LeaseRef, ttl: Duration) -> BackendResult<Renewed> {
        let mut record = self
            .record_of(&lease.lease_id)
            .ok_or(BackendError::LeaseMismatch)?;
        record.store.ttl_ms = ttl.as_millis() as u64;
        record.store.renewed_at_ms = now_ms();
        let version = self.overwrite(lease, record.clone()).await?;
        if let Some(held) = self.held.locked().get_mut(&lease.lease_id) {
            *held = Held { version, record };
        }
        Ok(Renewed::ByThisCall)
    }

    async fn end(&self, lease: &LeaseRef, ending: &Ending) -> BackendResult<()> {
        let Some(mut record) = self.record_of(&lease.lease_id) else {
            return Ok(());
        };
        // The record as last written is the record as stored: a write by
        // anyone else would make this one fail its precondition.
        record.end(ending);
        record.store.forced_ttl_ms = None;
        record.store.renewed_at_ms = now_ms();
        let name = self.name(&lease.key);
        let outcome = self.overwrite(lease, record.clone()).await;
        if let Ok(version) = &outcome {
            self.learn(&name, Some((version.clone(), record)));
        }
        self.held.locked().remove(&lease.lease_id);
        match outcome {
            Ok(_) | Err(BackendError::LeaseMismatch) => Ok(()), // already someone else's: nothing to free
            Err(err) => Err(err),
        }
    }

    async fn adopt(&self, lease: &LeaseRef, by: &Adopter) -> BackendResult<Adopted> {
        self.trusted().await?;
        let name = self.name(&lease.key);
        let Read { object, date } = self.store.get(&name).await.map_err(unavailable)?;
        let stored = object.ok_or(BackendError::LeaseMismatch)?;
        let mut record = self.parse(&name, &stored)?;
        // The owner is checked on this read, and the write below is
        // conditional on its version: no one can change the holder between.
        if !record.held_by(&lease.lease_id, lease.token)
            || !record.holder.as_ref().is_some_and(|h| by.owns(h))
            || self.expired(&name, &record, &stored, date)
        {
            return Err(BackendError::LeaseMismatch);
        }
        if let Some(holder) = record.holder.as_mut() {
            holder.agent_id = by.agent_id.clone();
            let at = Stamp::store_or_agent(date);
            let adopted = history::event(EventKind::Adopted, holder, record.token, at);
            history::push(&mut record.history, adopted);
        }
        record.store.renewed_at_ms = now_ms();
        let holder = record
            .holder
            .clone()
            .ok_or_else(|| BackendError::Corrupt(format!("{name} is held but names no holder")))?;
        let ttl = Duration::from_millis(record.store.ttl_ms);
        self.held.locked().insert(
            lease.lease_id.clone(),
            Held {
                version: stored.version,
                record: record.clone(),
            },
        );
        let sent = Instant::now();
        let written = self.overwrite(lease, record.clone()).await;
        let mut held = self.held.locked();
        match written {
            Ok(version) => {
                held.insert(lease.lease_id.clone(), Held { version, record });
                Ok(Adopted::new(holder, sent, ttl))
            }
            Err(err) => {
                held.remove(&lease.lease_id);
                Err(err)
            }
        }
    }

    async fn confirm_stopped(&self, lease: &LeaseRef) -> BackendResult<()> {
        let name = self.stopped_name(&lease.key, lease.token);
        let body = serde_json::json!({ "key": lease.key.as_str(), "stopped": lease.token });
        match self
            .store
            .put(&name, body.to_string().into_bytes(), Precondition::Absent)
            .await
        {
            Ok(_) | Err(CasError::Conflict) => Ok(()),
            Err(err) => Err(unavailable(err)),
        }
    }

    async fn displaced_stopped(&self, key: &Key, displaced: &Displaced) -> BackendResult<bool> {
        let name = self.stopped_name(key, displaced.token);
        let Read { object, .. } = self.store.get(&name).await.map_err(unavailable)?;
        if object.is_none() {
            return Ok(false);
        }
        // Read once, by the one forcer it was written for.
        let _ = self.store.delete(&name).await;
        Ok(true)
    }

    async fn history(&self, key: &Key) -> BackendResult<Vec<KeyEvent>> {
        let name = self.name(key);
        let Read { object, .. } = self.store.get(&name).await.map_err(unavailable)?;
        match object {
            Some(stored) => Ok(self.parse(&name, &stored)?.history),
            None => Ok(Vec::new()),
        }
    }

    async fn inspect(&self, key: &Key) -> BackendResult<KeyRecord> {
        let name = self.name(key);
        let read = self.store.get(&name).await.map_err(unavailable)?;
        Ok(self.shown(key, &name, read)?.0)
    }

    async fn list(&self, ask: PageAsk<'_>) -> BackendResult<ListPage> {
        self.list_page(ask).await
    }

    async fn list_slots(&self, key: &Key) -> BackendResult<Option<Vec<Listed>>> {
        self.listed_slots(key).await.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{FaultyStore, Throttled};
    use super::super::MemoryCasStore;
    use super::*;
    use crate::backend::fixtures::{adopter, history_lines, lease, spec, Take, OWNER_UID};
    use runlock_protocol::Clock;

    const TTL: Duration = Duration::from_secs(10);

    /// An engine over `store` that has already checked the store (`proof`),
    /// so that the requests a test counts or faults it injects are its own.
    async fn proven(store: Arc<dyn CasStore>) -> CasEngine {
        let pace = store.site().min_write_interval;
        let engine = CasEngine::new(store);
        engine.prove().await.expect("the store keeps its promises");
        // The probe is removed in the background, once the store's pace allows.
        tokio::time::sleep(pace + Duration::from_millis(100)).await;
        engine
    }

    async fn pair(store: Arc<dyn CasStore>) -> (CasEngine, CasEngine) {
        (proven(store.clone()).await, proven(store).await)
    }

    async fn stored(store: &dyn CasStore, key: &str) -> CasRecord {
        let read = store.get(&format!("{key}.json")).await.expect("get");
        serde_json::from_slice(&read.object.expect("record").body).expect("json")
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_user_its_record_names_adopts_a_lease() {
        let store = Arc::new(MemoryCasStore::new());
        let (one, two) = pair(store.clone()).await;
        one.take("k", "l1", TTL).await;
        let stranger = Adopter {
            uid: OWNER_UID + 1,
            ..adopter("two")
        };
        assert!(matches!(
            two.adopt(&lease("k", "l1", 1), &stranger).await,
            Err(BackendError::LeaseMismatch)
        ));
        let record = stored(store.as_ref(), "k").await;
        assert_eq!(record.holder.expect("held").agent_id, "agent-of-l1");
        let adopted = two
            .adopt(&lease("k", "l1", 1), &adopter("two"))
            .await
            .expect("the owner's");
        assert_eq!(
            (
                adopted.grant.holder.agent_id.as_str(),
                adopted.grant.holder.token
            ),
            ("two", 1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn agents_exclude_each_other_and_release_leaves_a_free_record() {
        let store = Arc::new(MemoryCasStore::new());
        let (one, two) = pair(store.clone()).await;
        assert_eq!(one.take("k", "l1", TTL).await.holder.token, 1);
        match two.acquire(&spec("k", "l2", false, TTL)).await {
            Err(BackendError::Held(Some(h), _)) => {
                assert_eq!((h.host.as_str(), h.token), ("host-of-l1", 1))
            }
            other => panic!("expected held, got {other:?}"),
        }
        one.renew(&lease("k", "l1", 1), TTL).await.expect("renew");
        one.release(&lease("k", "l1", 1)).await.expect("release");
        let record = stored(store.as_ref(), "k").await;
        assert_eq!(
            (record.state, record.token, record.holder),
            (KeyState::Free, 1, None)
        );
        assert_eq!(two.take("k", "l2", TTL).await.holder.token, 2);
        let inspected = one
            .inspect(&Key::new("k").expect("valid"))
            .await
            .expect("inspect");
        assert_eq!((inspected.state, inspected.token), (KeyState::Held, 2));
        assert!(inspected
            .expires_in_ms
            .is_some_and(|ms| ms <= TTL.as_millis() as u64));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_holder_is_taken_over_only_after_ttl_grace_and_a_second_by_the_store_clock() {
        let store = Arc::new(MemoryCasStore::new());
        let (one, two) = pair(store.clone()).await;
        one.take("k", "l1", TTL).await;
        let written = Instant::now();
        let earliest = written + TTL + grace(TTL);
        loop {
            match two.acquire(&spec("k", "l2", false, TTL)).await {
                Ok(grant) => {
                    let at = Instant::now();
                    assert!(at >= earliest, "taken over {:?} too early", earliest - at);
                    assert!(
                        at <= earliest + CLOCK_RESOLUTION * 2,
                        "taken over late: {:?}",
                        at - written
                    );
                    assert_eq!(grant.holder.token, 2);
                    break;
                }
                Err(BackendError::Held(..)) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(other) => panic!("{other}"),
            }
        }
        assert!(matches!(
            one.renew(&lease("k", "l1", 1), TTL).await,
            Err(BackendError::LeaseMismatch)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_store_clock_a_record_must_be_seen_unchanged_for_ttl_and_grace() {
        let store = Arc::new(MemoryCasStore::with_clock(false));
        let (one, two) = pair(store.clone()).await;
        one.take("k", "l1", TTL).await;
        tokio::time::sleep(TTL * 5).await; // time passing unseen by `two` counts for nothing
        let first_look = Instant::now();
        assert!(matches!(
            two.acquire(&spec("k", "l2", false, TTL)).await,
            Err(BackendError::Held(..))
        ));
        // A renewal in between starts the watch again.
        tokio::time::sleep(TTL).await;
        one.renew(&lease("k", "l1", 1), TTL).await.expect("renew");
        let renewed = Instant::now();
        loop {
            match two.acquire(&spec("k", "l2", false, TTL)).await {
                Ok(_) => break,
                Err(BackendError::Held(..)) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(other) => panic!("{other}"),
            }
        }
        assert!(Instant::now() >= renewed + TTL + grace(TTL));
        assert!(Instant::now() > first_look + TTL + grace(TTL));
    }

    #[tokio::test(start_paused = true)]
    async fn force_writes_a_larger_token_and_the_old_holder_can_neither_renew_nor_free_it() {
        let store = Arc::new(MemoryCasStore::new());
        let (one, two) = pair(store.clone()).await;
        one.take("k", "l1", TTL).await;
        assert_eq!(
            two.acquire(&spec("k", "l2", true, TTL))
                .await
                .expect("forced")
                .holder
                .token,
            2
        );
        let record = stored(store.as_ref(), "k").await;
        assert_eq!(
            (record.forced_from, record.lease_id.as_deref()),
            (Some(1), Some("l2"))
        );
        assert!(matches!(
            one.renew(&lease("k", "l1", 1), TTL).await,
            Err(BackendError::LeaseMismatch)
        ));
        one.release(&lease("k", "l1", 1))
            .await
            .expect("a lost lease releases quietly");
        assert_eq!(stored(store.as_ref(), "k").await.state, KeyState::Held);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_whose_answer_was_lost_is_recognised_as_ours() {
        let store = Arc::new(FaultyStore::reliable(MemoryCasStore::new()));
        let (one, two) = pair(store.clone()).await;
        store.lose_next_answer();
        assert_eq!(one.take("k", "l1", TTL).await.holder.token, 1);
        store.lose_next_answer();
        // The retry meets a version it does not know, reads the record, finds it ours.
        one.renew(&lease("k", "l1", 1), TTL)
            .await
            .expect("the landed write is adopted");
        one.renew(&lease("k", "l1", 1), TTL)
            .await
            .expect("and its version kept");
        assert!(matches!(
            two.acquire(&spec("k", "l2", false, TTL)).await,
            Err(BackendError::Held(..))
        ));
        one.release(&lease("k", "l1", 1)).await.expect("release");
        assert_eq!(stored(store.as_ref(), "k").await.state, KeyState::Free);
    }

    #[tokio::test(start_paused = true)]
    async fn on_a_store_that_limits_writes_one_record_is_written_at_most_once_an_interval() {
        let store = Arc::new(Throttled::new());
        let engine = proven(store.clone()).await;
        store.writes.lock().expect("lock").clear();
        assert_eq!(engine.min_ttl(), Duration::from_secs(5));
        let ttl = engine.min_ttl();
        // Short runs back to back, each acquire right after the previous release.
        for (token, id) in [(1, "l1"), (2, "l2"), (3, "l3")] {
            let mut short = spec("k", id, false, TTL);
            short.ttl = ttl;
            engine.acquire(&short).await.expect("free");
            engine
                .renew(&lease("k", id, token), ttl)
                .await
                .expect("renew");
            engine
                .release(&lease("k", id, token))
                .await
                .expect("release");
        }
        // Another key is not held up by this one.
        let started = Instant::now();
        engine.take("j", "j1", TTL).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        let closest = store.closest_writes().expect("rewrites");
        assert!(closest >= Duration::from_secs(1), "{closest:?}");
        // The proof's probe object is removed in the meantime: not counted.
        let writes = store.writes.lock().expect("lock").clone();
        let records = writes
            .iter()
            .filter(|(name, _)| !name.contains(proof::PROBE));
        assert_eq!(records.count(), 10, "{writes:?}");
        assert!(CasEngine::new(Arc::new(MemoryCasStore::new()))
            .min_ttl()
            .is_zero());
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_whose_precondition_failed_does_not_hold_up_the_next() {
        let store = Arc::new(Throttled::new());
        let (one, two) = pair(store.clone()).await;
        one.take("k", "l1", TTL).await;
        one.release(&lease("k", "l1", 1)).await.expect("release");
        tokio::time::sleep(Duration::from_secs(2)).await;
        // `two` first tries to create the record, fails, reads it, and replaces it at once.
        let started = Instant::now();
        let grant = two.take("k", "l2", TTL).await;
        assert_eq!(grant.holder.token, 2);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    /// BENCHMARKS.md quotes these counts.
    #[tokio::test(start_paused = true)]
    async fn uncontended_operations_cost_one_write_each() {
        let store = Arc::new(FaultyStore::reliable(MemoryCasStore::new()));
        let engine = proven(store.clone()).await;
        let other = proven(store.clone()).await;
        let proof = store.requests();
        let requests = || {
            let now = store.requests();
            (now.0 - proof.0, now.1 - proof.1)
        };
        engine.take("k", "l1", TTL).await;
        assert_eq!(
            requests(),
            (0, 1),
            "acquire of a new key: one conditional PUT"
        );
        engine
            .renew(&lease("k", "l1", 1), TTL)
            .await
            .expect("renew");
        assert_eq!(requests(), (0, 2), "renew: one conditional PUT");
        engine.release(&lease("k", "l1", 1)).await.expect("release");
        assert_eq!(requests(), (0, 3), "release: one conditional PUT");
        let again = engine.take("k", "l2", TTL).await;
        assert_eq!(again.holder.token, 2);
        assert_eq!(
            requests(),
            (0, 4),
            "acquire of a key this agent freed: one PUT"
        );
        // Those single writes kept the history, in order.
        assert_eq!(
            history_lines(&engine, "k").await,
            [
                "Granted 1 host-of-l1",
                "Released 1 host-of-l1",
                "Granted 2 host-of-l2"
            ]
        );

        // A key last written by another agent: the guess fails, then a read and a write.
        other.take("j", "o1", TTL).await;
        other.release(&lease("j", "o1", 1)).await.expect("release");
        let before = requests();
        assert_eq!(engine.take("j", "l3", TTL).await.holder.token, 2);
        let after = requests();
        assert_eq!((after.0 - before.0, after.1 - before.1), (1, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_from_an_agent_that_kept_no_history_reads_as_none_and_starts_one() {
        let store = Arc::new(MemoryCasStore::new());
        let old = r#"{"key":"k","state":"free","token":7,"ttl_ms":10000,"renewed_at_ms":1}"#;
        store
            .put("k.json", old.as_bytes().to_vec(), Precondition::Absent)
            .await
            .expect("seeded");
        let engine = proven(store.clone()).await;
        let key = Key::new("k").expect("valid");
        assert!(engine.history(&key).await.expect("history").is_empty());
        assert_eq!(engine.inspect(&key).await.expect("inspect").incident, None);
        let grant = engine.take("k", "l1", TTL).await;
        assert_eq!(grant.holder.token, 8);
        let history = engine.history(&key).await.expect("history");
        assert_eq!(
            history
                .iter()
                .map(|e| (e.kind, e.token))
                .collect::<Vec<_>>(),
            [(EventKind::Granted, 8)]
        );
        // The stored record is one an older agent reads: its fields are all there.
        let record = stored(store.as_ref(), "k").await;
        assert_eq!((record.state, record.token), (KeyState::Held, 8));
    }

    #[tokio::test(start_paused = true)]
    async fn a_force_an_expiry_and_a_break_are_recorded_with_who_and_which_token() {
        let store = Arc::new(MemoryCasStore::new());
        let (one, two) = pair(store.clone()).await;
        let key = Key::new("k").expect("valid");
        one.take("k", "l1", TTL).await;
        two.acquire(&spec("k", "l2", true, TTL))
            .await
            .expect("forced");
        match one.acquire(&spec("k", "l3", false, TTL)).await {
            Err(BackendError::Held(Some(h), Some(incident))) => {
                assert_eq!(h.token, 2);
                assert_eq!(
                    (incident.kind, incident.token, incident.from_token),
                    (EventKind::Forced, 2, Some(1))
                );
            }
            other => panic!("expected held naming the force, got {other:?}"),
        }
        // `two` goes silent: `one` takes the key over once it expired.
        tokio::time::sleep(TTL + grace(TTL) + CLOCK_RESOLUTION * 2).await;
        one.take("k", "l4", TTL).await;
        let mut breaking = spec("k", "l5", true, TTL);
        breaking.breaking = true;
        two.acquire(&breaking).await.expect("broken");
        two.end(&lease("k", "l5", 4), &Ending::AfterBreak)
            .await
            .expect("freed");
        let history = one.history(&key).await.expect("history");
        let got: Vec<_> = history
            .iter()
            .map(|e| (e.kind, e.token, e.from_token, e.host.as_str(), e.clock))
            .collect();
        assert_eq!(
            got,
            [
                (EventKind::Granted, 1, None, "host-of-l1", Clock::Agent),
                (EventKind::Forced, 2, Some(1), "host-of-l2", Clock::Store),
                (EventKind::Expired, 2, None, "host-of-l2", Clock::Store),
                (EventKind::Granted, 3, None, "host-of-l4", Clock::Store),
                (EventKind::Broken, 4, Some(3), "host-of-l5", Clock::Store),
            ]
        );
        assert!(
            !history[2].reason.is_empty(),
            "an expiry says how it was seen"
        );
        let record = one.inspect(&key).await.expect("inspect");
        assert_eq!(record.state, KeyState::Free);
        assert_eq!(record.incident.map(|e| e.kind), Some(EventKind::Broken));
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_that_is_not_ours_to_read_is_reported_not_overwritten() {
        let store = Arc::new(MemoryCasStore::new());
        store
            .put(
                "k.json",
                b"{\"not\": \"a record\"}".to_vec(),
                Precondition::Absent,
            )
            .await
            .expect("put");
        let engine = CasEngine::new(store.clone());
        match engine.acquire(&spec("k", "l1", false, TTL)).await {
            // Moved aside, it would hand out its tokens again: never advised.
            Err(BackendError::Corrupt(msg)) => assert!(
                msg.contains("k.json") && msg.contains("token is at least its last"),
                "{msg}"
            ),
            other => panic!("expected corrupt, got {other:?}"),
        }
        let read = store.get("k.json").await.expect("get");
        assert_eq!(read.object.expect("kept").body, b"{\"not\": \"a record\"}");
    }
}
