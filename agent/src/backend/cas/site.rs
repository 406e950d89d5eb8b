//! Where an object store keeps the lock records and how it is named to
//! people: built once when a store opens, from its URI, and the only thing
//! the engine asks of a store besides its objects.

use std::time::Duration;

/// A store's site: its records' prefix, its description and its pace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// The store's URI with any secret removed, and where it is reached when
    /// that is not the default (a custom endpoint, an emulator).
    pub description: String,
    /// The object name prefix the lock records live under: `prefix/.runlock/locks/`
    /// for `SCHEME://PLACE/prefix`, so that they stay apart from Meltano's objects.
    pub records: String,
    /// How far apart the store wants writes of one object (GCS sustains about
    /// one per second); the engine spaces its own writes of a record by this,
    /// and refuses TTLs too short to renew at that pace. Zero: no limit.
    pub min_write_interval: Duration,
}

impl Site {
    /// The site of `SCHEME://PLACE[/prefix]`, reached as `reached` says
    /// ("endpoint URL") when that is not the default.
    #[cfg(object_store)]
    pub(super) fn object_store(
        scheme: &str,
        place: &str,
        prefix: &str,
        reached: Option<String>,
        min_write_interval: Duration,
    ) -> Site {
        let (uri, records) = if prefix.is_empty() {
            (format!("{scheme}://{place}"), RECORDS.to_string())
        } else {
            (
                format!("{scheme}://{place}/{prefix}"),
                format!("{prefix}/{RECORDS}"),
            )
        };
        Site {
            description: match reached {
                Some(reached) => format!("{uri} ({reached})"),
                None => uri,
            },
            records,
            min_write_interval,
        }
    }

    /// A store in this process (tests): records at the top, no pace.
    #[cfg(any(test, feature = "test-support"))]
    pub fn in_process(description: &str) -> Site {
        Site {
            description: description.to_string(),
            records: String::new(),
            min_write_interval: Duration::ZERO,
        }
    }
}

#[cfg(object_store)]
/// Where the lock records live, below the URI's prefix: apart from Meltano's
/// `prefix/<state_id>/` objects, so one URI serves both.
const RECORDS: &str = ".runlock/locks/";

#[cfg(object_store)]
/// `SCHEME://PLACE/prefix` → (PLACE, the prefix without surrounding slashes):
/// every object store's URI. `place` is what the store calls it ("bucket",
/// "container"); `settings` says where credentials and endpoints come from
/// instead, for the error that refuses a URI carrying them.
pub(super) fn place_and_prefix(
    uri: &str,
    scheme: &str,
    place: &str,
    settings: &str,
) -> anyhow::Result<(String, String)> {
    let rest = uri
        .strip_prefix(scheme)
        .and_then(|rest| rest.strip_prefix("://"))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{:?} is not a {scheme}:// URI",
                crate::backend::redact_uri(uri)
            )
        })?;
    let (name, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if name.is_empty() {
        anyhow::bail!(
            "backend {scheme}:// needs a {place}, as in {scheme}://my-{place}/meltano-state"
        );
    }
    if name.contains(['@', '?', '#', ':']) || prefix.contains(['?', '#']) {
        anyhow::bail!(
            "backend {:?}: write {scheme}://{}/PREFIX; {settings}",
            crate::backend::redact_uri(uri),
            place.to_uppercase()
        );
    }
    Ok((name.to_string(), prefix.trim_matches('/').to_string()))
}

#[cfg(all(test, object_store))]
mod tests {
    use super::place_and_prefix;

    /// What every object store's URI shares; each store's tests add its own
    /// scheme and rules.
    #[test]
    fn uris_name_a_place_and_an_optional_prefix_and_never_echo_credentials() {
        let parse = |u: &str| place_and_prefix(u, "x", "bucket", "see the docs").expect("valid");
        assert_eq!(parse("x://b"), ("b".into(), "".into()));
        assert_eq!(parse("x://b/"), ("b".into(), "".into()));
        assert_eq!(
            parse("x://b/meltano/state/"),
            ("b".into(), "meltano/state".into())
        );
        for bad in [
            "x://",
            "x:///x",
            "y://b",
            "x:/b",
            "x://b?sig=1",
            "x://b/p#f",
        ] {
            assert!(
                place_and_prefix(bad, "x", "bucket", "see the docs").is_err(),
                "{bad}"
            );
        }
        let err = place_and_prefix("x://KEY:SECRET@b/x", "x", "bucket", "see the docs")
            .expect_err("refused");
        assert!(!err.to_string().contains("SECRET"), "{err}");
        assert!(err.to_string().contains("see the docs"), "{err}");
    }
}
