//! The durations a lease's safety rests on, every one derived from its TTL
//! (DESIGN.md, "Timing"). The agent, every backend and the shim take them
//! from here, so that the rule they must keep together is written once:
//!
//! a holder trusts its lease until `sent + trusted_for(ttl)`, its run is
//! SIGKILLed at most `kill_grace(ttl)` later, so by `sent + ttl`; nobody takes
//! the key over before the store's clock says `written + ttl + grace(ttl)`,
//! and the store writes no earlier than the holder sent.

use std::time::Duration;

/// The shortest TTL a lease may ask for (a backend may ask for more).
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// The longest TTL a lease may ask for: a day.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest a run gets between SIGTERM and SIGKILL when its lease is lost
/// under `on_lost = term`, whether the shim or the agent stops it.
pub const MAX_KILL_GRACE: Duration = Duration::from_secs(5);

/// How often a lease is renewed (before jitter).
pub fn renewal_period(ttl: Duration) -> Duration {
    ttl / 3
}

/// How long before its TTL runs out a holder stops trusting its lease: the
/// time its run has, with the grace, to be stopped.
pub fn margin(ttl: Duration) -> Duration {
    ttl / 6
}

/// How long after sending its last successful write a holder trusts its lease.
pub fn trusted_for(ttl: Duration) -> Duration {
    ttl - margin(ttl)
}

/// How long past a holder's TTL, by the store's clock, others wait before
/// taking over: room for the store clock's rate error and a signal's delivery.
pub fn grace(ttl: Duration) -> Duration {
    (ttl / 10).max(Duration::from_millis(500))
}

/// The kill grace for a lease of `ttl`: [`MAX_KILL_GRACE`], or the margin when
/// that is shorter, so that a run told at its deadline is gone by its TTL.
pub fn kill_grace(ttl: Duration) -> Duration {
    MAX_KILL_GRACE.min(margin(ttl))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TTLs across the whole range: every millisecond up to 2 s, then a
    /// geometric sweep to a day, and the edges.
    fn ttls() -> impl Iterator<Item = Duration> {
        let fine = (MIN_TTL.as_millis() as u64..=2_000).map(Duration::from_millis);
        let coarse = std::iter::successors(Some(Duration::from_secs(2)), |t| {
            Some(t.mul_f64(1.01)).filter(|t| *t <= MAX_TTL)
        });
        fine.chain(coarse).chain([MAX_TTL, Duration::from_secs(30)])
    }

    #[test]
    fn a_run_told_at_its_deadline_is_gone_by_its_ttl_before_anyone_takes_over() {
        for ttl in ttls() {
            let killed_by = trusted_for(ttl) + kill_grace(ttl);
            assert!(killed_by <= ttl, "ttl {ttl:?}: killed at {killed_by:?}");
            assert!(
                kill_grace(ttl) <= margin(ttl) + grace(ttl),
                "ttl {ttl:?}: the kill grace does not fit the margin and the grace"
            );
            assert!(grace(ttl) > Duration::ZERO, "ttl {ttl:?}: no grace");
            assert!(
                renewal_period(ttl) * 2 <= trusted_for(ttl),
                "ttl {ttl:?}: fewer than two renewals before the deadline"
            );
        }
    }

    #[test]
    fn the_kill_grace_is_five_seconds_from_a_thirty_second_ttl_up() {
        assert_eq!(kill_grace(Duration::from_secs(30)), MAX_KILL_GRACE);
        assert_eq!(kill_grace(MAX_TTL), MAX_KILL_GRACE);
        assert_eq!(kill_grace(Duration::from_secs(6)), Duration::from_secs(1));
    }
}
