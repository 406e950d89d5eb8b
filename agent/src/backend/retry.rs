//! How a backend waits on its store: the time bounds of every request to a
//! network store, and one retry budget with capped, jittered exponential
//! pauses, so that agents retrying together spread out.

use std::time::Duration;

/// The time bounds of a network store's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Connecting (TCP, TLS, login) may take this long.
    pub connect: Duration,
    /// One request may take this long.
    pub attempt: Duration,
    /// One operation, retries included, may take this long: a hung store
    /// never blocks a caller for longer.
    pub operation: Duration,
}

/// The bounds every network store keeps (S3, Azure, GCS, PostgreSQL, etcd).
pub const TIMEOUTS: Timeouts = Timeouts {
    connect: Duration::from_secs(2),
    attempt: Duration::from_secs(3),
    operation: Duration::from_secs(5),
};

/// The retries of a network store's transient failure (unreachable, 5xx,
/// throttled, a reset connection) within one operation, each try within
/// [`TIMEOUTS`]`.attempt` and all within its `.operation`: every store's
/// client retries by it, through its own SDK's settings where it has one.
#[cfg(network_store)]
pub const TRANSIENT: RetryBudget = RetryBudget {
    attempts: 3,
    first_pause: Duration::from_millis(100),
    longest_pause: Duration::from_millis(800),
};

/// How many times an operation is tried, and how long it pauses between tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBudget {
    /// Tries in all, the first included.
    pub attempts: u32,
    /// The pause after the first failed try; it doubles with each one after.
    pub first_pause: Duration,
    /// The longest pause, before jitter.
    pub longest_pause: Duration,
}

impl RetryBudget {
    /// Whether another try is allowed after `tried` tries.
    #[cfg_attr(
        not(any(feature = "s3", feature = "gcs", feature = "etcd")),
        allow(dead_code, reason = "the engine counts its own tries")
    )]
    pub fn allows_another(&self, tried: u32) -> bool {
        tried < self.attempts
    }

    /// The pause after `tried` failed tries: `first_pause` doubling, capped at
    /// `longest_pause`, then [`jittered`].
    pub fn pause(&self, tried: u32) -> Duration {
        let doublings = tried.saturating_sub(1).min(16);
        let base = self
            .first_pause
            .saturating_mul(1 << doublings)
            .min(self.longest_pause);
        jittered(base)
    }

    /// Sleeps for [`RetryBudget::pause`].
    pub async fn wait(&self, tried: u32) {
        tokio::time::sleep(self.pause(tried)).await;
    }
}

/// `base` scaled by a random 0.5 to 1.5: agents that wait alike (retrying
/// one store, polling one held key) spread out instead of coming back together.
pub fn jittered(base: Duration) -> Duration {
    base.mul_f64(0.5 + fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_longest_and_are_jittered_around_it() {
        let budget = RetryBudget {
            attempts: 3,
            first_pause: Duration::from_millis(10),
            longest_pause: Duration::from_millis(40),
        };
        for (tried, base) in [(0, 10), (1, 10), (2, 20), (3, 40), (9, 40), (u32::MAX, 40)] {
            let pause = budget.pause(tried);
            let base = Duration::from_millis(base);
            assert!(
                pause >= base / 2 && pause <= base * 3 / 2,
                "{tried}: {pause:?}"
            );
        }
        assert!(budget.allows_another(2) && !budget.allows_another(3));
    }
}
