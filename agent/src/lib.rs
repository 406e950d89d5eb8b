//! runlockd, the per-host lock agent: a Unix-socket server over a lease
//! registry and a backend. `main.rs` wires these together; tests and benches
//! use them directly.

pub mod access;
pub mod backend;
pub mod config;
pub mod connection;
pub mod exit_status;
mod handoff;
#[cfg(test)]
mod layers;
pub mod lease;
pub mod limits;
pub mod listener;
pub mod meltano;
pub mod metrics;
pub mod notify;
pub mod process;
pub mod server;
pub mod shown;
pub mod telemetry;
pub mod unpoisoned;

pub use server::serve;
