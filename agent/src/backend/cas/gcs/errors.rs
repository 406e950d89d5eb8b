//! What a GCS answer means (`Failure`'s shape) and what a credentials
//! problem is, in words that name the bucket and what to check, never a
//! token, a key or an answer's own text beyond plain words.

use super::settings::{Credentials, EMULATOR_ENV};
use super::transport::Answer;
use super::GcsStore;
use crate::backend::cas::{root_cause, CasError};
use crate::backend::failure;
use hyper::StatusCode;

/// The answers to one request that an operation handles itself.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Handled {
    /// 404 for the object (not the bucket).
    NotFound,
    /// 412: the generation did not match.
    PreconditionFailed,
}

pub(super) type Failure = failure::Failure<Handled>;

impl GcsStore {
    pub(super) fn no_such_bucket(&self) -> CasError {
        CasError::Refused(self.no_such_bucket_message())
    }

    pub(super) fn no_such_bucket_message(&self) -> String {
        format!("bucket {} does not exist at {}", self.bucket, self.location)
    }

    /// What an answer means; `None` for success.
    pub(super) fn classify(&self, answer: &Answer, what: &str) -> Option<Failure> {
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
                Failure::Refused(self.no_such_bucket_message())
            }
            404 => Failure::Expected(Handled::NotFound),
            412 => Failure::Expected(Handled::PreconditionFailed),
            401 | 403 => Failure::Refused(format!(
                "access denied to bucket {} at {} ({named}): check the credentials ({}) and \
                 that they may read and write gs://{}/{}*",
                self.bucket,
                self.location,
                self.credentials_hint(),
                self.bucket,
                self.site.records,
            )),
            429 => Failure::Transient(format!(
                "GCS at {} is throttling requests for {what} ({named}): too many writes to \
                 one lock record, or to the bucket",
                self.location
            )),
            408 | 500.. => Failure::Transient(format!(
                "GCS at {} answered {named} for {what}",
                self.location
            )),
            _ => Failure::Refused(format!(
                "GCS at {} refused a request for {what}: {named}",
                self.location
            )),
        })
    }

    /// Where the credentials come from, for "access denied" messages.
    pub(super) fn credentials_hint(&self) -> String {
        match &self.credentials {
            Credentials::Emulator => format!("{EMULATOR_ENV} names an emulator: none are sent"),
            Credentials::Default(_) => "GOOGLE_APPLICATION_CREDENTIALS, `gcloud auth \
                                        application-default login`, or the instance's service \
                                        account"
                .to_string(),
            _ => self.key_named(),
        }
    }

    /// The service-account key the credentials are, named for a message
    /// (never quoted); for the others, where they are looked for.
    fn key_named(&self) -> String {
        match &self.credentials {
            Credentials::KeyFile { path, setting, .. } => format!(
                "the service-account key {} named by {setting}",
                path.display()
            ),
            Credentials::Inline(key) => format!(
                "the service-account key of {} from {}",
                key.client_email, key.setting
            ),
            _ => "Application Default Credentials".to_string(),
        }
    }

    /// A credentials source that cannot be used: the file is missing or is not
    /// a service-account key, or none is found. Never quotes the file.
    pub(super) fn credentials_error(&self, err: &gcp_auth::Error) -> CasError {
        let source = self.key_named();
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
    pub(super) fn token_error(&self, err: &gcp_auth::Error, source: &str) -> CasError {
        match err {
            gcp_auth::Error::Other("HTTP request failed", cause) => CasError::Unavailable(format!(
                "cannot reach Google's token service for {source}: {}",
                root_cause(cause.as_ref())
            )),
            gcp_auth::Error::Http(what, cause) => CasError::Unavailable(format!(
                "Google's token service, for {source}: {what}: {}",
                root_cause(cause)
            )),
            gcp_auth::Error::Str("token request failed") => CasError::Refused(format!(
                "Google's token service refused {source}: check that the key is current \
                 (not deleted or disabled) and the account exists"
            )),
            other => self.credentials_error(other),
        }
    }
}

/// Whether a status is worth another attempt.
pub(super) fn retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 429 | 500 | 502 | 503 | 504)
}

/// The JSON error's message and first reason, when they are plain words; a
/// reason carrying anything else is dropped rather than echoed.
pub(super) fn error_detail(body: &[u8]) -> (String, String) {
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
