//! One shape for what a failed request to a store means, before an operation
//! decides what to do with it: an answer the operation expects and handles
//! (a missing object, a failed precondition, a lease gone), a failure worth
//! another try, or a refusal no retry mends. Each store classifies its
//! client's errors into it (`classify` in the `errors.rs` of each backend's
//! folder); messages name the
//! store and what to check, never a secret.

/// A sorted failure; `A` is what the store's operations expect and handle.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    not(any(feature = "s3", feature = "azure", feature = "gcs", feature = "etcd")),
    allow(
        dead_code,
        reason = "only the stores left out of this build expect answers"
    )
)]
pub enum Failure<A = Unexpected> {
    /// An answer the operation handles itself.
    Expected(A),
    /// Not reached, no answer, overloaded: trying again may work.
    Transient(String),
    /// Refused (credentials, permissions, no such bucket): the same request
    /// fails the same way until someone changes something.
    Refused(String),
}

/// No answer is expected: every failure is a transient one or a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unexpected {}

impl<A> Failure<A> {
    /// Whether it is worth another try.
    #[cfg_attr(
        not(feature = "postgres"),
        allow(dead_code, reason = "only the PostgreSQL session retries by it")
    )]
    pub fn is_transient(&self) -> bool {
        matches!(self, Failure::Transient(_))
    }
}

/// For the stores' classifier tests: whether `failure` is a refusal, and
/// its message; a failure the operation handles, or none, fails the test.
#[cfg(all(test, object_store))]
pub fn refusal_and_message<A: std::fmt::Debug>(
    failure: impl Into<Option<Failure<A>>>,
) -> (bool, String) {
    match failure.into() {
        Some(Failure::Refused(m)) => (true, m),
        Some(Failure::Transient(m)) => (false, m),
        other => panic!("not an error with a message: {other:?}"),
    }
}

impl Failure<Unexpected> {
    /// The message of a failure that can only be transient or refused.
    pub fn message(self) -> String {
        match self {
            Failure::Transient(message) | Failure::Refused(message) => message,
            Failure::Expected(never) => match never {},
        }
    }
}
