//! What `s3://bucket/prefix` and the `[s3]` settings name; everything else
//! comes from the AWS SDK's own configuration chain.

use crate::backend::{redact_uri, Secret};

/// The configuration file's `[s3]` settings; each overrides the SDK's own
/// chain (environment, profile, instance metadata).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Options {
    /// An S3-compatible endpoint, addressed path-style.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_url: Option<String>,
    /// The bucket's region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// A profile of the AWS configuration files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// A static access key id (with `secret_access_key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id: Option<String>,
    /// A static secret key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key: Option<Secret>,
}

impl S3Options {
    /// The options with any secret in the endpoint's URL removed, for printing.
    pub fn redacted(&self) -> S3Options {
        S3Options {
            endpoint_url: self.endpoint_url.as_deref().map(redact_uri),
            ..self.clone()
        }
    }
}

/// `s3://bucket/prefix` → (bucket, prefix without surrounding slashes).
pub(super) fn parse_uri(uri: &str) -> anyhow::Result<(String, String)> {
    crate::backend::cas::place_and_prefix(
        uri,
        "s3",
        "bucket",
        "credentials and the endpoint come from the AWS configuration (AWS_PROFILE, \
         AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, ...)",
    )
}
