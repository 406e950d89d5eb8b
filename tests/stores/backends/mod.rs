//! The backends in this process, against the real stores' emulators: one
//! conformance suite every backend runs, and each store's own tests that
//! need its emulator (moved here from agent/src, so that `cargo test -p
//! runlock-agent` needs no store running).

mod conformance;
mod etcd;
mod gcs;
mod listing;
mod postgres;
