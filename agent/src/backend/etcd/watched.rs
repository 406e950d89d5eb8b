//! What the watch on the prefix says of the keys this agent holds. A key is
//! deleted behind its holder's back only by a `--force` elsewhere or by its
//! lease running out, and the watch sees every delete under the prefix. So
//! while the watch has been up since a key was granted (or last read), and
//! has not seen it deleted, the key is still this holder's, and a renewal
//! need not read it: a held key then costs etcd nothing per renewal.
//!
//! "Up since" is an epoch: each time the watch is (re)established it gets a
//! new one, and a key stamped with an older epoch (or with none, granted
//! while the watch was down) is read at its next renewal and stamped anew.
//! A stamp is taken before the request it vouches for is sent, so every
//! delete after that request's revision reaches the watch.

use crate::unpoisoned::Unpoisoned;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Not watching: no key can be vouched for.
const DOWN: u64 = 0;

#[derive(Default)]
pub(super) struct Watched {
    /// The current epoch, or `DOWN`.
    epoch: AtomicU64,
    last_epoch: AtomicU64,
    /// Held keys by name: one grant of a name at a time here (a force by
    /// this agent of its own key replaces the stamp; the grant forced out
    /// then finds another token, and reads).
    held: Mutex<HashMap<String, Stamp>>,
}

#[derive(Clone, Copy)]
struct Stamp {
    token: i64,
    epoch: u64,
    deleted: bool,
}

/// The watch's word on one held key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Word {
    /// Deleted since it was granted: the holder has lost it.
    Deleted,
    /// Not deleted, and the watch has been up all along.
    Kept,
    /// The watch cannot say: read the key.
    Unknown,
}

impl Watched {
    /// The epoch to stamp a request about to be sent with.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    #[cfg(feature = "test-support")]
    pub(super) fn is_up(&self) -> bool {
        self.epoch() != DOWN
    }

    /// The watch is established (etcd answered its creation): a new epoch.
    pub(super) fn up(&self) {
        let epoch = self.last_epoch.fetch_add(1, Ordering::SeqCst) + 1;
        self.epoch.store(epoch, Ordering::SeqCst);
    }

    /// The watch has failed or ended.
    pub(super) fn down(&self) {
        self.epoch.store(DOWN, Ordering::SeqCst);
    }

    /// A key granted (or adopted, or read as ours) by a request stamped `epoch`.
    pub(super) fn hold(&self, name: &str, token: i64, epoch: u64) {
        let mut held = self.held.locked();
        match held.get_mut(name) {
            Some(stamp) if stamp.token == token => stamp.epoch = epoch,
            _ => {
                let stamp = Stamp {
                    token,
                    epoch,
                    deleted: false,
                };
                held.insert(name.to_string(), stamp);
            }
        }
    }

    /// This agent lets the key go: its delete is no news.
    pub(super) fn forget(&self, name: &str, token: i64) {
        let mut held = self.held.locked();
        if held.get(name).is_some_and(|stamp| stamp.token == token) {
            held.remove(name);
        }
    }

    /// The watch saw `name`, created at `token`, deleted.
    pub(super) fn deleted(&self, name: &str, token: i64) {
        if let Some(stamp) = self.held.locked().get_mut(name) {
            stamp.deleted |= stamp.token == token;
        }
    }

    pub(super) fn word(&self, name: &str, token: i64) -> Word {
        let epoch = self.epoch();
        match self
            .held
            .locked()
            .get(name)
            .filter(|stamp| stamp.token == token)
        {
            Some(stamp) if stamp.deleted => Word::Deleted,
            Some(stamp) if epoch != DOWN && stamp.epoch == epoch => Word::Kept,
            _ => Word::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_vouched_for_only_while_the_watch_that_saw_it_granted_is_up() {
        let watched = Watched::default();
        watched.hold("k", 7, watched.epoch());
        assert_eq!(watched.word("k", 7), Word::Unknown, "granted while down");
        watched.up();
        watched.hold("k", 7, watched.epoch());
        assert_eq!(watched.word("k", 7), Word::Kept);
        watched.down();
        watched.up();
        assert_eq!(watched.word("k", 7), Word::Unknown, "a gap: read once");
        watched.hold("k", 7, watched.epoch());
        assert_eq!(watched.word("k", 7), Word::Kept);
    }

    #[test]
    fn a_delete_of_the_key_as_granted_is_final_and_of_another_grant_is_not() {
        let watched = Watched::default();
        watched.up();
        watched.hold("k", 7, watched.epoch());
        watched.deleted("k", 6);
        assert_eq!(
            watched.word("k", 7),
            Word::Kept,
            "an earlier grant's delete"
        );
        watched.deleted("k", 7);
        watched.hold("k", 7, watched.epoch());
        assert_eq!(watched.word("k", 7), Word::Deleted);
        watched.forget("k", 7);
        assert_eq!(watched.word("k", 7), Word::Unknown);
    }
}
