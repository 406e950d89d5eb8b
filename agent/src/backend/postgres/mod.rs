//! The PostgreSQL backend (`postgresql://…`): native semantics, not the
//! object-store engine. One table in a schema of its own, one statement per
//! operation, expiry by the database's clock, releases announced with
//! `NOTIFY` so that waiters on other hosts retry at once.
//!
//! Leases are rows, not session locks: they outlive the agent (and its
//! connection), so a restarted agent adopts them (DESIGN.md, "When a run
//! or the agent goes away").

// The client (settings, TLS, errors) is built whatever the features: the
// Meltano system-database check (`meltano/guard.rs`) speaks PostgreSQL too.
#[cfg(feature = "postgres")]
mod backend;
mod errors;
mod link;
#[cfg(feature = "postgres")]
mod session;
mod settings;
#[cfg(feature = "postgres")]
mod sql;
mod tls;

pub use crate::backend::options::DEFAULT_SCHEMA;
#[cfg(feature = "postgres")]
pub use backend::PostgresBackend;
pub use link::{Kept, Link};
pub use settings::{PasswordSource, Settings};
