//! `runlockd` as operators run it: the process and its socket, its
//! configuration, its answers to bad input, its metrics and its restarts.

mod bad_input;
pub mod config;
pub mod metrics;
pub mod process;
pub mod restart;
