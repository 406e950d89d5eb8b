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

use super::{CasError, CasStore, Read, Stored};
use crate::backend::redact_uri;
use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::interceptors::BeforeDeserializationInterceptorContextRef;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    ConfigBag, Intercept, Region, RequestChecksumCalculation, ResponseChecksumValidation,
    RuntimeComponents,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::Client;
use aws_types::service_config::ServiceConfigKey;
use std::error::Error as StdError;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Connecting to the store may take this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// One HTTP attempt may take this long.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);
/// One operation, retries included, may take this long: a hung store never blocks for longer.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP attempts per operation (the SDK retries transient failures: 5xx, throttling, resets).
const HTTP_ATTEMPTS: u32 = 3;
/// How often a write that met `409 ConditionalRequestConflict` is sent again.
const CONFLICT_ATTEMPTS: u32 = 3;

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
    /// A static secret key: never printed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key: Option<String>,
}

impl S3Options {
    /// The options with the secret replaced, for printing.
    pub fn redacted(&self) -> S3Options {
        S3Options {
            endpoint_url: self.endpoint_url.as_deref().map(redact_uri),
            secret_access_key: self.secret_access_key.as_ref().map(|_| "<redacted>".into()),
            ..self.clone()
        }
    }
}

/// An S3 bucket (or an S3-compatible store) as a compare-and-swap store.
pub struct S3Store {
    client: Client,
    bucket: String,
    /// The object key prefix for records: `prefix/.runlock/locks/`.
    records: String,
    /// The URI without secrets, and the custom endpoint if any.
    description: String,
    /// Where the bucket is, for messages: the endpoint, or the AWS region.
    location: String,
}

/// What went wrong with one request, before it is turned into a [`CasError`].
enum Failure {
    /// 404 for the object (not the bucket).
    NoSuchKey,
    /// 412: the condition did not hold.
    PreconditionFailed,
    /// 409 ConditionalRequestConflict: a concurrent conditional write; try again.
    Busy,
    /// Anything else.
    Other(CasError),
}

impl S3Store {
    /// Opens `s3://bucket/prefix` with `options` over the SDK's default
    /// configuration chain. Makes no request; see [`S3Store::probe`].
    pub async fn open(uri: &str, options: &S3Options) -> anyhow::Result<S3Store> {
        let (bucket, prefix) = parse_uri(uri)?;
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(profile) = &options.profile {
            loader = loader.profile_name(profile);
        }
        if let Some(region) = &options.region {
            loader = loader.region(Region::new(region.clone()));
        }
        match (&options.access_key_id, &options.secret_access_key) {
            (Some(id), Some(secret)) => {
                loader = loader.credentials_provider(aws_sdk_s3::config::Credentials::new(
                    id,
                    secret,
                    None,
                    None,
                    "runlockd configuration",
                ));
            }
            (None, None) => {}
            _ => anyhow::bail!("[s3] access_key_id and secret_access_key must be given together"),
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
                    .connect_timeout(CONNECT_TIMEOUT)
                    .operation_attempt_timeout(ATTEMPT_TIMEOUT)
                    .operation_timeout(OPERATION_TIMEOUT)
                    .build(),
            )
            .retry_config(
                RetryConfig::standard()
                    .with_max_attempts(HTTP_ATTEMPTS)
                    .with_initial_backoff(Duration::from_millis(50))
                    .with_max_backoff(Duration::from_millis(500)),
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
        let client = Client::from_conf(config.build());
        let records = super::records_under(&prefix);
        let plain = super::object_uri("s3", &bucket, &prefix);
        let (description, location) = match &endpoint {
            Some(url) => {
                let url = redact_uri(url);
                (format!("{plain} (endpoint {url})"), url)
            }
            None => (plain, format!("AWS region {region}")),
        };
        Ok(S3Store {
            client,
            bucket,
            records,
            description,
            location,
        })
    }

    /// The object key prefix the lock records live under (for [`super::CasEngine::new`]);
    /// the store itself takes whole object keys.
    pub fn records_prefix(&self) -> &str {
        &self.records
    }

    /// Checks that the bucket answers (HeadBucket); the error names the cause.
    pub async fn probe(&self) -> Result<(), CasError> {
        let sent = self.client.head_bucket().bucket(&self.bucket).send().await;
        match sent {
            Ok(_) => Ok(()),
            Err(err) => Err(match self.failure(err, "") {
                // HeadBucket has no body, so a missing bucket is a bare 404.
                Failure::NoSuchKey => self.no_such_bucket(),
                Failure::Other(err) => err,
                Failure::PreconditionFailed | Failure::Busy => {
                    CasError::Unavailable(format!("{}: unexpected answer", self.description))
                }
            }),
        }
    }

    fn no_such_bucket(&self) -> CasError {
        CasError::Refused(format!(
            "bucket {} does not exist at {}",
            self.bucket, self.location
        ))
    }

    /// Sorts an SDK error; `name` is the object the request was about.
    fn failure<E>(&self, err: SdkError<E, HttpResponse>, name: &str) -> Failure
    where
        E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
    {
        let what = if name.is_empty() {
            format!("bucket {}", self.bucket)
        } else {
            format!("s3://{}/{name}", self.bucket)
        };
        match &err {
            SdkError::ServiceError(service) => {
                let status = service.raw().status().as_u16();
                let code = service.err().code().unwrap_or("");
                match (status, code) {
                    (_, "NoSuchBucket") => Failure::Other(self.no_such_bucket()),
                    (404, _) => Failure::NoSuchKey,
                    (412, _) | (_, "PreconditionFailed") => Failure::PreconditionFailed,
                    (409, "ConditionalRequestConflict") => Failure::Busy,
                    (403, _)
                    | (
                        _,
                        "AccessDenied"
                        | "InvalidAccessKeyId"
                        | "SignatureDoesNotMatch"
                        | "ExpiredToken"
                        | "InvalidToken"
                        | "TokenRefreshRequired",
                    ) => Failure::Other(CasError::Refused(format!(
                        "access denied to bucket {} at {} ({}): check the credentials \
                         (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the \
                         instance role) and that they may read and write s3://{}/{}*",
                        self.bucket,
                        self.location,
                        if code.is_empty() { "403" } else { code },
                        self.bucket,
                        self.records,
                    ))),
                    (301, _) | (_, "PermanentRedirect" | "AuthorizationHeaderMalformed") => {
                        Failure::Other(CasError::Refused(format!(
                            "bucket {} is not in {} ({}): set AWS_REGION to the bucket's region",
                            self.bucket,
                            self.location,
                            if code.is_empty() { "301" } else { code },
                        )))
                    }
                    (501, _) | (_, "NotImplemented") => Failure::Other(CasError::Refused(format!(
                        "the store at {} does not support conditional writes \
                         (If-None-Match / If-Match on PutObject), which runlock needs",
                        self.location
                    ))),
                    (500.., _) | (409 | 429, _) | (_, "SlowDown" | "RequestTimeout") => {
                        Failure::Other(CasError::Unavailable(format!(
                            "S3 at {} answered {status} {code} for {what}",
                            self.location
                        )))
                    }
                    _ => Failure::Other(CasError::Refused(format!(
                        "S3 at {} refused a request for {what}: {status} {code}",
                        self.location
                    ))),
                }
            }
            SdkError::TimeoutError(_) => Failure::Other(CasError::Unavailable(format!(
                "S3 at {} did not answer within {}s for {what}",
                self.location,
                OPERATION_TIMEOUT.as_secs()
            ))),
            SdkError::DispatchFailure(dispatch) => {
                let cause = super::root_cause(&err);
                let message = if dispatch.is_timeout() {
                    format!(
                        "S3 at {} did not answer in time for {what}: {cause}",
                        self.location
                    )
                } else if dispatch.is_io() {
                    format!("cannot reach S3 at {}: {cause}", self.location)
                } else {
                    format!(
                        "cannot send a request to S3 at {} for {what}: {cause}",
                        self.location
                    )
                };
                Failure::Other(CasError::Unavailable(message))
            }
            SdkError::ResponseError(_) => Failure::Other(CasError::Unavailable(format!(
                "S3 at {} sent an unreadable answer for {what}: {}",
                self.location,
                super::root_cause(&err)
            ))),
            // Building or signing the request failed: no credentials, a bad region.
            _ => Failure::Other(CasError::Refused(format!(
                "cannot make a request to S3 at {} for {what}: {}",
                self.location,
                super::root_cause(&err)
            ))),
        }
    }

    async fn put(
        &self,
        name: &str,
        body: Vec<u8>,
        version: Option<&str>,
    ) -> Result<String, CasError> {
        let key = name;
        let mut attempt = 0;
        loop {
            attempt += 1;
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
            let failure = match request.send().await {
                Ok(output) => {
                    return output.e_tag().map(str::to_string).ok_or_else(|| {
                        CasError::Unavailable(format!(
                            "S3 at {} answered a write of {key} without an ETag",
                            self.location
                        ))
                    })
                }
                Err(err) => self.failure(err, key),
            };
            match failure {
                // If-Match on a missing object: someone removed it; the engine re-reads.
                Failure::PreconditionFailed | Failure::NoSuchKey => return Err(CasError::Conflict),
                Failure::Busy if attempt < CONFLICT_ATTEMPTS => {
                    let pause = Duration::from_millis(20 * u64::from(attempt))
                        .mul_f64(0.5 + fastrand::f64());
                    tokio::time::sleep(pause).await;
                }
                Failure::Busy => return Err(CasError::Conflict),
                Failure::Other(err) => return Err(err),
            }
        }
    }
}

/// `s3://bucket/prefix` → (bucket, prefix without surrounding slashes).
fn parse_uri(uri: &str) -> anyhow::Result<(String, String)> {
    super::place_and_prefix(
        uri,
        "s3",
        "bucket",
        "credentials and the endpoint come from the AWS configuration (AWS_PROFILE, \
         AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, ...)",
    )
}

/// Records the response's `Date` header, for one request.
#[derive(Debug, Default, Clone)]
struct CaptureDate(Arc<Mutex<Option<SystemTime>>>);

impl CaptureDate {
    fn take(&self) -> Option<SystemTime> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl Intercept for CaptureDate {
    fn name(&self) -> &'static str {
        "runlock::CaptureDate"
    }

    fn read_before_deserialization(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_s3::error::BoxError> {
        let date = context
            .response()
            .headers()
            .get("date")
            .and_then(|d| httpdate::parse_http_date(d).ok());
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = date;
        Ok(())
    }
}

#[async_trait]
impl CasStore for S3Store {
    fn describe(&self) -> String {
        self.description.clone()
    }

    async fn get(&self, name: &str) -> Result<Read, CasError> {
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
                return match self.failure(err, key) {
                    Failure::NoSuchKey => Ok(Read {
                        object: None,
                        date: date.take(),
                    }),
                    Failure::Other(err) => Err(err),
                    Failure::PreconditionFailed | Failure::Busy => {
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
    use aws_sdk_s3::error::{ConnectorError, ErrorMetadata};
    use aws_sdk_s3::operation::put_object::PutObjectError;
    use aws_sdk_s3::primitives::SdkBody;

    #[test]
    fn uris_name_a_bucket_and_an_optional_prefix() {
        let parse = |u: &str| parse_uri(u).expect("valid");
        assert_eq!(parse("s3://b"), ("b".into(), "".into()));
        assert_eq!(parse("s3://b/"), ("b".into(), "".into()));
        assert_eq!(
            parse("s3://b/meltano/state/"),
            ("b".into(), "meltano/state".into())
        );
        assert!(parse_uri("s3://").is_err());
        assert!(parse_uri("s3:///x").is_err());
        let err = parse_uri("s3://KEY:SECRET@b/x").expect_err("refused");
        assert!(!err.to_string().contains("SECRET"), "{err}");
    }

    fn store() -> S3Store {
        let config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .build();
        S3Store {
            client: Client::from_conf(config),
            bucket: "locks".into(),
            records: format!("p/{}", super::super::RECORDS),
            description: "s3://locks/p (endpoint http://s3.test)".into(),
            location: "http://s3.test".into(),
        }
    }

    /// The store's reading of an answer `status` with error `code`; the error's
    /// message carries a would-be secret.
    fn answer(status: u16, code: &str) -> Failure {
        let meta = ErrorMetadata::builder()
            .code(code)
            .message("AKIASECRETKEY signature 0123abcd")
            .build();
        let raw = HttpResponse::new(status.try_into().expect("a status"), SdkBody::empty());
        store().failure(
            SdkError::service_error(PutObjectError::generic(meta), raw),
            "p/.runlock/locks/k.json",
        )
    }

    fn message(failure: Failure) -> (bool, String) {
        match failure {
            Failure::Other(CasError::Refused(m)) => (true, m),
            Failure::Other(CasError::Unavailable(m)) => (false, m),
            _ => panic!("not an error with a message"),
        }
    }

    #[test]
    fn answers_are_sorted_by_status_and_code() {
        assert!(matches!(
            answer(412, "PreconditionFailed"),
            Failure::PreconditionFailed
        ));
        assert!(matches!(
            answer(409, "ConditionalRequestConflict"),
            Failure::Busy
        ));
        assert!(matches!(answer(404, "NoSuchKey"), Failure::NoSuchKey));
        let (refused, text) = message(answer(404, "NoSuchBucket"));
        assert!(refused);
        assert_eq!(text, "bucket locks does not exist at http://s3.test");
        for code in [
            "AccessDenied",
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "",
        ] {
            let (refused, text) = message(answer(403, code));
            assert!(refused, "{code}");
            assert!(text.starts_with("access denied to bucket locks"), "{text}");
            assert!(text.contains("check the credentials"), "{text}");
            assert!(
                !text.contains("AKIA") && !text.contains("0123abcd"),
                "{text}"
            );
        }
        let (refused, text) = message(answer(503, "SlowDown"));
        assert!(!refused, "{text}");
        assert!(!text.contains("AKIA"), "{text}");
        let (refused, text) = message(answer(400, "InvalidRequest"));
        assert!(refused && !text.contains("AKIA"), "{text}");
        assert!(message(answer(501, "NotImplemented"))
            .1
            .contains("conditional writes"));
    }

    #[test]
    fn transport_failures_are_unavailable_and_name_the_endpoint() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let err: SdkError<PutObjectError, HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::io(refused.into()));
        let (refused, text) = message(store().failure(err, "k"));
        assert!(!refused);
        assert!(
            text.starts_with("cannot reach S3 at http://s3.test: "),
            "{text}"
        );
        let err: SdkError<PutObjectError, HttpResponse> = SdkError::timeout_error("slow");
        let (refused, text) = message(store().failure(err, "k"));
        assert!(!refused && text.contains("did not answer"), "{text}");
    }
}
