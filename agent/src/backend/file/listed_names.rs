//! The lock directory's record names as a listing's first page read them,
//! kept for its later pages, so that a page costs its own records rather
//! than a read and a sort of the whole directory (which made a listing of N
//! keys cost N²/250). SPEC 8.10 lets a key created while a client pages be
//! missed; a name removed since is skipped when its record is read.

use crate::unpoisoned::Unpoisoned;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Listings whose names are kept at once: the oldest is dropped past it (its
/// next page reads the directory again, and is kept in turn).
const KEPT: usize = 4;
/// A listing's names are not used past this: it has long finished.
const KEPT_FOR: Duration = Duration::from_secs(120);
/// How a page token names the listing it belongs to.
const TOKEN_PREFIX: &str = "names-";

/// Sorted record names under one prefix, as one listing read them.
struct Snapshot {
    id: u64,
    wanted: String,
    names: Arc<Vec<String>>,
    taken: Instant,
}

#[derive(Default)]
pub(super) struct ListedNames {
    kept: Mutex<(VecDeque<Snapshot>, u64)>,
}

impl ListedNames {
    /// The names that start with `wanted` as the listing of `token` read
    /// them, with the token for its next pages; `read` (the directory's
    /// names, unsorted) when that listing's are not kept.
    pub(super) fn names<E>(
        &self,
        token: Option<&str>,
        wanted: &str,
        read: impl FnOnce() -> Result<Vec<String>, E>,
    ) -> Result<(Arc<Vec<String>>, String), E> {
        let id = token
            .and_then(|t| t.strip_prefix(TOKEN_PREFIX))
            .and_then(|id| id.parse::<u64>().ok());
        if let Some(id) = id {
            let kept = self.kept.locked();
            let found = kept
                .0
                .iter()
                .find(|s| s.id == id && s.wanted == wanted && s.taken.elapsed() < KEPT_FOR);
            if let Some(snapshot) = found {
                return Ok((snapshot.names.clone(), format!("{TOKEN_PREFIX}{id}")));
            }
        }
        let mut names = read()?;
        names.sort_unstable();
        let names = Arc::new(names);
        let mut kept = self.kept.locked();
        let (snapshots, next_id) = &mut *kept;
        *next_id += 1;
        let id = *next_id;
        snapshots.retain(|s| s.taken.elapsed() < KEPT_FOR);
        if snapshots.len() >= KEPT {
            snapshots.pop_front();
        }
        snapshots.push_back(Snapshot {
            id,
            wanted: wanted.to_string(),
            names: names.clone(),
            taken: Instant::now(),
        });
        Ok((names, format!("{TOKEN_PREFIX}{id}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_reads_the_directory_once_and_only_its_own_names() {
        let listed = ListedNames::default();
        let reads = std::cell::Cell::new(0);
        let read = |names: &[&str]| {
            reads.set(reads.get() + 1);
            Ok::<_, ()>(names.iter().map(|n| n.to_string()).collect())
        };
        let (first, token) = listed
            .names(None, "a", || read(&["a2", "a1"]))
            .expect("read");
        assert_eq!(*first, ["a1", "a2"]);
        let (again, same) = listed
            .names(Some(&token), "a", || read(&["a3"]))
            .expect("kept");
        assert_eq!((*again).clone(), *first);
        assert_eq!(same, token);
        // Another prefix, or a token this agent never gave, reads afresh.
        let (other, _) = listed
            .names(Some(&token), "b", || read(&["b1"]))
            .expect("read");
        assert_eq!(*other, ["b1"]);
        let (forged, _) = listed
            .names(Some("names-99"), "a", || read(&["a3"]))
            .expect("read");
        assert_eq!(*forged, ["a3"]);
        assert_eq!(reads.get(), 3);
        // Only the latest few listings are kept.
        for _ in 0..KEPT {
            listed.names(None, "a", || read(&[])).expect("read");
        }
        let (evicted, _) = listed
            .names(Some(&token), "a", || read(&["a9"]))
            .expect("read");
        assert_eq!(*evicted, ["a9"]);
    }
}
