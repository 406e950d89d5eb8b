//! Times as people read them.

use runlock_protocol::LAST_RFC3339_MS;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An epoch-milliseconds instant as RFC 3339 (UTC); one past the year 9999
/// (which humantime refuses to format) as its raw number.
pub fn rfc3339(ms: u64) -> String {
    if ms > LAST_RFC3339_MS {
        return format!("{ms}ms after the epoch");
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_past_the_year_9999_are_shown_not_panicked_on() {
        assert_eq!(rfc3339(LAST_RFC3339_MS), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(u64::MAX), format!("{}ms after the epoch", u64::MAX));
        assert!(since(u64::MAX).starts_with(&u64::MAX.to_string()));
    }
}
