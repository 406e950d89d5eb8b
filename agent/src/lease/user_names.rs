//! Peers' user names by uid, looked up once a while, not once a connection:
//! NSS reads /etc/passwd on every call, and where it asks a directory (LDAP,
//! SSSD) it blocks the agent's worker thread for a round trip.

use crate::unpoisoned::Unpoisoned;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a name looked up stays good: a renamed user is shown by the
/// new name at most this late.
const FRESH_FOR: Duration = Duration::from_secs(60);

/// At most this many uids are kept; a fuller cache starts afresh.
const MOST_KEPT: usize = 1024;

/// A uid's name as NSS gives it (the uid in digits where it has none),
/// remembered for [`FRESH_FOR`].
#[derive(Default)]
pub(super) struct UserNames(Mutex<HashMap<u32, (String, Instant)>>);

impl UserNames {
    pub(super) fn of(&self, uid: u32) -> String {
        let now = Instant::now();
        if let Some((name, _)) = (self.0.locked().get(&uid))
            .filter(|(_, looked_up)| now.duration_since(*looked_up) < FRESH_FOR)
        {
            return name.clone();
        }
        // Outside the lock: NSS may take a while.
        let name = look_up(uid);
        let mut names = self.0.locked();
        if names.len() >= MOST_KEPT {
            names.clear();
        }
        names.insert(uid, (name.clone(), now));
        name
    }
}

fn look_up(uid: u32) -> String {
    match nix::unistd::User::from_uid(uid.into()) {
        Ok(Some(user)) => user.name,
        _ => uid.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_looked_up_again_once_it_is_stale_and_an_unknown_uid_reads_as_digits() {
        let names = UserNames::default();
        assert_eq!(names.of(0), "root");
        // A name remembered is given as remembered while it is fresh…
        let stale = Instant::now() - FRESH_FOR;
        names
            .0
            .locked()
            .insert(0, ("renamed".into(), Instant::now()));
        assert_eq!(names.of(0), "renamed");
        // …and looked up again once it is not.
        names.0.locked().insert(0, ("renamed".into(), stale));
        assert_eq!(names.of(0), "root");
        assert_eq!(names.of(4_000_000_000), "4000000000");
    }

    #[test]
    fn a_full_cache_starts_afresh() {
        let names = UserNames::default();
        for uid in 0..MOST_KEPT as u32 + 1 {
            names.of(3_000_000_000 + uid);
        }
        assert_eq!(names.0.locked().len(), 1);
    }
}
