//! The shim's code, for its two programs: `runlock` (src/main.rs), the
//! small one that wraps each run, and `runlock-ui` (src/bin/runlock-ui), the
//! page `runlock ui` hands over to, so that the shim links no HTTP server.
//! Packaging builds the man pages and completions from [`cli`] and the exit
//! statuses from [`exit`]; the tests check runs against [`exit`] too.

pub mod agent;
pub mod cli;
pub mod commands;
pub mod exit;
pub mod format;
pub mod host_config;
pub mod order;
pub mod signals;
pub mod wait_line;
