//! What an S3 answer means (`Failure`'s shape), by status and error code, in
//! words that name the bucket and what to check. No message carries a
//! secret: service errors are named by their code, access errors by a fixed
//! text.

use super::S3Store;
use crate::backend::cas::root_cause;
use crate::backend::failure;
use crate::backend::retry::TIMEOUTS;
use aws_credential_types::provider::error::CredentialsError;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use std::error::Error as StdError;

/// The answers to one request that an operation handles itself.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Handled {
    /// 404 for the object (not the bucket).
    NoSuchKey,
    /// 412: the condition did not hold.
    PreconditionFailed,
    /// 409 ConditionalRequestConflict: a concurrent conditional write; try again.
    Busy,
}

pub(super) type Failure = failure::Failure<Handled>;

impl S3Store {
    pub(super) fn no_such_bucket_message(&self) -> String {
        format!("bucket {} does not exist at {}", self.bucket, self.location)
    }

    /// The SDK found no credentials: named as such, with where it looked,
    /// rather than as the last place's failure (IMDS's, most often).
    fn no_credentials_message(&self, cause: &str) -> String {
        match &self.credentials_looked_in {
            Some(looked_in) => format!(
                "no AWS credentials found for S3 at {}: looked in {looked_in} (the last \
                 said: {cause}); set one of them, or [s3] access_key_id and \
                 secret_access_key in the configuration file",
                self.location
            ),
            None => format!("no AWS credentials for S3 at {}: {cause}", self.location),
        }
    }

    /// Sorts an SDK error; `name` is the object the request was about.
    pub(super) fn classify<E>(&self, err: SdkError<E, HttpResponse>, name: &str) -> Failure
    where
        E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
    {
        let what = if name.is_empty() {
            format!("bucket {}", self.bucket)
        } else {
            format!("s3://{}/{name}", self.bucket)
        };
        if let Some(cause) = credentials_failure(&err) {
            return Failure::Transient(self.no_credentials_message(&cause));
        }
        match &err {
            SdkError::ServiceError(service) => {
                let status = service.raw().status().as_u16();
                let code = service.err().code().unwrap_or("");
                match (status, code) {
                    (_, "NoSuchBucket") => Failure::Refused(self.no_such_bucket_message()),
                    (404, _) => Failure::Expected(Handled::NoSuchKey),
                    (412, _) | (_, "PreconditionFailed") => {
                        Failure::Expected(Handled::PreconditionFailed)
                    }
                    (409, "ConditionalRequestConflict") => Failure::Expected(Handled::Busy),
                    (403, _)
                    | (
                        _,
                        "AccessDenied"
                        | "InvalidAccessKeyId"
                        | "SignatureDoesNotMatch"
                        | "ExpiredToken"
                        | "InvalidToken"
                        | "TokenRefreshRequired",
                    ) => Failure::Refused(format!(
                        "access denied to bucket {} at {} ({}): check the credentials \
                         (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the \
                         instance role) and that they may read and write s3://{}/{}*",
                        self.bucket,
                        self.location,
                        if code.is_empty() { "403" } else { code },
                        self.bucket,
                        self.site.records,
                    )),
                    (301, _) | (_, "PermanentRedirect" | "AuthorizationHeaderMalformed") => {
                        Failure::Refused(format!(
                            "bucket {} is not in {} ({}): set AWS_REGION to the bucket's region",
                            self.bucket,
                            self.location,
                            if code.is_empty() { "301" } else { code },
                        ))
                    }
                    (501, _) | (_, "NotImplemented") => Failure::Refused(format!(
                        "the store at {} does not support conditional writes \
                         (If-None-Match / If-Match on PutObject), which runlock needs",
                        self.location
                    )),
                    (500.., _) | (409 | 429, _) | (_, "SlowDown" | "RequestTimeout") => {
                        Failure::Transient(format!(
                            "S3 at {} answered {status} {code} for {what}",
                            self.location
                        ))
                    }
                    _ => Failure::Refused(format!(
                        "S3 at {} refused a request for {what}: {status} {code}",
                        self.location
                    )),
                }
            }
            SdkError::TimeoutError(_) => Failure::Transient(format!(
                "S3 at {} did not answer within {}s for {what}",
                self.location,
                TIMEOUTS.operation.as_secs()
            )),
            SdkError::DispatchFailure(dispatch) => {
                let cause = root_cause(&err);
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
                Failure::Transient(message)
            }
            SdkError::ResponseError(_) => Failure::Transient(format!(
                "S3 at {} sent an unreadable answer for {what}: {}",
                self.location,
                root_cause(&err)
            )),
            // Building or signing the request failed: no credentials, a bad region.
            _ => Failure::Refused(format!(
                "cannot make a request to S3 at {} for {what}: {}",
                self.location,
                root_cause(&err)
            )),
        }
    }
}

/// Why the SDK could not get credentials, when that is why `err` happened
/// (the credential chain's own error is among its causes).
fn credentials_failure(err: &(dyn StdError + 'static)) -> Option<String> {
    let mut cause = Some(err);
    while let Some(current) = cause {
        if current.is::<CredentialsError>() {
            return Some(root_cause(current));
        }
        cause = current.source();
    }
    None
}
