//! Spacing this agent's writes of one record by the store's pace.

use crate::unpoisoned::Unpoisoned;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Spaces this agent's writes of one record by the store's minimum write
/// interval (GCS: about one per object per second), so that a release right
/// after an acquire, or an acquire right after a release, does not meet the
/// store's throttling. Other agents' writes are not known here: a write that
/// is throttled anyway is retried by the store adapter.
pub(super) struct Pacer {
    pub(super) interval: Duration,
    /// When each record's last write that may have landed was (or will be) sent.
    pub(super) booked: Mutex<HashMap<String, Instant>>,
}

/// One write's slot, for [`Pacer::cancel`].
pub(super) struct Booking {
    at: Instant,
    previous: Option<Instant>,
}

impl Pacer {
    /// Waits until `name` may be written again and books that moment for the
    /// write about to be sent.
    pub(super) async fn book(&self, name: &str) -> Option<Booking> {
        if self.interval.is_zero() {
            return None;
        }
        let now = Instant::now();
        let booking = {
            let mut booked = self.booked.locked();
            booked.retain(|_, last| *last + self.interval > now);
            let previous = booked.get(name).copied();
            let at = previous.map_or(now, |last| (last + self.interval).max(now));
            booked.insert(name.to_string(), at);
            Booking { at, previous }
        };
        tokio::time::sleep_until(booking.at).await;
        Some(booking)
    }

    /// The booked write changed nothing (its precondition failed): it does not count.
    pub(super) fn cancel(&self, name: &str, booking: Option<Booking>) {
        let Some(booking) = booking else { return };
        let mut booked = self.booked.locked();
        if booked.get(name) == Some(&booking.at) {
            match booking.previous {
                Some(previous) => booked.insert(name.to_string(), previous),
                None => booked.remove(name),
            };
        }
    }
}
