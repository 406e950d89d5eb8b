//! Which etcd ranges a page of `list` reads, and how their answers make the
//! page. A key's record and its history have names of their own
//! (`{prefix}{name}`, `{prefix}.history/{name}`), and a released key has only
//! its history, so a page reads both and merges them by name.

use std::collections::BTreeMap;

/// The names (below the prefix) a page reads: from `start` on, up to `end`
/// (excluded; `None`: every name after).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Names {
    start: Vec<u8>,
    end: Option<Vec<u8>>,
}

/// An etcd range: from its first key on, up to its end (excluded).
pub(super) type Range = (Vec<u8>, Vec<u8>);

impl Names {
    /// The names that start with `spelled` and come after both `after` and
    /// `past` (the name a page ended on, as bytes: see [`page`]).
    pub(super) fn new(spelled: &str, after: Option<&str>, past: Option<&[u8]>) -> Names {
        let mut start = spelled.as_bytes().to_vec();
        for bound in [after.map(str::as_bytes), past].into_iter().flatten() {
            // The first name after it.
            start = start.max([bound, &[0]].concat());
        }
        Names {
            start,
            end: successor(spelled.as_bytes()),
        }
    }

    /// The ranges of the records under `prefix` among these names: not the
    /// names that start with `.` (histories, force markers, `stopped`
    /// words), which no escaped key spells and which would fill a range's
    /// limit with what is not a record.
    pub(super) fn record_ranges(&self, prefix: &str) -> Vec<Range> {
        let (dot, after_dot): (&[u8], &[u8]) = (b".", b"/");
        let mut ranges = Vec::new();
        let below_end = match &self.end {
            Some(end) if end.as_slice() < dot => end.as_slice(),
            _ => dot,
        };
        if self.start.as_slice() < below_end {
            ranges.push((under(prefix, &self.start), under(prefix, below_end)));
        }
        let above_start = self.start.as_slice().max(after_dot);
        if self.end.as_deref().is_none_or(|end| above_start < end) {
            ranges.push((under(prefix, above_start), self.end_under(prefix)));
        }
        ranges
    }

    /// The range of these names under `prefix`, all of it (the histories').
    pub(super) fn range(&self, prefix: &str) -> Range {
        (under(prefix, &self.start), self.end_under(prefix))
    }

    fn end_under(&self, prefix: &str) -> Vec<u8> {
        match &self.end {
            Some(end) => under(prefix, end),
            // invariant: a prefix ends with `/`, which has a successor
            None => successor(prefix.as_bytes()).unwrap_or_default(),
        }
    }
}

fn under(prefix: &str, name: &[u8]) -> Vec<u8> {
    [prefix.as_bytes(), name].concat()
}

/// The first byte string after every one that starts with `bytes`; `None`
/// when there is none (empty, or all `0xff`).
pub(super) fn successor(bytes: &[u8]) -> Option<Vec<u8>> {
    let last = bytes.iter().rposition(|&b| b < 0xff)?;
    let mut end = bytes[..=last].to_vec();
    end[last] += 1;
    Some(end)
}

/// What a page read of one name.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Found<T> {
    /// The key's record: present while it is held.
    pub(super) record: Option<T>,
    /// Its history.
    pub(super) history: Option<T>,
}

/// A page's names, and where the next page starts.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Page<T> {
    /// The names, in order, with what was read of each.
    pub(super) names: Vec<(String, Found<T>)>,
    /// If more follow, the last name the page went through, which the next
    /// page starts after.
    pub(super) last: Option<Vec<u8>>,
}

/// The first `limit` names of the records and histories read (each by name,
/// below its prefix). Each range was read with a limit of `limit + 1`, so
/// that the first `limit + 1` names of them all are exactly the store's: a
/// range cut short has that many before its cut.
pub(super) fn page<T>(
    records: impl IntoIterator<Item = (Vec<u8>, T)>,
    histories: impl IntoIterator<Item = (Vec<u8>, T)>,
    limit: usize,
) -> Page<T> {
    let mut found: BTreeMap<Vec<u8>, Found<T>> = BTreeMap::new();
    let empty = || Found {
        record: None,
        history: None,
    };
    for (name, kv) in records {
        found.entry(name).or_insert_with(empty).record = Some(kv);
    }
    for (name, kv) in histories {
        found.entry(name).or_insert_with(empty).history = Some(kv);
    }
    let more = found.len() > limit;
    let found: Vec<_> = found.into_iter().take(limit).collect();
    let last = found.last().filter(|_| more).map(|(name, _)| name.clone());
    let names = found
        .into_iter()
        // Names runlock writes are ASCII; one that is not even UTF-8 is no
        // record (and may end a page: hence a cursor of bytes).
        .filter_map(|(name, found)| Some((String::from_utf8(name).ok()?, found)))
        .collect();
    Page { names, last }
}

/// `name` as a cursor's text.
pub(super) fn to_hex(name: &[u8]) -> String {
    name.iter().map(|b| format!("{b:02x}")).collect()
}

/// The name a cursor's text spells; `None` if it spells none.
pub(super) fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}
