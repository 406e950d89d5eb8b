//! runlock's integration tests: the real `runlockd` and `runlock` on temporary
//! sockets (built once per test process by `support::bins`).

#[macro_use]
extern crate runlock_tests as support;

mod access;
mod agent_process;
mod attach;
mod azure;
mod azure_credentials;
mod backends;
mod bad_input;
mod book;
mod client_example;
mod config;
mod crash_release;
mod deploy;
mod file_backend;
mod file_layout;
mod file_trust;
mod fleet;
mod force;
mod from_meltano;
mod gcs;
mod legacy;
mod lifecycle;
mod listing;
mod man_pages;
mod meltano;
mod meltano_differential;
mod meltano_e2e;
mod metrics;
mod package;
mod postgres_connections;
mod reattach_trust;
mod restart;
mod run_holds_lock;
mod scenarios;
mod secrets;
mod shim_trust;
mod slots;
mod systemd;
mod throttling;
mod trust;
mod ui;
mod ui_screenshot;
mod untrusted_stores;
mod waiting;
