//! What the agent takes from Meltano: a project's `state_backend` settings as
//! the agent's configuration (`check-config --from-meltano`), and the guard
//! that refuses keys Meltano's system database records as running. The
//! project is read by runlock-meltano-project, as the shim's `--meltano`
//! reads it.

pub mod guard;
pub mod state_backend;
