//! Azure Blob through Azurite, which `scripts/test` starts
//! (tests/scripts/azurite.sh) and names in `RUNLOCK_TEST_AZURE_*`; records are
//! read back with Azure's own Python SDK (`RUNLOCK_TEST_AZURE_PYTHON`), the way
//! a person would.

use super::{
    object_uri, python_sdk::PythonSdk, test_var, Endpoint, Failure, Kind, Objects, OwnServer, Store,
};
use crate::closed_port;
use crate::rewriting_proxy::RequestHead;
use anyhow::Result;
use tokio::process::Command;

/// Azurite's well-known account and key (documented, not a secret).
pub const ACCOUNT: &str = "devstoreaccount1";
pub const KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// A well-formed key that is not the account's: Azurite checks Shared Key signatures.
pub const WRONG_KEY: &str = "cnVubG9jay13cm9uZy1hY2NvdW50LWtleS1tdXN0LW5vdC1sZWFrIQ==";

/// The Azure Blob store, as Azurite serves it; an endpoint is the account's
/// blob URL, `http://127.0.0.1:PORT/devstoreaccount1`.
#[derive(Debug, Clone, Copy)]
pub struct Azure;

const SCRIPT: &str = "azurite.sh";

/// A connection string for the account at `endpoint`, signing with `key`.
pub fn connection_string_with_key(endpoint: &str, key: &str) -> String {
    format!(
        "DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={key};\
         BlobEndpoint={endpoint};"
    )
}

/// Signs `head` again with the account's Shared Key, as the SDK signed it
/// (Azure's "Authorize with Shared Key"): a proxy that changed the request's
/// conditions must not also break its signature, or Azurite would refuse it
/// for that instead of showing what it does without them.
pub fn sign_again(head: &mut RequestHead) {
    use base64::Engine;
    use hmac::Mac;
    let header = |name: &str| head.header(name).unwrap_or_default().to_string();
    let length = header("content-length");
    let mut text = format!("{}\n", head.method);
    for value in [
        header("content-encoding"),
        header("content-language"),
        if length == "0" { String::new() } else { length },
        header("content-md5"),
        header("content-type"),
        header("date"),
        header("if-modified-since"),
        header("if-match"),
        header("if-none-match"),
        header("if-unmodified-since"),
        header("range"),
    ] {
        text.push_str(&value);
        text.push('\n');
    }
    let mut ms: Vec<(String, String)> = head
        .headers
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_string()))
        .filter(|(n, _)| n.starts_with("x-ms-"))
        .collect();
    ms.sort();
    for (name, value) in ms {
        text.push_str(&format!("{name}:{value}\n"));
    }
    let (path, query) = head.target.split_once('?').unwrap_or((&head.target, ""));
    text.push_str(&format!("/{ACCOUNT}{path}"));
    let mut params: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .map(|(n, v)| (percent_decoded(n).to_ascii_lowercase(), percent_decoded(v)))
        .collect();
    params.sort();
    for (name, value) in params {
        text.push_str(&format!("\n{name}:{value}"));
    }
    let key = base64::engine::general_purpose::STANDARD
        .decode(KEY)
        .expect("Azurite's key is base64");
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).expect("any key length");
    mac.update(text.as_bytes());
    let signature = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    head.set("Authorization", format!("SharedKey {ACCOUNT}:{signature}"));
}

fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The environment an agent (or the Python SDK) needs to use `endpoint`, signing with `key`.
fn env_with_key(endpoint: &str, key: &str) -> Vec<(String, String)> {
    vec![(
        "AZURE_STORAGE_CONNECTION_STRING".to_string(),
        connection_string_with_key(endpoint, key),
    )]
}

/// azure-storage-blob's side of [`PythonSdk`]'s script.
const SDK_SCRIPT: &str = r#"
import os
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.blob import BlobServiceClient
service = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])
def create(container):
    service.get_container_client(container).create_container()
def listed(container, prefix):
    blobs = service.get_container_client(container)
    for item in blobs.list_blobs(name_starts_with=prefix):
        try:
            got = blobs.download_blob(item.name)
        except ResourceNotFoundError:
            continue  # removed between the listing and the read (a probe)
        yield item.name, got.properties.last_modified, got.readall()
def read(container, name):
    try:
        return service.get_container_client(container).download_blob(name).readall()
    except ResourceNotFoundError:
        return None
def write(container, name, body):
    service.get_container_client(container).upload_blob(name, body, overwrite=True)
"#;

const SDK: PythonSdk = PythonSdk {
    name: "azure-storage-blob",
    python: ("RUNLOCK_TEST_AZURE_PYTHON", SCRIPT),
    script: SDK_SCRIPT,
    env: |endpoint| env_with_key(endpoint, KEY),
};

#[async_trait::async_trait]
impl Store for Azure {
    fn kind(&self) -> Kind {
        Kind::new("azure", "RUNLOCK_TEST_AZURE_ENDPOINT", SCRIPT)
    }

    async fn start_own(&self) -> Result<OwnServer> {
        let bin = test_var("RUNLOCK_TEST_AZURITE", SCRIPT)?;
        let data = tempfile::Builder::new()
            .prefix("runlock-azurite")
            .tempdir_in("/tmp")?;
        let port = closed_port()?;
        let mut command = Command::new(bin);
        command
            .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
            .arg("--location")
            .arg(data.path())
            .args(["--skipApiVersionCheck", "--loose", "--disableTelemetry"]);
        let base = format!("http://127.0.0.1:{port}");
        let url = format!("{base}/{ACCOUNT}");
        // Any HTTP answer (400 for `/`) means it is up.
        let ready = super::http_ready(format!("{base}/"), |_| true);
        OwnServer::spawn(command, Endpoint { url }, Some(data), ready).await
    }

    async fn create(&self, at: &Endpoint, name: &str) -> Result<()> {
        SDK.run(at, "create", name, "", b"").await.map(|_| ())
    }

    fn uri(&self, _at: &Endpoint, name: &str, prefix: &str) -> String {
        object_uri("azure", name, prefix)
    }

    fn env(&self, at: &Endpoint) -> Vec<(String, String)> {
        env_with_key(&at.url, KEY)
    }

    fn objects(&self) -> &dyn Objects {
        &SDK
    }

    async fn failures(&self, at: &Endpoint) -> Result<Vec<Failure>> {
        let missing = super::unique_name("missing");
        let existing = super::unique_name("wrong-key");
        self.create(at, &existing).await?;
        let refusing = format!("http://127.0.0.1:{}/{ACCOUNT}", closed_port()?);
        // No role-based permissions with a Shared Key: Azurite cannot show a key
        // that may read but not write.
        Ok(vec![
            Failure {
                what: "a missing container".into(),
                uri: format!("azure://{missing}/x"),
                env: env_with_key(&at.url, KEY),
                names: vec![missing, "does not exist".into()],
                secret: Some(KEY.into()),
            },
            Failure {
                what: "a wrong account key".into(),
                uri: format!("azure://{existing}/x"),
                env: env_with_key(&at.url, WRONG_KEY),
                names: vec![
                    existing,
                    "access denied".into(),
                    "check the account key".into(),
                ],
                secret: Some(WRONG_KEY.into()),
            },
            Failure {
                what: "an endpoint where nothing listens".into(),
                uri: "azure://locks/x".into(),
                env: env_with_key(&refusing, KEY),
                names: vec![refusing, "cannot reach".into()],
                secret: Some(KEY.into()),
            },
        ])
    }
}
