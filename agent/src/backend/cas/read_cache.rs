//! The records a listing read, by name and version: an object store's
//! listing gives each object's version and a read costs a request, so the
//! next listing (the fleet page polls) reads again only what changed.

use super::{Read, Stored};
use crate::unpoisoned::Unpoisoned;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::SystemTime;
use tokio::time::Instant;

/// Bodies kept at most, in bytes: past it the cache starts over (a record
/// is a few KiB, so this is thousands of keys).
const MAX_BYTES: usize = 32 << 20;

/// What a read returned, and when, by this agent's clock.
struct Cached {
    stored: Stored,
    date: Option<SystemTime>,
    at: Instant,
}

#[derive(Default)]
pub(super) struct ReadCache {
    entries: Mutex<(HashMap<String, Cached>, usize)>,
}

/// A version as the store wrote it, without the quotes some tag it with.
fn bare(version: &str) -> &str {
    version.trim_matches('"')
}

impl ReadCache {
    /// The read of `name` as it was when last read, if its version is still
    /// `version`; the store's date moved on by the time since.
    pub(super) fn get(&self, name: &str, version: &str) -> Option<Read> {
        let entries = self.entries.locked();
        let cached = entries.0.get(name)?;
        if bare(&cached.stored.version) != bare(version) {
            return None;
        }
        Some(Read {
            object: Some(cached.stored.clone()),
            date: cached.date.map(|date| date + cached.at.elapsed()),
        })
    }

    /// Keeps what a read of `name` returned.
    pub(super) fn put(&self, name: &str, read: &Read) {
        let Some(stored) = &read.object else {
            return;
        };
        let mut entries = self.entries.locked();
        let (map, bytes) = &mut *entries;
        if *bytes + stored.body.len() > MAX_BYTES {
            map.clear();
            *bytes = 0;
        }
        *bytes += stored.body.len();
        let cached = Cached {
            stored: stored.clone(),
            date: read.date,
            at: Instant::now(),
        };
        if let Some(old) = map.insert(name.to_string(), cached) {
            *bytes -= old.stored.body.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn read(version: &str, body: &[u8]) -> Read {
        Read {
            object: Some(Stored {
                body: body.to_vec(),
                version: version.into(),
                last_modified: None,
            }),
            date: Some(UNIX_EPOCH + Duration::from_secs(100)),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_is_reused_while_its_version_holds_with_the_store_s_date_moved_on() {
        let cache = ReadCache::default();
        cache.put("a", &read("\"v1\"", b"one"));
        tokio::time::advance(Duration::from_secs(5)).await;
        let again = cache.get("a", "v1").expect("same version, unquoted");
        assert_eq!(again.object.expect("object").body, b"one");
        assert_eq!(again.date, Some(UNIX_EPOCH + Duration::from_secs(105)));
        assert!(cache.get("a", "v2").is_none());
        assert!(cache.get("b", "v1").is_none());
        cache.put("a", &read("v2", b"two"));
        assert!(cache.get("a", "v1").is_none());
        assert_eq!(cache.entries.lock().expect("lock").1, 3);
    }
}
