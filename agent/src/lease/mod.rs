//! The agent's leases, by lease id, by key and by connection, and the local
//! waiter queues: one place that decides who holds what on this host.
//!
//! One `Registry` under one lock (`state`), its operations one idea a module:
//! `acquire` (and reattach), `takeover` (what one try at a key may take:
//! the take-over rule), `queue` (local waiters), `release` (and break),
//! `displaced` (a force waits for the run it displaces), `loss` (a lease
//! lost, and what `renewal` reports), `supervise` (the run a
//! peer attached), `view` (list and inspect as a peer may see them),
//! `listing` (the store's keys, a page at a time, likewise), `fleet` (what
//! this agent reports of itself to the store, and reads of the others'). It
//! speaks in `error::LeaseError` and `event::Event`; only the connection
//! turns them into wire messages. What happens to leases it tells an
//! `observer::Observer` (the agent's metrics), whom it does not know.

mod acquire;
mod displaced;
mod error;
mod event;
mod fleet;
mod listing;
mod loss;
#[cfg(test)]
mod model;
mod observer;
mod queue;
mod registry;
mod release;
pub mod renewal;
mod slots;
mod state;
mod supervise;
mod takeover;
#[cfg(test)]
mod testing;
mod user_names;
mod view;

pub use acquire::{AcquireRequest, Granted};
pub use error::LeaseError;
pub use event::{Event, Events, Loss};
pub use listing::{KeysPage, KeysQuery};
pub use observer::{Observer, Renewal, Takeover, Unobserved};
pub use registry::{Identity, Policy, Registry, DEFAULT_POLL_INTERVAL};
pub use state::{ConnId, PeerCred};
