//! What a peer is shown of the leases held here (`list`) and of a key's
//! record in the backend (`inspect`), bounded to fit a reply.

use super::error::{backend_on, valid_key, LeaseError};
use super::registry::Registry;
use super::state::ConnId;
use crate::shown;
use runlock_protocol::{KeyEvent, KeyRecord, LeaseInfo, MAX_FRAME_LEN};

impl Registry {
    /// How many leases this agent holds (without copying them, as `list` does).
    pub fn lease_count(&self) -> usize {
        self.state().leases.len()
    }

    /// Every lease held through this agent.
    pub fn list(&self) -> Vec<LeaseInfo> {
        let state = self.state();
        let mut leases: Vec<LeaseInfo> = state
            .leases
            .iter()
            .map(|(id, l)| LeaseInfo {
                key: l.key.split_slot().0.to_string(),
                lease_id: id.clone(),
                ttl_ms: l.ttl.as_millis() as u64,
                holder: l.holder.clone(),
                child_pid: state
                    .conns
                    .get(&l.conn)
                    .and_then(|c| c.child)
                    .map(|run| run.pid()),
            })
            .collect();
        leases.sort_by(|a, b| (&a.key, a.holder.slot).cmp(&(&b.key, b.holder.slot)));
        leases
    }

    /// The leases held through this agent as the connection's peer may see
    /// them, as many as fit one reply; and how many were left out. A lease
    /// id is shown to its owner only (empty for everyone else, force users
    /// included): with its token it is what `reattach` names.
    pub fn list_for(&self, conn: ConnId) -> (Vec<LeaseInfo>, u32) {
        // Field names, lease id and integers of one entry take less than this,
        // and the reply's own envelope less than the headroom.
        const ENTRY_OVERHEAD: usize = 320;
        const ENVELOPE_HEADROOM: usize = 4096;
        let viewer = self.viewer(conn);
        let mut room = MAX_FRAME_LEN - ENVELOPE_HEADROOM;
        let mut shown = Vec::new();
        let all = self.list();
        let total = all.len();
        for mut lease in all {
            if lease.holder.uid != viewer.uid {
                lease.lease_id.clear();
            }
            lease.holder = self.show(&lease.holder, viewer);
            let h = &lease.holder;
            let size = ENTRY_OVERHEAD
                + lease.key.len()
                + h.host.len()
                + h.agent_id.len()
                + h.user.len()
                + h.command.len();
            if size > room {
                break;
            }
            room -= size;
            shown.push(lease);
        }
        let omitted = u32::try_from(total - shown.len()).unwrap_or(u32::MAX);
        (shown, omitted)
    }

    /// The backend's record of a key, as the connection's peer may see it.
    pub async fn inspect_for(&self, conn: ConnId, key: &str) -> Result<KeyRecord, LeaseError> {
        let record = self.inspect(key).await?;
        Ok(self.shown_record(record, self.viewer(conn)))
    }

    /// The latest `limit` events of a key's history (all it keeps for 0),
    /// oldest first, each string cut to fit. An event names no command
    /// line, so every peer that may `inspect` the key may see them.
    pub async fn history(&self, key: &str, limit: usize) -> Result<Vec<KeyEvent>, LeaseError> {
        let key = valid_key(key)?;
        let events = self.slot_history(&key).await.map_err(backend_on(&key))?;
        // A record another agent wrote may hold more than this one keeps.
        let keep = match limit {
            0 => runlock_protocol::MAX_HISTORY_EVENTS,
            n => n.min(runlock_protocol::MAX_HISTORY_EVENTS),
        };
        let skip = events.len().saturating_sub(keep);
        Ok(events[skip..].iter().map(shown::event).collect())
    }

    /// The backend's record of a key, every slot's for a key with slots.
    pub async fn inspect(&self, key: &str) -> Result<KeyRecord, LeaseError> {
        let key = valid_key(key)?;
        let records = self.slot_records(&key).await.map_err(backend_on(&key))?;
        Ok(Registry::merge_records(&key, records))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[tokio::test]
    async fn a_lease_id_is_listed_for_its_owner_only() {
        let registry = registry();
        let member = USER;
        let (roots, _root_events) = connect(&registry, ROOT);
        let (members, _member_events) = connect(&registry, member);
        let root_lease = take(&registry, roots, &["a"])
            .await
            .expect("free")
            .remove(0);
        let member_lease = take(&registry, members, &["b"])
            .await
            .expect("free")
            .remove(0);
        let ids = |conn| -> Vec<(String, String)> {
            let (leases, _) = registry.list_for(conn);
            leases.into_iter().map(|l| (l.key, l.lease_id)).collect()
        };
        let (a, b) = ("a".to_string(), "b".to_string());
        assert_eq!(
            ids(members),
            vec![
                (a.clone(), String::new()),
                (b.clone(), member_lease.lease_id)
            ]
        );
        // Root may force and break, and needs no one's lease id for either.
        assert_eq!(
            ids(roots),
            vec![(a, root_lease.lease_id), (b, String::new())]
        );
    }
}
