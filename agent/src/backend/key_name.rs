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
}
