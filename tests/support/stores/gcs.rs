//! Google Cloud Storage through fake-gcs-server, which `scripts/test` starts
//! (tests/scripts/fake_gcs.sh) and names in `RUNLOCK_TEST_GCS_ENDPOINT`;
//! records are read back over HTTP on the JSON API, the way a person would.

use super::{
    object_uri, records_under, test_var, unique_name, Endpoint, Failure, Kind, Objects, OwnServer,
    Record, Store,
};
use crate::closed_port;
use crate::http;
use anyhow::{bail, Context, Result};
use tokio::process::Command;

/// The GCS store, as fake-gcs-server serves it.
#[derive(Debug, Clone, Copy)]
pub struct Gcs;

const SCRIPT: &str = "fake_gcs.sh";

const JSON: (&str, &str) = ("content-type", "application/json");

/// Object names go into JSON API paths as one segment (and query values).
fn encode(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The object's body; `None` for 404.
async fn read_object(at: &Endpoint, bucket: &str, object: &str) -> Result<Option<String>> {
    let url = format!(
        "{}/storage/v1/b/{bucket}/o/{}?alt=media",
        at.url,
        encode(object)
    );
    let answer = http::get(&url).await?;
    match answer.status {
        200 => Ok(Some(answer.body)),
        404 => Ok(None),
        other => bail!(
            "reading {object} from {bucket}: HTTP {other}: {}",
            answer.body
        ),
    }
}

#[async_trait::async_trait]
impl Store for Gcs {
    fn kind(&self) -> Kind {
        Kind::new("gcs", "RUNLOCK_TEST_GCS_ENDPOINT", SCRIPT)
    }

    async fn start_own(&self) -> Result<OwnServer> {
        let port = closed_port()?;
        let mut command = Command::new(test_var("RUNLOCK_TEST_GCS_BIN", SCRIPT)?);
        command.args([
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-backend",
            "memory",
        ]);
        command.args(["-log-level", "warn", "-port", &port.to_string()]);
        let url = format!("http://127.0.0.1:{port}");
        let ready = super::http_ready(format!("{url}/storage/v1/b"), super::not_an_error);
        OwnServer::spawn(command, Endpoint { url }, None, ready).await
    }

    async fn create(&self, at: &Endpoint, name: &str) -> Result<()> {
        let url = format!("{}/storage/v1/b?project=test", at.url);
        let body = serde_json::json!({ "name": name }).to_string();
        http::request("POST", &url, &[JSON], body)
            .await?
            .success("creating a bucket")
            .map(|_| ())
    }

    fn uri(&self, _at: &Endpoint, name: &str, prefix: &str) -> String {
        object_uri("gs", name, prefix)
    }

    fn env(&self, at: &Endpoint) -> Vec<(String, String)> {
        vec![("STORAGE_EMULATOR_HOST".into(), at.url.clone())]
    }

    fn objects(&self) -> &dyn Objects {
        self
    }

    async fn failures(&self, at: &Endpoint) -> Result<Vec<Failure>> {
        let missing = unique_name("missing");
        let refusing = format!("http://127.0.0.1:{}", closed_port()?);
        // Without an emulator the agent would ask Google: it must stop at the key
        // file, before any request. The file stays behind in the temp directory
        // (a few bytes): the failure outlives this call.
        let secret = "-----BEGIN PRIVATE KEY-----sEcReT-must-not-leak";
        let malformed = std::env::temp_dir().join(format!("{}.json", unique_name("bad-key")));
        std::fs::write(
            &malformed,
            format!("{{\"type\": \"service_account\", \"private_key\": \"{secret}\", oops"),
        )?;
        let malformed = malformed.display().to_string();
        let unreadable = std::env::temp_dir()
            .join(unique_name("no-key"))
            .join("key.json")
            .display()
            .to_string();
        let google = |key: &str| {
            vec![
                ("STORAGE_EMULATOR_HOST".to_string(), String::new()),
                (
                    "GOOGLE_APPLICATION_CREDENTIALS".to_string(),
                    key.to_string(),
                ),
            ]
        };
        // fake-gcs-server checks no credentials, so a wrong key cannot be shown
        // against it; agent/src/backend/cas/gcs.rs tests a refusing token service.
        Ok(vec![
            Failure {
                what: "a missing bucket".into(),
                uri: format!("gs://{missing}/x"),
                env: self.env(at),
                names: vec![missing, "does not exist".into()],
                secret: None,
            },
            Failure {
                what: "an endpoint where nothing listens".into(),
                uri: "gs://locks/x".into(),
                env: self.env(&Endpoint {
                    url: refusing.clone(),
                }),
                names: vec![refusing, "cannot reach".into()],
                secret: None,
            },
            Failure {
                what: "a malformed service-account key file".into(),
                uri: "gs://locks/x".into(),
                env: google(&malformed),
                names: vec![malformed.clone(), "is not a service-account key".into()],
                secret: Some(secret.into()),
            },
            Failure {
                what: "a key file that cannot be read".into(),
                uri: "gs://locks/x".into(),
                env: google(&unreadable),
                names: vec![unreadable.clone(), "cannot read it".into()],
                secret: None,
            },
        ])
    }
}

#[async_trait::async_trait]
impl Objects for Gcs {
    async fn records(&self, at: &Endpoint, name: &str, prefix: &str) -> Result<Vec<Record>> {
        let under = records_under(prefix);
        let url = format!("{}/storage/v1/b/{name}/o?prefix={}", at.url, encode(&under));
        let text = http::get(&url)
            .await?
            .success(&format!("listing {under} in {name}"))?;
        let listed: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("the listing was {text:?}"))?;
        let mut records = Vec::new();
        for item in listed["items"].as_array().into_iter().flatten() {
            let object = item["name"].as_str().context("an item without a name")?;
            if super::is_probe(object) {
                continue;
            }
            // `updated` is the store's clock at the write, to the microsecond.
            let updated = item["updated"].as_str().context("no updated")?;
            let written = humantime::parse_rfc3339(updated)
                .with_context(|| format!("updated {updated:?}"))?;
            let Some(body) = read_object(at, name, object).await? else {
                continue; // removed between the listing and the read
            };
            records.push(Record {
                name: object.to_string(),
                written: Some(written),
                body,
            });
        }
        Ok(records)
    }

    async fn put(&self, at: &Endpoint, name: &str, object: &str, body: &[u8]) -> Result<()> {
        let url = format!(
            "{}/upload/storage/v1/b/{name}/o?uploadType=media&name={}",
            at.url,
            encode(object)
        );
        let octets = ("content-type", "application/octet-stream");
        http::request("POST", &url, &[octets], body.to_vec())
            .await?
            .success(&format!("writing {object}"))
            .map(|_| ())
    }

    async fn get(&self, at: &Endpoint, name: &str, object: &str) -> Result<Option<String>> {
        read_object(at, name, object).await
    }
}
