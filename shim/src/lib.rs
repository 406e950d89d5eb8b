//! The shim's command-line contract, for what is built from it beside the
//! `runlock` binary: its clap definitions (packaging's man pages and
//! completions) and its exit codes (the tests' expectations of a run).

pub mod cli;
pub mod exit;
