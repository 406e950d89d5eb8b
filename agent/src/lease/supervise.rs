//! The run a peer attached: named once it is found to be the peer's, and
//! watched past its shim's end where the run was reattached.

use super::error::LeaseError;
use super::registry::Registry;
use super::state::ConnId;
use crate::process::Run;

impl Registry {
    /// The process group of a reattached connection's run while it still has
    /// members: such a connection's end (its shim killed) is not the run's.
    pub fn run_outliving(&self, conn: ConnId) -> Option<u32> {
        let run = self
            .state()
            .conns
            .get(&conn)
            .filter(|c| c.reattached && !c.leases.is_empty())?
            .child?;
        // Outside the lock: this reads /proc.
        run.has_members().then_some(run.pgid())
    }

    /// Names the run's process for every lease of the connection, once it is
    /// found to be the peer's; a refused one leaves any earlier one in place.
    pub fn attach(&self, conn: ConnId, pid: u32, pgid: u32) -> Result<(), LeaseError> {
        let (peer, _, _) = self.peer(conn)?;
        let run = Run::attach(peer.uid, pid, pgid).inspect_err(|err| {
            tracing::warn!(pid, pgid, error = %err, "attach refused");
        })?;
        if let Some(c) = self.state().conns.get_mut(&conn) {
            c.child = Some(run);
        }
        Ok(())
    }
}
