//! The order `runlock list` and `runlock ui` show keys in, as a person reads
//! them: numbers in a key by their value (`src2` before `src10`); the page
//! also shows the Meltano add-on's own keys in a group apart from the pipelines'.

use serde::Serialize;
use std::cmp::Ordering;

/// The add-on's state lock takes this, then the state ID, around each write
/// of a state (clients/meltano/src/runlock_meltano/state_lock.py); its run
/// locks are the state IDs themselves.
pub const STATE_WRITE_PREFIX: &str = "meltano-state-write:";

/// The page's groups of keys, in the order it shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Group {
    /// Whatever runs hold: pipelines, or any other command.
    Pipelines,
    /// The add-on's short locks around each state write.
    StateWrites,
}

pub fn group(key: &str) -> Group {
    if key.starts_with(STATE_WRITE_PREFIX) {
        Group::StateWrites
    } else {
        Group::Pipelines
    }
}

/// How the page names `key` within its group: a state write by its state ID.
pub fn label(key: &str) -> &str {
    key.strip_prefix(STATE_WRITE_PREFIX).unwrap_or(key)
}

/// `a` against `b`, their runs of ASCII digits compared as numbers and the
/// rest byte by byte; keys equal so (`src02`, `src2`) fall back to bytes, so
/// that the order is total.
pub fn natural(a: &str, b: &str) -> Ordering {
    let mut left = chunks(a);
    let mut right = chunks(b);
    loop {
        let ordering = match (left.next(), right.next()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if is_number(x) && is_number(y) => {
                let (x, y) = (x.trim_start_matches('0'), y.trim_start_matches('0'));
                x.len().cmp(&y.len()).then_with(|| x.cmp(y))
            }
            (Some(x), Some(y)) => x.cmp(y),
        };
        if ordering != Ordering::Equal {
            return ordering;
        }
    }
}

fn is_number(chunk: &str) -> bool {
    chunk.starts_with(|c: char| c.is_ascii_digit())
}

/// `text` cut into its longest runs of digits and of other characters.
fn chunks(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        let first = rest.chars().next()?;
        let digits = first.is_ascii_digit();
        let end = rest
            .find(|c: char| c.is_ascii_digit() != digits)
            .unwrap_or(rest.len());
        let (chunk, after) = rest.split_at(end);
        rest = after;
        Some(chunk)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(keys: &[&str]) -> Vec<String> {
        let mut keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        keys.sort_by(|a, b| natural(a, b));
        keys
    }

    #[test]
    fn numbers_in_keys_sort_by_their_value() {
        assert_eq!(
            sorted(&["src10", "src2", "src1", "src", "src10b", "src10a", "src9"]),
            ["src", "src1", "src2", "src9", "src10", "src10a", "src10b"]
        );
        assert_eq!(
            sorted(&["dev:tap-2-to-t-10", "dev:tap-2-to-t-9", "dev:tap-10-to-t-1"]),
            ["dev:tap-2-to-t-9", "dev:tap-2-to-t-10", "dev:tap-10-to-t-1"]
        );
    }

    #[test]
    fn numbers_longer_than_any_integer_and_leading_zeros_still_order() {
        let huge = format!("k{}", "9".repeat(40));
        let bigger = format!("k1{}", "0".repeat(40));
        assert_eq!(natural(&huge, &bigger), Ordering::Less);
        // Equal as numbers: told apart by their bytes, both ways the same.
        assert_eq!(natural("src02", "src2"), Ordering::Less);
        assert_eq!(natural("src2", "src02"), Ordering::Greater);
        assert_eq!(natural("src2", "src2"), Ordering::Equal);
    }

    #[test]
    fn text_around_digits_sorts_by_bytes_and_unicode_is_kept_whole() {
        assert_eq!(
            sorted(&["b1", "a10", "a9", "ä2", "a"]),
            ["a", "a9", "a10", "b1", "ä2"]
        );
    }

    #[test]
    fn the_add_ons_state_write_keys_are_a_group_of_their_own() {
        assert_eq!(
            group("meltano-state-write:dev:tap-a-to-b"),
            Group::StateWrites
        );
        assert_eq!(
            label("meltano-state-write:dev:tap-a-to-b"),
            "dev:tap-a-to-b"
        );
        assert_eq!(group("dev:tap-a-to-b"), Group::Pipelines);
        assert_eq!(label("dev:tap-a-to-b"), "dev:tap-a-to-b");
        // Only as a prefix: a state ID may mention it.
        assert_eq!(group("dev:meltano-state-write:x"), Group::Pipelines);
        assert!(Group::Pipelines < Group::StateWrites);
    }
}
