//! The configuration file's sections, one per backend. They are built
//! whatever backends this build holds (cargo features), so that one
//! configuration file serves every build; a backend's folder reads its own.

use super::{redact_uri, Secret};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Per-backend settings from the configuration file, one section each.
#[derive(Debug, Clone, Default)]
pub struct BackendOptions {
    /// `[s3]`.
    pub s3: S3Options,
    /// `[azure]`.
    pub azure: AzureOptions,
    /// `[gcs]`.
    pub gcs: GcsOptions,
    /// `[postgres]`.
    pub postgres: PostgresOptions,
    /// `[etcd]`.
    pub etcd: EtcdOptions,
    /// How hard an object store's proof tries: not configured, but
    /// thorough for `check-config`.
    pub proof: super::cas::Proof,
}

/// The configuration file's `[s3]` settings; each overrides the SDK's own
/// chain (environment, profile, instance metadata).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3Options {
    /// An S3-compatible endpoint, addressed path-style.
    pub endpoint_url: Option<String>,
    /// The bucket's region.
    pub region: Option<String>,
    /// A profile of the AWS configuration files.
    pub profile: Option<String>,
    /// A static access key id (with `secret_access_key`).
    pub access_key_id: Option<String>,
    /// A static secret key.
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

/// The configuration file's `[azure]` settings; they override the
/// `AZURE_STORAGE_*` environment variables.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AzureOptions {
    /// A storage connection string (`AccountName=…;AccountKey=…[;BlobEndpoint=…]`).
    pub connection_string: Option<Secret>,
    /// The storage account's name (with `account_key`).
    pub account_name: Option<String>,
    /// One of the storage account's access keys.
    pub account_key: Option<Secret>,
    /// The blob service's URL (`https://ACCOUNT.blob.core.windows.net`);
    /// Meltano's name, `storage_account_url`, is accepted too.
    #[serde(alias = "storage_account_url")]
    pub account_url: Option<String>,
    /// A shared access signature (`sv=…&sig=…`), with `account_url` or
    /// `account_name`, instead of an account key.
    pub sas_token: Option<Secret>,
    /// A CA (PEM) to trust for the blob endpoint besides the public ones:
    /// a private endpoint's, Azure Stack's, an emulator's.
    pub ca_file: Option<PathBuf>,
}

impl AzureOptions {
    /// The options with any SAS pasted into the account URL removed, for printing.
    pub fn redacted(&self) -> AzureOptions {
        AzureOptions {
            account_url: self.account_url.as_deref().map(redact_uri),
            ..self.clone()
        }
    }
}

/// The configuration file's `[gcs]` settings.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GcsOptions {
    /// A service-account key file (JSON), instead of Application Default
    /// Credentials (Meltano's `state_backend.gcs.application_credentials`).
    pub credentials_file: Option<PathBuf>,
    /// A service-account key's JSON text itself, where secrets are handed
    /// over as text (Meltano's `state_backend.gcs.application_credentials_json`).
    pub credentials_json: Option<Secret>,
}

/// The schema when the configuration names none.
pub const DEFAULT_SCHEMA: &str = "runlock";
/// Release notices go out on `runlock:<schema>`; a channel name has at most
/// 63 bytes, which leaves this much for the schema.
const MAX_SCHEMA_LEN: usize = 55;

/// The configuration file's `[postgres]` settings.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PostgresOptions {
    /// The schema of the lock table (default `runlock`).
    pub schema: Option<String>,
    /// `LISTEN` for releases. When unset: on, unless the server refused the
    /// startup parameter `options` (PgBouncer does), as a transaction-pooling
    /// proxy cannot pass notifications on; waiters then poll.
    pub listen: Option<bool>,
}

impl PostgresOptions {
    /// The schema to use, checked: letters, digits and `_`, not starting with a digit.
    pub fn schema(&self) -> Result<String, String> {
        let schema = self.schema.as_deref().unwrap_or(DEFAULT_SCHEMA);
        let mut chars = schema.chars();
        let valid = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            && schema.len() <= MAX_SCHEMA_LEN;
        if !valid {
            return Err(format!(
                "[postgres] schema {schema:?} must be 1 to {MAX_SCHEMA_LEN} letters, digits or \
                 '_', not starting with a digit"
            ));
        }
        Ok(schema.to_string())
    }
}

/// The configuration file's `[etcd]` settings. Without them, the URI's
/// userinfo or etcdctl's own `ETCDCTL_USER` / `ETCDCTL_PASSWORD` are used.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdOptions {
    /// The etcd user, where etcd has authentication enabled.
    pub user: Option<String>,
    /// Its password.
    pub password: Option<Secret>,
    /// The CA that signed etcd's certificate (PEM); turns TLS on.
    pub ca_file: Option<PathBuf>,
    /// A client certificate (PEM), for etcd's `--client-cert-auth`; turns TLS on.
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    pub key_file: Option<PathBuf>,
}
