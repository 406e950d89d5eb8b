//! The S3 adapter of the compare-and-swap trait: `If-None-Match: *` and
//! `If-Match: <etag>` on PutObject, the record's ETag and `Last-Modified`, and
//! the response's `Date` as the store's clock.
//!
//! `s3://bucket/prefix` keeps lock records under `prefix/.runlock/locks/`,
//! apart from Meltano's `prefix/<state_id>/state.json` and `lock` files.
//! Credentials and region come from the SDK's default chain (region
//! `us-east-1` when none is configured); `AWS_ENDPOINT_URL` or
//! `AWS_ENDPOINT_URL_S3` points it at an S3-compatible store, addressed
//! path-style. No message built here carries a secret: service errors are
//! named by their code, and access errors by a fixed text.

mod errors;
mod settings;
#[cfg(test)]
mod tests;
mod transport;

use super::{CasError, CasResult, CasStore, Names, Precondition, Read, Site, Stored};
use crate::backend::retry::{RetryBudget, TIMEOUTS, TRANSIENT};
use crate::backend::{redact_uri, S3Options, StoreContext, StoreObserver};
use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{Region, RequestChecksumCalculation, ResponseChecksumValidation};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::Client;
use aws_types::service_config::ServiceConfigKey;
use errors::Handled;
use settings::{parse_uri, CredentialSource};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use transport::CaptureDate;

/// How often a write that met `409 ConditionalRequestConflict` is sent, and
/// how long it waits in between.
const CONFLICT_RETRY: RetryBudget = RetryBudget {
    attempts: 3,
    first_pause: Duration::from_millis(20),
    longest_pause: Duration::from_millis(40),
};

/// An S3 bucket (or an S3-compatible store) as a compare-and-swap store.
pub struct S3Store {
    client: Client,
    bucket: String,
    /// The records' object key prefix (`prefix/.runlock/locks/`), the URI
    /// without secrets and the custom endpoint if any.
    site: Site,
    /// Where the bucket is, for messages: the endpoint, or the AWS region.
    location: String,
    /// Where the SDK looks for credentials, for the message when it finds
    /// none; `None` for static keys.
    credentials_looked_in: Option<String>,
}

impl S3Store {
    /// Where `open` would take credentials from, for `check-config`; makes no request.
    pub fn describe_credentials(options: &S3Options) -> anyhow::Result<String> {
        Ok(CredentialSource::of(options)?.describe())
    }

    /// The SDK's HTTP(S) client, for the credential chain and S3 alike:
    /// rustls on ring, as every store's client here is (the workspace's
    /// Cargo.toml says why), with the system's roots.
    pub fn sdk_http_client() -> aws_sdk_s3::config::SharedHttpClient {
        use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
        aws_smithy_http_client::Builder::new()
            .tls_provider(Provider::Rustls(CryptoMode::Ring))
            .build_https()
    }

    /// Opens `s3://bucket/prefix` with `options` over the SDK's default
    /// configuration chain. Makes no request: the agent's proof of the store is
    /// its first.
    pub async fn open(
        uri: &str,
        options: &S3Options,
        context: &StoreContext,
    ) -> anyhow::Result<S3Store> {
        let (bucket, prefix) = parse_uri(uri)?;
        let mut loader =
            aws_config::defaults(BehaviorVersion::latest()).http_client(Self::sdk_http_client());
        if let Some(profile) = &options.profile {
            loader = loader.profile_name(profile);
        }
        if let Some(region) = &options.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let CredentialSource::Static { id, secret } = CredentialSource::of(options)? {
            loader = loader.credentials_provider(aws_sdk_s3::config::Credentials::new(
                id,
                secret.expose(),
                None,
                None,
                "runlockd configuration",
            ));
        }
        let shared = loader.load().await;
        // The same lookup the S3 client makes: AWS_ENDPOINT_URL_S3 (or the profile's
        // s3 endpoint_url), else AWS_ENDPOINT_URL (or the profile's endpoint_url).
        let endpoint = shared
            .service_config()
            .and_then(|config| {
                config.load_config(
                    ServiceConfigKey::builder()
                        .service_id("S3")
                        .env("AWS_ENDPOINT_URL")
                        .profile("endpoint_url")
                        .build()
                        .ok()?,
                )
            })
            .or_else(|| shared.endpoint_url().map(str::to_string));
        let endpoint = options
            .endpoint_url
            .clone()
            .or(endpoint)
            .filter(|url| !url.is_empty());
        let region = shared
            .region()
            .cloned()
            .unwrap_or_else(|| Region::new("us-east-1"));
        let mut config = aws_sdk_s3::config::Builder::from(&shared)
            .region(region.clone())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(TIMEOUTS.connect)
                    .operation_attempt_timeout(TIMEOUTS.attempt)
                    .operation_timeout(TIMEOUTS.operation)
                    .build(),
            )
            .retry_config(
                RetryConfig::standard()
                    .with_max_attempts(TRANSIENT.attempts)
                    .with_initial_backoff(TRANSIENT.first_pause)
                    .with_max_backoff(TRANSIENT.longest_pause),
            );
        if let Some(url) = &endpoint {
            // Emulators and S3-compatible stores: path-style addressing, and no
            // checksums beyond what the API requires (not every store knows them).
            config = config
                .endpoint_url(url.clone())
                .force_path_style(true)
                .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
                .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
        }
        let client = Client::from_conf(
            config
                .interceptor(CountsThrottling(context.observer.clone()))
                .build(),
        );
        let (reached, location) = match &endpoint {
            Some(url) => {
                let url = redact_uri(url);
                (Some(format!("endpoint {url}")), url)
            }
            None => (None, format!("AWS region {region}")),
        };
        // No pace of its own: it takes a write of an object as soon as asked.
        let site = Site::object_store("s3", &bucket, &prefix, reached, Duration::ZERO);
        let profile_env = std::env::var("AWS_PROFILE").ok();
        let credentials_looked_in =
            CredentialSource::of(options)?.looked_in(profile_env.as_deref());
        Ok(S3Store {
            client,
            bucket,
            site,
            location,
            credentials_looked_in,
        })
    }
}

#[async_trait]
impl CasStore for S3Store {
    fn site(&self) -> &Site {
        &self.site
    }

    /// Asks nothing: the proof's first write, which follows, meets a missing
    /// bucket, refused credentials or a wrong region just as a HeadBucket
    /// would, and names them the same way ([`S3Store::failure`]). A request
    /// spared here is one less per agent when a fleet starts together.
    async fn probe(&self) -> CasResult<()> {
        Ok(())
    }

    async fn get(&self, name: &str) -> CasResult<Read> {
        let key = name;
        let date = CaptureDate::default();
        let sent = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .customize()
            .interceptor(date.clone())
            .send()
            .await;
        let output = match sent {
            Ok(output) => output,
            Err(err) => {
                return match self.classify(err, key).expected()? {
                    Handled::NoSuchKey => Ok(Read {
                        object: None,
                        date: date.take(),
                    }),
                    Handled::PreconditionFailed | Handled::Busy => {
                        Err(CasError::Unavailable(format!(
                            "S3 at {} answered a plain read of {key} with a conflict",
                            self.location
                        )))
                    }
                }
            }
        };
        let version = output.e_tag().map(str::to_string).ok_or_else(|| {
            CasError::Unavailable(format!(
                "S3 at {} returned {key} without an ETag",
                self.location
            ))
        })?;
        let last_modified = output
            .last_modified()
            .and_then(|t| SystemTime::try_from(*t).ok());
        let body = output.body.collect().await.map_err(|e| {
            CasError::Unavailable(format!(
                "reading {key} from S3 at {}: {}",
                self.location,
                super::root_cause(&e)
            ))
        })?;
        Ok(Read {
            object: Some(Stored {
                body: body.into_bytes().to_vec(),
                version,
                last_modified,
            }),
            date: date.take(),
        })
    }

    async fn put(&self, name: &str, body: Vec<u8>, when: Precondition<'_>) -> CasResult<String> {
        let version = when.version();
        let key = name;
        let body = &body;
        let written = CONFLICT_RETRY
            .run(
                |_| async move {
                    let request = self
                        .client
                        .put_object()
                        .bucket(&self.bucket)
                        .key(key)
                        .content_type("application/json")
                        .body(ByteStream::from(body.clone()));
                    let request = match version {
                        None => request.if_none_match("*"),
                        Some(etag) => request.if_match(etag),
                    };
                    let output = request
                        .send()
                        .await
                        .map_err(|err| self.classify(err, key))?;
                    output.e_tag().map(str::to_string).ok_or_else(|| {
                        errors::Failure::Transient(format!(
                            "S3 at {} answered a write of {key} without an ETag",
                            self.location
                        ))
                    })
                },
                |failure| matches!(failure, errors::Failure::Expected(Handled::Busy)),
            )
            .await;
        match written {
            Ok(etag) => Ok(etag),
            // If-Match on a missing object: someone removed it; the engine
            // re-reads. Still busy after the last try: the same.
            Err(failure) => match failure.expected()? {
                Handled::PreconditionFailed | Handled::NoSuchKey | Handled::Busy => {
                    Err(CasError::Conflict)
                }
            },
        }
    }

    async fn list(&self, prefix: &str, page: Option<&str>, limit: usize) -> CasResult<Names> {
        let sent = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(prefix)
            .set_continuation_token(page.map(str::to_string))
            .max_keys(i32::try_from(limit).unwrap_or(i32::MAX))
            .send()
            .await;
        match sent {
            Ok(output) => Ok(Names {
                names: output
                    .contents()
                    .iter()
                    .filter_map(|object| {
                        let name = object.key()?.to_string();
                        Some((name, object.e_tag().map(str::to_string)))
                    })
                    .collect(),
                next: output.next_continuation_token().map(str::to_string),
            }),
            Err(err) => {
                // A listing names no object: no answer but a list is expected.
                let answer = self.classify(err, prefix).expected()?;
                Err(CasError::Unavailable(format!(
                    "S3 at {} answered a listing of {prefix} with {answer:?}",
                    self.location
                )))
            }
        }
    }

    async fn delete(&self, name: &str) -> CasResult<()> {
        let sent = self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(name)
            .send()
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(err) => self.classify(err, name).expected().map(|_| ()),
        }
    }
}

/// Counts each attempt S3 answered 503 (SlowDown) or 429: the SDK retries
/// them before an operation's answer reaches us.
struct CountsThrottling(Arc<dyn StoreObserver>);

impl std::fmt::Debug for CountsThrottling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CountsThrottling")
    }
}

impl aws_sdk_s3::config::Intercept for CountsThrottling {
    fn name(&self) -> &'static str {
        "runlock counts throttling"
    }

    fn read_after_attempt(
        &self,
        context: &aws_sdk_s3::config::interceptors::FinalizerInterceptorContextRef<'_>,
        _: &aws_sdk_s3::config::RuntimeComponents,
        _: &mut aws_sdk_s3::config::ConfigBag,
    ) -> Result<(), aws_sdk_s3::error::BoxError> {
        if let Some(response) = context.response() {
            if matches!(response.status().as_u16(), 429 | 503) {
                self.0.throttled("s3");
            }
        }
        Ok(())
    }
}
