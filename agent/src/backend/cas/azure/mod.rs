//! The Azure Blob adapter of the compare-and-swap trait: uploads with
//! `If-None-Match: *` and `If-Match: <etag>`, the blob's ETag and
//! `Last-Modified`, and the response's `Date` as the store's clock.
//!
//! `azure://container/prefix` keeps lock records under `prefix/.runlock/locks/`,
//! apart from Meltano's `prefix/<state_id>/state.json` and `lock` blobs.
//! Credentials are a storage account key (Shared Key) or a shared access
//! signature (SAS), from a connection string (`AZURE_STORAGE_CONNECTION_STRING`,
//! which Meltano's azure state backend also reads; `BlobEndpoint=` points it at
//! Azurite), an account name and key (`AZURE_STORAGE_ACCOUNT` /
//! `AZURE_STORAGE_KEY`, the Azure CLI's names) or a SAS (`AZURE_STORAGE_SAS_TOKEN`);
//! the `[azure]` section of the configuration file overrides them. No message
//! built here carries the key, the SAS or the connection string: answers are
//! named by their status and error code, and transport failures by their root cause.

mod errors;
mod identity;
mod settings;
#[cfg(test)]
mod tests;

use super::{CasError, CasResult, CasStore, Names, Precondition, Read, Site, Stored};
use crate::backend::retry::{TIMEOUTS, TRANSIENT};
use crate::backend::{redact_uri, AzureOptions, StoreContext, StoreObserver};
use async_trait::async_trait;
use azure_core::error::ErrorKind;
use azure_core::prelude::IfMatchCondition;
use azure_core::{ExponentialRetryOptions, RetryOptions, TransportOptions};
use azure_storage::{CloudLocation, StorageCredentials};
use azure_storage_blobs::prelude::{ClientBuilder, ContainerClient};
use errors::Handled;
use futures::StreamExt;
use settings::{account, parse_uri, Credential};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Idle connections are dropped before Node's 5 s keep-alive (Azurite) closes
/// them, so that a request never goes out on a connection the server is closing.
const POOL_IDLE: Duration = Duration::from_secs(4);

/// The CA of `[azure] ca_file`, read at start so that a wrong path is named there.
fn ca(path: &std::path::Path) -> anyhow::Result<reqwest::Certificate> {
    let pem = std::fs::read(path)
        .map_err(|err| anyhow::anyhow!("[azure] ca_file {}: {err}", path.display()))?;
    reqwest::Certificate::from_pem(&pem)
        .map_err(|_| anyhow::anyhow!("[azure] ca_file {}: not a PEM certificate", path.display()))
}

/// An Azure Blob container as a compare-and-swap store.
pub struct AzureStore {
    container: ContainerClient,
    container_name: String,
    /// The records' blob name prefix (`prefix/.runlock/locks/`), the URI and the endpoint.
    site: Site,
    /// The blob endpoint, for messages.
    location: String,
    /// The setting the credential came from, and what it is, for messages.
    source: &'static str,
    credential: &'static str,
}

impl AzureStore {
    /// Opens `azure://container/prefix` with the account from `options` or the
    /// environment. Makes no request; see [`AzureStore::probe`].
    pub fn open(
        uri: &str,
        options: &AzureOptions,
        context: &StoreContext,
    ) -> anyhow::Result<AzureStore> {
        AzureStore::open_with(uri, options, context, |name| std::env::var(name).ok())
    }

    /// Which credential `open` would sign with and where it came from, for
    /// `check-config`: never the key or signature. Makes no request.
    pub fn describe_credentials(options: &AzureOptions) -> anyhow::Result<String> {
        let account = account(options, |name| std::env::var(name).ok())?;
        Ok(format!(
            "{} from {} (account {})",
            account.credential.kind(),
            account.source,
            account.name
        ))
    }

    fn open_with(
        uri: &str,
        options: &AzureOptions,
        context: &StoreContext,
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<AzureStore> {
        let (container_name, prefix) = parse_uri(uri)?;
        let account = account(options, &env)?;
        let mut http = reqwest::Client::builder()
            .connect_timeout(TIMEOUTS.connect)
            .timeout(TIMEOUTS.attempt)
            .pool_idle_timeout(POOL_IDLE);
        if let Some(path) = &options.ca_file {
            http = http.add_root_certificate(ca(path)?);
        }
        let http = http.build().map_err(|err| {
            anyhow::anyhow!("cannot set up an HTTP client: {}", super::root_cause(&err))
        })?;
        // The SDK retries I/O errors, 408, 429 and 5xx.
        let retry = ExponentialRetryOptions::default()
            .max_retries(TRANSIENT.attempts - 1)
            .initial_delay(TRANSIENT.first_pause)
            .max_delay(TRANSIENT.longest_pause)
            .max_total_elapsed(TIMEOUTS.operation);
        let location = CloudLocation::Custom {
            account: account.name.clone(),
            uri: account.endpoint.clone(),
        };
        let credentials = match &account.credential {
            Credential::Key(key) => {
                StorageCredentials::access_key(account.name.clone(), key.expose().to_string())
            }
            // Checked already (sv= and sig=): what the SDK refuses here is named, never shown.
            Credential::Sas(token) => {
                StorageCredentials::sas_token(token.expose()).map_err(|_| {
                    anyhow::anyhow!(
                        "{}: the shared access signature is not a query string",
                        account.source
                    )
                })?
            }
            Credential::EntraId => StorageCredentials::token_credential(identity::chain(&env)),
        };
        let container = ClientBuilder::with_location(location, credentials)
            .retry(RetryOptions::exponential(retry))
            .transport(TransportOptions::new(Arc::new(CountsThrottling {
                http,
                observer: context.observer.clone(),
            })))
            .container_client(container_name.clone());
        let location = redact_uri(&account.endpoint);
        let reached = Some(format!("endpoint {location}"));
        // No pace of its own: it takes a write of an object as soon as asked.
        let site = Site::object_store("azure", &container_name, &prefix, reached, Duration::ZERO);
        Ok(AzureStore {
            container,
            container_name,
            site,
            location,
            source: account.source,
            credential: account.credential.kind(),
        })
    }

    /// Runs one operation within the operation's time bound.
    async fn bounded<T>(
        &self,
        name: &str,
        operation: impl std::future::Future<Output = T>,
    ) -> CasResult<T> {
        tokio::time::timeout(TIMEOUTS.operation, operation)
            .await
            .map_err(|_| {
                CasError::Unavailable(format!(
                    "Azure Blob at {} did not answer within {}s for azure://{}/{name}",
                    self.location,
                    TIMEOUTS.operation.as_secs(),
                    self.container_name
                ))
            })
    }
}

#[async_trait]
impl CasStore for AzureStore {
    fn site(&self) -> &Site {
        &self.site
    }

    /// Checks that the container answers and the key is accepted, by reading a
    /// blob that need not exist (the same permission the engine needs).
    async fn probe(&self) -> CasResult<()> {
        let name = format!("{}probe", self.site.records);
        self.get(&name).await.map(|_| ())
    }

    async fn get(&self, name: &str) -> CasResult<Read> {
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
                return match self.classify(&err, name).expected()? {
                    Handled::NoSuchBlob => Ok(Read {
                        object: None,
                        date: None,
                    }),
                    Handled::PreconditionFailed => Err(CasError::Unavailable(format!(
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

    async fn put(&self, name: &str, body: Vec<u8>, when: Precondition<'_>) -> CasResult<String> {
        let version = when.version();
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
            // If-Match on a missing blob: someone removed it; the engine re-reads.
            Err(err) => self
                .classify(&err, name)
                .expected()
                .and(Err(CasError::Conflict)),
        }
    }

    async fn list(&self, prefix: &str, page: Option<&str>, limit: usize) -> CasResult<Names> {
        let mut request = self.container.list_blobs().prefix(prefix.to_string());
        if let Some(most) = u32::try_from(limit)
            .ok()
            .and_then(std::num::NonZeroU32::new)
        {
            request = request.max_results(azure_core::request_options::MaxResults::new(most));
        }
        if let Some(page) = page {
            request = request.marker(azure_core::request_options::NextMarker::new(page.into()));
        }
        let first = async { request.into_stream().next().await };
        let answer = match self.bounded(prefix, first).await? {
            Some(answer) => answer,
            None => {
                return Err(CasError::Unavailable(format!(
                    "Azure Blob at {} answered a listing of {prefix} with nothing",
                    self.location
                )))
            }
        };
        match answer {
            Ok(listed) => Ok(Names {
                names: listed
                    .blobs
                    .items
                    .into_iter()
                    .filter_map(|item| match item {
                        azure_storage_blobs::container::operations::BlobItem::Blob(blob) => {
                            Some((blob.name, Some(blob.properties.etag.to_string())))
                        }
                        _ => None,
                    })
                    .collect(),
                next: listed
                    .next_marker
                    .map(|m| m.as_str().to_string())
                    .filter(|m| !m.is_empty()),
            }),
            Err(err) => self.classify(&err, prefix).expected().and_then(|_| {
                Err(CasError::Unavailable(format!(
                    "Azure Blob at {} did not list {prefix}",
                    self.location
                )))
            }),
        }
    }

    async fn delete(&self, name: &str) -> CasResult<()> {
        let request = self.container.blob_client(name).delete().into_future();
        match self.bounded(name, request).await? {
            Ok(_) => Ok(()),
            Err(err) => self.classify(&err, name).expected().map(|_| ()),
        }
    }
}

/// The HTTP client, counting each answer that said slow down (503
/// ServerBusy, 429): the SDK retries them before an answer reaches us.
struct CountsThrottling {
    http: reqwest::Client,
    observer: Arc<dyn StoreObserver>,
}

impl std::fmt::Debug for CountsThrottling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.http.fmt(f)
    }
}

#[async_trait::async_trait]
impl azure_core::HttpClient for CountsThrottling {
    async fn execute_request(
        &self,
        request: &azure_core::Request,
    ) -> azure_core::Result<azure_core::Response> {
        let response = self.http.execute_request(request).await?;
        if matches!(u16::from(response.status()), 429 | 503) {
            self.observer.throttled("azure");
        }
        Ok(response)
    }
}
