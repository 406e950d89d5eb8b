//! runlock's integration tests: the real `runlockd` and `runlock` on temporary
//! sockets (built once per test process by `support::bins`), grouped by the
//! surface they test.

#[macro_use]
extern crate runlock_tests as support;

mod agent;
mod meltano;
mod shim;
mod shipped;
mod stores;
mod trust;
mod ui;
