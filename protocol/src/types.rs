//! The values messages carry: keys, leases, holders and key records.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The longest key, in bytes of UTF-8.
pub const MAX_KEY_LEN: usize = 512;

/// A validated lock key: UTF-8, 1 to 512 bytes, no control characters and
/// no invisible ones.
///
/// Keys travel as plain strings so that the agent can answer an invalid one
/// with `invalid_key` rather than failing to decode the whole request.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Key(String);

/// Why a string is not a valid key; the message names the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidKey {
    /// The key is the empty string.
    #[error("invalid key: a key must not be empty")]
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`] bytes.
    #[error("invalid key: a key must be at most 512 bytes of UTF-8, this one is {0} bytes")]
    TooLong(usize),
    /// The key holds a control character.
    #[error(
        "invalid key: a key must not contain control characters (found U+{0:04X} at byte {1})"
    )]
    ControlCharacter(u32, usize),
    /// The key holds a character that is not seen: a format character
    /// (zero-width, bidirectional) or a line or paragraph separator.
    #[error(
        "invalid key: a key must not contain invisible characters, which would make it look like \
         another (found U+{0:04X} at byte {1})"
    )]
    InvisibleCharacter(u32, usize),
}

impl Key {
    /// Checks the key rules and wraps the string.
    pub fn new(key: impl Into<String>) -> Result<Key, InvalidKey> {
        let key = key.into();
        if key.is_empty() {
            return Err(InvalidKey::Empty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(InvalidKey::TooLong(key.len()));
        }
        if let Some((at, c)) = key.char_indices().find(|(_, c)| c.is_control()) {
            return Err(InvalidKey::ControlCharacter(c as u32, at));
        }
        if let Some((at, c)) = key.char_indices().find(|&(_, c)| is_invisible(c)) {
            return Err(InvalidKey::InvisibleCharacter(c as u32, at));
        }
        Ok(Key(key))
    }

    /// The key as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key of the record that slot `slot` of this key is kept in: the
    /// key itself for slot 0, else the key, U+001F and the slot's number.
    /// No valid key holds a control character, so a slot's record never
    /// clashes with a key's (SPEC 13).
    pub fn slot_record(&self, slot: u32) -> Key {
        match slot {
            0 => self.clone(),
            n => Key(format!("{}{SLOT_SEPARATOR}{n}", self.0)),
        }
    }

    /// The key a slot record belongs to and the slot's number (0 for a key's
    /// own record).
    pub fn split_slot(&self) -> (&str, u32) {
        match self.0.rsplit_once(SLOT_SEPARATOR) {
            Some((base, n)) => (base, n.parse().unwrap_or(0)),
            None => (&self.0, 0),
        }
    }

    /// A key as a record names it: a valid key, or a slot record's key
    /// ([`Key::slot_record`]).
    pub fn parse_record(name: &str) -> Result<Key, InvalidKey> {
        match name.rsplit_once(SLOT_SEPARATOR) {
            Some((base, slot)) => {
                let key = Key::new(base)?;
                let at = base.len();
                match slot.parse::<u32>() {
                    Ok(n) if n > 0 && n.to_string() == slot => Ok(key.slot_record(n)),
                    _ => Err(InvalidKey::ControlCharacter(SLOT_SEPARATOR as u32, at)),
                }
            }
            None => Key::new(name),
        }
    }

    /// The key as a log line names it: a slot's record as `KEY#SLOT`.
    pub fn logged(&self) -> std::borrow::Cow<'_, str> {
        match self.split_slot() {
            (key, 0) => key.into(),
            (key, slot) => format!("{key}#{slot}").into(),
        }
    }

    /// The key a slot record belongs to, as peers name it.
    pub fn base(&self) -> Key {
        Key(self.split_slot().0.to_string())
    }
}

/// Joins a key and a slot number in a slot record's key.
const SLOT_SEPARATOR: char = '\u{1f}';

/// The code points of Unicode's general categories Cf (format: zero-width
/// spaces and joiners, bidirectional marks, embeddings and isolates, tags)
/// and Zl, Zp (line and paragraph separators), as of Unicode 16.0 (SPEC
/// 8.1). None is seen where a key is printed, and a bidirectional one
/// reorders what follows, so a key holding one looks like another key.
const INVISIBLE: &[(char, char)] = &[
    ('\u{00AD}', '\u{00AD}'),
    ('\u{0600}', '\u{0605}'),
    ('\u{061C}', '\u{061C}'),
    ('\u{06DD}', '\u{06DD}'),
    ('\u{070F}', '\u{070F}'),
    ('\u{0890}', '\u{0891}'),
    ('\u{08E2}', '\u{08E2}'),
    ('\u{180E}', '\u{180E}'),
    ('\u{200B}', '\u{200F}'),
    ('\u{2028}', '\u{202E}'),
    ('\u{2060}', '\u{2064}'),
    ('\u{2066}', '\u{206F}'),
    ('\u{FEFF}', '\u{FEFF}'),
    ('\u{FFF9}', '\u{FFFB}'),
    ('\u{110BD}', '\u{110BD}'),
    ('\u{110CD}', '\u{110CD}'),
    ('\u{13430}', '\u{1343F}'),
    ('\u{1BCA0}', '\u{1BCA3}'),
    ('\u{1D173}', '\u{1D17A}'),
    ('\u{E0001}', '\u{E0001}'),
    ('\u{E0020}', '\u{E007F}'),
];

/// Whether `c` is one of the characters no key may hold for not being seen
/// (SPEC 8.1); what prints peers' text escapes them too.
pub fn is_invisible(c: char) -> bool {
    INVISIBLE
        .iter()
        .any(|&(first, last)| (first..=last).contains(&c))
}

/// The most slots a key may have.
pub const MAX_SLOTS: u32 = 64;

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// Who holds a lease. Recorded by the agent at acquisition: the host, agent and
/// fencing token are the agent's; pid and uid come from the peer's SO_PEERCRED.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// Host name of the agent that granted the lease.
    pub host: String,
    /// Id of the agent process that granted the lease.
    pub agent_id: String,
    /// Pid of the process that asked for the lease (the shim).
    pub pid: u32,
    /// Uid of that process.
    pub uid: u32,
    /// Gid of that process (absent from records written before it was kept).
    #[serde(default)]
    pub gid: u32,
    /// User name for `uid`, or the uid as digits when it has none.
    pub user: String,
    /// The command line the lease protects, as the client described it.
    pub command: String,
    /// When the lease was granted, in milliseconds since the Unix epoch (agent's clock).
    pub acquired_at_ms: u64,
    /// The fencing token of the lease.
    pub token: u64,
    /// The slot held, for a key with slots (0-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    /// How many slots the key was taken with; absent for a plain key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<u32>,
}

/// One key granted by an `acquire`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The key.
    pub key: String,
    /// The lease's id, unique across agents and restarts.
    pub lease_id: String,
    /// The fencing token: larger than every earlier token of this key (of
    /// this slot, for a key with slots).
    pub token: u64,
    /// The slot granted, for a key with slots (0-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
}

/// One lease as `list` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    /// The key.
    pub key: String,
    /// The lease's id.
    pub lease_id: String,
    /// The lease's time to live, in milliseconds.
    pub ttl_ms: u64,
    /// Who holds it, token included.
    pub holder: Holder,
    /// The run's process id once the client has sent `attach`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_pid: Option<u32>,
}

/// Whether a key is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyState {
    /// Nobody holds the key.
    Free,
    /// A lease holds the key.
    Held,
    /// A state this build does not know.
    #[serde(other)]
    Unknown,
}

/// How far a backend's exclusion reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Only agents on this host (or sharing a lock-capable mount) exclude each other.
    Host,
    /// Every agent that shares the backend excludes every other.
    Global,
    /// A scope this build does not know.
    #[serde(other)]
    Unknown,
}

/// A key's record in the backend, as `inspect` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// The key.
    pub key: String,
    /// Free or held.
    pub state: KeyState,
    /// The last fencing token issued for the key; 0 when it was never acquired.
    pub token: u64,
    /// The holder while the key is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    /// Milliseconds until the lease expires unless renewed; absent where the
    /// backend's locks do not expire (the kernel lock of `file://`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_ms: Option<u64>,
    /// The backend's scope.
    pub scope: Scope,
    /// The key's last force, break, expiry or loss, when its history holds one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incident: Option<Box<KeyEvent>>,
    /// For a key with slots: how many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<u32>,
    /// For a key with slots: the holder of every held slot, by slot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<Holder>,
}

impl KeyRecord {
    /// The record of a key nobody holds (never taken, as far as it says).
    pub fn free(key: &Key, scope: Scope) -> KeyRecord {
        KeyRecord {
            key: key.to_string(),
            state: KeyState::Free,
            token: 0,
            holder: None,
            expires_in_ms: None,
            scope,
            incident: None,
            slots: None,
            holders: Vec::new(),
        }
    }
}

/// One key of a store's listing (`list_keys`): its record as `inspect`
/// reports it, or why its record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyListing {
    /// The key; for a record that could not be read, the store's name for it.
    pub key: String,
    /// The key's record (every slot's, for a key with slots); absent when unreadable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<KeyRecord>,
    /// Why the record could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
    /// Its history's events at or after the request's `events_since_ms`,
    /// oldest first (every slot's, for a key with slots).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<KeyEvent>,
    /// How many of those events, the oldest, were left out so that the
    /// entry fits one frame (a key with many slots keeps many events).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub events_omitted: u32,
    /// How many acquires wait for the key through the answering agent.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub waiting_here: u32,
    /// The acquires waiting for the key through any agent, as the agents'
    /// reports in the store last said (the answering agent's: as they are
    /// now), longest waiting first, at most [`MAX_LISTED_WAITERS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiters: Vec<Waiter>,
    /// The acquires any agent refused because the key was held, at or after
    /// the request's `events_since_ms`, as the agents' reports say, oldest
    /// first, at most [`MAX_LISTED_REFUSALS`] (the newest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<Refusal>,
}

/// A listing names at most this many waiters of one key.
pub const MAX_LISTED_WAITERS: usize = 64;
/// And at most this many of its refusals.
pub const MAX_LISTED_REFUSALS: usize = 256;

/// An acquire waiting for a key held elsewhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiter {
    /// The host of the agent it waits through.
    pub host: String,
    /// The uid of the waiting client.
    pub uid: u32,
    /// Its user name.
    pub user: String,
    /// Its pid.
    pub pid: u32,
    /// Since when it waits, by its agent's clock (ms since the epoch).
    pub since_ms: u64,
}

/// An acquire refused because its key was held: at once, or after its wait.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// When, by the refusing agent's clock (ms since the epoch).
    pub at_ms: u64,
    /// The host of the agent that refused it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
    /// The uid of the client refused.
    pub uid: u32,
    /// Its user name.
    pub user: String,
    /// Its pid.
    pub pid: u32,
    /// How long it had waited, in ms (0: it did not).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub waited_ms: u64,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What happened to a key, as its history records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A lease was granted to a key that was free (or never taken).
    Granted,
    /// Its holder let the key go.
    Released,
    /// A lease was granted with `force` over a live holder.
    Forced,
    /// Someone broke the holder's lease (`release{key}`).
    Broken,
    /// The holder's lease ran out without a release, seen by the next acquirer.
    Expired,
    /// The holder's agent gave the lease up: it could not renew it in time.
    Lost,
    /// A new agent adopted the lease of one that stopped (`reattach`).
    Adopted,
    /// A kind this build does not know.
    #[serde(other)]
    Unknown,
}

impl EventKind {
    /// The kind as the wire names it (`granted`, `released`, …).
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Granted => "granted",
            EventKind::Released => "released",
            EventKind::Forced => "forced",
            EventKind::Broken => "broken",
            EventKind::Expired => "expired",
            EventKind::Lost => "lost",
            EventKind::Adopted => "adopted",
            EventKind::Unknown => "unknown",
        }
    }

    /// Whether a person looking at a held key should hear of it: the key
    /// changed hands, or a lease ended, other than by a grant or release.
    pub fn is_incident(self) -> bool {
        matches!(
            self,
            EventKind::Forced | EventKind::Broken | EventKind::Expired | EventKind::Lost
        )
    }
}

/// Whose clock an event's time was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Clock {
    /// The store's own (PostgreSQL's `clock_timestamp()`, an object store's `Date`).
    Store,
    /// The wall clock of the agent that wrote the event.
    Agent,
    /// A clock this build does not know.
    #[serde(other)]
    Unknown,
}

/// The last instant RFC 3339 can write (9999-12-31T23:59:59.999Z), in
/// milliseconds since the Unix epoch: a time a record holds may lie past it.
pub const LAST_RFC3339_MS: u64 = 253_402_300_799_999;

/// One entry of a key's history: what happened, when, to which token, and
/// who did it (for `expired` and `lost`: whose lease it was).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyEvent {
    /// What happened.
    pub kind: EventKind,
    /// When, in milliseconds since the Unix epoch, by `clock`.
    pub at_ms: u64,
    /// Whose clock `at_ms` is.
    pub clock: Clock,
    /// The token of the lease the event is about.
    pub token: u64,
    /// The token taken over (`forced`, `broken`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_token: Option<u64>,
    /// Host name of the agent that acted.
    pub host: String,
    /// Id of that agent process.
    pub agent_id: String,
    /// Pid of the client that acted (0 where none did: `expired`, `lost`).
    pub pid: u32,
    /// Uid of that client.
    pub uid: u32,
    /// User name of `uid`.
    pub user: String,
    /// Why, for people; empty when the kind says it all.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// The slot the event is about, for a key with slots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
}

/// What a run does when the agent or the backend cannot be reached: the
/// operator's `on_unavailable` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUnavailable {
    /// The run does not start (exit 69).
    #[default]
    Fail,
    /// The run starts without a lock, and the shim says so loudly.
    Warn,
    /// The run starts without a lock, silently.
    Skip,
    /// A policy this build does not know: treated as `fail`.
    #[serde(other)]
    Unknown,
}

impl std::str::FromStr for OnUnavailable {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "fail" => Ok(OnUnavailable::Fail),
            "warn" => Ok(OnUnavailable::Warn),
            "skip" => Ok(OnUnavailable::Skip),
            other => Err(format!("{other:?} is not one of fail, warn, skip")),
        }
    }
}

/// What should happen to a run whose lease is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnLost {
    /// SIGTERM to the run's process group, SIGKILL after a grace period.
    #[default]
    Term,
    /// SIGKILL to the run's process group at once.
    Kill,
    /// Let the run go on (the shim still exits 76).
    Ignore,
}

/// Why a lease was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LostReason {
    /// Another client took the key with `force`.
    Forced,
    /// Someone broke the lease with `release KEY`.
    Broken,
    /// The backend no longer holds the lease for us (it expired or could not be renewed).
    Expired,
    /// A reason this build does not know.
    #[serde(other)]
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_rules_name_the_rule() {
        assert_eq!(Key::new(""), Err(InvalidKey::Empty));
        assert_eq!(Key::new("a".repeat(513)), Err(InvalidKey::TooLong(513)));
        assert!(Key::new("a".repeat(512)).is_ok());
        assert_eq!(Key::new("a\nb"), Err(InvalidKey::ControlCharacter(10, 1)));
        assert!(Key::new("dev:tap-x-to-target-y:é").is_ok());
        assert_eq!(
            Key::new("nightly\u{200B}"),
            Err(InvalidKey::InvisibleCharacter(0x200B, 7))
        );
        for c in [
            '\u{AD}',
            '\u{202E}',
            '\u{2028}',
            '\u{2066}',
            '\u{FEFF}',
            '\u{E0041}',
        ] {
            assert!(Key::new(format!("a{c}b")).is_err(), "U+{:04X}", c as u32);
        }
        // Visible marks and emoji stay keys: only what is not seen is refused.
        assert!(Key::new("café-❤\u{FE0F}-नमस्ते").is_ok());
        assert!(InvalidKey::Empty.to_string().contains("must not be empty"));
    }
}
