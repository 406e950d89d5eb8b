//! What a failed file operation means: the path and the operation, as the
//! backend's error.

use super::Inner;
use crate::backend::BackendError;
use std::io;

impl Inner {
    pub(super) fn io_error(
        &self,
        what: &str,
        name: &str,
        err: impl Into<io::Error>,
    ) -> BackendError {
        let err = err.into();
        BackendError::Unavailable(format!("{what} {}: {err}", self.path(name).display()))
    }
}
