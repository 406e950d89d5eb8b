//! What an Azure Blob answer means (`Failure`'s shape), by status and
//! `x-ms-error-code`, in words that name the container and what to check,
//! never the key: transport failures are named by their root cause.

use super::AzureStore;
use crate::backend::cas::root_cause;
use crate::backend::failure;
use azure_core::error::ErrorKind;

/// The answers to one request that an operation handles itself.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Handled {
    /// 404 for the blob (not the container).
    NoSuchBlob,
    /// 409 BlobAlreadyExists (`If-None-Match: *`) or 412 ConditionNotMet (`If-Match`).
    PreconditionFailed,
}

pub(super) type Failure = failure::Failure<Handled>;

impl AzureStore {
    /// Sorts an SDK error; `name` is the blob the request was about.
    pub(super) fn classify(&self, err: &azure_core::Error, name: &str) -> Failure {
        let what = format!("azure://{}/{name}", self.container_name);
        match err.kind() {
            ErrorKind::HttpResponse { status, error_code } => {
                let status = *status as u16;
                let code = error_code.as_deref().unwrap_or("");
                self.answer(status, code, &what)
            }
            ErrorKind::Io => Failure::Transient(format!(
                "cannot reach Azure Blob at {}: {}",
                self.location,
                root_cause(err)
            )),
            ErrorKind::DataConversion => Failure::Transient(format!(
                "Azure Blob at {} sent an unreadable answer for {what}: {}",
                self.location,
                root_cause(err)
            )),
            // No token: each source of the chain says why (never a secret).
            ErrorKind::Credential => Failure::Refused(format!(
                "cannot get a token for Azure Blob at {} ({}, {}): {}",
                self.location,
                self.credential,
                self.source,
                root_cause(err)
            )),
            // Signing failed, or the request could not be built.
            _ => Failure::Refused(format!(
                "cannot make a request to Azure Blob at {} for {what}: {}",
                self.location,
                root_cause(err)
            )),
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
            (404, "ContainerNotFound") => Failure::Refused(format!(
                "container {} does not exist at {}: create it (az storage container create \
                 --name {}) or fix the backend URI",
                self.container_name, self.location, self.container_name
            )),
            (404, "BlobNotFound" | "") => Failure::Expected(Handled::NoSuchBlob),
            (409, "BlobAlreadyExists") | (412, "ConditionNotMet" | "") => {
                Failure::Expected(Handled::PreconditionFailed)
            }
            // Someone put an Azure lease on our record: no write succeeds until it is broken.
            (412, code) if code.starts_with("Lease") => Failure::Refused(format!(
                "{what} at {} carries an Azure lease ({code}) that runlock did not take: \
                 break it (az storage blob lease break)",
                self.location
            )),
            (403, _) => Failure::Refused(format!(
                "access denied to container {} at {} ({shown}): check the {} ({}) and that \
                 it may read, write, create, delete and list blobs under {}",
                self.container_name, self.location, self.credential, self.source, self.site.records
            )),
            (408 | 429 | 500.., _) => Failure::Transient(format!(
                "Azure Blob at {} answered {shown} for {what}",
                self.location
            )),
            _ => Failure::Refused(format!(
                "Azure Blob at {} refused a request for {what}: {shown}",
                self.location
            )),
        }
    }
}
