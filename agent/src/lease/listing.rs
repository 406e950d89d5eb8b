//! `list_keys`: every key the store records, from every host, a page at a
//! time, as the asking peer may see them. The store lists records; a key
//! with slots is listed once, from its own record, with every slot's read
//! back as `inspect` reads them.

use super::error::LeaseError;
use super::fleet::Fleet;
use super::registry::Registry;
use super::state::ConnId;
use crate::backend::{ListFrom, Listed, PageAsk};
use crate::shown::{self, Viewer};
use runlock_protocol::codec::encode_body;
use runlock_protocol::{
    Envelope, Key, KeyEvent, KeyListing, KeyRecord, KeyState, MAX_FRAME_LEN, MAX_KEYS_PER_PAGE,
};

/// Records asked of the store at once: an object store reads each, so a
/// page is also this many reads.
const STORE_PAGE: usize = 250;
/// Store pages one reply may go through when most records are left out
/// (free keys, another prefix's hashed names), so that a reply stays prompt.
const STORE_PAGES_PER_REPLY: usize = 8;
/// Room kept in a frame for the reply's own fields and cursor.
const REPLY_HEADROOM: usize = 16 * 1024;
/// A cursor longer than this was not made here (a store's page token is far shorter).
const MAX_CURSOR_LEN: usize = 8 * 1024;

/// What `list_keys` asks.
pub struct KeysQuery {
    /// Only keys that start with this.
    pub prefix: String,
    /// Where the previous page ended.
    pub cursor: Option<String>,
    /// Free keys too.
    pub free: bool,
    /// Each key's events from then on (ms since the epoch).
    pub events_since_ms: Option<u64>,
}

/// One `keys` reply: the keys, and where the next page starts.
pub struct KeysPage {
    /// The keys, in the store's order.
    pub keys: Vec<KeyListing>,
    /// The next page's cursor; `None` after the last.
    pub cursor: Option<String>,
}

impl Registry {
    /// A page of the store's keys as the connection's peer may see them.
    pub async fn list_keys_for(
        &self,
        conn: ConnId,
        query: KeysQuery,
    ) -> Result<KeysPage, LeaseError> {
        if !query.prefix.is_empty() {
            super::error::valid_key(&query.prefix)?;
        }
        let mut from = match &query.cursor {
            Some(cursor) => decode_cursor(cursor)?,
            None => ListFrom::default(),
        };
        let viewer = self.viewer(conn);
        let fleet = self.fleet().await;
        let mut room = MAX_FRAME_LEN - REPLY_HEADROOM;
        let mut keys = Vec::new();
        for _ in 0..STORE_PAGES_PER_REPLY {
            let page = self
                .backend
                .list(PageAsk {
                    prefix: &query.prefix,
                    from: &from,
                    limit: STORE_PAGE,
                })
                .await
                .map_err(LeaseError::Listing)?;
            let mut consumed = from.after.clone();
            for listed in page.records {
                let name = listed.name.clone();
                if let Some(listing) = self.listing(listed, &query, viewer, &fleet).await? {
                    let size = encoded_len(&listing);
                    if size > room || keys.len() == MAX_KEYS_PER_PAGE {
                        // This page of the store goes on after the last key sent.
                        let next = ListFrom {
                            after: consumed,
                            ..from
                        };
                        return Ok(KeysPage {
                            keys,
                            cursor: Some(encode_cursor(&next)),
                        });
                    }
                    room -= size;
                    keys.push(listing);
                }
                consumed = Some(name);
            }
            match page.next {
                Some(next) => from = next,
                None => return Ok(KeysPage { keys, cursor: None }),
            }
            // A store page's worth is a reply: a client sees progress, and a
            // reply never waits on more than one page of reads.
            if keys.len() >= STORE_PAGE {
                break;
            }
        }
        Ok(KeysPage {
            keys,
            cursor: Some(encode_cursor(&from)),
        })
    }

    /// `listed` as the peer may see it; `None` for a record the listing
    /// leaves out: a slot's (listed with its key), or a free key unless asked.
    async fn listing(
        &self,
        listed: Listed,
        query: &KeysQuery,
        viewer: Viewer,
        fleet: &Fleet,
    ) -> Result<Option<KeyListing>, LeaseError> {
        let (record, history) = match listed.read {
            Ok(read) => read,
            Err(why) => return Ok(Some(unreadable(&listed.name, &why))),
        };
        let key = match Key::parse_record(&record.key) {
            Ok(key) => key,
            Err(why) => return Ok(Some(unreadable(&listed.name, &why.to_string()))),
        };
        if key.split_slot().1 > 0 {
            return Ok(None);
        }
        let slotted = record.holder.as_ref().is_some_and(|h| h.slots.is_some())
            || history.iter().any(|e| e.slot.is_some());
        let (record, history) = if slotted {
            // Every slot's record, read as `inspect` and `history` read them.
            let reread = async {
                let records = self.slot_records(&key).await?;
                let history = self.slot_history(&key).await?;
                Ok((Registry::merge_records(&key, records), history))
            };
            match reread.await {
                Ok(both) => both,
                Err(err) => {
                    let err: crate::backend::BackendError = err;
                    return Ok(Some(unreadable(&key, &err.to_string())));
                }
            }
        } else {
            (record, history)
        };
        if record.state == KeyState::Free && !query.free {
            return Ok(None);
        }
        let events = match query.events_since_ms {
            Some(since) => history
                .iter()
                .filter(|e| e.at_ms >= since)
                .map(shown::event)
                .collect(),
            None => Vec::new(),
        };
        let waiting_here = u32::try_from(self.state().queues.len(&key)).unwrap_or(u32::MAX);
        let (waiters, refused) = self.fleet_of(fleet, &key, query.events_since_ms);
        Ok(Some(KeyListing {
            key: key.to_string(),
            record: Some(self.shown_record(record, viewer)),
            unreadable: None,
            events,
            waiting_here,
            waiters,
            refused,
        }))
    }

    /// A record as `viewer` may see it.
    pub(super) fn shown_record(&self, mut record: KeyRecord, viewer: Viewer) -> KeyRecord {
        record.holder = record.holder.map(|h| self.show(&h, viewer));
        for holder in record.holders.iter_mut() {
            *holder = self.show(holder, viewer);
        }
        record.incident = record.incident.map(|e| Box::new(shown::event(&e)));
        record
    }
}

fn unreadable(name: &impl std::fmt::Display, why: &str) -> KeyListing {
    KeyListing {
        key: shown::cut(&name.to_string(), runlock_protocol::types::MAX_KEY_LEN),
        record: None,
        unreadable: Some(shown::cut(why, shown::MAX_NAME_LEN * 4)),
        events: Vec::<KeyEvent>::new(),
        waiting_here: 0,
        waiters: Vec::new(),
        refused: Vec::new(),
    }
}

fn encoded_len(listing: &KeyListing) -> usize {
    encode_body(&Envelope::event(listing)).map_or(usize::MAX, |body| body.len())
}

fn encode_cursor(from: &ListFrom) -> String {
    // invariant: plain strings and a bool always serialize
    serde_json::to_string(from).unwrap_or_default()
}

fn decode_cursor(cursor: &str) -> Result<ListFrom, LeaseError> {
    if cursor.len() > MAX_CURSOR_LEN {
        return Err(LeaseError::BadCursor(format!(
            "{} bytes, longer than any this agent gives",
            cursor.len()
        )));
    }
    serde_json::from_str(cursor).map_err(|e| LeaseError::BadCursor(e.to_string()))
}
