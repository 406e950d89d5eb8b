//! Talking to the GCS JSON API: one HTTP/1.1 client, an access token per
//! request, and each exchange bounded in time with bounded retries of
//! transient failures.

use super::errors::retryable;
use super::settings::Credentials;
use super::GcsStore;
use crate::backend::cas::{root_cause, CasError, CasResult};
use crate::backend::retry::{TIMEOUTS, TRANSIENT};
use bytes::Bytes;
use gcp_auth::{CustomServiceAccount, TokenProvider};
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderMap, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Request, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// The OAuth scope for reading and writing objects.
const SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_write";
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

pub(super) type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// One HTTP answer, read whole.
pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
}

impl GcsStore {
    /// An access token for the next request; `None` for an emulator.
    pub(super) async fn token(&self) -> CasResult<Option<String>> {
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
            Credentials::Inline(key) => key.account.token(&[SCOPE]).await.map_err(|err| {
                self.token_error(
                    &err,
                    &format!("the key of {} from {}", key.client_email, key.setting),
                )
            })?,
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

    /// Sends one request, with credentials, bounded retries of transient
    /// failures, and the operation's time bound; returns the final answer
    /// (an error status included) or why none came.
    pub(super) async fn exchange(
        &self,
        what: &str,
        request: impl Fn() -> hyper::http::request::Builder,
        body: Bytes,
        content_type: Option<&str>,
    ) -> CasResult<Answer> {
        let deadline = Instant::now() + TIMEOUTS.operation;
        let token = match tokio::time::timeout_at(deadline, self.token()).await {
            Ok(token) => token?,
            Err(_) => {
                return Err(CasError::Unavailable(format!(
                    "no Google access token within {}s for {what}",
                    TIMEOUTS.operation.as_secs()
                )))
            }
        };
        let (token, request, body) = (&token, &request, &body);
        // A retryable answer or failure is the error of a try; the last one
        // stands, an error status included.
        let exchanged = TRANSIENT
            .run_paced(
                Some(deadline),
                |_| async move {
                    let mut builder = request();
                    if let Some(token) = token {
                        builder = builder.header(AUTHORIZATION, format!("Bearer {token}"));
                    }
                    if let Some(content_type) = content_type {
                        builder = builder.header(CONTENT_TYPE, content_type);
                    }
                    let built = builder.body(Full::new(body.clone())).map_err(|err| {
                        Err(CasError::Refused(format!(
                            "cannot build a request for {what}: {err}"
                        )))
                    })?;
                    let attempt_end = deadline.min(Instant::now() + TIMEOUTS.attempt);
                    let answer = match tokio::time::timeout_at(attempt_end, self.send(built)).await
                    {
                        Ok(outcome) => outcome,
                        Err(_) => Err(format!(
                            "GCS at {} did not answer within {}s for {what}",
                            self.location,
                            TIMEOUTS.attempt.as_secs()
                        )),
                    }
                    .map_err(|why| Err(CasError::Unavailable(why)))?;
                    if matches!(answer.status.as_u16(), 429 | 503) {
                        self.observer.throttled("gcs");
                    }
                    if retryable(answer.status) {
                        Err(Ok(answer))
                    } else {
                        Ok(answer)
                    }
                },
                |failed, tried| match failed {
                    Ok(answer) if answer.status == StatusCode::TOO_MANY_REQUESTS => {
                        Some(TRANSIENT.pause(tried).max(THROTTLED_PAUSE))
                    }
                    Ok(_) | Err(CasError::Unavailable(_)) => Some(TRANSIENT.pause(tried)),
                    Err(_) => None,
                },
            )
            .await;
        exchanged.or_else(|last| last)
    }

    /// One HTTP exchange; the error is a message naming the cause.
    pub(super) async fn send(&self, request: Request<Full<Bytes>>) -> Result<Answer, String> {
        let response = self.http.request(request).await.map_err(|err| {
            if err.is_connect() {
                format!(
                    "cannot reach GCS at {}: {}",
                    self.location,
                    root_cause(&err)
                )
            } else {
                format!(
                    "GCS at {} failed to answer: {}",
                    self.location,
                    root_cause(&err)
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
                    root_cause(err.as_ref())
                )
            })?
            .to_bytes();
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }
}

/// The `generation` of an upload's answer (a string in the JSON API).
pub(super) fn generation_of(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    match &value["generation"] {
        serde_json::Value::String(text) if !text.is_empty() => Some(text.clone()),
        serde_json::Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

pub(super) fn encode(text: &str) -> String {
    utf8_percent_encode(text, SEGMENT).to_string()
}

pub(super) fn header_time(
    headers: &HeaderMap,
    name: hyper::header::HeaderName,
) -> Option<SystemTime> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| httpdate::parse_http_date(text).ok())
}

/// One HTTP/1.1 client with connection reuse. Plain HTTP is for emulators, so
/// when the system's CA certificates are missing it still works there.
pub(super) fn http_client(plain: bool) -> anyhow::Result<HttpClient> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(TIMEOUTS.connect));
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
