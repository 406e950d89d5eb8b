//! What `gs://bucket/prefix`, the `[gcs]` settings and the environment name:
//! the bucket, the records' prefix, where credentials come from, and an
//! emulator, if any.

use crate::backend::redact_uri;
use gcp_auth::{CustomServiceAccount, TokenProvider};
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::OnceCell;

/// The real service.
pub(super) const GOOGLE_API: &str = "https://storage.googleapis.com";
/// Where emulators are found, as every Google client library reads it.
pub const EMULATOR_ENV: &str = "STORAGE_EMULATOR_HOST";

/// Where access tokens come from.
pub(super) enum Credentials {
    /// An emulator: none at all.
    Emulator,
    /// A service-account key file, named by `setting`. Loaded on first use
    /// and kept; a file that cannot be used is tried again on the next request.
    KeyFile {
        path: PathBuf,
        setting: &'static str,
        account: OnceCell<Arc<CustomServiceAccount>>,
    },
    /// gcloud's user credentials, the metadata server or the gcloud CLI, as
    /// gcp_auth finds them.
    Default(OnceCell<Arc<dyn TokenProvider>>),
}

/// `gs://bucket/prefix` → (bucket, prefix without surrounding slashes).
pub(super) fn parse_uri(uri: &str) -> anyhow::Result<(String, String)> {
    crate::backend::cas::place_and_prefix(
        uri,
        "gs",
        "bucket",
        &format!(
            "credentials come from GOOGLE_APPLICATION_CREDENTIALS, [gcs] credentials_file or \
             gcloud, and an emulator from {EMULATOR_ENV}"
        ),
    )
}

/// `STORAGE_EMULATOR_HOST` as a base URL: `host:port` or `http://host:port`.
pub(super) fn emulator_url(host: &str) -> anyhow::Result<String> {
    let host = host.trim().trim_end_matches('/');
    let url = if host.contains("://") {
        host.to_string()
    } else {
        format!("http://{host}")
    };
    let parsed: hyper::Uri = url.parse().map_err(|_| {
        anyhow::anyhow!(
            "{EMULATOR_ENV}={:?} is not host:port or a URL",
            redact_uri(&url)
        )
    })?;
    if parsed.host().is_none() || !matches!(parsed.scheme_str(), Some("http" | "https")) {
        anyhow::bail!(
            "{EMULATOR_ENV}={:?} is not host:port or an http(s) URL",
            redact_uri(&url)
        );
    }
    Ok(url)
}
