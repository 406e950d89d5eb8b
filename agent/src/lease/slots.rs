//! Keys with slots: at most N holders at once (SPEC 13). Slot `i` of a key is
//! leased, renewed, released and fenced exactly as a plain key is, in a record
//! of its own (`Key::slot_record`), so every backend keeps slots without
//! knowing of them. This module chooses the slot an acquire takes, checks the
//! count every holder took the key with, and reads a key's slots back as one
//! record and one history.

use super::registry::Registry;
use crate::backend::{AcquireSpec, BackendError, BackendResult, Grant};
use runlock_protocol::{Holder, Key, KeyEvent, KeyRecord, KeyState, MAX_SLOTS};

/// Slot records are looked for this many at a time when a key's count is
/// not known from a live holder.
const DISCOVERY_BATCH: u32 = 8;

/// The slot records one attempt reads at once: a 64-slot key costs the
/// store's client 8 requests in flight, not 64.
const READS_IN_FLIGHT: usize = 8;

/// The slot acquire attempts one user's runs make at once through an agent
/// (each waiter tries again as before, in turn): with [`READS_IN_FLIGHT`],
/// at most 32 of a user's reads are in flight, however many runs wait.
/// Renewals never wait for these.
const TURNS_PER_USER: usize = 4;

/// Why a key's slots could not be taken.
pub(super) enum SlotRefusal {
    /// Every slot is held: the holders by slot, and the latest incident.
    Held(Vec<Holder>, Option<Box<KeyEvent>>),
    /// A live holder took the key with another count: that count and the
    /// holders of that count.
    Mismatch(u32, Vec<Holder>),
    /// The store failed.
    Backend(BackendError),
}

/// The slot a holder or event read from slot record `slot` names: that one,
/// whatever the store says (another agent, or anyone who can write to the
/// store, wrote it, and a page draws a lane for each slot up to it); none
/// for a plain key's.
fn placed(named: Option<u32>, slot: u32) -> Option<u32> {
    (slot > 0 || named.is_some()).then_some(slot)
}

/// A record read from slot record `slot`, its slot numbers bounded: each
/// names `slot`, and no count is over [`MAX_SLOTS`].
fn bounded(mut record: KeyRecord, slot: u32) -> KeyRecord {
    for holder in record.holder.iter_mut().chain(&mut record.holders) {
        holder.slot = placed(holder.slot, slot);
        holder.slots = holder.slots.map(|n| n.clamp(1, MAX_SLOTS));
    }
    if let Some(incident) = &mut record.incident {
        incident.slot = placed(incident.slot, slot);
    }
    record.slots = record.slots.map(|n| n.clamp(1, MAX_SLOTS));
    record
}

/// The count a holder took its key with: a plain key is a key with one slot.
pub(super) fn count_of(holder: &Holder) -> u32 {
    holder.slots.unwrap_or(1)
}

/// The holders among `holders` that took the key with a count other than `n`,
/// with that count, if there are any.
fn mismatch(holders: &[Holder], n: u32) -> Option<(u32, Vec<Holder>)> {
    let other = holders.iter().find(|h| count_of(h) != n)?;
    let count = count_of(other);
    let same: Vec<Holder> = holders
        .iter()
        .filter(|h| count_of(h) == count)
        .cloned()
        .collect();
    Some((count, same))
}

/// The live holder of each held slot record, by slot, with its slot named.
fn live_holders(records: &[KeyRecord]) -> Vec<Holder> {
    live_holders_from(records, 0)
}

/// [`live_holders`] of records that start at slot `first`.
fn live_holders_from(records: &[KeyRecord], first: u32) -> Vec<Holder> {
    records
        .iter()
        .zip(first..)
        .filter(|(r, _)| r.state == KeyState::Held)
        .filter_map(|(r, slot)| {
            let mut holder = r.holder.clone()?;
            holder.slot.get_or_insert(slot);
            Some(holder)
        })
        .collect()
}

/// The latest force, break, expiry or loss of any slot, naming its slot.
fn latest_incident(records: &[KeyRecord]) -> Option<Box<KeyEvent>> {
    let mut latest: Option<Box<KeyEvent>> = None;
    for (slot, record) in records.iter().enumerate() {
        if let Some(mut incident) = record.incident.clone() {
            incident.slot.get_or_insert(slot as u32);
            if latest.as_ref().is_none_or(|l| incident.at_ms >= l.at_ms) {
                latest = Some(incident);
            }
        }
    }
    latest
}

impl Registry {
    /// Takes one of the `n` slots of `key` for `spec` (whose key, slot and
    /// holder are filled in here): first the slot this agent last let go,
    /// with one write where the store remembers it free; else the lowest
    /// free slot of the records read; with `force` and every slot held, the
    /// slot whose holder was granted earliest. `may_wait`: as
    /// `acquire_unless_held_here` has it.
    pub(super) async fn take_slot(
        &self,
        key: &Key,
        n: u32,
        mut spec: AcquireSpec,
        may_wait: bool,
    ) -> Result<(AcquireSpec, Grant), SlotRefusal> {
        let turns = self.slot_turns(spec.holder.uid);
        let _turn = turns.acquire().await;
        let force = spec.force;
        spec.force = false;
        let hint = self.state().free_slots.remove(key);
        if let Some((slot, _)) = hint.filter(|&(slot, count)| count == n && slot < n) {
            match self.try_slot(key, n, slot, &spec, may_wait).await {
                Ok(grant) => return Ok(grant),
                Err(SlotRefusal::Held(..)) => {}
                Err(refusal) => return Err(refusal),
            }
        }
        let records = self
            .read_range(key, 0..n)
            .await
            .map_err(SlotRefusal::Backend)?;
        let holders = live_holders(&records);
        if let Some((count, theirs)) = mismatch(&holders, n) {
            return Err(SlotRefusal::Mismatch(count, theirs));
        }
        let free = (0..n).filter(|&slot| records[slot as usize].state != KeyState::Held);
        for slot in free {
            match self.try_slot(key, n, slot, &spec, may_wait).await {
                Ok(grant) => return Ok(grant),
                Err(SlotRefusal::Held(..)) => {}
                Err(refusal) => return Err(refusal),
            }
        }
        let incident = latest_incident(&records);
        if force {
            let oldest = holders.iter().min_by_key(|h| h.acquired_at_ms);
            if let Some(slot) = oldest.and_then(|h| h.slot) {
                spec.force = true;
                return self.try_slot(key, n, slot, &spec, may_wait).await;
            }
        }
        Err(SlotRefusal::Held(holders, incident))
    }

    /// One attempt at slot `slot`: a live holder of another count is a
    /// mismatch, not a slot held.
    async fn try_slot(
        &self,
        key: &Key,
        n: u32,
        slot: u32,
        spec: &AcquireSpec,
        may_wait: bool,
    ) -> Result<(AcquireSpec, Grant), SlotRefusal> {
        let mut spec = spec.clone();
        spec.key = key.slot_record(slot);
        spec.holder.slot = Some(slot);
        spec.holder.slots = Some(n);
        match self.acquire_unless_held_here(&spec, may_wait).await {
            Ok(grant) => Ok((spec, grant)),
            Err(BackendError::Held(Some(holder), incident)) => {
                let mut holder = *holder;
                holder.slot = Some(slot);
                holder.slots = holder.slots.map(|n| n.clamp(1, MAX_SLOTS));
                match count_of(&holder) == n {
                    true => Err(SlotRefusal::Held(vec![holder], incident)),
                    false => Err(SlotRefusal::Mismatch(count_of(&holder), vec![holder])),
                }
            }
            Err(BackendError::Held(None, incident)) => Err(SlotRefusal::Held(vec![], incident)),
            // A slot a stranger holds is a held slot: the next may be free.
            Err(BackendError::HeldUnrecorded(_)) => Err(SlotRefusal::Held(vec![], None)),
            Err(err) => Err(SlotRefusal::Backend(err)),
        }
    }

    /// The semaphore of `uid`'s slot acquire attempts (see [`TURNS_PER_USER`]).
    fn slot_turns(&self, uid: u32) -> std::sync::Arc<tokio::sync::Semaphore> {
        self.state()
            .slot_turns
            .entry(uid)
            .or_insert_with(|| std::sync::Arc::new(tokio::sync::Semaphore::new(TURNS_PER_USER)))
            .clone()
    }

    /// The records of `slots` of `key`, [`READS_IN_FLIGHT`] at a time.
    async fn read_range(
        &self,
        key: &Key,
        slots: std::ops::Range<u32>,
    ) -> BackendResult<Vec<KeyRecord>> {
        use futures::StreamExt;
        let reads = slots.map(|slot| {
            let record = key.slot_record(slot);
            async move { (self.backend.inspect(&record).await).map(|r| bounded(r, slot)) }
        });
        futures::stream::iter(reads)
            .buffered(READS_IN_FLIGHT)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect()
    }

    /// The records of every slot `key` has: one read for a plain key or a
    /// held slot 0, whose holder says how many; otherwise the slot records
    /// that exist, looked for a few at a time (slots are taken lowest
    /// first, so they are found contiguous).
    pub(super) async fn slot_records(&self, key: &Key) -> BackendResult<Vec<KeyRecord>> {
        let first = bounded(self.backend.inspect(key).await?, 0);
        let mut records = vec![first];
        let mut known = records[0].holder.as_ref().map(count_of);
        if known.is_none() {
            // Free: a key that never had slots has no slot 1.
            let mut next = 1;
            let mut batch = 1;
            'looking: while next < MAX_SLOTS {
                let end = (next + batch).min(MAX_SLOTS);
                for record in self.read_range(key, next..end).await? {
                    if record.token == 0 {
                        break 'looking;
                    }
                    records.push(record);
                }
                next = end;
                batch = DISCOVERY_BATCH;
            }
            known = live_holders(&records).iter().map(count_of).max();
        }
        let n = known.unwrap_or(1).clamp(1, MAX_SLOTS);
        let have = records.len() as u32;
        if n > have {
            records.extend(self.read_range(key, have..n).await?);
        }
        Ok(records)
    }

    /// Every slot record `key` has ever had, from slot `from` on: read until
    /// a record that was never written (slots are taken lowest first, so
    /// records ever written are contiguous), a few at a time.
    pub(super) async fn records_from(&self, key: &Key, from: u32) -> BackendResult<Vec<KeyRecord>> {
        let mut records = Vec::new();
        let mut next = from;
        // One record first: most keys have never had the next slot.
        let mut batch = 1;
        while next < MAX_SLOTS {
            let end = (next + batch).min(MAX_SLOTS);
            for record in self.read_range(key, next..end).await? {
                if record.token == 0 {
                    return Ok(records);
                }
                records.push(record);
            }
            next = end;
            batch = DISCOVERY_BATCH;
        }
        Ok(records)
    }

    /// Invariant 10, checked after a grant of slot `mine` of `key` taken with
    /// count `n` (a plain key: slot 0, count 1): the live holders of every
    /// other slot record, read after our own write. Two acquirers of different
    /// counts each write before they read, so at least one of them sees the
    /// other; a holder of another count is a mismatch, and the grant is given
    /// back. A slot that was never written bounds the read.
    pub(super) async fn counts_agree(
        &self,
        key: &Key,
        n: u32,
        mine: u32,
    ) -> BackendResult<Option<(u32, Vec<Holder>)>> {
        // Slot 0 is read too unless it is ours (a plain key: one read, slot 1's).
        let first = u32::from(mine == 0);
        let records = self.records_from(key, first).await?;
        let others: Vec<Holder> = live_holders_from(&records, first)
            .into_iter()
            .filter(|h| h.slot != Some(mine))
            .collect();
        Ok(mismatch(&others, n))
    }

    /// The live holders of a key's slots, as far as they can be read.
    pub(super) async fn slot_holders(&self, key: &Key) -> Vec<Holder> {
        let records = self.slot_records(key).await.unwrap_or_default();
        live_holders(&records)
    }

    /// A key's slots as one record (SPEC 13): a plain key's record as it is.
    pub(super) fn merge_records(key: &Key, mut records: Vec<KeyRecord>) -> KeyRecord {
        let holders = live_holders(&records);
        let slotted = records.len() > 1 || holders.iter().any(|h| h.slots.is_some());
        if !slotted {
            return records.swap_remove(0);
        }
        let n = holders
            .iter()
            .map(count_of)
            .max()
            .unwrap_or(records.len() as u32);
        let incident = latest_incident(&records);
        let lowest = records
            .iter()
            .position(|r| r.state == KeyState::Held)
            .unwrap_or(0);
        let mut record = records.swap_remove(lowest);
        record.key = key.to_string();
        record.holder = holders.first().cloned();
        record.incident = incident;
        record.slots = Some(n);
        record.holders = holders;
        record
    }

    /// The histories of a key's slots, merged by time and then slot, each
    /// slot's own order kept exact whatever its clocks say.
    pub(super) async fn slot_history(&self, key: &Key) -> BackendResult<Vec<KeyEvent>> {
        let first = self.backend.history(key).await?;
        if !first.iter().any(|e| e.slot.is_some()) {
            return Ok(first);
        }
        let mut slots = vec![first];
        let mut next = 1;
        'looking: while next < MAX_SLOTS {
            let end = (next + DISCOVERY_BATCH).min(MAX_SLOTS);
            let reads = (next..end).map(|slot| {
                let record = key.slot_record(slot);
                async move { self.backend.history(&record).await }
            });
            for history in futures::future::join_all(reads).await {
                let history = history?;
                if history.is_empty() {
                    break 'looking;
                }
                slots.push(history);
            }
            next = end;
        }
        Ok(merge_histories(slots))
    }
}

/// One list of the slots' events: at each step the earliest next event of
/// any slot (the lower slot on a tie), so each slot keeps its own order.
pub(super) fn merge_histories(slots: Vec<Vec<KeyEvent>>) -> Vec<KeyEvent> {
    let total = slots.iter().map(Vec::len).sum();
    let mut merged = Vec::with_capacity(total);
    let mut heads: Vec<std::iter::Peekable<std::vec::IntoIter<KeyEvent>>> = slots
        .into_iter()
        .map(|s| s.into_iter().peekable())
        .collect();
    loop {
        let earliest = heads
            .iter_mut()
            .enumerate()
            .filter_map(|(slot, events)| events.peek().map(|e| (e.at_ms, slot)))
            .min();
        let Some((_, slot)) = earliest else {
            return merged;
        };
        if let Some(mut event) = heads[slot].next() {
            // The slot it was read from, whatever the store says.
            event.slot = Some(slot as u32);
            merged.push(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::{READS_IN_FLIGHT, TURNS_PER_USER};
    use crate::backend::cas::{testing::FaultyStore, CasEngine, MemoryCasStore};
    use runlock_protocol::{ErrorCode, EventKind, LostReason};

    fn slots(keys: &[&str], n: u32, wait: Duration, force: bool) -> AcquireRequest {
        AcquireRequest {
            slots: n,
            ..request(keys, wait, force)
        }
    }

    async fn take_slots(registry: &Registry, conn: ConnId, n: u32) -> Result<Lease, LeaseError> {
        let never = CancellationToken::new();
        let granted = registry
            .acquire(conn, slots(&["w"], n, Duration::ZERO, false), &never)
            .await?;
        Ok(granted.leases[0].clone())
    }

    #[test]
    fn slot_numbers_read_from_a_store_are_bounded_by_where_they_were_read() {
        use runlock_protocol::{Clock, KeyEvent, KeyRecord, KeyState, Scope, MAX_SLOTS};
        let far = Some(u32::MAX - 1);
        let key = Key::new("w").expect("a valid key");
        let mut holder = crate::backend::fixtures::spec("w", "l1", false, Duration::ZERO).holder;
        (holder.slot, holder.slots) = (far, far);
        let event = KeyEvent {
            kind: EventKind::Forced,
            at_ms: 1,
            clock: Clock::Agent,
            token: 2,
            from_token: Some(1),
            host: "h".into(),
            agent_id: "a".into(),
            pid: 1,
            uid: 0,
            user: "root".into(),
            reason: String::new(),
            slot: far,
        };
        let record = KeyRecord {
            state: KeyState::Held,
            holder: Some(holder.clone()),
            holders: vec![holder],
            incident: Some(Box::new(event.clone())),
            slots: far,
            ..KeyRecord::free(&key, Scope::Global)
        };
        let plain = super::bounded(record.clone(), 0);
        let third = super::bounded(record, 3);
        for (record, slot) in [(plain, 0), (third, 3)] {
            let holder = record.holder.as_ref().expect("a holder");
            assert_eq!(holder.slot, Some(slot));
            assert_eq!(holder.slots, Some(MAX_SLOTS));
            assert_eq!(record.holders[0].slot, Some(slot));
            assert_eq!(record.incident.as_ref().and_then(|i| i.slot), Some(slot));
            assert_eq!(record.slots, Some(MAX_SLOTS));
        }
        let merged = super::merge_histories(vec![vec![event.clone()], vec![event]]);
        let slots: Vec<_> = merged.iter().map(|e| e.slot).collect();
        assert_eq!(slots, [Some(0), Some(1)]);
    }

    #[tokio::test]
    async fn n_slots_admit_n_holders_and_refuse_the_next_naming_them() {
        let registry = registry();
        let mut taken = Vec::new();
        let mut events = Vec::new();
        for _ in 0..3 {
            let (conn, e) = connect(&registry, ROOT);
            events.push(e);
            taken.push(
                take_slots(&registry, conn, 3)
                    .await
                    .expect("a slot is free"),
            );
        }
        let slots: Vec<_> = taken.iter().map(|l| l.slot).collect();
        assert_eq!(slots, vec![Some(0), Some(1), Some(2)]);
        assert!(taken.iter().all(|l| l.key == "w" && l.token == 1));
        let (fourth, _e) = connect(&registry, ROOT);
        let err = take_slots(&registry, fourth, 3)
            .await
            .expect_err("all held");
        assert_eq!(err.code(), ErrorCode::Held);
        assert_eq!(err.key().as_deref(), Some("w"));
        let holders: Vec<_> = err.holders().iter().map(|h| h.slot).collect();
        assert_eq!(holders, vec![Some(0), Some(1), Some(2)]);
        assert!(err.holders().iter().all(|h| h.slots == Some(3)));
        assert!(err.to_string().contains("all 3 slots held"), "{err}");
        let listed: Vec<_> = registry
            .list()
            .iter()
            .map(|l| (l.key.clone(), l.holder.slot))
            .collect();
        assert_eq!(
            listed,
            vec![
                ("w".into(), Some(0)),
                ("w".into(), Some(1)),
                ("w".into(), Some(2))
            ]
        );
    }

    #[tokio::test]
    async fn a_count_other_than_the_holders_is_refused_naming_both() {
        let registry = registry();
        let (holder, _e1) = connect(&registry, ROOT);
        take_slots(&registry, holder, 3).await.expect("free");
        let (other, _e2) = connect(&registry, ROOT);
        let err = take_slots(&registry, other, 5)
            .await
            .expect_err("3 is not 5");
        assert_eq!(err.code(), ErrorCode::SlotsMismatch);
        let text = err.to_string();
        assert!(
            text.contains("held with 3 slots") && text.contains("asks 5 slots"),
            "{text}"
        );
        assert_eq!(err.holders().len(), 1);
        // A plain key is a key with one slot: it neither takes nor forces a slot.
        let err = take(&registry, other, &["w"])
            .await
            .expect_err("1 is not 3");
        assert_eq!(err.code(), ErrorCode::SlotsMismatch);
        let never = CancellationToken::new();
        let forced = registry
            .acquire(other, request(&["w"], Duration::ZERO, true), &never)
            .await;
        assert_eq!(
            forced.expect_err("1 is not 3").code(),
            ErrorCode::SlotsMismatch
        );
        // Nothing was taken by the refused requests.
        assert_eq!(registry.list().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_slot_goes_to_the_waiter_and_tokens_grow_per_slot() {
        let registry = registry();
        let (a, _ea) = connect(&registry, ROOT);
        let (b, _eb) = connect(&registry, ROOT);
        take_slots(&registry, a, 2).await.expect("slot 0");
        let second = take_slots(&registry, b, 2).await.expect("slot 1");
        let (waiter, _ew) = connect(&registry, ROOT);
        let asked = slots(&["w"], 2, Duration::from_secs(60), false);
        let task = spawn_queued(&registry, waiter, asked).await;
        registry
            .release(b, &[second.lease_id])
            .await
            .expect("released");
        let granted = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("woken")
            .expect("ran")
            .expect("granted");
        assert_eq!(granted.leases[0].slot, Some(1));
        assert_eq!(granted.leases[0].token, 2, "slot 1's second lease");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_behind_another_times_out_naming_every_slot_holder() {
        let registry = registry();
        let mut events = Vec::new();
        for _ in 0..2 {
            let (conn, e) = connect(&registry, ROOT);
            events.push(e);
            take_slots(&registry, conn, 2)
                .await
                .expect("a slot is free");
        }
        let (first, _e1) = connect(&registry, ROOT);
        let asked = slots(&["w"], 2, Duration::from_secs(3600), false);
        let _first = spawn_queued(&registry, first, asked).await;
        let (second, _e2) = connect(&registry, ROOT);
        let never = CancellationToken::new();
        let err = registry
            .acquire(
                second,
                slots(&["w"], 2, Duration::from_secs(1), false),
                &never,
            )
            .await
            .expect_err("still held");
        assert_eq!(err.code(), ErrorCode::Timeout);
        let named: Vec<_> = err.holders().iter().map(|h| h.slot).collect();
        assert_eq!(named, vec![Some(0), Some(1)]);
    }

    #[tokio::test(start_paused = true)]
    async fn runs_that_start_together_each_take_a_slot_of_their_own() {
        // Every request to the store takes a while, so the three overlap.
        let slow = FaultyStore::random(
            MemoryCasStore::new(),
            7,
            Duration::from_millis(50),
            0.0,
            0.0,
        );
        let registry = agent(Arc::new(CasEngine::new(Arc::new(slow))), "agent-1");
        let mut runs = Vec::new();
        for _ in 0..3 {
            let (conn, events) = connect(&registry, ROOT);
            let shared = registry.clone();
            runs.push(tokio::spawn(async move {
                let _events = events;
                take_slots(&shared, conn, 3).await
            }));
        }
        let mut slots = Vec::new();
        for run in runs {
            let lease = run
                .await
                .expect("ran")
                .expect("a slot of its own, without waiting");
            slots.push(lease.slot);
        }
        slots.sort();
        assert_eq!(slots, vec![Some(0), Some(1), Some(2)]);
    }

    // Paused: the force waits out the displaced run's deadline (TTL +
    // grace), which no one ends here; auto-advanced, not 33 s of the suite's.
    #[tokio::test(start_paused = true)]
    async fn force_takes_the_slot_granted_earliest() {
        let registry = registry();
        let (a, mut first_events) = connect(&registry, ROOT);
        let (b, _eb) = connect(&registry, ROOT);
        let first = take_slots(&registry, a, 2).await.expect("slot 0");
        // A later acquired_at_ms, by the wall clock, which paused time does not move.
        std::thread::sleep(Duration::from_millis(5));
        take_slots(&registry, b, 2).await.expect("slot 1");
        let (forcer, _ef) = connect(&registry, ROOT);
        let never = CancellationToken::new();
        let forced = registry
            .acquire(forcer, slots(&["w"], 2, Duration::ZERO, true), &never)
            .await
            .expect("forced");
        assert_eq!(forced.leases[0].slot, first.slot);
        assert_eq!(forced.leases[0].token, first.token + 1);
        match first_events.try_recv().expect("told") {
            Event::Lost { lease_id, loss, .. } => {
                assert_eq!(lease_id, first.lease_id);
                assert_eq!(loss.reason(), LostReason::Forced);
            }
            other => panic!("expected lost, got {other:?}"),
        }
        assert_eq!(
            registry.list().len(),
            2,
            "one slot forced, the other untouched"
        );
    }

    #[tokio::test]
    async fn inspect_and_history_show_every_slot() {
        let registry = registry();
        let (a, _ea) = connect(&registry, ROOT);
        let (b, _eb) = connect(&registry, ROOT);
        // Events of different slots are ordered by their clocks: a few ms
        // apart, so that memory://'s millisecond stamps tell them apart.
        let apart = || std::thread::sleep(Duration::from_millis(3));
        let zero = take_slots(&registry, a, 3).await.expect("slot 0");
        apart();
        take_slots(&registry, b, 3).await.expect("slot 1");
        apart();
        registry
            .release(a, &[zero.lease_id])
            .await
            .expect("released");
        let record = registry.inspect("w").await.expect("record");
        assert_eq!(record.slots, Some(3));
        assert_eq!(record.key, "w");
        let held: Vec<_> = record.holders.iter().map(|h| h.slot).collect();
        assert_eq!(held, vec![Some(1)]);
        assert_eq!(record.holder.expect("lowest held").slot, Some(1));
        let events = registry.history("w", 0).await.expect("history");
        let seen: Vec<_> = events.iter().map(|e| (e.kind, e.slot)).collect();
        assert_eq!(
            seen,
            vec![
                (EventKind::Granted, Some(0)),
                (EventKind::Granted, Some(1)),
                (EventKind::Released, Some(0)),
            ]
        );
        // A plain key reads as it always did.
        take(&registry, a, &["plain"]).await.expect("free");
        let plain = registry.inspect("plain").await.expect("record");
        assert_eq!((plain.slots, plain.holders.len()), (None, 0));
    }

    /// Issue 27, item 1: slot 0 of a 3-slot key comes free while slots 1
    /// and 2 are held; a plain run, and a run of another count, each take
    /// a free record and must still be refused, through either agent.
    #[tokio::test]
    async fn a_plain_run_or_another_count_beside_slot_holders_is_refused() {
        let store = Arc::new(MemoryCasStore::new());
        let one = agent(Arc::new(CasEngine::new(store.clone())), "agent-1");
        let two = agent(Arc::new(CasEngine::new(store.clone())), "agent-2");
        let mut conns = Vec::new();
        let mut leases = Vec::new();
        for registry in [&one, &two, &one] {
            let (conn, events) = connect(registry, ROOT);
            leases.push(take_slots(registry, conn, 3).await.expect("a slot is free"));
            conns.push((conn, events));
        }
        assert_eq!(leases[0].slot, Some(0));
        one.release(conns[0].0, &[leases[0].lease_id.clone()])
            .await
            .expect("released");
        for registry in [&one, &two] {
            let (conn, _e) = connect(registry, ROOT);
            let err = take(registry, conn, &["w"])
                .await
                .expect_err("3 are held with 3");
            assert_eq!(err.code(), ErrorCode::SlotsMismatch, "{err}");
            let err = take_slots(registry, conn, 2).await.expect_err("2 is not 3");
            assert_eq!(err.code(), ErrorCode::SlotsMismatch, "{err}");
        }
        // Nothing was left taken by the refused runs: the slot is free for
        // a run of the holders' own count, which the shortcut gives slot 0.
        let (conn, _e) = connect(&one, ROOT);
        let again = take_slots(&one, conn, 3).await.expect("slot 0 is free");
        assert_eq!(again.slot, Some(0));
        let record = two.inspect("w").await.expect("record");
        assert_eq!(record.holders.len(), 3, "{record:?}");
    }

    #[tokio::test]
    async fn a_smaller_count_is_refused_beside_holders_of_higher_slots() {
        let registry = registry();
        let mut held = Vec::new();
        for _ in 0..5 {
            let (conn, events) = connect(&registry, ROOT);
            let lease = take_slots(&registry, conn, 5).await.expect("free");
            held.push((conn, events, lease));
        }
        for (conn, _, lease) in &held[..2] {
            registry
                .release(*conn, std::slice::from_ref(&lease.lease_id))
                .await
                .expect("released");
        }
        let (conn, _e) = connect(&registry, ROOT);
        let never = CancellationToken::new();
        for (req, what) in [
            (
                slots(&["w"], 2, Duration::ZERO, false),
                "slots 2 to 4 are held with 5",
            ),
            (slots(&["w"], 2, Duration::ZERO, true), "nor by force"),
            (
                request(&["w"], Duration::ZERO, true),
                "a plain force neither",
            ),
        ] {
            let err = registry.acquire(conn, req, &never).await.expect_err(what);
            assert_eq!(err.code(), ErrorCode::SlotsMismatch, "{what}: {err}");
        }
        assert_eq!(registry.list().len(), 3, "the three holders untouched");
    }

    /// Issue 27, item 4: one user's many slot waiters on a 64-slot key
    /// keep at most TURNS_PER_USER × READS_IN_FLIGHT reads in flight.
    #[tokio::test]
    async fn one_user_s_slot_waiters_keep_a_bounded_number_of_reads_in_flight() {
        let store = Arc::new(FaultyStore::random(
            MemoryCasStore::new(),
            27,
            Duration::from_millis(4),
            0.0,
            0.0,
        ));
        let registry = agent(Arc::new(CasEngine::new(store.clone())), "agent-1");
        let (root, _e) = connect(&registry, ROOT);
        for _ in 0..64 {
            take_slots(&registry, root, 64)
                .await
                .expect("a slot is free");
        }
        store
            .most_reads_in_flight
            .store(0, std::sync::atomic::Ordering::SeqCst);
        let member = PeerCred {
            pid: 2,
            uid: 65534,
            gid: 65534,
        };
        let waiters = (0..32).map(|_| {
            let registry = registry.clone();
            let (conn, events) = connect(&registry, member);
            async move {
                let asked = slots(&["w"], 64, Duration::from_millis(300), false);
                let answer = registry
                    .acquire(conn, asked, &CancellationToken::new())
                    .await;
                drop(events);
                answer.map(|_| ()).expect_err("every slot is held")
            }
        });
        for err in futures::future::join_all(waiters).await {
            assert_eq!(err.code(), ErrorCode::Timeout, "{err}");
        }
        let most = store
            .most_reads_in_flight
            .load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            most as usize <= TURNS_PER_USER * READS_IN_FLIGHT,
            "{most} reads at once"
        );
    }

    #[tokio::test]
    async fn the_slot_let_go_last_is_taken_again_with_one_write() {
        let store = Arc::new(FaultyStore::reliable(MemoryCasStore::new()));
        let registry = agent(Arc::new(CasEngine::new(store.clone())), "agent-1");
        let (conn, _events) = connect(&registry, ROOT);
        let lease = take_slots(&registry, conn, 3).await.expect("free");
        registry
            .release(conn, &[lease.lease_id])
            .await
            .expect("released");
        let (gets, puts) = store.requests();
        let again = take_slots(&registry, conn, 3).await.expect("free");
        assert_eq!(again.slot, lease.slot);
        // One write, then the check's read of slot 1 (never written).
        assert_eq!(
            store.requests(),
            (gets + 1, puts + 1),
            "(reads, writes) of the second acquire"
        );
    }

    #[tokio::test]
    async fn slot_counts_outside_the_range_and_unknown_slots_are_bad_requests() {
        let registry = registry();
        let (conn, _e) = connect(&registry, ROOT);
        for n in [0, runlock_protocol::MAX_SLOTS + 1] {
            let err = take_slots(&registry, conn, n)
                .await
                .expect_err("out of range");
            assert_eq!(err.code(), ErrorCode::BadRequest);
        }
        let err = registry
            .break_key(conn, "w", runlock_protocol::MAX_SLOTS)
            .await
            .expect_err("no such slot");
        assert_eq!(err.code(), ErrorCode::BadRequest);
    }
}
