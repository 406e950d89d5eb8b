//! What the S3 SDK does not hand back by itself: the answer's `Date`
//! header, the store's clock.

use crate::unpoisoned::Unpoisoned;
use aws_sdk_s3::config::interceptors::BeforeDeserializationInterceptorContextRef;
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// Records the response's `Date` header, for one request.
#[derive(Debug, Default, Clone)]
pub(super) struct CaptureDate(Arc<Mutex<Option<SystemTime>>>);

impl CaptureDate {
    pub(super) fn take(&self) -> Option<SystemTime> {
        self.0.locked().take()
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
        *self.0.locked() = date;
        Ok(())
    }
}
