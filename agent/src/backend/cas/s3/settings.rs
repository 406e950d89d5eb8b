//! What `s3://bucket/prefix` and the `[s3]` settings name; everything else
//! comes from the AWS SDK's own configuration chain.

use crate::backend::{S3Options, Secret};

/// Where the store's credentials come from: the one choice the store and
/// `check-config` both make.
pub(super) enum CredentialSource<'a> {
    /// `[s3] access_key_id` and `secret_access_key`.
    Static { id: &'a str, secret: &'a Secret },
    /// A named profile of the AWS configuration files.
    Profile(&'a str),
    /// The SDK's default chain.
    DefaultChain,
}

impl<'a> CredentialSource<'a> {
    /// The source `options` name; static keys win over a profile.
    pub(super) fn of(options: &'a S3Options) -> anyhow::Result<CredentialSource<'a>> {
        match (
            &options.access_key_id,
            &options.secret_access_key,
            &options.profile,
        ) {
            (Some(id), Some(secret), _) => Ok(CredentialSource::Static { id, secret }),
            (None, None, Some(profile)) => Ok(CredentialSource::Profile(profile)),
            (None, None, None) => Ok(CredentialSource::DefaultChain),
            _ => anyhow::bail!("[s3] access_key_id and secret_access_key must be given together"),
        }
    }

    /// Where the SDK looks for credentials from this source, for the message
    /// that none were found; `None` for static keys, which are always there.
    pub(super) fn looked_in(&self, profile_env: Option<&str>) -> Option<String> {
        match self {
            CredentialSource::Static { .. } => None,
            CredentialSource::Profile(profile) => Some(format!(
                "profile {profile:?} ([s3] profile) of ~/.aws/credentials and ~/.aws/config"
            )),
            CredentialSource::DefaultChain => Some(format!(
                "the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), profile {:?} \
                 of ~/.aws/credentials and ~/.aws/config (AWS_PROFILE), web identity \
                 (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN), the container's \
                 credentials (AWS_CONTAINER_CREDENTIALS_FULL_URI or _RELATIVE_URI) and \
                 the instance metadata service (IMDS)",
                profile_env.filter(|p| !p.is_empty()).unwrap_or("default")
            )),
        }
    }

    /// What `check-config` says of it: the key id at most, never the secret.
    pub(super) fn describe(&self) -> String {
        match self {
            CredentialSource::Static { id, .. } => {
                format!("static access key {id} from [s3] access_key_id / secret_access_key")
            }
            CredentialSource::Profile(profile) => {
                format!("AWS profile {profile:?} ([s3] profile)")
            }
            CredentialSource::DefaultChain => {
                "AWS SDK default chain (environment / profile / instance role)".to_string()
            }
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
