//! Agents' reports in the store: each agent writes what only it knows (the
//! runs waiting through it, the acquires it refused) where every agent can
//! read it, so that a listing shows the fleet's. The store keeps them as
//! opaque bytes under the agent's id; `lease::report` says what is in them.

/// The largest report an agent writes or reads back: what is bigger was
/// not written by an agent, and is reported unreadable instead of read.
pub const MAX_REPORT_LEN: usize = 512 * 1024;

/// An agent id fit to name a report in any store: what `runlockd` makes
/// (a UUID) and nothing a path, an object name or a SQL literal could
/// misread.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReportName(String);

impl ReportName {
    /// The longest id accepted.
    const MAX_LEN: usize = 64;

    /// `agent_id` as a report's name; `None` if it has characters other than
    /// ASCII letters, digits, `-` and `_`, or is empty or too long.
    pub fn new(agent_id: &str) -> Option<ReportName> {
        let fits = !agent_id.is_empty()
            && agent_id.len() <= Self::MAX_LEN
            && agent_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        fits.then(|| ReportName(agent_id.to_string()))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name of its report object or file: `<agent id>.json`.
    pub fn file_name(&self) -> String {
        format!("{}.json", self.0)
    }

    /// The report a file or object so named holds; `None` for any other name.
    pub fn from_file_name(name: &str) -> Option<ReportName> {
        name.strip_suffix(".json").and_then(ReportName::new)
    }
}

impl std::fmt::Display for ReportName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One agent's report as the store returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredReport {
    /// Whose.
    pub agent: ReportName,
    /// Its bytes, or why they could not be read.
    pub body: Result<Vec<u8>, String>,
}

impl StoredReport {
    /// `body` as read, refused unread if longer than any agent writes.
    pub fn read(agent: ReportName, body: Vec<u8>) -> StoredReport {
        let body = if body.len() > MAX_REPORT_LEN {
            Err(format!(
                "the report is {} bytes, more than the {MAX_REPORT_LEN} an agent writes",
                body.len()
            ))
        } else {
            Ok(body)
        };
        StoredReport { agent, body }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_ids_name_a_report() {
        let uuid = "0f8fad5b-d9cb-469f-a165-70867728950e";
        assert_eq!(ReportName::new(uuid).expect("uuid").as_str(), uuid);
        for bad in ["", "../x", "a/b", "a b", "a'b", "é", &"a".repeat(65)] {
            assert!(ReportName::new(bad).is_none(), "{bad:?}");
        }
        let name = ReportName::new("agent_1").expect("plain");
        assert_eq!(
            ReportName::from_file_name(&name.file_name()),
            Some(name.clone())
        );
        assert_eq!(ReportName::from_file_name("agent_1.tmp"), None);
    }

    #[test]
    fn an_oversized_report_is_unreadable_not_read() {
        let name = ReportName::new("a").expect("plain");
        let big = StoredReport::read(name.clone(), vec![b' '; MAX_REPORT_LEN + 1]);
        assert!(big.body.expect_err("too big").contains("bytes"));
        assert!(StoredReport::read(name, b"{}".to_vec()).body.is_ok());
    }
}
