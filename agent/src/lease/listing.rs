//! `list_keys`: every key the store records, from every host, a page at a
//! time, as the asking peer may see them. The store lists records; a key
//! with slots is listed once, from its own record, with every slot's read
//! back as `inspect` reads them.

use super::error::LeaseError;
use super::fleet::Reading;
use super::registry::Registry;
use super::state::ConnId;
use crate::backend::{BackendError, ListFrom, Listed, PageAsk};
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

/// What `list_keys` asks, as the peer sent it.
pub use runlock_protocol::ListKeysRequest as KeysQuery;

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
        let fleet = self.fleet.reading().await;
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
                if let Some(mut listing) = self.listing(listed, &query, viewer, &fleet).await? {
                    let mut size = encoded_len(&listing);
                    if keys.is_empty() && size > room {
                        // Alone in a reply and still too large: cut, since a
                        // reply without it would leave the cursor where it was.
                        listing = cut_to_fit(listing, room);
                        size = encoded_len(&listing);
                    }
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
        fleet: &Reading,
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
            match self.with_slots(&key, record, history).await {
                Ok(both) => both,
                Err(err) => return Ok(Some(unreadable(&key, &err.to_string()))),
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
        let (waiting_here, (waiters, refused)) = {
            let state = self.state();
            let since = query.events_since_ms;
            let waiting_here = u32::try_from(state.queues.len(&key)).unwrap_or(u32::MAX);
            let fleet = fleet.of(&key, since, &state.queues, &state.report);
            (waiting_here, fleet)
        };
        Ok(Some(KeyListing {
            key: key.to_string(),
            record: Some(self.shown_record(record, viewer)),
            unreadable: None,
            events,
            events_omitted: 0,
            waiting_here,
            waiters,
            refused,
        }))
    }

    /// A key's record and history merged with every slot's (SPEC 13): from
    /// the store's listing of its slot records where it has one, so that a
    /// record unchanged since the last listing is not read again; else each
    /// slot read as `inspect` and `history` read them.
    async fn with_slots(
        &self,
        key: &Key,
        record: KeyRecord,
        history: Vec<KeyEvent>,
    ) -> Result<(KeyRecord, Vec<KeyEvent>), BackendError> {
        let Some(listed) = self.backend.list_slots(key).await? else {
            let records = self.slot_records(key).await?;
            let history = self.slot_history(key).await?;
            return Ok((Registry::merge_records(key, records), history));
        };
        let mut slots = Vec::with_capacity(listed.len());
        for slot in listed {
            let (record, history) = slot.read.map_err(BackendError::Corrupt)?;
            let number = Key::parse_record(&record.key).map_or(0, |k| k.split_slot().1);
            slots.push((number, record, history));
        }
        slots.sort_by_key(|(number, _, _)| *number);
        let (mut records, mut histories) = (vec![record], vec![history]);
        for (_, record, history) in slots {
            records.push(record);
            histories.push(history);
        }
        Ok((
            Registry::merge_records(key, records),
            super::slots::merge_histories(histories),
        ))
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
        events_omitted: 0,
        waiting_here: 0,
        waiters: Vec::new(),
        refused: Vec::new(),
    }
}

fn encoded_len<T: serde::Serialize>(item: &T) -> usize {
    encode_body(&Envelope::event(item)).map_or(usize::MAX, |body| body.len())
}

/// `listing` within `room` bytes: its newest events that fit, the older
/// ones counted in `events_omitted`. Every other part of an entry is bounded
/// well below a frame (holders, waiters and refusals are counted and cut to
/// their lengths), so only a key's events can outgrow one.
fn cut_to_fit(mut listing: KeyListing, room: usize) -> KeyListing {
    // The `events` field's name and array header, and the count's widest form.
    const EVENTS_FIELD: usize = 16;
    let events = std::mem::take(&mut listing.events);
    listing.events_omitted = u32::MAX;
    let mut left = room.saturating_sub(encoded_len(&listing) + EVENTS_FIELD);
    // Each event measured as a body of its own: a little more than it takes
    // in the array, so the sum never underestimates.
    let kept = events
        .iter()
        .rev()
        .take_while(|event| {
            let size = encoded_len(event);
            let fits = size <= left;
            left = left.saturating_sub(size);
            fits
        })
        .count();
    let omitted = events.len() - kept;
    listing.events = events.into_iter().skip(omitted).collect();
    listing.events_omitted = u32::try_from(omitted).unwrap_or(u32::MAX);
    if encoded_len(&listing) > room {
        // Not reached within the agent's bounds; listed rather than dropped.
        return unreadable(&listing.key, "its listing is larger than a frame");
    }
    listing
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

#[cfg(test)]
mod tests {
    use super::*;
    use runlock_protocol::{Clock, EventKind, Scope};

    fn event(at_ms: u64) -> KeyEvent {
        let long = "x".repeat(shown::MAX_NAME_LEN);
        KeyEvent {
            kind: EventKind::Released,
            at_ms,
            clock: Clock::Agent,
            token: at_ms,
            from_token: None,
            host: long.clone(),
            agent_id: long.clone(),
            pid: 1,
            uid: 0,
            user: long.clone(),
            reason: long,
            slot: Some(1),
        }
    }

    #[test]
    fn a_key_larger_than_a_frame_keeps_its_newest_events_and_counts_the_rest() {
        let key = Key::new("big").expect("valid");
        let events: Vec<KeyEvent> = (0..64 * 32).map(event).collect();
        let listing = KeyListing {
            key: key.to_string(),
            record: Some(KeyRecord::free(&key, Scope::Global)),
            unreadable: None,
            events,
            events_omitted: 0,
            waiting_here: 0,
            waiters: Vec::new(),
            refused: Vec::new(),
        };
        let room = MAX_FRAME_LEN - REPLY_HEADROOM;
        assert!(encoded_len(&listing) > MAX_FRAME_LEN, "the case is one");
        let cut = cut_to_fit(listing, room);
        assert!(encoded_len(&cut) <= room);
        assert!(cut.record.is_some() && !cut.events.is_empty());
        assert_eq!(cut.events.len() + cut.events_omitted as usize, 64 * 32);
        assert_eq!(cut.events.last().map(|e| e.at_ms), Some(64 * 32 - 1));
        // Nearly all that fits is kept: a cut of a frame's worth, not of half.
        assert!(encoded_len(&cut) > room - 2 * encoded_len(&cut.events[0]));
    }
}
