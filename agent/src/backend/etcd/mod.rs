//! `etcd://host:port[,host:port]/prefix`: each held key is an etcd key under
//! `prefix/`, attached to the agent's etcd lease for its TTL (`session.rs`:
//! one lease per agent and TTL, of TTL + grace by etcd's clock, however many
//! keys are on it). Native semantics, not the object-store engine:
//!
//! - acquire: one transaction: if the key does not exist, put it with that
//!   lease, else read it (the holder). `--force` deletes the key if it is
//!   unchanged since that read and creates the key again.
//! - the fencing token is the key's create revision: the store revision of the
//!   transaction that granted it. etcd's revision is one counter for the whole
//!   keyspace that only grows and is persisted, and every acquisition creates
//!   the key anew, so each grant's token is larger than every earlier grant's
//!   of that key, whichever agent made it, across agent and etcd restarts. Only
//!   a new cluster, or a restore from an older backup, counts from the start.
//! - renew: the shared lease kept alive (at most once per TTL/6 for all its
//!   keys), and the key still attached to it with its create revision (a
//!   `--force` elsewhere replaces it): the watch on the prefix says so while
//!   it is up (`watched.rs`), else the key is read.
//! - release: one transaction deletes the key, if still attached to our lease
//!   with our token, and records the release in the key's history
//!   (`history.rs`); if the history changed meanwhile, the key alone is
//!   deleted, as before history was kept. No lease is revoked: it is shared.
//! - a holder whose agent dies stops keeping its lease alive, and etcd deletes
//!   its keys when the lease runs out, by etcd's own clock.
//! - waiters: the same watch reports deleted keys (`releases.rs`).
//!
//! `acquire.rs` takes a key (and forces one), `view.rs` is what `inspect`
//! and `list` show; this file holds the backend's state and the rest of
//! the [`Backend`] operations.
//!
//! No message built here carries the password: etcd's own messages never
//! echo it, and the endpoints are kept without userinfo.

mod acquire;
mod errors;
mod history;
mod listing;
mod record;
mod releases;
mod reports;
pub mod rpc;
mod session;
mod settings;
#[cfg(test)]
mod tests;
mod tls;
mod transport;
mod view;
mod watched;

use super::{
    key_name, AcquireSpec, Adopted, Adopter, Backend, BackendError, BackendResult, Capabilities,
    Displaced, Ending, EtcdOptions, Grant, LeaseRef, ListFrom, ListPage, Listed, PageAsk, Profile,
    Profiled, Renewed, ReportName, Reports, StoreContext, StoredReport,
};
use crate::backend::history::{self as shared, Stamp};
use crate::backend::retry::TIMEOUTS;
use crate::unpoisoned::Unpoisoned;
use async_trait::async_trait;
use errors::{LeaseGone, Problem};
use futures::StreamExt;
use history::Kept;
use record::EtcdRecord;
use rpc::{Compare, Get, KeyValue, Txn, TxnOp, TxnResponse};
use runlock_protocol::{timing, EventKind, Holder, Key, KeyEvent, KeyRecord, KeyState, Scope};
use session::Sessions;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use transport::{watch_releases, Connection};
use watched::{Watched, Word};

/// How long a word that a taken-over run has stopped is kept for its forcer.
const STOPPED_WORD_SECONDS: i64 = 3600;

/// The etcd lease TTL for a runlock TTL: others may take the key only after
/// TTL + grace by etcd's clock, the same margin the object stores give (see
/// `renewal::deadline`). etcd counts whole seconds.
pub(crate) fn lease_seconds(ttl: Duration) -> i64 {
    (ttl + timing::grace(ttl)).as_secs_f64().ceil() as i64
}

/// The etcd lease a key goes on, and when it was last kept alive: the
/// key's clock starts there.
#[derive(Debug, Clone, Copy)]
struct EtcdLease {
    id: i64,
    sent: Instant,
}

/// The lock store on an etcd cluster.
pub struct EtcdBackend {
    connection: Arc<Connection>,
    /// `etcd://hosts/prefix`, and the user if any: never the password.
    description: String,
    /// runlock lease id → the etcd lease that holds its key. (Its holder is
    /// in the key's history as kept here: the event that granted it.)
    held: Mutex<HashMap<String, i64>>,
    /// Each key's history as this agent last read or wrote it, by the
    /// history key's name: the condition its next write is made on.
    histories: Mutex<HashMap<String, Kept>>,
    /// The agent's etcd leases, one per TTL, that its keys are on.
    sessions: Sessions,
    /// What the watch says of the keys held here.
    watched: Arc<Watched>,
    /// Keys (by name) an acquire last found held: the next try reads first.
    seen_held: Mutex<HashSet<String>>,
    watch: bool,
    released: OnceLock<broadcast::Sender<Key>>,
    /// Stops the watch when the backend goes, or the agent's stores close.
    stop: CancellationToken,
    /// Where the watch and an abandoned acquire's clean-up run.
    context: StoreContext,
}

impl EtcdBackend {
    /// Who `open` would authenticate as, for `check-config`: the user and
    /// where the password came from, or the TLS client certificate; never
    /// the password. Makes no request.
    pub fn describe_credentials(uri: &str, options: &EtcdOptions) -> anyhow::Result<String> {
        let target = settings::parse_uri(uri)?;
        let user = settings::credentials(target.user, options)?;
        let certificate = tls::client_certificate(options);
        Ok(match (user, certificate) {
            (Some((name, _)), Some(cert)) => format!(
                "user {name} with a password, and TLS client certificate {}",
                cert.display()
            ),
            (Some((name, _)), None) => format!("user {name} with a password"),
            (None, Some(cert)) => format!("TLS client certificate {}", cert.display()),
            (None, None) => "none (the cluster must allow unauthenticated clients)".to_string(),
        })
    }

    /// Opens `etcd://[user:password@]host:port[,host:port]/prefix`. Makes no
    /// request; see [`EtcdBackend::probe`].
    pub fn open(
        uri: &str,
        options: &EtcdOptions,
        context: &StoreContext,
    ) -> anyhow::Result<EtcdBackend> {
        let target = settings::parse_uri(uri)?;
        let user = settings::credentials(target.user, options)?;
        let tls = tls::settings(target.tls, options)?;
        let hosts = target.hosts.join(",");
        let prefix = target.prefix;
        let mut description = format!("etcd://{hosts}/{}", prefix.trim_end_matches('/'));
        match (&user, &tls) {
            (Some((name, _)), Some(_)) => description.push_str(&format!(" (user {name}, TLS)")),
            (Some((name, _)), None) => description.push_str(&format!(" (user {name})")),
            (None, Some(_)) => description.push_str(" (TLS)"),
            (None, None) => {}
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        let connection = Arc::new(Connection {
            endpoints: target
                .hosts
                .iter()
                .map(|h| format!("{scheme}://{h}"))
                .collect(),
            user,
            tls,
            client: tokio::sync::Mutex::new(None),
            place: format!("etcd at {hosts}"),
            prefix: prefix.clone(),
        });
        Ok(EtcdBackend {
            sessions: Sessions::new(connection.clone()),
            watched: Arc::default(),
            connection,
            description,
            held: Mutex::new(HashMap::new()),
            histories: Mutex::new(HashMap::new()),
            seen_held: Mutex::new(HashSet::new()),
            watch: target.watch,
            released: OnceLock::new(),
            stop: context.closing(),
            context: context.clone(),
        })
    }

    /// Checks that etcd answers and lets this user read the prefix; the
    /// error names the cause.
    pub async fn probe(&self) -> BackendResult<()> {
        let prefix = self.connection.prefix.clone();
        self.bounded(async {
            self.connection
                .call(|c| {
                    let prefix = prefix.clone();
                    async move {
                        let only_one = Get::key(prefix)
                            .with_prefix()
                            .with_keys_only()
                            .with_limit(1);
                        c.get(only_one).await
                    }
                })
                .await
                .map(|_| ())
                .map_err(|p| self.connection.unavailable(p))
        })
        .await
    }

    fn name(&self, key: &Key) -> String {
        format!("{}{}", self.connection.prefix, key_name::escaped(key))
    }

    /// Bounds a whole operation: a hung etcd never blocks a caller for longer.
    async fn bounded<T>(
        &self,
        operation: impl Future<Output = BackendResult<T>>,
    ) -> BackendResult<T> {
        match tokio::time::timeout(TIMEOUTS.operation, operation).await {
            Ok(result) => result,
            Err(_) => Err(BackendError::Unavailable(format!(
                "{} gave no answer within {} s: check that etcd runs there and this host can \
                 reach it",
                self.connection.place,
                TIMEOUTS.operation.as_secs()
            ))),
        }
    }

    fn parse(&self, name: &str, kv: &KeyValue) -> BackendResult<EtcdRecord> {
        serde_json::from_slice(kv.value()).map_err(|e| {
            BackendError::Corrupt(format!(
                "{name} in {} is not a runlock record ({e}); delete it to free the key",
                self.description
            ))
        })
    }

    fn holder_of(&self, name: &str, kv: &KeyValue) -> BackendResult<Holder> {
        self.parse(name, kv)?
            .holder(kv.create_revision() as u64)
            .ok_or_else(|| {
                BackendError::Corrupt(format!(
                    "{name} in {} names no readable holder; delete it to free the key",
                    self.description
                ))
            })
    }

    fn lease_of(&self, lease_id: &str) -> Option<i64> {
        self.held.locked().get(lease_id).copied()
    }

    /// Where a key's history lives: a name no escaped key can have (a
    /// leading `.`), and a key the watch for released keys never sees
    /// deleted.
    fn history_name(&self, key: &Key) -> String {
        format!("{}{}", self.histories(), key_name::escaped(key))
    }

    /// What every history key's name starts with.
    fn histories(&self) -> String {
        format!("{}.history/", self.connection.prefix)
    }

    /// The history as this agent last saw it (absent if it never did).
    fn kept(&self, name: &str) -> Kept {
        let histories = self.histories.locked();
        histories.get(name).cloned().unwrap_or_default()
    }

    /// Notes what a read or a write showed of a history; whether it changed.
    fn keep(&self, name: &str, kept: Kept) -> bool {
        let mut histories = self.histories.locked();
        // An absent history is what an unknown one reads as: no entry for
        // it (each plain key's slot-1 history, read at every acquire, is).
        let before = if kept == Kept::default() {
            histories.remove(name)
        } else {
            histories.insert(name.to_string(), kept.clone())
        };
        before.unwrap_or_default() != kept
    }

    /// The history in a read's answer; unreadable: the error that says so.
    fn read_history(&self, name: &str, kv: Option<&KeyValue>) -> BackendResult<Kept> {
        Kept::read(kv).ok_or_else(|| {
            BackendError::Corrupt(format!(
                "{name} in {} is not a runlock history; delete it to start it afresh",
                self.description
            ))
        })
    }

    /// The lease for one acquire attempt, and when its clock started.
    async fn lease_for(&self, ttl: Duration) -> BackendResult<EtcdLease> {
        let (id, sent) = self.sessions.for_grant(ttl).await?;
        Ok(EtcdLease { id, sent })
    }

    /// Whether an acquire last found the key `name` held (`held`), now.
    fn seen_held(&self, name: &str, held: Option<bool>) -> bool {
        let mut seen = self.seen_held.locked();
        match held {
            Some(true) => !seen.insert(name.to_string()),
            Some(false) => seen.remove(name),
            None => seen.contains(name),
        }
    }

    /// A waiter's next try at a key it found held: one read-only
    /// transaction, which etcd answers without a Raft write (a conditional
    /// create is one, even when its condition fails, and wants a lease).
    /// `Ok(None)`: free now, or the key is this very acquire's own (an
    /// earlier answer was lost): the create path decides.
    async fn still_held(
        &self,
        spec: &AcquireSpec,
        name: &str,
        marker: &str,
        history_key: &str,
    ) -> BackendResult<Option<BackendError>> {
        let read = Txn::new().and_then([
            TxnOp::get(Get::key(name)),
            TxnOp::get(Get::key(history_key)),
            TxnOp::get(Get::key(marker)),
        ]);
        let answer = self.transact(read).await?;
        let mut got = answer.firsts();
        let (current, history_kv, forcing) = (
            got.next().flatten(),
            got.next().flatten(),
            got.next().flatten(),
        );
        let now = self.read_history(history_key, history_kv.as_ref())?;
        let incident = shared::last_incident(&now.events);
        self.keep(history_key, now);
        let holder = match current {
            Some(current) if self.parse(name, &current)?.lease_id != spec.lease_id => {
                Some(Box::new(self.holder_of(name, &current)?))
            }
            // Another agent is forcing it, and holds it meanwhile.
            None if forcing.is_some() => None,
            _ => {
                self.seen_held(name, Some(false));
                return Ok(None);
            }
        };
        Ok(Some(BackendError::Held(holder, incident)))
    }

    /// Where the agent of a lease taken over says its run has stopped, for
    /// the forcer waiting on it: a name no escaped key can have, as below.
    fn stopped_name(&self, key: &Key, token: u64) -> String {
        format!(
            "{}.stopped/{}/{token}",
            self.connection.prefix,
            key_name::escaped(key)
        )
    }

    /// Where a force in progress marks its key (see `acquire::take_over`): a name no
    /// escaped key can have, since escaping turns a leading `.` into `%2E`.
    pub(crate) fn force_marker(&self, key: &Key) -> String {
        format!(
            "{}.force/{}",
            self.connection.prefix,
            key_name::escaped(key)
        )
    }

    async fn transact(&self, txn: Txn) -> BackendResult<TxnResponse> {
        self.transact_as_is(txn)
            .await
            .map_err(|p| self.connection.unavailable(p))
    }

    /// [`Self::transact`], its failure as etcd's, for a caller that handles
    /// one of them itself.
    async fn transact_as_is(&self, txn: Txn) -> Result<TxnResponse, Problem> {
        self.connection
            .call(|c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
    }

    /// A key and its history, in one request.
    async fn read_with_history(
        &self,
        name: &str,
        history_key: &str,
    ) -> BackendResult<(Option<KeyValue>, Kept)> {
        let both = Txn::new().and_then([
            TxnOp::get(Get::key(name)),
            TxnOp::get(Get::key(history_key)),
        ]);
        let answer = self.transact(both).await?;
        let mut read = answer.firsts();
        let (kv, history_kv) = (read.next().flatten(), read.next().flatten());
        let kept = self.read_history(history_key, history_kv.as_ref())?;
        self.keep(history_key, kept.clone());
        Ok((kv, kept))
    }

    async fn read(&self, name: &str) -> BackendResult<Option<KeyValue>> {
        let got = self
            .connection
            .request(|c| async move { c.get(Get::key(name)).await })
            .await?;
        Ok(got.kvs.into_iter().next())
    }
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl EtcdBackend {
    /// The backend's URI with the password removed.
    pub fn describe(&self) -> String {
        self.description.clone()
    }
}

impl Profiled for EtcdBackend {
    fn profile(&self) -> Profile {
        Profile {
            // The lease outlives the agent; the next agent adopts it.
            capabilities: Capabilities::SHARED_LEASES,
            min_ttl: Duration::ZERO,
            description: self.description.clone(),
            releases: self.release_sender(),
        }
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    async fn confirm_stopped(&self, lease: &LeaseRef) -> BackendResult<()> {
        let name = &self.stopped_name(&lease.key, lease.token);
        // On a lease of its own, so that a word nobody reads (its forcer gave
        // up waiting) goes by itself.
        let granted = self
            .connection
            .request(|c| async move { c.lease_grant(STOPPED_WORD_SECONDS).await })
            .await?;
        self.connection
            .request(|c| async move { c.put(name.as_str(), "stopped", Some(granted)).await })
            .await?;
        Ok(())
    }

    async fn displaced_stopped(&self, key: &Key, displaced: &Displaced) -> BackendResult<bool> {
        let name = &self.stopped_name(key, displaced.token);
        // Read and removed in one request.
        let deleted = self
            .connection
            .request(|c| async move { c.delete(name.as_str()).await })
            .await?;
        Ok(deleted > 0)
    }

    async fn acquire(&self, spec: &AcquireSpec) -> BackendResult<Grant> {
        self.bounded(self.try_acquire(spec)).await
    }

    /// Keeps the agent's etcd lease for `ttl` alive (one request for all its
    /// keys, at most every TTL/6) and checks the key is still on it with its
    /// token: by the watch's word, else by reading it, both at once.
    async fn renew(&self, lease: &LeaseRef, ttl: Duration) -> BackendResult<Renewed> {
        let id = self
            .lease_of(&lease.lease_id)
            .ok_or(BackendError::LeaseMismatch)?;
        let name = self.name(&lease.key);
        let token = lease.token as i64;
        self.bounded(async {
            let word = self.watched.word(&name, token);
            if word == Word::Deleted {
                return Err(BackendError::LeaseMismatch);
            }
            let epoch = self.watched.epoch();
            let still_ours = async {
                if word == Word::Kept {
                    return Ok(true);
                }
                let ours = self
                    .read(&name)
                    .await?
                    .is_some_and(|kv| kv.lease() == id && kv.create_revision() == token);
                if ours {
                    self.watched.hold(&name, token, epoch);
                }
                Ok(ours)
            };
            let (kept, ours) = tokio::join!(self.sessions.renew(id, ttl), still_ours);
            let since = kept?;
            if ours? {
                Ok(Renewed::Since(since))
            } else {
                Err(BackendError::LeaseMismatch)
            }
        })
        .await
    }

    /// Deletes the key and records how its lease ended, in one transaction,
    /// if the key is still ours and its history as we last wrote it;
    /// otherwise deletes the key alone if it is still ours, and records
    /// nothing. The etcd lease is the agent's, and stays.
    async fn end(&self, lease: &LeaseRef, ending: &Ending) -> BackendResult<()> {
        let held = self.held.locked().remove(&lease.lease_id);
        let Some(id) = held else {
            return Ok(()); // not ours (any more): nothing to let go of
        };
        let name = self.name(&lease.key);
        self.watched.forget(&name, lease.token as i64);
        let history_key = self.history_name(&lease.key);
        let kept = self.kept(&history_key);
        let ours = [
            Compare::lease(name.clone(), id),
            Compare::create_revision(name.clone(), lease.token as i64),
        ];
        let mut when = ours.to_vec();
        let mut then = vec![TxnOp::delete(name.clone())];
        let mut events = kept.events.clone();
        // Without the event that began it (a history not current here), the
        // key alone is deleted, as when the history changed meanwhile.
        let event = kept
            .began(lease.token)
            .and_then(|began| ending.event_after(began, Stamp::agent_now()));
        if let Some(event) = event.clone() {
            shared::push(&mut events, event);
            when.push(Compare::mod_revision(history_key.clone(), kept.revision));
            then.push(TxnOp::put(
                history_key.clone(),
                history::body(&lease.key, &events),
                None,
            ));
        }
        self.bounded(async {
            let ended = self.transact(Txn::new().when(when).and_then(then)).await?;
            if ended.succeeded {
                let revision = ended.revision();
                if event.is_some() {
                    self.keep(&history_key, Kept::written(revision, events));
                }
                return Ok(());
            }
            let delete = Txn::new()
                .when(ours)
                .and_then([TxnOp::delete(name.clone())]);
            self.transact(delete).await.map(|_| ())
        })
        .await
    }

    /// A page costs one request, a read-only transaction of two or three
    /// ranges (the records', in two around the `.` names when the listing
    /// is of every key, and the histories' of the same names), then one
    /// request per etcd lease its held records are on (one per agent and
    /// TTL, shared by all that agent's keys) for the time it has left:
    /// never one per key. At most [`MOST_NAMES_PER_PAGE`] names a page. A
    /// released key too long to spell (named by its hash) is named by its
    /// history (see `history`).
    async fn list(&self, ask: PageAsk<'_>) -> BackendResult<ListPage> {
        self.list_page(ask).await
    }

    async fn history(&self, key: &Key) -> BackendResult<Vec<KeyEvent>> {
        let name = self.history_name(key);
        self.bounded(async {
            let kv = self.read(&name).await?;
            let kept = self.read_history(&name, kv.as_ref())?;
            let events = kept.events.clone();
            self.keep(&name, kept);
            Ok(events)
        })
        .await
    }

    async fn inspect(&self, key: &Key) -> BackendResult<KeyRecord> {
        let name = self.name(key);
        self.bounded(async {
            let (kv, kept) = self
                .read_with_history(&name, &self.history_name(key))
                .await?;
            let left = match &kv {
                Some(kv) => self.lease_left(kv.lease()).await,
                None => None,
            };
            self.shown(key, &name, kv.as_ref(), &kept, left)
        })
        .await
    }

    async fn adopt(&self, lease: &LeaseRef, by: &Adopter) -> BackendResult<Adopted> {
        let name = self.name(&lease.key);
        let history_key = self.history_name(&lease.key);
        self.bounded(async {
            let (kv, kept) = self.read_with_history(&name, &history_key).await?;
            let kv = kv.ok_or(BackendError::LeaseMismatch)?;
            let mut record = self.parse(&name, &kv)?;
            let id = kv.lease();
            let ours = record.lease_id == lease.lease_id
                && kv.create_revision() as u64 == lease.token
                && id != 0;
            if !ours {
                return Err(BackendError::LeaseMismatch);
            }
            record
                .holder
                .insert("agent_id".into(), by.agent_id.clone().into());
            let holder = record.holder(lease.token).ok_or_else(|| {
                BackendError::Corrupt(format!(
                    "{name} in {} names no readable holder",
                    self.description
                ))
            })?;
            // The rewrite below holds only if the record is unchanged.
            if !by.owns(&holder) {
                return Err(BackendError::LeaseMismatch);
            }
            let ttl = Duration::from_millis(record.ttl_ms);
            // The key moves to this agent's lease: the stopped agent's runs
            // that no agent adopts go when its lease runs out.
            let ours = self.lease_for(ttl).await?;
            let epoch = self.watched.epoch();
            let mut events = kept.events.clone();
            let adopted =
                shared::event(EventKind::Adopted, &holder, lease.token, Stamp::agent_now());
            shared::push(&mut events, adopted);
            // Rewritten only if untouched since the read: a force in between wins.
            let rewrite = Txn::new()
                .when([
                    Compare::mod_revision(name.clone(), kv.mod_revision()),
                    Compare::mod_revision(history_key.clone(), kept.revision),
                ])
                .and_then([
                    TxnOp::put(name.clone(), record.body(), Some(ours.id)),
                    TxnOp::put(
                        history_key.clone(),
                        history::body(&lease.key, &events),
                        None,
                    ),
                ]);
            let written = self.transact(rewrite).await?;
            if !written.succeeded {
                return Err(BackendError::LeaseMismatch);
            }
            let revision = written.revision();
            self.keep(&history_key, Kept::written(revision, events));
            self.hold(&lease.key, &lease.lease_id, ours.id, lease.token, epoch);
            Ok(Adopted::new(holder, ours.sent, ttl))
        })
        .await
    }
}
