//! Times as people read them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An epoch-milliseconds instant as RFC 3339 (UTC).
pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// `2026-11-30T04:05:06.000Z (3m 2s ago)`.
pub fn since(ms: u64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(ms);
    match SystemTime::now().duration_since(at) {
        Ok(ago) => format!(
            "{} ({} ago)",
            rfc3339(ms),
            humantime::format_duration(Duration::from_secs(ago.as_secs()))
        ),
        Err(_) => rfc3339(ms),
    }
}
