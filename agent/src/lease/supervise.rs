//! The run a peer attached: named once it is found to be the peer's, and
//! watched past its shim's end where the run was reattached.

use super::error::LeaseError;
use super::registry::Registry;
use super::state::ConnId;
use crate::process::{AttachRefused, Run};
use std::sync::Arc;
use tokio::sync::Notify;

impl Registry {
    /// The process group of a reattached connection's run while it still has
    /// members: such a connection's end (its shim killed) is not the run's.
    pub fn run_outliving(&self, conn: ConnId) -> Option<u32> {
        let (run, _) = self.reattached_run(conn)?;
        // Outside the lock: this reads /proc.
        run.has_members().then_some(run.pgid())
    }

    /// Returns once a reattached connection's run has ended (its group has no
    /// member left) or the connection holds no lease any more; at once for
    /// any other connection. Each member's exit is awaited, not polled for.
    pub async fn run_ended(&self, conn: ConnId) {
        // Looked at again after each notice: one may be left from leases gone
        // before a later reattach.
        while let Some((run, leases_gone)) = self.reattached_run(conn) {
            tokio::select! {
                _ = run.ended() => return,
                _ = leases_gone.notified() => {}
            }
        }
    }

    /// The run of a reattached connection that holds leases, and what tells
    /// when they are gone.
    fn reattached_run(&self, conn: ConnId) -> Option<(Run, Arc<Notify>)> {
        let state = self.state();
        let c = state
            .conns
            .get(&conn)
            .filter(|c| c.reattached && !c.leases.is_empty())?;
        Some((c.child?, c.leases_gone.clone()))
    }

    /// Names the run's process for every lease of the connection, once it is
    /// found to be the peer's; a refused one leaves any earlier one in place.
    pub fn attach(&self, conn: ConnId, pid: u32, pgid: u32) -> Result<(), LeaseError> {
        let (peer, _, _) = self.peer(conn)?;
        let run = Run::attach(peer.uid, pid, pgid).inspect_err(|err| match err {
            // A command quicker than its shim's attach: nothing left to stop.
            AttachRefused::NoProcess(_) => tracing::debug!(pid, pgid, "attach of an ended run"),
            _ => tracing::warn!(pid, pgid, error = %err, "attach refused"),
        })?;
        if let Some(c) = self.state().conns.get_mut(&conn) {
            c.child = Some(run);
        }
        Ok(())
    }
}
