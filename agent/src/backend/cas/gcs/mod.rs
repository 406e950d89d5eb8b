//! The Google Cloud Storage adapter of the compare-and-swap trait, over the
//! JSON API: multipart uploads with `ifGenerationMatch=0` (create) or
//! `ifGenerationMatch=<generation>` (replace), and one `alt=media` read whose
//! `x-goog-generation`, `Last-Modified` and `Date` headers carry the version
//! and the store's clock.
//!
//! `gs://bucket/prefix` keeps lock records under `prefix/.runlock/locks/`, as
//! s3:// does. Credentials: `[gcs] credentials_json` or `credentials_file`,
//! else a key's JSON in `RUNLOCK_GCS_CREDENTIALS_JSON` (or Meltano's
//! variable), else Application Default Credentials
//! (`GOOGLE_APPLICATION_CREDENTIALS`, gcloud's user credentials, the metadata
//! server, the gcloud CLI). `STORAGE_EMULATOR_HOST` points it at
//! an emulator, spoken to without credentials. No message built here carries
//! a secret: answers are named by status and reason, credential problems by
//! fixed texts.
//!
//! Why not a GCS client crate: the lease engine needs the answer's `Date`
//! header (the store's clock) and preconditions on multipart uploads (the only
//! ones the emulator enforces), and the JSON API it needs is three requests.

mod errors;
mod inline_key;
mod settings;
#[cfg(test)]
mod tests;
mod transport;

pub use settings::EMULATOR_ENV;

use super::{CasError, CasResult, CasStore, Names, Precondition, Read, Site, Stored};
use crate::backend::{redact_uri, GcsOptions, StoreContext, StoreObserver, Unobserved};
use async_trait::async_trait;
use bytes::Bytes;
use errors::{Failure, Handled};
use hyper::header::{DATE, LAST_MODIFIED};
use hyper::Request;
use settings::{emulator_url, parse_uri, Credentials, Source, GOOGLE_API};
use std::sync::Arc;
use std::time::Duration;
use transport::{encode, generation_of, header_time, http_client, Answer, HttpClient};

/// GCS sustains about one write per second to one object name.
const MIN_WRITE_INTERVAL: Duration = Duration::from_secs(1);

/// A GCS bucket as a compare-and-swap store.
pub struct GcsStore {
    http: HttpClient,
    /// `https://storage.googleapis.com` or the emulator's URL, without a trailing `/`.
    api: String,
    credentials: Credentials,
    bucket: String,
    /// The records' object name prefix (`prefix/.runlock/locks/`), the URI
    /// and the emulator if any.
    site: Site,
    /// Where the bucket is, for messages.
    location: String,
    /// Told of each answer that said slow down.
    observer: Arc<dyn StoreObserver>,
}

impl GcsStore {
    /// The answer to a listing of the bucket's objects with `query`, `what`
    /// naming it in errors: a missing bucket is a bare 404 here.
    async fn listing(&self, query: &str, what: &str) -> CasResult<Answer> {
        let url = format!(
            "{}/storage/v1/b/{}/o?{query}",
            self.api,
            encode(&self.bucket)
        );
        let answer = self
            .exchange(what, || Request::get(url.as_str()), Bytes::new(), None)
            .await?;
        match self
            .classify(&answer, what)
            .map(Failure::expected)
            .transpose()?
        {
            None => Ok(answer),
            Some(Handled::NotFound) => Err(self.no_such_bucket()),
            Some(Handled::PreconditionFailed) => Err(CasError::Unavailable(format!(
                "GCS at {} answered a listing of {what} with 412",
                self.location
            ))),
        }
    }

    /// Opens `gs://bucket/prefix`: an emulator if `STORAGE_EMULATOR_HOST` is
    /// set, else GCS with `options`' credentials or Application Default
    /// Credentials. Makes no request; see [`GcsStore::probe`].
    pub fn open(
        uri: &str,
        options: &GcsOptions,
        context: &StoreContext,
    ) -> anyhow::Result<GcsStore> {
        Ok(GcsStore {
            observer: context.observer.clone(),
            ..GcsStore::with(uri, options, &process_env)?
        })
    }

    /// Where `open` would take credentials from, for `check-config`; makes no request.
    pub fn describe_credentials(options: &GcsOptions) -> anyhow::Result<String> {
        if let Some(host) = process_env(EMULATOR_ENV) {
            return Ok(format!(
                "none: {EMULATOR_ENV} names the emulator {}",
                redact_uri(&emulator_url(&host)?)
            ));
        }
        Ok(Source::find(options, &process_env)?.describe())
    }

    /// [`GcsStore::open`] on the emulator at `endpoint`, whatever the environment says.
    #[cfg(feature = "test-support")]
    pub(crate) fn on_emulator(uri: &str, endpoint: &str) -> anyhow::Result<GcsStore> {
        let endpoint = endpoint.to_string();
        let env = move |name: &str| (name == EMULATOR_ENV).then(|| endpoint.clone());
        GcsStore::with(uri, &GcsOptions::default(), &env)
    }

    /// [`GcsStore::open`] with `env` standing for the environment.
    fn with(
        uri: &str,
        options: &GcsOptions,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<GcsStore> {
        let (bucket, prefix) = parse_uri(uri)?;
        // Loaded even for an emulator, which needs none, so that a bad key
        // is found before the agent moves to the real service.
        let configured = Source::find(options, env)?.credentials()?;
        let emulator = env(EMULATOR_ENV).filter(|host| !host.trim().is_empty());
        let (api, credentials) = match &emulator {
            Some(host) => (emulator_url(host)?, Credentials::Emulator),
            None => (GOOGLE_API.to_string(), configured),
        };
        let (reached, location) = match emulator {
            Some(_) => {
                let shown = redact_uri(&api);
                (Some(format!("emulator {shown}")), shown)
            }
            None => (None, "Google Cloud Storage".to_string()),
        };
        let site = Site::object_store("gs", &bucket, &prefix, reached, MIN_WRITE_INTERVAL);
        Ok(GcsStore {
            http: http_client(api.starts_with("http://"))?,
            api,
            credentials,
            bucket,
            site,
            location,
            observer: Arc::new(Unobserved),
        })
    }

    fn object(&self, name: &str) -> String {
        format!("gs://{}/{name}", self.bucket)
    }

    /// Object `name`'s address in the JSON API.
    fn object_url(&self, name: &str) -> String {
        format!(
            "{}/storage/v1/b/{}/o/{}",
            self.api,
            encode(&self.bucket),
            encode(name)
        )
    }

    /// A multipart upload of `body` as object `name`, only if its generation is
    /// `generation` (0: only if it does not exist).
    async fn upload(&self, name: &str, body: Vec<u8>, generation: &str) -> CasResult<String> {
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
        match self
            .classify(&answer, &what)
            .map(Failure::expected)
            .transpose()?
        {
            None => generation_of(&answer.body).ok_or_else(|| {
                CasError::Unavailable(format!(
                    "GCS at {} answered a write of {what} without a generation",
                    self.location
                ))
            }),
            Some(Handled::PreconditionFailed) => Err(CasError::Conflict),
            // An upload creates the object, so only the bucket can be missing.
            Some(Handled::NotFound) => Err(self.no_such_bucket()),
        }
    }
}

#[async_trait]
impl CasStore for GcsStore {
    fn site(&self) -> &Site {
        &self.site
    }

    /// Checks that the bucket answers and lets us list the records' prefix;
    /// the error names the cause.
    async fn probe(&self) -> CasResult<()> {
        let query = format!(
            "maxResults=1&fields=kind&prefix={}",
            encode(&self.site.records)
        );
        let what = format!("bucket {}", self.bucket);
        self.listing(&query, &what).await.map(|_| ())
    }

    async fn get(&self, name: &str) -> CasResult<Read> {
        let url = format!("{}?alt=media", self.object_url(name));
        let what = self.object(name);
        let answer = self
            .exchange(&what, || Request::get(url.as_str()), Bytes::new(), None)
            .await?;
        let date = header_time(&answer.headers, DATE);
        match self
            .classify(&answer, &what)
            .map(Failure::expected)
            .transpose()?
        {
            None => {}
            Some(Handled::NotFound) => return Ok(Read { object: None, date }),
            Some(Handled::PreconditionFailed) => {
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

    async fn put(&self, name: &str, body: Vec<u8>, when: Precondition<'_>) -> CasResult<String> {
        // Generation 0: only if there is none.
        self.upload(name, body, when.version().unwrap_or("0")).await
    }

    async fn list(&self, prefix: &str, page: Option<&str>, limit: usize) -> CasResult<Names> {
        let mut query = format!(
            "prefix={}&maxResults={limit}&fields=items(name,generation),nextPageToken",
            encode(prefix)
        );
        if let Some(page) = page {
            query.push_str(&format!("&pageToken={}", encode(page)));
        }
        let what = format!("the objects of bucket {} under {prefix:?}", self.bucket);
        let answer = self.listing(&query, &what).await?;
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Listing {
            #[serde(default)]
            items: Vec<Item>,
            next_page_token: Option<String>,
        }
        #[derive(serde::Deserialize)]
        struct Item {
            name: String,
            generation: Option<String>,
        }
        let listing: Listing = serde_json::from_slice(&answer.body).map_err(|e| {
            CasError::Unavailable(format!(
                "GCS at {} answered a listing of {what} with what is not a listing: {e}",
                self.location
            ))
        })?;
        Ok(Names {
            names: listing
                .items
                .into_iter()
                .map(|item| (item.name, item.generation))
                .collect(),
            next: listing.next_page_token.filter(|t| !t.is_empty()),
        })
    }

    async fn delete(&self, name: &str) -> CasResult<()> {
        let url = self.object_url(name);
        let what = self.object(name);
        let answer = self
            .exchange(&what, || Request::delete(url.as_str()), Bytes::new(), None)
            .await?;
        match self.classify(&answer, &what).map(Failure::expected) {
            None | Some(Ok(_)) => Ok(()),
            Some(Err(err)) => Err(err),
        }
    }
}

/// A variable of this process, if set.
fn process_env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .filter(|value| !value.trim().is_empty())
}
