//! A store that misbehaves on purpose, for engine tests and the simulation:
//! requests are delayed, fail without effect, or take effect but lose their
//! answer (the case that makes a writer unsure whether it wrote).

use super::{CasError, CasResult, CasStore, MemoryCasStore, Names, Precondition, Read, Site};
use crate::unpoisoned::Unpoisoned;
use async_trait::async_trait;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    Fine,
    FailBefore,
    LoseAnswer,
}

pub struct FaultyStore {
    pub inner: MemoryCasStore,
    rng: Mutex<fastrand::Rng>,
    max_delay: Duration,
    fail_before: f64,
    lose_answer: f64,
    lose_next_answer: AtomicBool,
    fail_everything: AtomicBool,
    /// Requests seen: reads and writes.
    pub gets: AtomicU64,
    pub puts: AtomicU64,
    /// Reads being answered now, and the most there ever were at once
    /// (reads only: the agent's own report writes are not what a bound on
    /// waiters' reads is about).
    reads_in_flight: AtomicU64,
    pub most_reads_in_flight: AtomicU64,
}

impl FaultyStore {
    /// A store that behaves until told otherwise.
    pub fn reliable(inner: MemoryCasStore) -> FaultyStore {
        FaultyStore::random(inner, 0, Duration::ZERO, 0.0, 0.0)
    }

    /// Each request waits up to `max_delay` (before and after it takes effect),
    /// fails first with probability `fail_before`, loses its answer after a write
    /// with probability `lose_answer`.
    pub fn random(
        inner: MemoryCasStore,
        seed: u64,
        max_delay: Duration,
        fail_before: f64,
        lose_answer: f64,
    ) -> FaultyStore {
        FaultyStore {
            inner,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            max_delay,
            fail_before,
            lose_answer,
            lose_next_answer: AtomicBool::new(false),
            fail_everything: AtomicBool::new(false),
            gets: AtomicU64::new(0),
            puts: AtomicU64::new(0),
            reads_in_flight: AtomicU64::new(0),
            most_reads_in_flight: AtomicU64::new(0),
        }
    }

    /// The next write takes effect, but its caller is told it failed.
    pub fn lose_next_answer(&self) {
        self.lose_next_answer.store(true, Ordering::SeqCst);
    }

    fn draw(&self, write: bool) -> (Duration, Duration, Fate) {
        let mut rng = self.rng.locked();
        let delay = |rng: &mut fastrand::Rng| self.max_delay.mul_f64(rng.f64());
        let (before, after) = (delay(&mut rng), delay(&mut rng));
        let roll = rng.f64();
        let fate = if self.fail_everything.load(Ordering::SeqCst) {
            Fate::FailBefore
        } else if write && self.lose_next_answer.swap(false, Ordering::SeqCst) {
            Fate::LoseAnswer
        } else if roll < self.fail_before {
            Fate::FailBefore
        } else if write && roll < self.fail_before + self.lose_answer {
            Fate::LoseAnswer
        } else {
            Fate::Fine
        };
        (before, after, fate)
    }

    /// From now on every request fails (or, with `false`, none is forced to).
    pub fn fail_everything(&self, fail: bool) {
        self.fail_everything.store(fail, Ordering::SeqCst);
    }

    /// Requests so far, as (reads, writes).
    pub fn requests(&self) -> (u64, u64) {
        (
            self.gets.load(Ordering::SeqCst),
            self.puts.load(Ordering::SeqCst),
        )
    }

    async fn around<T>(
        &self,
        write: bool,
        op: impl std::future::Future<Output = CasResult<T>>,
    ) -> CasResult<T> {
        let counter = if write { &self.puts } else { &self.gets };
        counter.fetch_add(1, Ordering::SeqCst);
        if write {
            return self.fated(write, op).await;
        }
        let now = self.reads_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_reads_in_flight.fetch_max(now, Ordering::SeqCst);
        let outcome = self.fated(write, op).await;
        self.reads_in_flight.fetch_sub(1, Ordering::SeqCst);
        outcome
    }

    async fn fated<T>(
        &self,
        write: bool,
        op: impl std::future::Future<Output = CasResult<T>>,
    ) -> CasResult<T> {
        let (before, after, fate) = self.draw(write);
        tokio::time::sleep(before).await;
        if fate == Fate::FailBefore {
            return Err(CasError::Unavailable("injected failure".into()));
        }
        let result = op.await;
        tokio::time::sleep(after).await;
        match fate {
            Fate::LoseAnswer => Err(CasError::Unavailable("injected lost answer".into())),
            _ => result,
        }
    }
}

#[async_trait]
impl CasStore for FaultyStore {
    fn site(&self) -> &Site {
        self.inner.site()
    }

    async fn probe(&self) -> CasResult<()> {
        Ok(())
    }

    async fn get(&self, name: &str) -> CasResult<Read> {
        self.around(false, self.inner.get(name)).await
    }

    async fn put(&self, name: &str, body: Vec<u8>, when: Precondition<'_>) -> CasResult<String> {
        self.around(true, self.inner.put(name, body, when)).await
    }

    async fn list(&self, prefix: &str, page: Option<&str>, limit: usize) -> CasResult<Names> {
        self.around(false, self.inner.list(prefix, page, limit))
            .await
    }

    async fn delete(&self, name: &str) -> CasResult<()> {
        self.around(true, self.inner.delete(name)).await
    }
}

/// A memory store that wants writes of one object a second apart (as GCS
/// does) and notes when each successful write happened.
pub struct Throttled {
    pub inner: MemoryCasStore,
    site: Site,
    /// Each successful write (removals too): the object and when.
    pub writes: Mutex<Vec<(String, tokio::time::Instant)>>,
}

impl Throttled {
    pub fn new() -> Throttled {
        Throttled {
            inner: MemoryCasStore::new(),
            site: Site {
                min_write_interval: Duration::from_secs(1),
                ..Site::in_process("throttled://")
            },
            writes: Mutex::new(Vec::new()),
        }
    }

    fn noted<T>(&self, name: &str, result: CasResult<T>) -> CasResult<T> {
        if result.is_ok() {
            let mut writes = self.writes.locked();
            writes.push((name.to_string(), tokio::time::Instant::now()));
        }
        result
    }

    /// The shortest time between two successful writes of one object.
    pub fn closest_writes(&self) -> Option<Duration> {
        let writes = self.writes.locked();
        let mut closest: Option<Duration> = None;
        for (i, (name, at)) in writes.iter().enumerate() {
            if let Some((_, before)) = writes[..i].iter().rev().find(|(n, _)| n == name) {
                let gap = *at - *before;
                closest = Some(closest.map_or(gap, |c| c.min(gap)));
            }
        }
        closest
    }
}

#[async_trait]
impl CasStore for Throttled {
    fn site(&self) -> &Site {
        &self.site
    }
    async fn probe(&self) -> CasResult<()> {
        Ok(())
    }
    async fn get(&self, name: &str) -> CasResult<Read> {
        self.inner.get(name).await
    }
    async fn put(&self, name: &str, body: Vec<u8>, when: Precondition<'_>) -> CasResult<String> {
        let result = self.inner.put(name, body, when).await;
        self.noted(name, result)
    }
    async fn list(&self, prefix: &str, page: Option<&str>, limit: usize) -> CasResult<Names> {
        self.inner.list(prefix, page, limit).await
    }
    async fn delete(&self, name: &str) -> CasResult<()> {
        let result = self.inner.delete(name).await;
        self.noted(name, result)
    }
}
