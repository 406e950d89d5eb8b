//! How a key becomes a file or object name: safe on every store, distinct for
//! distinct keys, and readable for the common ones.

use runlock_protocol::Key;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;

/// Bytes outside `[A-Za-z0-9._-]` become `%XX` (a leading `.` too, so names
/// never clash with our own dot files); names too long for a file system
/// become `%sha256-…`, which no escaped key can spell. Slot `i ≥ 1` of a
/// key is the key's name, `#` and `i`: no escaped key holds a `#`.
pub fn escaped(key: &Key) -> String {
    match key.split_slot() {
        (base, 0) => escaped_str(base),
        (base, slot) => format!("{}#{slot}", escaped_str(base)),
    }
}

/// How every name of a key too long to spell starts.
const HASHED: &str = "%sha256-";

/// The names a listing of the keys that start with `prefix` reads: those
/// that spell it, or with `hashed` those of keys named by their hash, whose
/// record says their key. `None`: there are no such names to read (an
/// empty prefix's spelled names already include the hashed ones).
pub fn listed_names(prefix: &str, hashed: bool) -> Option<String> {
    match (hashed, prefix.is_empty()) {
        (false, _) => Some(spelled(prefix)),
        (true, false) => Some(HASHED.to_string()),
        (true, true) => None,
    }
}

/// Whether `name` is that of a key too long to spell, named by its hash.
#[cfg(feature = "etcd")]
pub fn is_hashed(name: &str) -> bool {
    name.starts_with(HASHED)
}

/// The key that [`escaped`] names `name`, where the name spells it (a
/// hashed name does not); `None` for a name `escaped` never gives. For a
/// store that keeps a key's name without its record: etcd keeps only a
/// released key's history.
#[cfg(feature = "etcd")]
pub fn unescaped(name: &str) -> Option<Key> {
    let (base, slot) = match name.rsplit_once('#') {
        Some((base, slot)) => (base, slot.parse::<u32>().ok()?),
        None => (name, 0),
    };
    if is_hashed(base) {
        return None;
    }
    let mut bytes = Vec::with_capacity(base.len());
    let mut rest = base.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        if b == b'%' {
            let hex = std::str::from_utf8(rest.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &rest[2..];
        } else {
            bytes.push(b);
        }
    }
    let key = Key::new(String::from_utf8(bytes).ok()?)
        .ok()?
        .slot_record(slot);
    // Only the one spelling `escaped` gives: `%3a`, `#0` or a long key spelled out are not names.
    (escaped(&key) == name).then_some(key)
}

fn escaped_str(key: &str) -> String {
    let mut name = spelled(key);
    if name.len() > 200 {
        name = Sha256::digest(key.as_bytes())
            .iter()
            .fold(String::from(HASHED), |mut s, b| {
                let _ = write!(s, "{b:02x}");
                s
            });
    }
    name
}

/// `key` with every byte outside `[A-Za-z0-9._-]` (and a leading `.`) as `%XX`.
fn spelled(key: &str) -> String {
    let mut name = String::new();
    for (i, b) in key.bytes().enumerate() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || (b == b'.' && i > 0) {
            name.push(b as char);
        } else {
            let _ = write!(name, "%{b:02X}");
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_safe_and_distinct() {
        let k = |s: &str| escaped(&Key::new(s).expect("valid"));
        assert_eq!(k("dev:tap-a-to-target-b"), "dev%3Atap-a-to-target-b");
        assert_eq!(k(".x"), "%2Ex");
        assert_eq!(k("a/b"), "a%2Fb");
        assert!(k(&"é".repeat(200)).starts_with("%sha256-"));
        assert!(k(&"é".repeat(200)).len() < 250);
        assert_ne!(k(&"é".repeat(200)), k(&"é".repeat(199)));
        let slot = |s: &str, n| escaped(&Key::new(s).expect("valid").slot_record(n));
        assert_eq!(slot("a#1", 0), "a%231");
        assert_eq!(slot("a", 1), "a#1");
        assert_ne!(slot("a", 1), slot("a#1", 0));
        assert!(slot(&"é".repeat(200), 3).ends_with("#3"));
    }

    #[test]
    #[cfg(feature = "etcd")]
    fn spelled_names_give_their_key_back_and_no_other_name_gives_one() {
        let key = |s: &str| Key::new(s).expect("valid");
        for name in ["dev:tap/a b", "a#1", "é", "-x", "a.b"] {
            assert_eq!(unescaped(&escaped(&key(name))), Some(key(name)), "{name}");
            let slot = key(name).slot_record(4);
            assert_eq!(unescaped(&escaped(&slot)), Some(slot), "{name}");
        }
        let long = key(&"é".repeat(200));
        assert!(is_hashed(&escaped(&long)));
        assert_eq!(unescaped(&escaped(&long)), None);
        for not_a_name in [
            "", "%3a", "%3", "%ZZ", "a#0", "a#x", "a b", "%FF", ".x", "a#1#2",
        ] {
            assert_eq!(unescaped(not_a_name), None, "{not_a_name:?}");
        }
    }
}
