//! How a backend waits on its store: the time bounds of every request to a
//! network store, and one retry budget with capped, jittered exponential
//! pauses, so that agents retrying together spread out.

use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

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
    #[cfg_attr(
        not(feature = "etcd"),
        allow(dead_code, reason = "only the etcd watch waits outside `run`")
    )]
    pub async fn wait(&self, tried: u32) {
        tokio::time::sleep(self.pause(tried)).await;
    }

    /// Tries `op` (given the try's number, from 1) until it succeeds, fails in
    /// a way `is_transient` says another try will not mend, or the budget is
    /// spent, pausing [`RetryBudget::pause`] in between; returns its last result.
    pub async fn run<T, E, Fut>(
        &self,
        op: impl FnMut(u32) -> Fut,
        is_transient: impl Fn(&E) -> bool,
    ) -> Result<T, E>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        self.run_paced(None, op, |err, tried| {
            is_transient(err).then(|| self.pause(tried))
        })
        .await
    }

    /// [`RetryBudget::run`] for callers that choose each pause themselves:
    /// `pause_after` gives the pause after a failed try (zero: try again at
    /// once), `None` to stop there.
    /// A try that could only start at or past `deadline` is not made.
    pub async fn run_paced<T, E, Fut>(
        &self,
        deadline: Option<Instant>,
        mut op: impl FnMut(u32) -> Fut,
        mut pause_after: impl FnMut(&E, u32) -> Option<Duration>,
    ) -> Result<T, E>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        let mut tried = 0;
        loop {
            tried += 1;
            let err = match op(tried).await {
                Ok(value) => return Ok(value),
                Err(err) => err,
            };
            let Some(pause) = pause_after(&err, tried) else {
                return Err(err);
            };
            let too_late = deadline.is_some_and(|deadline| Instant::now() + pause >= deadline);
            if !self.allows_another(tried) || too_late {
                return Err(err);
            }
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
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

    const BUDGET: RetryBudget = RetryBudget {
        attempts: 4,
        first_pause: Duration::from_millis(100),
        longest_pause: Duration::from_millis(400),
    };

    /// A try that fails with its own number, transiently unless it is `fatal`.
    async fn failing(tried: u32, fatal: u32) -> Result<(), (u32, bool)> {
        Err((tried, tried == fatal))
    }

    /// [`RetryBudget::run`] over `op`: its result, the tries made and the time taken.
    async fn tally<T, E, Fut>(
        mut op: impl FnMut(u32) -> Fut,
        is_transient: impl Fn(&E) -> bool,
    ) -> (Result<T, E>, Vec<u32>, Duration)
    where
        Fut: Future<Output = Result<T, E>>,
    {
        let started = Instant::now();
        let mut tries = Vec::new();
        let answer = BUDGET
            .run(
                |tried| {
                    tries.push(tried);
                    op(tried)
                },
                is_transient,
            )
            .await;
        (answer, tries, started.elapsed())
    }

    fn about(waited: Duration, base_ms: u64) {
        let base = Duration::from_millis(base_ms);
        assert!(waited >= base / 2 && waited <= base * 3 / 2, "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn retries_a_transient_failure_until_a_try_succeeds() {
        let busy_twice = |tried| async move {
            if tried < 3 {
                Err("busy")
            } else {
                Ok(tried)
            }
        };
        let (answer, tries, waited) = tally(busy_twice, |_| true).await;
        assert_eq!(answer, Ok(3));
        assert_eq!(tries, [1, 2, 3]);
        about(waited, 100 + 200);
    }

    #[tokio::test(start_paused = true)]
    async fn stops_at_once_on_a_failure_that_is_not_transient() {
        let (answer, tries, waited) = tally(|tried| failing(tried, 1), |&(_, fatal)| !fatal).await;
        assert_eq!(answer, Err((1, true)));
        assert_eq!(tries, [1]);
        assert_eq!(waited, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_spent_budget_returns_the_last_error_without_a_pause_after_it() {
        let (answer, tries, waited) = tally(|tried| failing(tried, 0), |&(_, fatal)| !fatal).await;
        assert_eq!(answer, Err((4, false)));
        assert_eq!(tries, [1, 2, 3, 4]);
        about(waited, 100 + 200 + 400);
    }

    #[tokio::test(start_paused = true)]
    async fn paced_tries_take_the_chosen_pauses_and_stop_before_the_deadline() {
        let started = Instant::now();
        let deadline = started + Duration::from_millis(250);
        let mut tries = 0;
        let answer = BUDGET
            .run_paced(
                Some(deadline),
                |tried| {
                    tries += 1;
                    failing(tried, 0)
                },
                |_, _| Some(Duration::from_millis(100)),
            )
            .await;
        // Tries at 0, 100 and 200 ms; a fourth, at 300 ms, would be past the deadline.
        assert_eq!(answer, Err((3, false)));
        assert_eq!(tries, 3);
        assert_eq!(started.elapsed(), Duration::from_millis(200));

        let answer = BUDGET
            .run_paced(
                None,
                |tried| failing(tried, 0),
                |_, tried| (tried < 2).then_some(Duration::ZERO),
            )
            .await;
        assert_eq!(answer, Err((2, false)), "`None` from pause_after stops");
    }
}
