//! The Azure tests' view of Azurite, which `scripts/test` installs and starts
//! (tests/scripts/azurite.sh) and names in `RUNLOCK_TEST_AZURE_*`: a fresh
//! container per test, and blobs read back with Azure's own Python SDK
//! (`RUNLOCK_TEST_AZURE_PYTHON`), the way a person would.

use anyhow::{bail, Context, Result};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::process::Command;

const HOW: &str = "run the tests with `bash scripts/test`, which starts Azurite \
                   (or start it with `bash tests/scripts/azurite.sh` and export what it prints)";

/// Azurite's well-known account and key (documented, not a secret).
pub const ACCOUNT: &str = "devstoreaccount1";
pub const KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

fn var(name: &str) -> Result<String> {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => Ok(value),
        _ => bail!("{name} is not set: the Azure tests need Azurite; {HOW}"),
    }
}

/// The shared Azurite's blob endpoint, `http://127.0.0.1:PORT/devstoreaccount1`.
pub fn endpoint() -> Result<String> {
    var("RUNLOCK_TEST_AZURE_ENDPOINT")
}

/// A Python with azure-storage-blob.
pub fn python() -> Result<String> {
    var("RUNLOCK_TEST_AZURE_PYTHON")
}

/// The connection string for `endpoint` with `key` (the right one unless a test says otherwise).
pub fn connection_string_with_key(endpoint: &str, key: &str) -> String {
    format!(
        "DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={key};\
         BlobEndpoint={endpoint};"
    )
}

/// The connection string for `endpoint`.
pub fn connection_string(endpoint: &str) -> String {
    connection_string_with_key(endpoint, KEY)
}

/// The environment an agent (or the Python SDK) needs to use `endpoint`.
pub fn env_for(endpoint: &str) -> Vec<(String, String)> {
    vec![(
        "AZURE_STORAGE_CONNECTION_STRING".to_string(),
        connection_string(endpoint),
    )]
}

/// A name no other test uses: `rl-HINT-PID-N` (lowercase, as Azure requires).
pub fn unique_name(hint: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let hint: String = hint
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .filter(|c| c.is_ascii_alphanumeric())
        .take(30)
        .collect();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("rl-{hint}-{}-{n}", std::process::id())
}

/// One blob as the Python SDK read it.
#[derive(Debug, Clone)]
pub struct Blob {
    /// Its name in the container.
    pub name: String,
    /// Its `Last-Modified`, by the store's clock (whole seconds).
    pub last_modified: SystemTime,
    /// Its body.
    pub body: String,
}

impl Blob {
    /// The body as JSON.
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_str(&self.body)
            .with_context(|| format!("{} is not JSON: {:?}", self.name, self.body))
    }
}

const SDK: &str = r#"
import json, os, sys
from azure.storage.blob import BlobServiceClient
action, container, arg = sys.argv[1], sys.argv[2], sys.argv[3]
service = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])
blobs = service.get_container_client(container)
if action == "create":
    blobs.create_container()
    print("[]")
elif action == "list":
    out = []
    for item in blobs.list_blobs(name_starts_with=arg):
        got = blobs.download_blob(item.name)
        out.append({"name": item.name, "last_modified": got.properties.last_modified.timestamp(),
                    "body": got.readall().decode()})
    print(json.dumps(out))
elif action == "put":
    blobs.upload_blob(arg, sys.stdin.buffer.read(), overwrite=True)
    print("[]")
"#;

/// Runs the Python SDK's `action` on `container` at `endpoint`.
async fn sdk(
    endpoint: &str,
    action: &str,
    container: &str,
    arg: &str,
    input: Option<&[u8]>,
) -> Result<String> {
    use tokio::io::AsyncWriteExt;
    let mut command = Command::new(python()?);
    command
        .args(["-c", SDK, action, container, arg])
        // In the environment, not argv, so that `ps` never shows the key.
        .envs(env_for(endpoint))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .context("starting python with azure-storage-blob")?;
    let mut stdin = child.stdin.take().context("no stdin pipe")?;
    stdin.write_all(input.unwrap_or_default()).await?;
    drop(stdin);
    let out = super::within(
        Duration::from_secs(30),
        "the Azure SDK",
        child.wait_with_output(),
    )
    .await?
    .context("running python with azure-storage-blob")?;
    if !out.status.success() {
        bail!(
            "azure-storage-blob {action} {arg:?} in {container} at {endpoint} failed ({}): {}; {HOW}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Creates container `name` at `endpoint` with the Python SDK.
pub async fn create_container(endpoint: &str, name: &str) -> Result<()> {
    sdk(endpoint, "create", name, "", None).await.map(|_| ())
}

/// Every blob under `prefix` in container `name` at `endpoint`, read with the Python SDK.
pub async fn blobs(endpoint: &str, name: &str, prefix: &str) -> Result<Vec<Blob>> {
    let text = sdk(endpoint, "list", name, prefix, None).await?;
    let listed: Vec<serde_json::Value> = serde_json::from_str(text.trim())
        .with_context(|| format!("the Azure SDK printed {text:?}"))?;
    listed
        .into_iter()
        .map(|b| {
            let seconds = b["last_modified"].as_f64().context("no last_modified")?;
            Ok(Blob {
                name: b["name"].as_str().context("no name")?.to_string(),
                last_modified: UNIX_EPOCH + Duration::from_secs_f64(seconds),
                body: b["body"].as_str().context("no body")?.to_string(),
            })
        })
        .collect()
}

/// Writes blob `blob` in container `name` at `endpoint` with the Python SDK.
pub async fn put_blob(endpoint: &str, name: &str, blob: &str, body: &[u8]) -> Result<()> {
    sdk(endpoint, "put", name, blob, Some(body))
        .await
        .map(|_| ())
}

/// A container of its own for one test, in the shared Azurite.
pub struct Container {
    /// The container's name.
    pub name: String,
    /// The blob endpoint it lives at.
    pub endpoint: String,
}

impl Container {
    /// Creates a new, empty container in the shared Azurite.
    pub async fn create(hint: &str) -> Result<Container> {
        let endpoint = endpoint()?;
        Container::create_at(&endpoint, hint).await
    }

    /// Creates a new, empty container at `endpoint` (an Azurite of the test's own).
    pub async fn create_at(endpoint: &str, hint: &str) -> Result<Container> {
        let name = unique_name(hint);
        create_container(endpoint, &name).await?;
        Ok(Container {
            name,
            endpoint: endpoint.to_string(),
        })
    }

    /// A container name that nobody creates, in the shared Azurite.
    pub fn missing(hint: &str) -> Result<Container> {
        Ok(Container {
            name: unique_name(hint),
            endpoint: endpoint()?,
        })
    }

    /// `azure://NAME/PREFIX` (or `azure://NAME` for an empty prefix).
    pub fn uri(&self, prefix: &str) -> String {
        if prefix.is_empty() {
            format!("azure://{}", self.name)
        } else {
            format!("azure://{}/{prefix}", self.name)
        }
    }

    /// Every blob under `prefix`, read with the Python SDK.
    pub async fn blobs(&self, prefix: &str) -> Result<Vec<Blob>> {
        blobs(&self.endpoint, &self.name, prefix).await
    }

    /// Writes a blob with the Python SDK.
    pub async fn put(&self, blob: &str, body: &[u8]) -> Result<()> {
        put_blob(&self.endpoint, &self.name, blob, body).await
    }
}
