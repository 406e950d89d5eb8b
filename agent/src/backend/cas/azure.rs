//! The Azure Blob adapter of the compare-and-swap trait: uploads with
//! `If-None-Match: *` and `If-Match: <etag>`, the blob's ETag and
//! `Last-Modified`, and the response's `Date` as the store's clock.
//!
//! `azure://container/prefix` keeps lock records under `prefix/.runlock/locks/`,
//! apart from Meltano's `prefix/<state_id>/state.json` and `lock` blobs.
//! Credentials are a storage account key (Shared Key), from a connection string
//! (`AZURE_STORAGE_CONNECTION_STRING`, which Meltano's azure state backend also
//! reads; `BlobEndpoint=` points it at Azurite) or an account name and key
//! (`AZURE_STORAGE_ACCOUNT` / `AZURE_STORAGE_KEY`, the Azure CLI's names); the
//! `[azure]` section of the configuration file overrides both. No message built
//! here carries the key or the connection string: answers are named by their
//! status and error code, and transport failures by their root cause.

use super::{CasError, CasStore, Read, Stored};
use crate::backend::redact_uri;
use async_trait::async_trait;
use azure_core::error::ErrorKind;
use azure_core::prelude::IfMatchCondition;
use azure_core::{ExponentialRetryOptions, RetryOptions, TransportOptions};
use azure_storage::{CloudLocation, StorageCredentials};
use azure_storage_blobs::prelude::{ClientBuilder, ContainerClient};
use futures::StreamExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Connecting to the store may take this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// One HTTP attempt may take this long.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);
/// One operation, retries included, may take this long: a hung store never blocks for longer.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(5);
/// Retries after the first attempt (the SDK retries I/O errors, 408, 429 and 5xx).
const HTTP_RETRIES: u32 = 2;
/// Idle connections are dropped before Node's 5 s keep-alive (Azurite) closes
/// them, so that a request never goes out on a connection the server is closing.
const POOL_IDLE: Duration = Duration::from_secs(4);
/// The Azure CLI's variables, also read by the Azure SDKs' samples.
const CONNECTION_STRING_ENV: &str = "AZURE_STORAGE_CONNECTION_STRING";
const ACCOUNT_ENV: &str = "AZURE_STORAGE_ACCOUNT";
const KEY_ENV: &str = "AZURE_STORAGE_KEY";
/// Azurite's well-known development account (`UseDevelopmentStorage=true`); not a secret.
const DEV_ACCOUNT: &str = "devstoreaccount1";
const DEV_ENDPOINT: &str = "http://127.0.0.1:10000/devstoreaccount1";

/// The configuration file's `[azure]` settings; they override the
/// `AZURE_STORAGE_*` environment variables.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AzureOptions {
    /// A storage connection string (`AccountName=…;AccountKey=…[;BlobEndpoint=…]`): never printed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_string: Option<String>,
    /// The storage account's name (with `account_key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_name: Option<String>,
    /// One of the storage account's access keys: never printed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_key: Option<String>,
}

impl AzureOptions {
    /// The options with the secrets replaced, for printing.
    pub fn redacted(&self) -> AzureOptions {
        let hidden = |value: &Option<String>| value.as_ref().map(|_| "<redacted>".to_string());
        AzureOptions {
            connection_string: hidden(&self.connection_string),
            account_key: hidden(&self.account_key),
            ..self.clone()
        }
    }
}

/// A storage account to sign requests for.
#[derive(Clone, PartialEq, Eq)]
struct Account {
    name: String,
    /// The base64 account key: never printed (see the `Debug` below).
    key: String,
    /// The blob service's URL, without a trailing slash.
    endpoint: String,
    /// The setting the key came from, for "check …" advice.
    source: &'static str,
}

impl std::fmt::Debug for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Account")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// The account from `options`, else from the environment (`env` looks a variable up).
fn account(
    options: &AzureOptions,
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Account> {
    let env = |name: &str| env(name).filter(|value| !value.trim().is_empty());
    if let Some(text) = &options.connection_string {
        return parse_connection_string(text, "[azure] connection_string");
    }
    match (&options.account_name, &options.account_key) {
        (Some(name), Some(key)) => {
            return public_account(name, key, "[azure] account_name / account_key")
        }
        (None, None) => {}
        _ => anyhow::bail!("[azure] account_name and account_key must be given together"),
    }
    if let Some(text) = env(CONNECTION_STRING_ENV) {
        return parse_connection_string(&text, CONNECTION_STRING_ENV);
    }
    match (env(ACCOUNT_ENV), env(KEY_ENV)) {
        (Some(name), Some(key)) => {
            public_account(&name, &key, "AZURE_STORAGE_ACCOUNT / AZURE_STORAGE_KEY")
        }
        (None, None) => anyhow::bail!(
            "backend azure:// needs a storage account key: set {CONNECTION_STRING_ENV} (as for \
             Meltano's azure state backend), or {ACCOUNT_ENV} and {KEY_ENV}, or [azure] \
             connection_string (or account_name and account_key) in the configuration file"
        ),
        (Some(_), None) => anyhow::bail!("{ACCOUNT_ENV} is set but {KEY_ENV} is not"),
        (None, Some(_)) => anyhow::bail!("{KEY_ENV} is set but {ACCOUNT_ENV} is not"),
    }
}

/// An account in Azure's public cloud.
fn public_account(name: &str, key: &str, source: &'static str) -> anyhow::Result<Account> {
    let name = name.trim();
    check_account_name(name, source)?;
    let account = Account {
        name: name.to_string(),
        key: key.trim().to_string(),
        endpoint: format!("https://{name}.blob.core.windows.net"),
        source,
    };
    check_key(&account)?;
    Ok(account)
}

fn check_account_name(name: &str, source: &str) -> anyhow::Result<()> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric()) {
        anyhow::bail!(
            "{source}: the account name {name:?} is not a storage account name \
             (letters and digits only)"
        );
    }
    Ok(())
}

/// Fails, naming where the key came from but not the key, unless it is base64
/// (Shared Key signing decodes it for every request).
fn check_key(account: &Account) -> anyhow::Result<()> {
    match azure_core::base64::decode(&account.key) {
        Ok(bytes) if !bytes.is_empty() => Ok(()),
        _ => anyhow::bail!(
            "{}: the account key is not base64; copy key1 or key2 again from the storage \
             account's \"Access keys\" page",
            account.source
        ),
    }
}

/// Reads a storage connection string (`Key=Value` pairs separated by `;`).
/// Errors name the part at fault, never a value.
fn parse_connection_string(text: &str, source: &'static str) -> anyhow::Result<Account> {
    let mut fields = std::collections::HashMap::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((name, value)) = part.split_once('=') else {
            anyhow::bail!("{source}: a part of the connection string is not Key=Value");
        };
        // Keys are case-insensitive in Azure's own SDKs; values (the base64 key) are not.
        fields.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    let field = |name: &str| fields.get(name).filter(|v| !v.is_empty()).cloned();
    if field("usedevelopmentstorage").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(Account {
            name: DEV_ACCOUNT.into(),
            key: azure_storage::EMULATOR_ACCOUNT_KEY.into(),
            endpoint: DEV_ENDPOINT.into(),
            source,
        });
    }
    if field("sharedaccesssignature").is_some() && field("accountkey").is_none() {
        anyhow::bail!(
            "{source}: a SharedAccessSignature connection string is not supported; use one \
             with AccountName and AccountKey"
        );
    }
    let (Some(name), Some(key)) = (field("accountname"), field("accountkey")) else {
        anyhow::bail!("{source}: the connection string needs AccountName and AccountKey");
    };
    check_account_name(&name, source)?;
    let endpoint = match field("blobendpoint") {
        Some(url) => {
            let parsed = azure_core::Url::parse(&url).map_err(|_| {
                anyhow::anyhow!("{source}: BlobEndpoint is not a URL (as in http://127.0.0.1:10000/{DEV_ACCOUNT})")
            })?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.query().is_some() {
                anyhow::bail!(
                    "{source}: BlobEndpoint must be an http:// or https:// URL without a query"
                );
            }
            url.trim_end_matches('/').to_string()
        }
        None => {
            let protocol = field("defaultendpointsprotocol").unwrap_or_else(|| "https".into());
            if protocol != "https" && protocol != "http" {
                anyhow::bail!("{source}: DefaultEndpointsProtocol must be https or http");
            }
            let suffix = field("endpointsuffix").unwrap_or_else(|| "core.windows.net".into());
            format!("{protocol}://{name}.blob.{suffix}")
        }
    };
    let account = Account {
        name,
        key,
        endpoint,
        source,
    };
    check_key(&account)?;
    Ok(account)
}

/// An Azure Blob container as a compare-and-swap store.
pub struct AzureStore {
    container: ContainerClient,
    container_name: String,
    /// The blob name prefix for records: `prefix/.runlock/locks/`.
    records: String,
    /// The URI and the endpoint, for `describe`.
    description: String,
    /// The blob endpoint, for messages.
    location: String,
    /// The setting the key came from, for messages.
    source: &'static str,
}

/// What one failed request means, before it becomes a [`CasError`].
#[derive(Debug)]
enum Failure {
    /// 404 for the blob (not the container).
    NoSuchBlob,
    /// 409 BlobAlreadyExists (`If-None-Match: *`) or 412 ConditionNotMet (`If-Match`).
    PreconditionFailed,
    /// Anything else.
    Other(CasError),
}

impl AzureStore {
    /// Opens `azure://container/prefix` with the account from `options` or the
    /// environment. Makes no request; see [`AzureStore::probe`].
    pub fn open(uri: &str, options: &AzureOptions) -> anyhow::Result<AzureStore> {
        AzureStore::open_with(uri, options, |name| std::env::var(name).ok())
    }

    fn open_with(
        uri: &str,
        options: &AzureOptions,
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<AzureStore> {
        let (container_name, prefix) = parse_uri(uri)?;
        let account = account(options, env)?;
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(ATTEMPT_TIMEOUT)
            .pool_idle_timeout(POOL_IDLE)
            .build()
            .map_err(|err| {
                anyhow::anyhow!("cannot set up an HTTP client: {}", super::root_cause(&err))
            })?;
        let retry = ExponentialRetryOptions::default()
            .max_retries(HTTP_RETRIES)
            .initial_delay(Duration::from_millis(50))
            .max_delay(Duration::from_millis(500))
            .max_total_elapsed(OPERATION_TIMEOUT);
        let location = CloudLocation::Custom {
            account: account.name.clone(),
            uri: account.endpoint.clone(),
        };
        let credentials = StorageCredentials::access_key(account.name.clone(), account.key.clone());
        let container = ClientBuilder::with_location(location, credentials)
            .retry(RetryOptions::exponential(retry))
            .transport(TransportOptions::new(Arc::new(http)))
            .container_client(container_name.clone());
        let records = super::records_under(&prefix);
        let plain = super::object_uri("azure", &container_name, &prefix);
        let location = redact_uri(&account.endpoint);
        Ok(AzureStore {
            container,
            container_name,
            records,
            description: format!("{plain} (endpoint {location})"),
            location,
            source: account.source,
        })
    }

    /// The blob name prefix the lock records live under (for [`super::CasEngine::new`]).
    pub fn records_prefix(&self) -> &str {
        &self.records
    }

    /// Checks that the container answers and the key is accepted, by reading a
    /// blob that need not exist (the same permission the engine needs).
    pub async fn probe(&self) -> Result<(), CasError> {
        let name = format!("{}probe", self.records);
        self.get(&name).await.map(|_| ())
    }

    /// Sorts an SDK error; `name` is the blob the request was about.
    fn failure(&self, err: &azure_core::Error, name: &str) -> Failure {
        let what = format!("azure://{}/{name}", self.container_name);
        match err.kind() {
            ErrorKind::HttpResponse { status, error_code } => {
                let status = *status as u16;
                let code = error_code.as_deref().unwrap_or("");
                self.answer(status, code, &what)
            }
            ErrorKind::Io => Failure::Other(CasError::Unavailable(format!(
                "cannot reach Azure Blob at {}: {}",
                self.location,
                super::root_cause(err)
            ))),
            ErrorKind::DataConversion => Failure::Other(CasError::Unavailable(format!(
                "Azure Blob at {} sent an unreadable answer for {what}: {}",
                self.location,
                super::root_cause(err)
            ))),
            // Signing failed, or the request could not be built.
            _ => Failure::Other(CasError::Refused(format!(
                "cannot make a request to Azure Blob at {} for {what}: {}",
                self.location,
                super::root_cause(err)
            ))),
        }
    }

    /// Sorts an answer by its status and `x-ms-error-code`.
    fn answer(&self, status: u16, code: &str, what: &str) -> Failure {
        let shown = if code.is_empty() {
            status.to_string()
        } else {
            format!("{status} {code}")
        };
        match (status, code) {
            (404, "ContainerNotFound") => Failure::Other(CasError::Refused(format!(
                "container {} does not exist at {}: create it (az storage container create \
                 --name {}) or fix the backend URI",
                self.container_name, self.location, self.container_name
            ))),
            (404, "BlobNotFound" | "") => Failure::NoSuchBlob,
            (409, "BlobAlreadyExists") | (412, "ConditionNotMet" | "") => {
                Failure::PreconditionFailed
            }
            // Someone put an Azure lease on our record: no write succeeds until it is broken.
            (412, code) if code.starts_with("Lease") => Failure::Other(CasError::Refused(format!(
                "{what} at {} carries an Azure lease ({code}) that runlock did not take: \
                 break it (az storage blob lease break)",
                self.location
            ))),
            (403, _) => Failure::Other(CasError::Refused(format!(
                "access denied to container {} at {} ({shown}): check the account key \
                 ({}) and that it may read and write blobs under {}",
                self.container_name, self.location, self.source, self.records
            ))),
            (408 | 429 | 500.., _) => Failure::Other(CasError::Unavailable(format!(
                "Azure Blob at {} answered {shown} for {what}",
                self.location
            ))),
            _ => Failure::Other(CasError::Refused(format!(
                "Azure Blob at {} refused a request for {what}: {shown}",
                self.location
            ))),
        }
    }

    async fn put(
        &self,
        name: &str,
        body: Vec<u8>,
        version: Option<&str>,
    ) -> Result<String, CasError> {
        let condition = match version {
            None => IfMatchCondition::NotMatch("*".into()),
            Some(etag) => IfMatchCondition::Match(etag.into()),
        };
        let request = self
            .container
            .blob_client(name)
            .put_block_blob(body)
            .content_type("application/json")
            .if_match(condition)
            .into_future();
        match self.bounded(name, request).await? {
            Ok(written) => Ok(written.etag),
            Err(err) => match self.failure(&err, name) {
                // If-Match on a missing blob: someone removed it; the engine re-reads.
                Failure::PreconditionFailed | Failure::NoSuchBlob => Err(CasError::Conflict),
                Failure::Other(err) => Err(err),
            },
        }
    }

    /// Runs one operation within [`OPERATION_TIMEOUT`].
    async fn bounded<T>(
        &self,
        name: &str,
        operation: impl std::future::Future<Output = T>,
    ) -> Result<T, CasError> {
        tokio::time::timeout(OPERATION_TIMEOUT, operation)
            .await
            .map_err(|_| {
                CasError::Unavailable(format!(
                    "Azure Blob at {} did not answer within {}s for azure://{}/{name}",
                    self.location,
                    OPERATION_TIMEOUT.as_secs(),
                    self.container_name
                ))
            })
    }
}

/// `azure://container/prefix` → (container, prefix without surrounding slashes).
fn parse_uri(uri: &str) -> anyhow::Result<(String, String)> {
    let (container, prefix) = super::place_and_prefix(
        uri,
        "azure",
        "container",
        "the account and its key come from AZURE_STORAGE_CONNECTION_STRING (or \
         AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY)",
    )?;
    // Azure's rule for container names, checked here so that a typo is named at start.
    let valid = (3..=63).contains(&container.len())
        && container
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !container.starts_with('-')
        && !container.ends_with('-')
        && !container.contains("--");
    if !valid {
        anyhow::bail!(
            "backend azure://{container}: a container name is 3 to 63 lowercase letters, digits \
             and single hyphens, starting and ending with a letter or digit"
        );
    }
    Ok((container, prefix))
}

#[async_trait]
impl CasStore for AzureStore {
    fn describe(&self) -> String {
        self.description.clone()
    }

    async fn get(&self, name: &str) -> Result<Read, CasError> {
        let read = async {
            let mut pages = self.container.blob_client(name).get().into_stream();
            let first = match pages.next().await {
                Some(Ok(first)) => first,
                Some(Err(err)) => return Err(err),
                None => {
                    return Err(azure_core::Error::message(
                        ErrorKind::DataConversion,
                        "an empty answer",
                    ))
                }
            };
            let body = first.data.collect().await?;
            Ok((first.blob, first.date, body))
        };
        let (blob, date, body) = match self.bounded(name, read).await? {
            Ok(read) => read,
            Err(err) => {
                return match self.failure(&err, name) {
                    Failure::NoSuchBlob => Ok(Read {
                        object: None,
                        date: None,
                    }),
                    Failure::Other(err) => Err(err),
                    Failure::PreconditionFailed => Err(CasError::Unavailable(format!(
                        "Azure Blob at {} answered a plain read of {name} with a conflict",
                        self.location
                    ))),
                }
            }
        };
        Ok(Read {
            object: Some(Stored {
                body: body.to_vec(),
                version: blob.properties.etag.to_string(),
                last_modified: Some(SystemTime::from(blob.properties.last_modified)),
            }),
            date: Some(SystemTime::from(date)),
        })
    }

    async fn put_if_absent(&self, name: &str, body: Vec<u8>) -> Result<String, CasError> {
        self.put(name, body, None).await
    }

    async fn put_if_match(
        &self,
        name: &str,
        body: Vec<u8>,
        version: &str,
    ) -> Result<String, CasError> {
        self.put(name, body, Some(version)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A made-up key, base64 like a real one.
    const KEY: &str = "c2VjcmV0LWtleS1ieXRlcy1mb3ItdGVzdHMtb25seQ==";

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn uris_name_a_container_and_an_optional_prefix() {
        let parse = |u: &str| parse_uri(u).expect("valid");
        assert_eq!(parse("azure://locks"), ("locks".into(), "".into()));
        assert_eq!(parse("azure://locks/"), ("locks".into(), "".into()));
        assert_eq!(
            parse("azure://my-locks/meltano/state/"),
            ("my-locks".into(), "meltano/state".into())
        );
        for bad in [
            "azure://",
            "azure:///x",
            "azure://ab",
            "azure://Locks",
            "azure://a--b",
            "azure://-ab",
        ] {
            assert!(parse_uri(bad).is_err(), "{bad}");
        }
        let err = parse_uri("azure://acct:SECRET@locks/x").expect_err("refused");
        assert!(!err.to_string().contains("SECRET"), "{err}");
    }

    #[test]
    fn a_connection_string_with_a_blob_endpoint_points_at_it() {
        let text = format!(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};\
             BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1/;"
        );
        let account = parse_connection_string(&text, CONNECTION_STRING_ENV).expect("valid");
        assert_eq!(account.name, "devstoreaccount1");
        assert_eq!(account.key, KEY);
        assert_eq!(account.endpoint, "http://127.0.0.1:10000/devstoreaccount1");
        let public = parse_connection_string(
            &format!("accountname=prod1;accountkey={KEY};EndpointSuffix=core.chinacloudapi.cn"),
            CONNECTION_STRING_ENV,
        )
        .expect("valid");
        assert_eq!(public.endpoint, "https://prod1.blob.core.chinacloudapi.cn");
        let dev = parse_connection_string("UseDevelopmentStorage=true", CONNECTION_STRING_ENV)
            .expect("valid");
        assert_eq!(dev.endpoint, DEV_ENDPOINT);
    }

    #[test]
    fn a_bad_connection_string_is_named_without_its_secret() {
        let secret = "c2VjcmV0";
        for text in [
            format!("AccountName=a1;AccountKey={secret}!!;BlobEndpoint=http://x"),
            format!("AccountName=a1;{secret}"),
            format!("AccountKey={secret}"),
            format!("AccountName=a1;SharedAccessSignature=sv=2020&sig={secret}"),
            format!("AccountName=a1;AccountKey={secret};BlobEndpoint=not a url {secret}"),
        ] {
            let err = parse_connection_string(&text, CONNECTION_STRING_ENV).expect_err(&text);
            let shown = format!("{err:#}");
            assert!(shown.starts_with(CONNECTION_STRING_ENV), "{shown}");
            assert!(!shown.contains(secret), "{shown}");
        }
        let account = parse_connection_string(&format!("AccountName=a1;AccountKey={KEY}"), "x")
            .expect("valid");
        assert!(!format!("{account:?}").contains(KEY));
    }

    #[test]
    fn the_configuration_file_wins_over_the_environment() {
        let env = |name: &str| match name {
            CONNECTION_STRING_ENV => Some(format!(
                "AccountName=fromenv;AccountKey={KEY};BlobEndpoint=http://127.0.0.1:1/fromenv"
            )),
            ACCOUNT_ENV => Some("other".into()),
            KEY_ENV => Some(KEY.into()),
            _ => None,
        };
        let from_env = account(&AzureOptions::default(), env).expect("env");
        assert_eq!(
            (from_env.name.as_str(), from_env.source),
            ("fromenv", CONNECTION_STRING_ENV)
        );
        let options = AzureOptions {
            account_name: Some("fromfile".into()),
            account_key: Some(KEY.into()),
            ..AzureOptions::default()
        };
        let from_file = account(&options, env).expect("file");
        assert_eq!(from_file.endpoint, "https://fromfile.blob.core.windows.net");
        let key_only = |name: &str| (name == KEY_ENV).then(|| KEY.to_string());
        let err = account(&AzureOptions::default(), key_only).expect_err("no account");
        assert!(err.to_string().contains("AZURE_STORAGE_ACCOUNT"), "{err}");
        let err = account(&AzureOptions::default(), no_env).expect_err("nothing");
        assert!(err.to_string().contains(CONNECTION_STRING_ENV), "{err}");
        let half = AzureOptions {
            account_key: Some(KEY.into()),
            ..AzureOptions::default()
        };
        assert!(account(&half, no_env).is_err());
    }

    #[test]
    fn printed_options_hide_the_secrets() {
        let options = AzureOptions {
            connection_string: Some(format!("AccountName=a1;AccountKey={KEY}")),
            account_name: Some("a1".into()),
            account_key: Some(KEY.into()),
        };
        let shown = toml::to_string(&options.redacted()).expect("toml");
        assert!(!shown.contains(KEY), "{shown}");
        assert!(shown.contains("account_name = \"a1\""), "{shown}");
    }

    fn store() -> AzureStore {
        let options = AzureOptions {
            connection_string: Some(format!(
                "AccountName=devstoreaccount1;AccountKey={KEY};\
                 BlobEndpoint=http://azure.test/devstoreaccount1"
            )),
            ..AzureOptions::default()
        };
        AzureStore::open_with("azure://locks/p", &options, no_env).expect("opens")
    }

    /// The store's reading of an answer `status` with error `code`, whose
    /// message carries a would-be secret.
    fn answer(status: u16, code: &str) -> Failure {
        let status = azure_core::StatusCode::try_from(status).expect("a status");
        let code = (!code.is_empty()).then(|| code.to_string());
        let err = azure_core::Error::message(
            ErrorKind::http_response(status, code),
            format!("signature 0123abcd key {KEY}"),
        );
        store().failure(&err, "p/.runlock/locks/k.json")
    }

    fn message(failure: Failure) -> (bool, String) {
        match failure {
            Failure::Other(CasError::Refused(m)) => (true, m),
            Failure::Other(CasError::Unavailable(m)) => (false, m),
            other => panic!("not an error with a message: {other:?}"),
        }
    }

    #[test]
    fn answers_are_sorted_by_status_and_code() {
        assert!(matches!(
            answer(409, "BlobAlreadyExists"),
            Failure::PreconditionFailed
        ));
        assert!(matches!(
            answer(412, "ConditionNotMet"),
            Failure::PreconditionFailed
        ));
        assert!(matches!(answer(404, "BlobNotFound"), Failure::NoSuchBlob));
        let (refused, text) = message(answer(404, "ContainerNotFound"));
        assert!(refused);
        assert!(
            text.starts_with(
                "container locks does not exist at http://azure.test/devstoreaccount1"
            ),
            "{text}"
        );
        for code in [
            "AuthorizationFailure",
            "AuthenticationFailed",
            "AuthorizationPermissionMismatch",
            "",
        ] {
            let (refused, text) = message(answer(403, code));
            assert!(refused, "{code}");
            assert!(
                text.starts_with("access denied to container locks"),
                "{text}"
            );
            assert!(
                text.contains("check the account key (AZURE_STORAGE_CONNECTION_STRING)")
                    || text.contains("[azure] connection_string"),
                "{text}"
            );
            assert!(!text.contains(KEY) && !text.contains("0123abcd"), "{text}");
        }
        let (refused, text) = message(answer(412, "LeaseIdMissing"));
        assert!(refused && text.contains("lease"), "{text}");
        for (status, code) in [(503, "ServerBusy"), (500, "InternalError"), (429, "")] {
            let (refused, text) = message(answer(status, code));
            assert!(!refused, "{text}");
            assert!(!text.contains(KEY), "{text}");
        }
        let (refused, text) = message(answer(400, "InvalidHeaderValue"));
        assert!(
            refused && text.contains("400 InvalidHeaderValue") && !text.contains(KEY),
            "{text}"
        );
        assert!(matches!(
            answer(409, "LeaseAlreadyPresent"),
            Failure::Other(CasError::Refused(_))
        ));
    }

    #[test]
    fn transport_failures_are_unavailable_and_name_the_endpoint() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let err = azure_core::Error::full(
            ErrorKind::Io,
            refused,
            "failed to execute `reqwest` request",
        );
        let (refused, text) = message(store().failure(&err, "k"));
        assert!(!refused);
        assert!(
            text.starts_with("cannot reach Azure Blob at http://azure.test/devstoreaccount1: "),
            "{text}"
        );
        assert_eq!(
            store().describe(),
            "azure://locks/p (endpoint http://azure.test/devstoreaccount1)"
        );
        assert_eq!(store().records_prefix(), "p/.runlock/locks/");
    }

    #[tokio::test]
    async fn a_refused_endpoint_is_unavailable_within_the_operation_timeout() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a port")
            .port();
        let options = AzureOptions {
            connection_string: Some(format!(
                "AccountName=devstoreaccount1;AccountKey={KEY};\
                 BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1"
            )),
            ..AzureOptions::default()
        };
        let store = AzureStore::open_with("azure://locks", &options, no_env).expect("opens");
        let started = std::time::Instant::now();
        let err = store.probe().await.expect_err("nothing listens");
        assert!(started.elapsed() <= OPERATION_TIMEOUT + Duration::from_secs(1));
        match err {
            CasError::Unavailable(text) => {
                assert!(
                    text.starts_with(&format!(
                        "cannot reach Azure Blob at http://127.0.0.1:{port}/"
                    )),
                    "{text}"
                );
                assert!(!text.contains(KEY), "{text}");
            }
            other => panic!("expected unavailable, got {other:?}"),
        }
    }
}
