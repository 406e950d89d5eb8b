//! runlock's integration tests: the real `runlockd` and `runlock` on temporary
//! sockets (built once per test process by `support::bins`).

#[macro_use]
mod support;

mod agent_process;
mod bad_input;
mod crash_release;
mod file_backend;
mod lifecycle;
mod metrics;
mod s3;
mod s3_faults;
