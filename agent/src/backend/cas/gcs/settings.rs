//! What `gs://bucket/prefix`, the `[gcs]` settings and the environment name:
//! the bucket, the records' prefix, where credentials come from, and an
//! emulator, if any.

use super::inline_key::{self, InlineKey};
use crate::backend::{redact_uri, GcsOptions, Secret};
use gcp_auth::{CustomServiceAccount, TokenProvider};
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::OnceCell;

/// The real service.
pub(super) const GOOGLE_API: &str = "https://storage.googleapis.com";
/// Where emulators are found, as every Google client library reads it.
pub const EMULATOR_ENV: &str = "STORAGE_EMULATOR_HOST";
/// A service-account key's JSON text, for hosts that hold secrets in variables.
pub const CREDENTIALS_JSON_ENV: &str = "RUNLOCK_GCS_CREDENTIALS_JSON";
/// Meltano's name for the same, so a project's environment serves as it is.
pub const MELTANO_CREDENTIALS_JSON_ENV: &str =
    "MELTANO_STATE_BACKEND_GCS_APPLICATION_CREDENTIALS_JSON";
/// A service-account key file, as every Google client library reads it.
const KEY_FILE_ENV: &str = "GOOGLE_APPLICATION_CREDENTIALS";

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
    /// A service-account key given as JSON text, loaded when the store opened.
    Inline(InlineKey),
    /// gcloud's user credentials, the metadata server or the gcloud CLI, as
    /// gcp_auth finds them.
    Default(OnceCell<Arc<dyn TokenProvider>>),
}

/// Where credentials come from, before anything is loaded: the first of
/// `[gcs] credentials_json` or `credentials_file` (not both), then the
/// variables `RUNLOCK_GCS_CREDENTIALS_JSON`,
/// `MELTANO_STATE_BACKEND_GCS_APPLICATION_CREDENTIALS_JSON` and
/// `GOOGLE_APPLICATION_CREDENTIALS`, else Application Default Credentials.
/// `env` looks a variable up.
pub(super) enum Source {
    Json {
        json: Secret,
        setting: &'static str,
    },
    File {
        path: PathBuf,
        setting: &'static str,
    },
    Default,
}

impl Source {
    pub(super) fn find(
        options: &GcsOptions,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Source> {
        let env = |name: &str| env(name).filter(|value| !value.trim().is_empty());
        Ok(
            match (&options.credentials_json, &options.credentials_file) {
                (Some(_), Some(_)) => anyhow::bail!(
                    "[gcs] credentials_json and credentials_file are both set: keep one"
                ),
                (Some(json), None) => Source::Json {
                    json: json.clone(),
                    setting: "[gcs] credentials_json",
                },
                (None, Some(path)) => Source::File {
                    path: path.clone(),
                    setting: "[gcs] credentials_file",
                },
                (None, None) => {
                    if let Some(json) = env(CREDENTIALS_JSON_ENV) {
                        Source::Json {
                            json: json.into(),
                            setting: CREDENTIALS_JSON_ENV,
                        }
                    } else if let Some(json) = env(MELTANO_CREDENTIALS_JSON_ENV) {
                        Source::Json {
                            json: json.into(),
                            setting: MELTANO_CREDENTIALS_JSON_ENV,
                        }
                    } else if let Some(path) = env(KEY_FILE_ENV) {
                        Source::File {
                            path: path.into(),
                            setting: KEY_FILE_ENV,
                        }
                    } else {
                        Source::Default
                    }
                }
            },
        )
    }

    /// Loads what can be loaded without a request: an inline key is checked
    /// now, so that a bad one stops the agent at start-up.
    pub(super) fn credentials(self) -> anyhow::Result<Credentials> {
        Ok(match self {
            Source::Json { json, setting } => {
                Credentials::Inline(inline_key::load(&json, setting)?)
            }
            Source::File { path, setting } => Credentials::KeyFile {
                path,
                setting,
                account: OnceCell::new(),
            },
            Source::Default => Credentials::Default(OnceCell::new()),
        })
    }

    /// What `check-config` says of it: where the key is and whose it is, never the key.
    pub(super) fn describe(&self) -> String {
        match self {
            Source::Json { json, setting } => {
                match inline_key::client_email(json.expose(), setting) {
                    Ok(email) => {
                        format!("service-account key from {setting} (client_email {email})")
                    }
                    Err(err) => format!("service-account key from {setting}, unusable: {err}"),
                }
            }
            Source::File { path, setting } => format!(
                "service-account key file {} named by {setting}",
                path.display()
            ),
            Source::Default => "Application Default Credentials (gcloud's user credentials, the \
                                metadata server or the gcloud CLI, found on first use)"
                .to_string(),
        }
    }
}

/// `gs://bucket/prefix` → (bucket, prefix without surrounding slashes).
pub(super) fn parse_uri(uri: &str) -> anyhow::Result<(String, String)> {
    crate::backend::cas::place_and_prefix(
        uri,
        "gs",
        "bucket",
        &format!(
            "credentials come from [gcs] credentials_json or credentials_file, \
             RUNLOCK_GCS_CREDENTIALS_JSON, GOOGLE_APPLICATION_CREDENTIALS or \
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
