//! Taking a key: one transaction that creates it on the agent's etcd lease
//! or reads who has it, and `--force`'s delete-and-create over a holder.

use super::*;
use crate::unpoisoned::Unpoisoned;

/// How often a forced acquire may find the key taken again between its delete and its create.
const FORCE_ATTEMPTS: usize = 4;

/// What a force writes: the key's name, its marker's, the record, the
/// lease, and the event that goes into the key's history.
#[derive(Clone, Copy)]
struct Forced<'a> {
    key: &'a Key,
    name: &'a str,
    marker: &'a str,
    body: &'a [u8],
    lease: i64,
    history: &'a str,
    event: &'a KeyEvent,
}

impl EtcdBackend {
    /// Notes a key granted on `lease`, by requests sent in watch epoch `epoch`.
    fn granted(
        &self,
        spec: &AcquireSpec,
        lease: EtcdLease,
        token: u64,
        epoch: u64,
        displaced: Option<Displaced>,
    ) -> Grant {
        let holder = Holder {
            token,
            ..spec.holder.clone()
        };
        self.hold(&spec.key, &spec.lease_id, lease.id, token, epoch);
        Grant {
            holder,
            sent: lease.sent,
            lock: None,
            displaced,
        }
    }

    /// Notes a key held here, and has the watch look after it.
    pub(super) fn hold(&self, key: &Key, lease_id: &str, etcd_lease: i64, token: u64, epoch: u64) {
        self.held.locked().insert(lease_id.to_string(), etcd_lease);
        self.watched.hold(&self.name(key), token as i64, epoch);
        // Started by the first holder (or waiter), and kept.
        let _ = self.release_sender();
    }

    /// One acquire: create the key with a lease, or read who has it.
    pub(super) async fn try_acquire(&self, spec: &AcquireSpec) -> BackendResult<Grant> {
        let name = self.name(&spec.key);
        let marker = self.force_marker(&spec.key);
        let body = EtcdRecord::new(spec).body();
        let history_key = self.history_name(&spec.key);
        if !spec.force && self.seen_held(&name, None) {
            if let Some(refused) = self.still_held(spec, &name, &marker, &history_key).await? {
                return Err(refused);
            }
        }
        // Token 0: the grant's own revision (see `history`).
        let grant = shared::event(EventKind::Granted, &spec.holder, 0, Stamp::agent_now());
        for _ in 0..FORCE_ATTEMPTS {
            let lease = self.lease_for(spec.ttl).await?;
            let epoch = self.watched.epoch();
            let kept = self.kept(&history_key);
            let events = kept.after_grant(grant.clone());
            let create = Txn::new()
                .when([
                    Compare::create_revision(name.clone(), 0),
                    Compare::create_revision(marker.clone(), 0),
                    Compare::mod_revision(history_key.clone(), kept.revision),
                ])
                .and_then([
                    TxnOp::put(name.clone(), body.clone(), Some(lease.id)),
                    TxnOp::put(history_key.clone(), history::body(&spec.key, &events), None),
                ])
                .or_else([
                    TxnOp::get(Get::key(name.clone())),
                    TxnOp::get(Get::key(history_key.clone())),
                ]);
            let answer = match self.transact_as_is(create).await {
                Ok(answer) => answer,
                Err(Problem::Expected(LeaseGone)) => {
                    // Gone between its keep-alive and this write (revoked by
                    // hand, say): the next attempt grants another.
                    self.sessions.gone(lease.id);
                    continue;
                }
                Err(problem) => {
                    self.abandon([&name, &marker], &body, lease);
                    return Err(self.connection.unavailable(problem));
                }
            };
            if answer.succeeded {
                self.seen_held(&name, Some(false));
                let revision = answer.revision();
                let events = history::filled(events, revision as u64);
                self.keep(&history_key, Kept::written(revision, events));
                return Ok(self.granted(spec, lease, revision as u64, epoch, None));
            }
            let mut read = answer.firsts();
            let (current, history_kv) = (read.next().flatten(), read.next().flatten());
            let now = self.read_history(&history_key, history_kv.as_ref())?;
            let incident = shared::last_incident(&now.events);
            if self.keep(&history_key, now) && current.is_none() {
                // Only the history had changed since this agent saw it: again.
                continue;
            }
            let Some(current) = current else {
                // No key, so the force marker: another agent is forcing it
                // and holds it meanwhile.
                if !spec.force {
                    self.seen_held(&name, Some(true));
                    return Err(BackendError::Held(None, incident));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let record = self.parse(&name, &current)?;
            // A retried create whose first answer was lost finds its own write.
            if record.lease_id == spec.lease_id && current.lease() == lease.id {
                let token = current.create_revision() as u64;
                return Ok(self.granted(spec, lease, token, epoch, None));
            }
            let holder = self.holder_of(&name, &current)?;
            if !spec.force {
                self.seen_held(&name, Some(true));
                return Err(BackendError::Held(Some(Box::new(holder)), incident));
            }
            let mut event = grant.clone();
            event.kind = if spec.breaking {
                EventKind::Broken
            } else {
                EventKind::Forced
            };
            event.from_token = Some(current.create_revision() as u64);
            let forced = Forced {
                key: &spec.key,
                name: &name,
                marker: &marker,
                body: &body,
                lease: lease.id,
                history: &history_key,
                event: &event,
            };
            let displaced = Displaced {
                token: holder.token,
                ttl: Duration::from_millis(record.ttl_ms),
                holder: Some(holder),
                lock: None,
            };
            match self.take_over(&forced, &current).await {
                Ok(Some(token)) => {
                    let grant = self.granted(spec, lease, token, epoch, Some(displaced));
                    return Ok(grant);
                }
                Ok(None) => {}
                Err(err) => {
                    self.abandon([&name, &marker], &body, lease);
                    return Err(err);
                }
            }
        }
        Err(BackendError::Unavailable(format!(
            "{name} in {}: taken again {FORCE_ATTEMPTS} times while forcing it; try again",
            self.description
        )))
    }

    /// `--force`, in two transactions, as etcd allows no put and delete of
    /// one key in one: the key, if still as read, is deleted and the force
    /// marker put in its place (on the forcer's lease, so that it expires
    /// if the forcer dies), then the key is created and the marker deleted.
    /// Between the two, a waiter woken by the delete finds the marker and is
    /// told the key is held: only the forcer can take it. The old holder's
    /// lease is not revoked (it is its agent's, shared by its other keys):
    /// its agent's watch sees the delete, or its next renewal reads the key.
    /// `Ok(None)`: the key changed meanwhile; read it again.
    async fn take_over(
        &self,
        forced: &Forced<'_>,
        current: &KeyValue,
    ) -> BackendResult<Option<u64>> {
        let Forced {
            key,
            name,
            marker,
            body,
            lease,
            history,
            event,
        } = *forced;
        let delete = Txn::new()
            .when([
                Compare::mod_revision(name, current.mod_revision()),
                Compare::create_revision(marker, 0),
            ])
            .and_then([
                TxnOp::delete(name),
                TxnOp::put(marker, body, Some(lease)),
                TxnOp::get(Get::key(history)),
            ]);
        let deleted = self.transact(delete).await?;
        if !deleted.succeeded {
            return Ok(None);
        }
        // The history as the delete saw it: only the forcer, holding the
        // marker, writes it before the key is created again.
        let history_kv = deleted.firsts().flatten().next();
        let kept = self.read_history(history, history_kv.as_ref())?;
        let mut events = kept.events.clone();
        shared::push(&mut events, event.clone());
        let create = Txn::new()
            .when([
                Compare::value(marker, body),
                Compare::create_revision(name, 0),
                Compare::mod_revision(history, kept.revision),
            ])
            .and_then([
                TxnOp::put(name, body, Some(lease)),
                TxnOp::delete(marker),
                TxnOp::put(history, history::body(key, &events), None),
            ])
            // Only an agent of an older version, which knows no marker, can
            // have created the key (or written no history) meanwhile: give
            // the marker up, read again.
            .or_else([TxnOp::delete(marker)]);
        let created = self.transact(create).await?;
        if !created.succeeded {
            return Ok(None);
        }
        let revision = created.revision();
        let events = history::filled(events, revision as u64);
        self.keep(history, Kept::written(revision, events));
        Ok(Some(revision as u64))
    }

    /// Deletes, in the background, the key an acquire may have written
    /// before its answer was lost: if it landed, nobody was told. Only that
    /// very write is deleted (its body names the attempt's lease id).
    /// A force's marker too (same body): the shared lease would keep it.
    fn abandon(&self, names: [&str; 2], body: &[u8], lease: EtcdLease) {
        let deletes = names.map(|name| {
            Txn::new()
                .when([Compare::value(name, body), Compare::lease(name, lease.id)])
                .and_then([TxnOp::delete(name)])
        });
        let connection = self.connection.clone();
        // Not cut short at shutdown (a write never is): each delete is
        // bounded by its timeout, and the shutdown waits for it.
        self.context.spawn(async move {
            for delete in deletes {
                let _ = tokio::time::timeout(
                    TIMEOUTS.operation,
                    connection.call(|c| {
                        let delete = delete.clone();
                        async move { c.txn(delete).await }
                    }),
                )
                .await;
            }
        });
    }
}
