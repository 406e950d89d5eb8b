//! Each store as the agent uses it: the backends in this process, and real
//! agents on `file://` and on the emulators, including stores that throttle,
//! run out of connections, cannot lock, or carry a fleet.

mod azure;
mod azure_credentials;
mod backends;
mod file;
mod fleet;
pub mod gcs;
mod postgres_connections;
mod throttling;
mod untrusted;
