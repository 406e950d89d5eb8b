//! `runlock run` and its neighbours (`list`, `release`, `--force`, `--wait`,
//! `--slots`) through real agents: a run's life, crash release, runs across
//! hosts sharing a store.

mod crash_release;
mod force;
mod lifecycle;
mod listing;
mod run_holds_lock;
mod scenarios;
mod slots;
mod waiting;
