//! A held key's value in etcd: the record, readable with `etcdctl get
//! --prefix -w json`. Unlike the object stores' record it has no token: the
//! token is the key's create revision, known only once the key is written.

use crate::backend::AcquireSpec;
use runlock_protocol::{Holder, KeyState};
use serde::{Deserialize, Serialize};

/// A key's value in etcd: readable with `etcdctl get --prefix -w json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct EtcdRecord {
    /// The key.
    pub(super) key: String,
    /// Always `held`: a free key has no record.
    pub(super) state: KeyState,
    /// The holding lease's id (runlock's, not etcd's: that is the key's `lease`).
    pub(super) lease_id: String,
    /// The holder's TTL in milliseconds.
    pub(super) ttl_ms: u64,
    /// The holder, without its token: the token is the key's create revision,
    /// which is known only once the key is written.
    pub(super) holder: serde_json::Map<String, serde_json::Value>,
}

impl EtcdRecord {
    pub(super) fn new(spec: &AcquireSpec) -> EtcdRecord {
        let mut holder = match serde_json::to_value(&spec.holder) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(), // invariant: a Holder serializes to an object
        };
        holder.remove("token");
        EtcdRecord {
            key: spec.key.to_string(),
            state: KeyState::Held,
            lease_id: spec.lease_id.clone(),
            ttl_ms: spec.ttl.as_millis() as u64,
            holder,
        }
    }

    pub(super) fn body(&self) -> Vec<u8> {
        // invariant: plain strings, numbers and a JSON map always serialize
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The holder, with the token it was granted (the key's create revision).
    pub(super) fn holder(&self, token: u64) -> Option<Holder> {
        let mut holder = self.holder.clone();
        holder.insert("token".into(), token.into());
        serde_json::from_value(serde_json::Value::Object(holder)).ok()
    }
}
