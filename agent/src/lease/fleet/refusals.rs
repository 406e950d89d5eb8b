//! The acquires this agent refused lately because their key was held: the
//! store records none (a refusal writes nothing), so the fleet page's marks
//! come from here, bounded in count and age.

use runlock_protocol::{Key, Refusal};
use std::collections::{HashMap, VecDeque};

/// At most this many refusals are kept, the oldest dropped first.
const KEPT: usize = 4096;
/// And none older than a day: the page's timeline is a day long.
const KEPT_FOR_MS: u64 = 24 * 60 * 60 * 1000;

/// Refusals by key, oldest first, and the order they came in across keys.
#[derive(Default)]
pub(super) struct Refusals {
    by_key: HashMap<Key, VecDeque<Refusal>>,
    order: VecDeque<Key>,
}

impl Refusals {
    /// Notes that an acquire of `key` (a key with slots: its base) was refused.
    pub(super) fn note(&mut self, key: Key, refusal: Refusal) {
        let now = refusal.at_ms;
        self.by_key
            .entry(key.clone())
            .or_default()
            .push_back(refusal);
        self.order.push_back(key);
        while self.order.len() > KEPT || self.oldest_at().is_some_and(|at| at + KEPT_FOR_MS < now) {
            self.drop_oldest();
        }
    }

    /// The refusals of `key` at or after `since_ms`, oldest first.
    pub(super) fn of(&self, key: &Key, since_ms: u64) -> Vec<Refusal> {
        self.by_key
            .get(key)
            .map(|kept| {
                kept.iter()
                    .filter(|r| r.at_ms >= since_ms)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The newest `most` refusals of every key, with their keys, oldest first.
    pub(super) fn newest(&self, most: usize) -> Vec<(Key, Refusal)> {
        let mut all: Vec<(Key, Refusal)> = (self.by_key.iter())
            .flat_map(|(key, kept)| kept.iter().map(move |r| (key.clone(), r.clone())))
            .collect();
        all.sort_by_key(|(_, r)| r.at_ms);
        let skip = all.len().saturating_sub(most);
        all.split_off(skip)
    }

    fn oldest_at(&self) -> Option<u64> {
        let key = self.order.front()?;
        self.by_key.get(key)?.front().map(|r| r.at_ms)
    }

    fn drop_oldest(&mut self) {
        let Some(key) = self.order.pop_front() else {
            return;
        };
        if let Some(kept) = self.by_key.get_mut(&key) {
            kept.pop_front();
            if kept.is_empty() {
                self.by_key.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(at_ms: u64) -> Refusal {
        Refusal {
            at_ms,
            host: "h".into(),
            uid: 1000,
            user: "etl".into(),
            pid: 42,
            waited_ms: 0,
        }
    }

    #[test]
    fn refusals_are_kept_by_key_bounded_in_count_and_age() {
        let (a, b) = (Key::new("a").expect("valid"), Key::new("b").expect("valid"));
        let mut refusals = Refusals::default();
        refusals.note(a.clone(), refusal(1_000));
        refusals.note(b.clone(), refusal(2_000));
        refusals.note(a.clone(), refusal(3_000));
        let at = |key: &Key, since| -> Vec<u64> {
            refusals.of(key, since).iter().map(|r| r.at_ms).collect()
        };
        assert_eq!(at(&a, 0), [1_000, 3_000]);
        assert_eq!(at(&a, 2_000), [3_000]);
        assert_eq!(at(&b, 0), [2_000]);

        // A day later, the old ones are gone.
        let mut refusals = Refusals::default();
        refusals.note(a.clone(), refusal(1_000));
        refusals.note(b.clone(), refusal(1_000 + KEPT_FOR_MS + 1));
        assert!(refusals.of(&a, 0).is_empty());
        assert_eq!(refusals.by_key.len(), 1);

        // Past the count, the oldest go first.
        let mut refusals = Refusals::default();
        for i in 0..(KEPT as u64 + 10) {
            refusals.note(a.clone(), refusal(10_000 + i));
        }
        let kept = refusals.of(&a, 0);
        assert_eq!(kept.len(), KEPT);
        assert_eq!(kept[0].at_ms, 10_010);
    }
}
