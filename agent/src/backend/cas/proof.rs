//! Before an object store is trusted with a lock, it must show that it
//! refuses what the lease engine relies on it refusing. Some S3-compatible
//! stores ignore `If-None-Match` and `If-Match` and answer 200: on such a
//! store two agents would both be granted one key, with one token. So, on a
//! probe object beside the records, the store must refuse a create-if-absent
//! of an existing object and a replace against a version that is no longer
//! current, must give each write a new version, must show a write to the next
//! read, and must stamp a write with a time no older than the write (expiry
//! is judged by it).
//!
//! Refusing one request at a time is not enough: in 2026 several
//! self-hosted S3 stores (SeaweedFS, RustFS, versitygw) were found to check a
//! condition and then write, in two steps, so that two concurrent conditional
//! writes of one object both succeeded. So every conditional write of the
//! proof is a race: two creates-if-absent of the new probe object at
//! once, then as many replaces against the version the winning create left,
//! and exactly one writer must win each. A race's losers are the proof's
//! "create again" and "stale replace": a store that ignores a condition, or
//! checks it apart from the write, lets them win too. `runlockd
//! check-config` races more writers on more objects ([`Proof::THOROUGH`]).
//!
//! Each proof writes an object of its own (`probe-<random>`), removed once
//! the verdict is in: agents that start together on one store never write
//! one object, so none breaks another's proof (invariant 9), and on a store
//! that limits writes per object (GCS) the proof keeps to its pace. It is on
//! every agent's start path, so it asks what it must and no more: three round
//! trips (the creates' race, the replaces' race, a read), five requests with
//! two racers; the agent removes the object afterwards, off that path and at
//! a random moment within 10 s, so that agents starting together do not
//! remove theirs during their first grants ([`remove_probe_later`]).
//!
//! Only a definite answer condemns a store: an error or a timeout leaves the
//! question open, and it is asked again at the next acquire.

use super::{CasError, CasStore, Precondition, Read, Stored};
use std::time::Duration;

/// The start of a probe object's name under the records' prefix: never a
/// key's record, whose names all end in `.json`.
pub const PROBE: &str = "probe-";

/// How many times a step is tried again after the object changed under it:
/// nobody else writes it, so only a store that loses or reorders writes does.
const ATTEMPTS: usize = 12;

/// Waits a random 5–50 ms before a step is tried again.
async fn back_off() {
    tokio::time::sleep(Duration::from_millis(fastrand::u64(5..50))).await;
}

/// Why a store is not (yet) trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unproven {
    /// The store answered, and broke the guarantee named.
    Lacks(String),
    /// No definite answer: the store failed, or others kept writing the probe.
    Unanswered(String),
}

/// How hard a proof tries: how many writers race in each of its races, and
/// how many probe objects it puts through the checks at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proof {
    pub racers: usize,
    pub objects: usize,
}

impl Proof {
    /// On every agent's start path: a store that checks and writes in two
    /// steps lets every racer through that checks before the first writes,
    /// so two find it. No more: 200 agents starting together with 4 racers
    /// on each of 2 objects opened up to 9 connections each and moto stopped
    /// accepting (BENCHMARKS.md, "Fleet").
    pub const AT_START: Proof = Proof {
        racers: 2,
        objects: 1,
    };
    /// `runlockd check-config`, asked once by a person: many writers on
    /// several objects at once, so that a window between check and write too
    /// short for two racers to meet is met.
    pub const THOROUGH: Proof = Proof {
        racers: 8,
        objects: 4,
    };
}

impl Default for Proof {
    fn default() -> Proof {
        Proof::AT_START
    }
}

/// Puts `store` through the checks on probe objects of this proof's own
/// under `prefix`, `proof.objects` at once; returns the verdict (the first
/// guarantee found broken, else the first open question) and the objects'
/// names, for [`remove_probe`].
pub async fn prove(
    store: &dyn CasStore,
    prefix: &str,
    proof: Proof,
) -> (Result<(), Unproven>, Vec<String>) {
    let writers: Vec<String> = (0..proof.objects.max(1))
        .map(|_| uuid::Uuid::new_v4().simple().to_string())
        .collect();
    let names: Vec<String> = writers
        .iter()
        .map(|writer| format!("{prefix}{PROBE}{writer}"))
        .collect();
    let checked = names
        .iter()
        .zip(&writers)
        .map(|(name, writer)| checks(store, name, writer, proof.racers));
    let verdicts = futures::future::join_all(checked).await;
    let condemned = verdicts
        .iter()
        .find(|verdict| matches!(verdict, Err(Unproven::Lacks(_))));
    let verdict = match condemned {
        Some(condemned) => condemned.clone(),
        None => verdicts.into_iter().find(Result::is_err).unwrap_or(Ok(())),
    };
    (verdict, names)
}

/// Conditional writes of `name` at once, one of `bodies` each:
/// creates if absent, or replaces against one version. Two winners condemn
/// the store; the winner (its index and version), or `None` where none was
/// seen (refused, or answers lost).
async fn race(
    store: &dyn CasStore,
    name: &str,
    bodies: &[String],
    when: Precondition<'_>,
) -> Result<Option<(usize, String)>, Unproven> {
    let racers = bodies
        .iter()
        .map(|body| store.put(name, body.clone().into_bytes(), when));
    let answers = futures::future::join_all(racers).await;
    let wins: Vec<(usize, String)> = answers
        .into_iter()
        .enumerate()
        .filter_map(|(racer, answer)| Some((racer, answer.ok()?)))
        .collect();
    if wins.len() > 1 {
        let (what, ignored) = match when {
            Precondition::Absent => (
                "creates of one new object, each only if it was absent",
                "If-None-Match: *",
            ),
            Precondition::Matches(_) => (
                "replaces of one object, each only if its version was the one all saw",
                "If-Match",
            ),
        };
        return Err(lacks(&format!(
            "{} of {} concurrent {what} all succeeded (it ignores {ignored} or its \
             equivalent, or checks the condition and writes in two steps), so two agents \
             racing for one key would both be granted it",
            wins.len(),
            bodies.len()
        )));
    }
    Ok(wins.into_iter().next())
}

/// How long after its proof an agent removes its probe object, at most: a
/// random share of it keeps the removals of agents that started together out
/// of their first grants (one request in nine on each agent's start path).
pub const REMOVAL_SPREAD: Duration = Duration::from_secs(10);

/// [`remove_probe`], at a random moment within [`REMOVAL_SPREAD`].
pub async fn remove_probe_later(store: &dyn CasStore, names: &[String]) {
    tokio::time::sleep(REMOVAL_SPREAD.mul_f64(fastrand::f64())).await;
    remove_probe(store, names).await;
}

/// Removes the probe objects `names` once the store allows another write of
/// them. A probe left behind (its agent stopped first) costs a few bytes and
/// misleads nobody: removing it is tidiness, never part of the verdict.
pub async fn remove_probe(store: &dyn CasStore, names: &[String]) {
    tokio::time::sleep(store.site().min_write_interval).await;
    let removals = names.iter().map(|name| async move {
        if let Err(err) = store.delete(name).await {
            tracing::debug!("could not remove the probe object {name}: {err}");
        }
    });
    futures::future::join_all(removals).await;
}

async fn checks(
    store: &dyn CasStore,
    name: &str,
    writer: &str,
    racers: usize,
) -> Result<(), Unproven> {
    // Each body differs from every other: a store whose version is a hash of
    // the content (S3's ETag) gives equal bodies one version.
    let body = |step: &str| format!("{{\"runlock_probe\":\"{writer}\",\"step\":\"{step}\"}}\n");
    let bodies = |step: &str| -> Vec<String> {
        (0..racers.max(2))
            .map(|racer| body(&format!("{step} {racer}")))
            .collect()
    };
    // The name is new, so the creates come first, without a read before
    // them, and the winner's answer names the version.
    let creates = bodies("create");
    let mut current = race(store, name, &creates, Precondition::Absent)
        .await?
        .map(|(won, version)| Stored {
            body: creates[won].clone().into(),
            version,
            last_modified: None,
        });

    for attempt in 0..ATTEMPTS {
        let before = match current.take() {
            Some(known) => known,
            // No create was seen to win (answers lost): read what is there.
            None => existing(store, name, &body("create")).await?,
        };
        // The create (or the last update) was a write of this object too.
        tokio::time::sleep(store.site().min_write_interval).await;
        let updates = bodies(&format!("update {attempt}"));
        let sent = std::time::Instant::now();
        let when = Precondition::Matches(&before.version);
        let Some((won, version)) = race(store, name, &updates, when).await? else {
            back_off().await; // changed under us, or the answers were lost
            continue;
        };
        if version == before.version {
            return Err(lacks(
                "a write left the object's version unchanged, so a write made against \
                 the old version cannot be refused",
            ));
        }
        let Read { object, date } = store.get(name).await.map_err(unanswered)?;
        let Some(after) = object else {
            back_off().await;
            continue;
        };
        if after.body == before.body {
            return Err(lacks(
                "a read after a write returned the object as it was before the write",
            ));
        }
        if after.body != updates[won].as_bytes() {
            if updates.iter().any(|lost| after.body == lost.as_bytes()) {
                return Err(lacks(
                    "a replace it refused, or made against a version that was no longer \
                     current, was written over the one it accepted",
                ));
            }
            back_off().await; // written since by someone else: nothing learnt
            continue;
        }
        if after.version != version {
            return Err(lacks(
                "a read after a write returned another version than the write did",
            ));
        }
        let sent_by_store_clock = date.and_then(|date| date.checked_sub(sent.elapsed()));
        if let (Some(written), Some(sent_at_the_latest)) =
            (after.last_modified, sent_by_store_clock)
        {
            // The store's clock read the read's date at most `sent.elapsed()`
            // after the update was sent, so the update cannot have been
            // written before that date less the elapsed time: a stamp older
            // than that would make a live holder look expired early.
            if written + super::CLOCK_RESOLUTION < sent_at_the_latest {
                return Err(lacks(&format!(
                    "it stamped a write {}s before the write was sent (a Last-Modified \
                     that does not move with each write), so a live holder would look \
                     expired",
                    sent_at_the_latest
                        .duration_since(written)
                        .unwrap_or(Duration::ZERO)
                        .as_secs()
                )));
            }
        }
        return Ok(());
    }
    Err(Unproven::Unanswered(format!(
        "{name} kept changing while it was checked, though no other agent writes it"
    )))
}

/// The probe object as it is now, created if absent.
async fn existing(store: &dyn CasStore, name: &str, body: &str) -> Result<Stored, Unproven> {
    for _ in 0..ATTEMPTS {
        if let Some(object) = store.get(name).await.map_err(unanswered)?.object {
            return Ok(object);
        }
        match store.put(name, body.into(), Precondition::Absent).await {
            Ok(_) | Err(CasError::Conflict) => {}
            Err(err) => return Err(unanswered(err)),
        }
    }
    Err(Unproven::Unanswered(format!(
        "{name} could not be created and read back"
    )))
}

fn lacks(what: &str) -> Unproven {
    Unproven::Lacks(what.to_string())
}

fn unanswered(err: CasError) -> Unproven {
    Unproven::Unanswered(match err {
        CasError::Conflict => "the store kept changing under us".to_string(),
        CasError::Unavailable(why) | CasError::Refused(why) => why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cas::testing::{FaultyStore, Throttled};
    use crate::backend::cas::{CasResult, MemoryCasStore, Site};
    use async_trait::async_trait;
    use std::sync::Arc;
    use std::time::SystemTime;

    /// A store that breaks one guarantee on purpose.
    #[derive(Default)]
    struct Broken {
        inner: MemoryCasStore,
        ignores_if_none_match: bool,
        ignores_if_match: bool,
        same_version: bool,
        /// Serves, once after each replace, the object as it was before it.
        reads_stale: bool,
        stamps_late: bool,
        previous: std::sync::Mutex<Option<Stored>>,
    }

    #[async_trait]
    impl CasStore for Broken {
        fn site(&self) -> &Site {
            self.inner.site()
        }
        async fn probe(&self) -> CasResult<()> {
            Ok(())
        }
        async fn get(&self, name: &str) -> CasResult<Read> {
            let mut read = self.inner.get(name).await?;
            if let Some(previous) = self.previous.lock().expect("lock").take() {
                read.object = Some(previous);
            }
            if self.stamps_late {
                if let Some(object) = read.object.as_mut() {
                    object.last_modified = Some(SystemTime::UNIX_EPOCH);
                }
            }
            Ok(read)
        }
        async fn put(
            &self,
            name: &str,
            body: Vec<u8>,
            when: Precondition<'_>,
        ) -> CasResult<String> {
            let Precondition::Matches(version) = when else {
                if self.ignores_if_none_match {
                    if let Some(current) = self.inner.get(name).await?.object {
                        let ignored = Precondition::Matches(&current.version);
                        return self.inner.put(name, body, ignored).await;
                    }
                }
                return self.inner.put(name, body, when).await;
            };
            let before = self.inner.get(name).await?.object;
            let expect = match (&before, self.ignores_if_match) {
                (Some(current), true) => current.version.clone(),
                _ => version.to_string(),
            };
            let written = self
                .inner
                .put(name, body, Precondition::Matches(&expect))
                .await?;
            if self.reads_stale {
                *self.previous.lock().expect("lock") = before;
            }
            Ok(if self.same_version {
                version.to_string()
            } else {
                written
            })
        }
        async fn list(
            &self,
            prefix: &str,
            page: Option<&str>,
            limit: usize,
        ) -> CasResult<super::super::Names> {
            self.inner.list(prefix, page, limit).await
        }
        async fn delete(&self, name: &str) -> CasResult<()> {
            self.inner.delete(name).await
        }
    }

    async fn verdict(store: &dyn CasStore) -> Result<(), Unproven> {
        let (verdict, probes) = prove(store, "locks/", Proof::AT_START).await;
        remove_probe(store, &probes).await;
        verdict
    }

    #[tokio::test]
    async fn a_store_that_keeps_its_promises_is_trusted_again_and_again() {
        let store = MemoryCasStore::new();
        for _ in 0..3 {
            assert_eq!(verdict(&store).await, Ok(()));
        }
    }

    #[tokio::test]
    async fn each_broken_guarantee_is_named() {
        type Breaks = fn(&mut Broken);
        let cases: [(Breaks, &str); 5] = [
            (|b| b.ignores_if_none_match = true, "If-None-Match"),
            (|b| b.ignores_if_match = true, "If-Match or"),
            (|b| b.same_version = true, "version unchanged"),
            (|b| b.reads_stale = true, "as it was before"),
            (|b| b.stamps_late = true, "look expired"),
        ];
        for (breaks, named) in cases {
            let mut store = Broken::default();
            breaks(&mut store);
            match verdict(&store).await {
                Err(Unproven::Lacks(what)) => assert!(what.contains(named), "{named}: {what}"),
                other => panic!("{named}: {other:?}"),
            }
        }
    }

    /// A sound store whose version is a hash of the content, as S3's ETag is.
    #[derive(Default)]
    struct ContentVersioned {
        inner: MemoryCasStore,
    }

    fn hashed(body: &[u8]) -> String {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        body.hash(&mut hasher);
        format!("{:x}", hasher.finish())
    }

    #[async_trait]
    impl CasStore for ContentVersioned {
        fn site(&self) -> &Site {
            self.inner.site()
        }
        async fn probe(&self) -> CasResult<()> {
            Ok(())
        }
        async fn get(&self, name: &str) -> CasResult<Read> {
            let mut read = self.inner.get(name).await?;
            if let Some(object) = read.object.as_mut() {
                object.version = hashed(&object.body);
            }
            Ok(read)
        }
        async fn put(
            &self,
            name: &str,
            body: Vec<u8>,
            when: Precondition<'_>,
        ) -> CasResult<String> {
            // No await point yields between the check and the write: atomic.
            let current = self.inner.get(name).await?.object;
            let seen = current.as_ref().map(|o| hashed(&o.body));
            if seen.as_deref() != when.version() {
                return Err(CasError::Conflict);
            }
            let version = hashed(&body);
            let inner = current.map(|o| o.version);
            let inner = match &inner {
                Some(v) => Precondition::Matches(v),
                None => Precondition::Absent,
            };
            self.inner.put(name, body, inner).await.map(|_| version)
        }
        async fn list(
            &self,
            prefix: &str,
            page: Option<&str>,
            limit: usize,
        ) -> CasResult<super::super::Names> {
            self.inner.list(prefix, page, limit).await
        }
        async fn delete(&self, name: &str) -> CasResult<()> {
            self.inner.delete(name).await
        }
    }

    #[tokio::test]
    async fn a_store_whose_version_hashes_the_content_is_trusted() {
        assert_eq!(verdict(&ContentVersioned::default()).await, Ok(()));
    }

    #[tokio::test]
    async fn a_store_atomic_only_one_request_at_a_time_is_refused() {
        let store = crate::backend::cas::RacyCasStore::default();
        match verdict(&store).await {
            Err(Unproven::Lacks(what)) => {
                assert!(what.contains("2 of 2 concurrent creates"), "{what}");
                assert!(what.contains("two steps"), "{what}");
            }
            other => panic!("a racy store was trusted: {other:?}"),
        }
    }

    #[tokio::test]
    async fn only_the_thorough_proof_finds_a_store_racy_under_load() {
        let store = crate::backend::cas::RacyCasStore::under_load();
        assert_eq!(verdict(&store).await, Ok(()), "two racers meet no window");
        let (thorough, probes) = prove(&store, "locks/", Proof::THOROUGH).await;
        remove_probe(&store, &probes).await;
        match thorough {
            Err(Unproven::Lacks(what)) => assert!(what.contains("two steps"), "{what}"),
            other => panic!("a store racy under load passed the thorough proof: {other:?}"),
        }
        assert_eq!(store.names(), Vec::<String>::new(), "every probe removed");
    }

    #[tokio::test(start_paused = true)]
    async fn agents_checking_one_store_at_once_all_come_to_trust_it() {
        let store = Arc::new(FaultyStore::random(
            MemoryCasStore::new(),
            7,
            Duration::from_millis(20),
            0.0,
            0.0,
        ));
        let checks = (0..8).map(|_| {
            let store = store.clone();
            tokio::spawn(async move { verdict(store.as_ref()).await })
        });
        for check in checks {
            assert_eq!(check.await.expect("no panic"), Ok(()));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn agents_proving_one_store_together_never_write_one_object_and_leave_none() {
        let store = Arc::new(Throttled::new());
        let checks = (0..50).map(|_| {
            let store = store.clone();
            tokio::spawn(async move { verdict(store.as_ref()).await })
        });
        for check in checks {
            assert_eq!(check.await.expect("no panic"), Ok(()));
        }
        let writes = store.writes.lock().expect("lock").clone();
        let mut by_object: std::collections::HashMap<String, Vec<tokio::time::Instant>> =
            std::collections::HashMap::new();
        for (name, at) in writes {
            by_object.entry(name).or_default().push(at);
        }
        assert_eq!(by_object.len(), 50, "a probe object per proof");
        for (name, times) in &by_object {
            assert!(name.starts_with("locks/probe-"), "{name}");
            // The races' winners (create, update), removal: no object
            // written faster than the store allows.
            assert_eq!(times.len(), 3, "{name}: {times:?}");
            for pair in times.windows(2) {
                assert!(
                    pair[1] - pair[0] >= Duration::from_secs(1),
                    "{name}: {times:?}"
                );
            }
        }
        assert_eq!(
            store.inner.names(),
            Vec::<String>::new(),
            "every probe removed"
        );
    }

    #[tokio::test]
    async fn a_failing_store_is_not_condemned() {
        let store = FaultyStore::reliable(MemoryCasStore::new());
        store.fail_everything(true);
        assert!(matches!(
            verdict(&store).await,
            Err(Unproven::Unanswered(_))
        ));
        store.fail_everything(false);
        store.lose_next_answer();
        // A lost answer leaves the step to be tried again, never a verdict.
        let first = verdict(&store).await;
        assert!(
            matches!(first, Ok(()) | Err(Unproven::Unanswered(_))),
            "{first:?}"
        );
        assert_eq!(verdict(&store).await, Ok(()));
    }
}
