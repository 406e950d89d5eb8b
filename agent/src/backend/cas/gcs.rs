//! The Google Cloud Storage adapter of the compare-and-swap trait, over the
//! JSON API: multipart uploads with `ifGenerationMatch=0` (create) or
//! `ifGenerationMatch=<generation>` (replace), and one `alt=media` read whose
//! `x-goog-generation`, `Last-Modified` and `Date` headers carry the version
//! and the store's clock.
//!
//! `gs://bucket/prefix` keeps lock records under `prefix/.runlock/locks/`, as
//! s3:// does. Credentials: `[gcs] credentials_file`, else Application Default
//! Credentials (`GOOGLE_APPLICATION_CREDENTIALS`, gcloud's user credentials,
//! the metadata server, the gcloud CLI). `STORAGE_EMULATOR_HOST` points it at
//! an emulator, spoken to without credentials. No message built here carries
//! a secret: answers are named by status and reason, credential problems by
//! fixed texts.
//!
//! Why not a GCS client crate: the lease engine needs the answer's `Date`
//! header (the store's clock) and preconditions on multipart uploads (the only
//! ones the emulator enforces), and the JSON API it needs is three requests.

use super::{CasError, CasStore, Read, Stored};
use crate::backend::redact_uri;
use async_trait::async_trait;
use bytes::Bytes;
use gcp_auth::{CustomServiceAccount, TokenProvider};
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderMap, AUTHORIZATION, CONTENT_TYPE, DATE, LAST_MODIFIED};
use hyper::{Request, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::OnceCell;
use tokio::time::Instant;

/// The real service.
const GOOGLE_API: &str = "https://storage.googleapis.com";
/// Where emulators are found, as every Google client library reads it.
pub const EMULATOR_ENV: &str = "STORAGE_EMULATOR_HOST";
/// The OAuth scope for reading and writing objects.
const SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_write";
/// GCS sustains about one write per second to one object name.
const MIN_WRITE_INTERVAL: Duration = Duration::from_secs(1);
/// Connecting may take this long (the same figures as s3.rs).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// One HTTP attempt may take this long.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);
/// One operation, credentials and retries included, may take this long.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP attempts per operation for transient failures (5xx, 429, resets).
const HTTP_ATTEMPTS: u32 = 3;
/// Google asks clients to back off at least a second after a 429.
const THROTTLED_PAUSE: Duration = Duration::from_secs(1);
/// Answers larger than this are not lock records; reading stops there.
const MAX_ANSWER: usize = 1 << 20;
/// Path segments keep only RFC 3986's unreserved characters.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The configuration file's `[gcs]` settings.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcsOptions {
    /// A service-account key file (JSON), instead of Application Default
    /// Credentials (Meltano's `state_backend.gcs.application_credentials`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_file: Option<PathBuf>,
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Where access tokens come from.
enum Credentials {
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

/// A GCS bucket as a compare-and-swap store.
pub struct GcsStore {
    http: HttpClient,
    /// `https://storage.googleapis.com` or the emulator's URL, without a trailing `/`.
    api: String,
    credentials: Credentials,
    bucket: String,
    /// The object name prefix for records: `prefix/.runlock/locks/`.
    records: String,
    /// The URI, and the emulator if any.
    description: String,
    /// Where the bucket is, for messages.
    location: String,
}

/// One HTTP answer, read whole.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

/// What an answer means, before it is turned into a [`CasError`].
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// 404 for the object (not the bucket).
    NotFound,
    /// 412: the generation did not match.
    PreconditionFailed,
    /// Anything else.
    Other(CasError),
}

impl GcsStore {
    /// Opens `gs://bucket/prefix`: an emulator if `STORAGE_EMULATOR_HOST` is
    /// set, else GCS with `options`' credentials or Application Default
    /// Credentials. Makes no request; see [`GcsStore::probe`].
    pub fn open(uri: &str, options: &GcsOptions) -> anyhow::Result<GcsStore> {
        let emulator = std::env::var(EMULATOR_ENV)
            .ok()
            .filter(|host| !host.trim().is_empty());
        let credentials_env = std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS")
            .filter(|path| !path.is_empty())
            .map(PathBuf::from);
        GcsStore::with(uri, options, emulator.as_deref(), credentials_env)
    }

    /// [`GcsStore::open`] with the environment passed in.
    fn with(
        uri: &str,
        options: &GcsOptions,
        emulator: Option<&str>,
        credentials_env: Option<PathBuf>,
    ) -> anyhow::Result<GcsStore> {
        let (bucket, prefix) = parse_uri(uri)?;
        let (api, credentials) = match emulator {
            Some(host) => (emulator_url(host)?, Credentials::Emulator),
            None => {
                let credentials = match (&options.credentials_file, credentials_env) {
                    (Some(path), _) => Credentials::KeyFile {
                        path: path.clone(),
                        setting: "[gcs] credentials_file",
                        account: OnceCell::new(),
                    },
                    (None, Some(path)) => Credentials::KeyFile {
                        path,
                        setting: "GOOGLE_APPLICATION_CREDENTIALS",
                        account: OnceCell::new(),
                    },
                    (None, None) => Credentials::Default(OnceCell::new()),
                };
                (GOOGLE_API.to_string(), credentials)
            }
        };
        let records = super::records_under(&prefix);
        let plain = super::object_uri("gs", &bucket, &prefix);
        let (description, location) = match emulator {
            Some(_) => {
                let shown = redact_uri(&api);
                (format!("{plain} (emulator {shown})"), shown)
            }
            None => (plain, "Google Cloud Storage".to_string()),
        };
        Ok(GcsStore {
            http: http_client(api.starts_with("http://"))?,
            api,
            credentials,
            bucket,
            records,
            description,
            location,
        })
    }

    /// The object name prefix the lock records live under (for [`super::CasEngine::new`]).
    pub fn records_prefix(&self) -> &str {
        &self.records
    }

    /// Checks that the bucket answers and lets us list the records' prefix;
    /// the error names the cause.
    pub async fn probe(&self) -> Result<(), CasError> {
        let url = format!(
            "{}/storage/v1/b/{}/o?maxResults=1&fields=kind&prefix={}",
            self.api,
            encode(&self.bucket),
            encode(&self.records)
        );
        let what = format!("bucket {}", self.bucket);
        let answer = self
            .exchange(&what, || Request::get(url.as_str()), Bytes::new(), None)
            .await?;
        match self.sort(&answer, &what) {
            None => Ok(()),
            // Listing a missing bucket is a bare 404.
            Some(Failure::NotFound) => Err(self.no_such_bucket()),
            Some(Failure::Other(err)) => Err(err),
            Some(Failure::PreconditionFailed) => Err(CasError::Unavailable(format!(
                "GCS at {} answered a listing of {what} with 412",
                self.location
            ))),
        }
    }

    fn no_such_bucket(&self) -> CasError {
        CasError::Refused(format!(
            "bucket {} does not exist at {}",
            self.bucket, self.location
        ))
    }

    fn object(&self, name: &str) -> String {
        format!("gs://{}/{name}", self.bucket)
    }

    /// What an answer means; `None` for success.
    fn sort(&self, answer: &Answer, what: &str) -> Option<Failure> {
        let status = answer.status;
        if status.is_success() {
            return None;
        }
        let (message, reason) = error_detail(&answer.body);
        let code = status.as_u16();
        let named = if reason.is_empty() {
            code.to_string()
        } else {
            format!("{code} {reason}")
        };
        Some(match code {
            404 if message
                .to_ascii_lowercase()
                .contains("bucket does not exist") =>
            {
                Failure::Other(self.no_such_bucket())
            }
            404 => Failure::NotFound,
            412 => Failure::PreconditionFailed,
            401 | 403 => Failure::Other(CasError::Refused(format!(
                "access denied to bucket {} at {} ({named}): check the credentials ({}) and \
                 that they may read and write gs://{}/{}*",
                self.bucket,
                self.location,
                self.credentials_hint(),
                self.bucket,
                self.records,
            ))),
            429 => Failure::Other(CasError::Unavailable(format!(
                "GCS at {} is throttling requests for {what} ({named}): too many writes to \
                 one lock record, or to the bucket",
                self.location
            ))),
            408 | 500.. => Failure::Other(CasError::Unavailable(format!(
                "GCS at {} answered {named} for {what}",
                self.location
            ))),
            _ => Failure::Other(CasError::Refused(format!(
                "GCS at {} refused a request for {what}: {named}",
                self.location
            ))),
        })
    }

    /// Where the credentials come from, for "access denied" messages.
    fn credentials_hint(&self) -> String {
        match &self.credentials {
            Credentials::Emulator => format!("{EMULATOR_ENV} names an emulator: none are sent"),
            Credentials::KeyFile { path, setting, .. } => {
                format!(
                    "the service-account key {} named by {setting}",
                    path.display()
                )
            }
            Credentials::Default(_) => "GOOGLE_APPLICATION_CREDENTIALS, `gcloud auth \
                                        application-default login`, or the instance's service \
                                        account"
                .to_string(),
        }
    }

    /// An access token for the next request; `None` for an emulator.
    async fn token(&self) -> Result<Option<String>, CasError> {
        let token = match &self.credentials {
            Credentials::Emulator => return Ok(None),
            Credentials::KeyFile {
                path,
                setting,
                account,
            } => {
                let account = account
                    .get_or_try_init(|| async {
                        CustomServiceAccount::from_file(path)
                            .map(Arc::new)
                            .map_err(|err| self.credentials_error(&err))
                    })
                    .await?;
                account.token(&[SCOPE]).await.map_err(|err| {
                    self.token_error(&err, &format!("{} named by {setting}", path.display()))
                })?
            }
            Credentials::Default(provider) => {
                let provider = provider
                    .get_or_try_init(|| async {
                        gcp_auth::provider()
                            .await
                            .map_err(|err| self.credentials_error(&err))
                    })
                    .await?;
                provider
                    .token(&[SCOPE])
                    .await
                    .map_err(|err| self.token_error(&err, "Application Default Credentials"))?
            }
        };
        Ok(Some(token.as_str().to_string()))
    }

    /// A credentials source that cannot be used: the file is missing or is not
    /// a service-account key, or none is found. Never quotes the file.
    fn credentials_error(&self, err: &gcp_auth::Error) -> CasError {
        let source = match &self.credentials {
            Credentials::KeyFile { path, setting, .. } => {
                format!(
                    "the service-account key {} named by {setting}",
                    path.display()
                )
            }
            _ => "Application Default Credentials".to_string(),
        };
        let why = match err {
            gcp_auth::Error::Io(_, io) => format!("cannot read it: {io}"),
            gcp_auth::Error::Json(_, json) => {
                let text = json.to_string();
                // serde names a missing field and nothing else; other errors may quote values.
                if text.starts_with("missing field") {
                    format!("it is not a service-account key: {text}")
                } else {
                    format!(
                        "it is not a service-account key (invalid JSON near line {}, column {})",
                        json.line(),
                        json.column()
                    )
                }
            }
            gcp_auth::Error::NoAuthMethod(..) => {
                return CasError::Refused(format!(
                    "no Google credentials found for bucket {}: set GOOGLE_APPLICATION_CREDENTIALS \
                     to a service-account key file, run `gcloud auth application-default login`, \
                     or run on Google Cloud with a service account (for an emulator, set {EMULATOR_ENV})",
                    self.bucket
                ))
            }
            // Fixed texts ("failed to parse PKCS#8 RSA key pair", ...); their sources may quote the key.
            gcp_auth::Error::Other(what, _)
            | gcp_auth::Error::Str(what)
            | gcp_auth::Error::Http(what, _) => what.to_string(),
        };
        CasError::Refused(format!("{source} cannot be used: {why}"))
    }

    /// Getting a token failed: the token service refused the credentials, or
    /// could not be reached.
    fn token_error(&self, err: &gcp_auth::Error, source: &str) -> CasError {
        match err {
            gcp_auth::Error::Other("HTTP request failed", cause) => CasError::Unavailable(format!(
                "cannot reach Google's token service for {source}: {}",
                super::root_cause(cause.as_ref())
            )),
            gcp_auth::Error::Http(what, cause) => CasError::Unavailable(format!(
                "Google's token service, for {source}: {what}: {}",
                super::root_cause(cause)
            )),
            gcp_auth::Error::Str("token request failed") => CasError::Refused(format!(
                "Google's token service refused {source}: check that the key is current \
                 (not deleted or disabled) and the account exists"
            )),
            other => self.credentials_error(other),
        }
    }

    /// Sends one request, with credentials, bounded retries of transient
    /// failures, and the operation's time bound; returns the final answer
    /// (an error status included) or why none came.
    async fn exchange(
        &self,
        what: &str,
        request: impl Fn() -> hyper::http::request::Builder,
        body: Bytes,
        content_type: Option<&str>,
    ) -> Result<Answer, CasError> {
        let deadline = Instant::now() + OPERATION_TIMEOUT;
        let token = match tokio::time::timeout_at(deadline, self.token()).await {
            Ok(token) => token?,
            Err(_) => {
                return Err(CasError::Unavailable(format!(
                    "no Google access token within {}s for {what}",
                    OPERATION_TIMEOUT.as_secs()
                )))
            }
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut builder = request();
            if let Some(token) = &token {
                builder = builder.header(AUTHORIZATION, format!("Bearer {token}"));
            }
            if let Some(content_type) = content_type {
                builder = builder.header(CONTENT_TYPE, content_type);
            }
            let built = builder.body(Full::new(body.clone())).map_err(|err| {
                CasError::Refused(format!("cannot build a request for {what}: {err}"))
            })?;
            let attempt_end = deadline.min(Instant::now() + ATTEMPT_TIMEOUT);
            let outcome = match tokio::time::timeout_at(attempt_end, self.send(built)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(format!(
                    "GCS at {} did not answer within {}s for {what}",
                    self.location,
                    ATTEMPT_TIMEOUT.as_secs()
                )),
            };
            let pause = match &outcome {
                Ok(answer) if answer.status == StatusCode::TOO_MANY_REQUESTS => THROTTLED_PAUSE,
                Ok(answer) if retryable(answer.status) => Duration::from_millis(100 << attempt),
                Ok(_) => return outcome.map_err(CasError::Unavailable),
                Err(_) => Duration::from_millis(100 << attempt),
            };
            let pause = pause.mul_f64(1.0 + 0.5 * fastrand::f64());
            if attempt >= HTTP_ATTEMPTS || Instant::now() + pause >= deadline {
                return outcome.map_err(CasError::Unavailable);
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// One HTTP exchange; the error is a message naming the cause.
    async fn send(&self, request: Request<Full<Bytes>>) -> Result<Answer, String> {
        let response = self.http.request(request).await.map_err(|err| {
            if err.is_connect() {
                format!(
                    "cannot reach GCS at {}: {}",
                    self.location,
                    super::root_cause(&err)
                )
            } else {
                format!(
                    "GCS at {} failed to answer: {}",
                    self.location,
                    super::root_cause(&err)
                )
            }
        })?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, MAX_ANSWER)
            .collect()
            .await
            .map_err(|err| {
                format!(
                    "reading an answer from GCS at {}: {}",
                    self.location,
                    super::root_cause(err.as_ref())
                )
            })?
            .to_bytes();
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// A multipart upload of `body` as object `name`, only if its generation is
    /// `generation` (0: only if it does not exist).
    async fn upload(
        &self,
        name: &str,
        body: Vec<u8>,
        generation: &str,
    ) -> Result<String, CasError> {
        let url = format!(
            "{}/upload/storage/v1/b/{}/o?uploadType=multipart&ifGenerationMatch={}&fields=generation",
            self.api,
            encode(&self.bucket),
            encode(generation)
        );
        let boundary = format!("runlock-{}", uuid::Uuid::new_v4().simple());
        let metadata = serde_json::json!({ "name": name, "contentType": "application/json" });
        let mut multipart = format!(
            "--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{metadata}\r\n\
             --{boundary}\r\nContent-Type: application/json\r\n\r\n"
        )
        .into_bytes();
        multipart.extend_from_slice(&body);
        multipart.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let what = self.object(name);
        let content_type = format!("multipart/related; boundary={boundary}");
        let answer = self
            .exchange(
                &what,
                || Request::post(url.as_str()),
                Bytes::from(multipart),
                Some(&content_type),
            )
            .await?;
        match self.sort(&answer, &what) {
            None => generation_of(&answer.body).ok_or_else(|| {
                CasError::Unavailable(format!(
                    "GCS at {} answered a write of {what} without a generation",
                    self.location
                ))
            }),
            Some(Failure::PreconditionFailed) => Err(CasError::Conflict),
            // An upload creates the object, so only the bucket can be missing.
            Some(Failure::NotFound) => Err(self.no_such_bucket()),
            Some(Failure::Other(err)) => Err(err),
        }
    }
}

/// Whether a status is worth another attempt.
fn retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 429 | 500 | 502 | 503 | 504)
}

/// The JSON error's message and first reason, when they are plain words; a
/// reason carrying anything else is dropped rather than echoed.
fn error_detail(body: &[u8]) -> (String, String) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return (String::new(), String::new());
    };
    let error = &value["error"];
    let message = error["message"].as_str().unwrap_or("").to_string();
    let reason = error["errors"][0]["reason"]
        .as_str()
        .filter(|r| r.len() <= 40 && r.chars().all(|c| c.is_ascii_alphanumeric() || c == ' '))
        .unwrap_or("")
        .to_string();
    (message, reason)
}

/// The `generation` of an upload's answer (a string in the JSON API).
fn generation_of(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    match &value["generation"] {
        serde_json::Value::String(text) if !text.is_empty() => Some(text.clone()),
        serde_json::Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

fn encode(text: &str) -> String {
    utf8_percent_encode(text, SEGMENT).to_string()
}

fn header_time(headers: &HeaderMap, name: hyper::header::HeaderName) -> Option<SystemTime> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| httpdate::parse_http_date(text).ok())
}

/// `gs://bucket/prefix` → (bucket, prefix without surrounding slashes).
fn parse_uri(uri: &str) -> anyhow::Result<(String, String)> {
    super::place_and_prefix(
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
fn emulator_url(host: &str) -> anyhow::Result<String> {
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

/// One HTTP/1.1 client with connection reuse. Plain HTTP is for emulators, so
/// when the system's CA certificates are missing it still works there.
fn http_client(plain: bool) -> anyhow::Result<HttpClient> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http.set_nodelay(true);
    let builder = match hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_native_roots(provider.clone())
    {
        Ok(builder) => builder,
        Err(_) if plain => {
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
        }
        Err(err) => anyhow::bail!(
            "cannot load the system's CA certificates for GCS ({err}): install ca-certificates"
        ),
    };
    let https = builder.https_or_http().enable_http1().wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(https))
}

#[async_trait]
impl CasStore for GcsStore {
    fn describe(&self) -> String {
        self.description.clone()
    }

    fn min_write_interval(&self) -> Duration {
        MIN_WRITE_INTERVAL
    }

    async fn get(&self, name: &str) -> Result<Read, CasError> {
        let url = format!(
            "{}/storage/v1/b/{}/o/{}?alt=media",
            self.api,
            encode(&self.bucket),
            encode(name)
        );
        let what = self.object(name);
        let answer = self
            .exchange(&what, || Request::get(url.as_str()), Bytes::new(), None)
            .await?;
        let date = header_time(&answer.headers, DATE);
        match self.sort(&answer, &what) {
            None => {}
            Some(Failure::NotFound) => return Ok(Read { object: None, date }),
            Some(Failure::Other(err)) => return Err(err),
            Some(Failure::PreconditionFailed) => {
                return Err(CasError::Unavailable(format!(
                    "GCS at {} answered a plain read of {what} with 412",
                    self.location
                )))
            }
        }
        // One request: the generation comes with the body, so the two always match.
        let version = answer
            .headers
            .get("x-goog-generation")
            .and_then(|value| value.to_str().ok())
            .filter(|text| !text.is_empty())
            .map(str::to_string)
            .ok_or_else(|| {
                CasError::Unavailable(format!(
                    "GCS at {} returned {what} without x-goog-generation",
                    self.location
                ))
            })?;
        Ok(Read {
            object: Some(Stored {
                body: answer.body.to_vec(),
                version,
                // Without it the engine falls back to watching the record unchanged.
                last_modified: header_time(&answer.headers, LAST_MODIFIED),
            }),
            date,
        })
    }

    async fn put_if_absent(&self, name: &str, body: Vec<u8>) -> Result<String, CasError> {
        self.upload(name, body, "0").await
    }

    async fn put_if_match(
        &self,
        name: &str,
        body: Vec<u8>,
        version: &str,
    ) -> Result<String, CasError> {
        self.upload(name, body, version).await
    }
}

#[cfg(test)]
mod tests {
    use super::super::{CasEngine, CasStore};
    use super::*;
    use crate::backend::fixtures::{lease, spec};

    const TTL: Duration = Duration::from_secs(10);
    use crate::backend::{Backend, BackendError};
    use runlock_protocol::{Key, KeyState};
    use std::io::Write as _;

    /// Would-be secrets planted in answers and key files: no message may carry them.
    const SECRET: &str = "s3cr3t-ya29-token";

    #[test]
    fn uris_name_a_bucket_and_an_optional_prefix() {
        let parse = |u: &str| parse_uri(u).expect("valid");
        assert_eq!(parse("gs://b"), ("b".into(), "".into()));
        assert_eq!(parse("gs://b/"), ("b".into(), "".into()));
        assert_eq!(
            parse("gs://b/meltano/state/"),
            ("b".into(), "meltano/state".into())
        );
        assert!(parse_uri("gs://").is_err());
        assert!(parse_uri("gs:///x").is_err());
        assert!(parse_uri("s3://b").is_err());
        let err = parse_uri(&format!("gs://user:{SECRET}@b/x")).expect_err("refused");
        assert!(!err.to_string().contains(SECRET), "{err}");
    }

    #[test]
    fn the_emulator_host_may_be_written_with_or_without_a_scheme() {
        assert_eq!(
            emulator_url("127.0.0.1:4443").expect("host:port"),
            "http://127.0.0.1:4443"
        );
        assert_eq!(
            emulator_url("http://localhost:9023/").expect("url"),
            "http://localhost:9023"
        );
        assert!(emulator_url("ftp://h:1").is_err());
        let err = emulator_url(&format!("http://u:{SECRET}@[bad")).expect_err("bad");
        assert!(!err.to_string().contains(SECRET), "{err}");
    }

    #[test]
    fn object_names_are_one_escaped_path_segment() {
        assert_eq!(
            encode("p/.runlock/locks/dev%3Aa.json"),
            "p%2F.runlock%2Flocks%2Fdev%253Aa.json"
        );
    }

    fn store_with(credentials: Credentials) -> GcsStore {
        let mut store =
            GcsStore::with("gs://my-bucket/p", &GcsOptions::default(), None, None).expect("opens");
        store.credentials = credentials;
        store
    }

    fn key_file(path: &std::path::Path) -> Credentials {
        Credentials::KeyFile {
            path: path.to_path_buf(),
            setting: "GOOGLE_APPLICATION_CREDENTIALS",
            account: OnceCell::new(),
        }
    }

    /// The store's reading of an answer `status` whose JSON error has `message`
    /// and `reason`, both carrying a would-be secret.
    fn answer(status: u16, message: &str, reason: &str) -> Option<Failure> {
        let body = serde_json::json!({"error": {"code": status, "message": message,
            "errors": [{"reason": reason, "message": format!("{message} {SECRET}")}]}});
        let answer = Answer {
            status: StatusCode::from_u16(status).expect("a status"),
            headers: HeaderMap::new(),
            body: Bytes::from(body.to_string()),
        };
        store_with(Credentials::Default(OnceCell::new()))
            .sort(&answer, "gs://my-bucket/p/.runlock/locks/k.json")
    }

    fn message(failure: Option<Failure>) -> (bool, String) {
        match failure {
            Some(Failure::Other(CasError::Refused(m))) => (true, m),
            Some(Failure::Other(CasError::Unavailable(m))) => (false, m),
            other => panic!("not an error with a message: {other:?}"),
        }
    }

    #[test]
    fn answers_are_sorted_by_status_and_reason_without_echoing_them() {
        assert_eq!(answer(200, "", ""), None);
        assert_eq!(
            answer(412, "Precondition failed", "conditionNotMet"),
            Some(Failure::PreconditionFailed)
        );
        // A bucket named like this one must not make a missing object a missing bucket.
        assert_eq!(
            answer(404, "No such object: my-bucket/p/k.json", "notFound"),
            Some(Failure::NotFound)
        );
        let (refused, text) = message(answer(
            404,
            "The specified bucket does not exist.",
            "notFound",
        ));
        assert!(refused);
        assert_eq!(
            text,
            "bucket my-bucket does not exist at Google Cloud Storage"
        );
        for status in [401, 403] {
            let (refused, text) = message(answer(status, SECRET, "forbidden"));
            assert!(refused, "{status}");
            assert!(
                text.starts_with(&format!(
                    "access denied to bucket my-bucket at Google Cloud Storage ({status} forbidden)"
                )),
                "{text}"
            );
            assert!(text.contains("GOOGLE_APPLICATION_CREDENTIALS"), "{text}");
            assert!(text.contains("gs://my-bucket/p/.runlock/locks/*"), "{text}");
        }
        for status in [429, 500, 503] {
            let (refused, _) = message(answer(status, SECRET, "backendError"));
            assert!(!refused, "{status} is worth retrying");
        }
        let (refused, text) = message(answer(400, SECRET, "invalid"));
        assert!(refused);
        assert!(text.ends_with(": 400 invalid"), "{text}");
        // A reason that is not plain words is dropped, not echoed.
        let (_, text) = message(answer(400, SECRET, &format!("bad {SECRET}!")));
        assert!(text.ends_with(": 400"), "{text}");
        for status in [400, 401, 403, 404, 409, 429, 500] {
            if let Some(Failure::Other(err)) = answer(status, SECRET, SECRET) {
                assert!(!err.to_string().contains(SECRET), "{status}: {err}");
            }
        }
    }

    #[test]
    fn a_write_answer_gives_its_generation() {
        assert_eq!(
            generation_of(br#"{"generation":"1796032005656719"}"#).as_deref(),
            Some("1796032005656719")
        );
        assert_eq!(
            generation_of(br#"{"generation":17}"#).as_deref(),
            Some("17")
        );
        assert_eq!(generation_of(br#"{"name":"x"}"#), None);
        assert_eq!(generation_of(b"not json"), None);
    }

    /// A credentials problem, as a read reports it (no request reaches GCS:
    /// the token comes first).
    async fn credentials_failure(credentials: Credentials) -> CasError {
        let store = store_with(credentials);
        store
            .get("p/.runlock/locks/k.json")
            .await
            .expect_err("no usable credentials")
    }

    #[tokio::test]
    async fn unusable_key_files_are_named_without_their_contents() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing.json");
        let err = credentials_failure(key_file(&missing)).await;
        let CasError::Refused(text) = err else {
            panic!("{err:?}")
        };
        assert!(text.contains(&missing.display().to_string()), "{text}");
        assert!(text.contains("GOOGLE_APPLICATION_CREDENTIALS"), "{text}");
        assert!(text.contains("cannot read it"), "{text}");

        let cases = [
            format!("{{\"private_key\": \"{SECRET}\", oops"),
            format!("{{\"type\": \"service_account\", \"private_key\": {{\"k\": \"{SECRET}\"}}}}"),
            format!("{{\"private_key\": 17, \"client_email\": \"{SECRET}\"}}"),
            format!(
                "{{\"type\": \"service_account\", \"private_key\": \"-----BEGIN PRIVATE KEY-----\\n\
                 {SECRET}\\n-----END PRIVATE KEY-----\\n\", \"client_email\": \"a@b\", \
                 \"token_uri\": \"http://127.0.0.1:9/token\"}}"
            ),
        ];
        for (i, contents) in cases.iter().enumerate() {
            let path = dir.path().join(format!("key-{i}.json"));
            std::fs::write(&path, contents).expect("write");
            let err = credentials_failure(key_file(&path)).await;
            let CasError::Refused(text) = &err else {
                panic!("{i}: {err:?}")
            };
            assert!(text.contains(&path.display().to_string()), "{i}: {text}");
            assert!(!text.contains(SECRET), "{i}: {text}");
        }
    }

    /// A service-account key file with a real RSA key (made by openssl), whose
    /// token service is `token_uri`.
    fn real_key_file(dir: &std::path::Path, token_uri: &str) -> (PathBuf, String) {
        let pem = std::process::Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
            ])
            .output()
            .expect("openssl runs");
        assert!(pem.status.success(), "openssl genpkey failed");
        let pem = String::from_utf8(pem.stdout).expect("PEM is text");
        let key = serde_json::json!({"type": "service_account", "project_id": "p",
            "private_key": pem, "client_email": "runlock@p.iam.gserviceaccount.com",
            "token_uri": token_uri});
        let path = dir.join("real-key.json");
        let mut file = std::fs::File::create(&path).expect("create");
        file.write_all(key.to_string().as_bytes()).expect("write");
        let secret = pem.lines().nth(5).expect("a key line").to_string();
        (path, secret)
    }

    #[tokio::test]
    async fn a_token_service_that_refuses_the_key_or_cannot_be_reached_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A local token service that refuses every key, as Google does a deleted one.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut peer, _)) = listener.accept().await {
                let mut request = vec![0; 64 * 1024];
                let _ = peer.read(&mut request).await;
                let body =
                    r#"{"error":"invalid_grant","error_description":"Invalid JWT Signature."}"#;
                let reply = format!(
                    "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = peer.write_all(reply.as_bytes()).await;
            }
        });
        let (path, secret) = real_key_file(dir.path(), &format!("http://127.0.0.1:{port}/token"));
        let err = credentials_failure(key_file(&path)).await;
        let CasError::Refused(text) = &err else {
            panic!("{err:?}")
        };
        assert!(text.contains("token service refused"), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(!text.contains(&secret), "{text}");

        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = closed.local_addr().expect("addr").port();
        drop(closed);
        let (path, secret) = real_key_file(dir.path(), &format!("http://127.0.0.1:{port}/token"));
        let err = credentials_failure(key_file(&path)).await;
        let CasError::Unavailable(text) = &err else {
            panic!("{err:?}")
        };
        assert!(
            text.contains("cannot reach Google's token service"),
            "{text}"
        );
        assert!(!text.contains(&secret), "{text}");
    }

    // Against fake-gcs-server (tests/scripts/fake_gcs.sh; scripts/test starts it).

    fn emulator() -> String {
        std::env::var("RUNLOCK_TEST_GCS_ENDPOINT").unwrap_or_else(|_| {
            panic!(
                "RUNLOCK_TEST_GCS_ENDPOINT is not set: start fake-gcs-server with \
                 `source tests/scripts/fake_gcs.sh && fake_gcs_start` (scripts/test does)"
            )
        })
    }

    /// A new, empty bucket on the emulator, and a store on it under prefix `p`.
    async fn bucket(what: &str) -> (GcsStore, String) {
        let endpoint = emulator();
        let name = format!(
            "{what}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let request = Request::post(format!("{endpoint}/storage/v1/b?project=test"))
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(
                serde_json::json!({ "name": name }).to_string(),
            )))
            .expect("request");
        let answer = http_client(true)
            .expect("client")
            .request(request)
            .await
            .expect("the emulator answers");
        assert!(
            answer.status().is_success(),
            "creating bucket {name}: {answer:?}"
        );
        let store = GcsStore::with(
            &format!("gs://{name}/p"),
            &GcsOptions::default(),
            Some(&endpoint),
            None,
        )
        .expect("opens");
        (store, name)
    }

    #[tokio::test]
    async fn creates_and_replaces_only_on_the_generation_read_with_the_body() {
        let (store, _) = bucket("cas").await;
        store.probe().await.expect("the bucket answers");
        let name = "p/.runlock/locks/k.json";
        let absent = store.get(name).await.expect("read");
        assert_eq!(absent.object, None);
        assert!(
            absent.date.is_some(),
            "the store's clock comes with a miss too"
        );

        let first = store
            .put_if_absent(name, b"{\"n\":1}".to_vec())
            .await
            .expect("created");
        assert_eq!(
            store.put_if_absent(name, b"{\"n\":2}".to_vec()).await,
            Err(CasError::Conflict)
        );
        let read = store.get(name).await.expect("read");
        let stored = read.object.expect("present");
        assert_eq!(
            (stored.body.as_slice(), stored.version.as_str()),
            (&b"{\"n\":1}"[..], first.as_str())
        );
        let (written, now) = (
            stored.last_modified.expect("Last-Modified"),
            read.date.expect("Date"),
        );
        assert!(
            now + Duration::from_secs(1) >= written,
            "{written:?} after {now:?}"
        );

        let second = store
            .put_if_match(name, b"{\"n\":3}".to_vec(), &first)
            .await
            .expect("replaced");
        assert_ne!(first, second);
        assert_eq!(
            store
                .put_if_match(name, b"{\"n\":4}".to_vec(), &first)
                .await,
            Err(CasError::Conflict),
            "a stale generation"
        );
        assert_eq!(
            store
                .put_if_match("p/.runlock/locks/none.json", b"{}".to_vec(), &first)
                .await,
            Err(CasError::Conflict),
            "a generation of an object that does not exist"
        );
        let read = store.get(name).await.expect("read");
        assert_eq!(
            read.object.map(|o| (o.body, o.version)),
            Some((b"{\"n\":3}".to_vec(), second))
        );
    }

    #[tokio::test]
    async fn of_racing_creates_exactly_one_wins() {
        let (store, _) = bucket("race").await;
        let store = Arc::new(store);
        let writers: Vec<_> = (0..8)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    store
                        .put_if_absent("p/.runlock/locks/r.json", format!("{{\"w\":{i}}}").into())
                        .await
                })
            })
            .collect();
        let mut won = 0;
        for writer in writers {
            match writer.await.expect("joins") {
                Ok(_) => won += 1,
                Err(CasError::Conflict) => {}
                Err(other) => panic!("{other}"),
            }
        }
        assert_eq!(won, 1);
    }

    #[tokio::test]
    async fn the_engine_on_gcs_excludes_frees_and_spaces_its_writes() {
        let (store, bucket) = bucket("engine").await;
        let prefix = store.records_prefix().to_string();
        let store: Arc<dyn CasStore> = Arc::new(store);
        let one = CasEngine::new(store.clone(), prefix.clone());
        let two = CasEngine::new(store.clone(), prefix.clone());
        assert_eq!(one.min_ttl(), Duration::from_secs(5));

        let started = Instant::now();
        let grant = one
            .acquire(&spec("dev:k", "l1", false, TTL))
            .await
            .expect("free");
        assert_eq!(grant.holder.token, 1);
        match two.acquire(&spec("dev:k", "l2", false, TTL)).await {
            Err(BackendError::Held(Some(holder))) => {
                assert_eq!((holder.host.as_str(), holder.token), ("host-of-l1", 1))
            }
            other => panic!("expected held, got {other:?}"),
        }
        one.release(&lease("dev:k", "l1", 1))
            .await
            .expect("release");
        assert!(
            started.elapsed() >= MIN_WRITE_INTERVAL,
            "the release went out {:?} after the acquire",
            started.elapsed()
        );
        let name = format!("{prefix}dev%3Ak.json");
        let record: serde_json::Value = serde_json::from_slice(
            &store
                .get(&name)
                .await
                .expect("read")
                .object
                .expect("kept")
                .body,
        )
        .expect("a JSON record");
        assert_eq!(record["state"], "free");
        assert_eq!(record["token"], 1);
        assert!(
            name.starts_with(&format!("p/{}", super::super::RECORDS)),
            "{name} in {bucket}"
        );

        let grant = two
            .acquire(&spec("dev:k", "l2", false, TTL))
            .await
            .expect("freed");
        assert_eq!(grant.holder.token, 2);
        two.renew(&lease("dev:k", "l2", 2), Duration::from_secs(10))
            .await
            .expect("renew");
        let inspected = one
            .inspect(&Key::new("dev:k").expect("valid"))
            .await
            .expect("inspect");
        assert_eq!((inspected.state, inspected.token), (KeyState::Held, 2));
        assert!(
            inspected.expires_in_ms.is_some_and(|ms| ms <= 10_000),
            "{inspected:?}"
        );
    }

    #[tokio::test]
    async fn a_missing_bucket_and_a_refused_endpoint_are_named() {
        let endpoint = emulator();
        let store = GcsStore::with(
            "gs://no-such-bucket-here/p",
            &GcsOptions::default(),
            Some(&endpoint),
            None,
        )
        .expect("opens");
        let expected = format!("bucket no-such-bucket-here does not exist at {endpoint}");
        assert_eq!(
            store.probe().await,
            Err(CasError::Refused(expected.clone()))
        );
        let engine = CasEngine::new(Arc::new(store), "p/.runlock/locks/");
        match engine.acquire(&spec("k", "l1", false, TTL)).await {
            Err(BackendError::Unavailable(text)) => assert_eq!(text, expected),
            other => panic!("{other:?}"),
        }

        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = closed.local_addr().expect("addr").port();
        drop(closed);
        let store = GcsStore::with(
            "gs://b/p",
            &GcsOptions::default(),
            Some(&format!("127.0.0.1:{port}")),
            None,
        )
        .expect("opens");
        let started = Instant::now();
        match store.probe().await {
            Err(CasError::Unavailable(text)) => assert!(
                text.starts_with(&format!("cannot reach GCS at http://127.0.0.1:{port}: ")),
                "{text}"
            ),
            other => panic!("{other:?}"),
        }
        assert!(
            started.elapsed() <= OPERATION_TIMEOUT,
            "{:?}",
            started.elapsed()
        );
    }
}
