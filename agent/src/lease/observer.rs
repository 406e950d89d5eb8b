//! What the lease layer tells whoever watches it: what happened to leases,
//! as it happens, in the lease layer's words. The agent's metrics implement
//! [`Observer`]; the lease layer knows nothing of them.

use crate::backend::Ending;
use runlock_protocol::LostReason;
use std::time::Duration;

/// How a renewal attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The store extended the lease.
    Ok,
    /// It failed in a way worth retrying before the lease's deadline.
    Retry,
    /// The lease is gone: taken, or not renewed before its deadline.
    Lost,
}

/// How this agent took a key from a live holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeover {
    /// An acquire with `--force`.
    Force,
    /// `runlock release --key`.
    Break,
}

/// Told what happens to the leases of one registry. Every method does
/// nothing unless implemented, so an observer takes only what it needs.
/// Calls come from under the registry's lock and from the renewal
/// scheduler's task: an observer records and returns, never waits.
pub trait Observer: Send + Sync + 'static {
    /// The agent holds `count` leases now.
    fn leases_held(&self, _count: usize) {}

    /// An acquire began (`true`) or stopped (`false`) waiting for a held key.
    fn waiting(&self, _began: bool) {}

    /// This agent took a key from a live holder.
    fn taken_over(&self, _how: Takeover) {}

    /// A renewal (or a retry) went out `late` after it was due.
    fn renewal_sent(&self, _late: Duration) {}

    /// A renewal attempt ended.
    fn renewal_ended(&self, _outcome: Renewal) {}

    /// A lease granted at `acquired_at_ms` (its holder's wall clock, 0 if
    /// unknown) was let go by this agent, as `ending` says.
    fn released(&self, _acquired_at_ms: u64, _ending: &Ending) {}

    /// A lease granted at `acquired_at_ms` was lost while held.
    fn lost(&self, _acquired_at_ms: u64, _reason: LostReason) {}
}

/// An observer that records nothing: a registry no one watches.
pub struct Unobserved;

impl Observer for Unobserved {}

/// Counts an acquire as waiting for as long as it is kept.
pub(super) struct Waiting<'a>(&'a dyn Observer);

impl<'a> Waiting<'a> {
    pub(super) fn begin(observer: &'a dyn Observer) -> Waiting<'a> {
        observer.waiting(true);
        Waiting(observer)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting(false);
    }
}
