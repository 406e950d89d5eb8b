//! An object store read and written through its own Python SDK (boto3,
//! azure-storage-blob), as a person would check what the agent wrote. Each
//! store gives the few SDK calls ([`PythonSdk::script`]); one [`ACTIONS`]
//! turns the command line into a call and prints its answer as JSON.

use super::{output_of, records_under, test_var, Endpoint, Objects, Record};
use anyhow::{Context, Result};
use std::time::Duration;
use tokio::process::Command;

/// Runs after a store's script: `ACTION SPACE ARG`, the body on stdin.
const ACTIONS: &str = r#"
import json, sys
action, space, arg = sys.argv[1:4]
if action == "list":
    print(json.dumps([{"name": name, "last_modified": modified.timestamp(), "body": body.decode()}
                      for name, modified, body in listed(space, arg)]))
elif action == "get":
    body = read(space, arg)
    print(json.dumps(None if body is None else body.decode()))
elif action == "put":
    write(space, arg, sys.stdin.buffer.read())
    print("[]")
else:
    globals()[action](space)
    print("[]")
"#;

pub struct PythonSdk {
    /// What errors call it ("boto3").
    pub name: &'static str,
    /// The variable naming a Python that has it, and the script under
    /// tests/scripts that installs it.
    pub python: (&'static str, &'static str),
    /// Python that defines `listed(space, prefix)` (each object under
    /// `prefix` as name, time of its write and body, skipping one removed
    /// since the listing), `read(space, name)` (the body, `None` if there is
    /// none) and `write(space, name, body)`; and any other action, such as
    /// `create(space)`.
    pub script: &'static str,
    /// The environment that points the SDK at an endpoint, credentials
    /// included (never in argv, which `ps` shows).
    pub env: fn(&str) -> Vec<(String, String)>,
}

impl PythonSdk {
    /// The Python that has the SDK.
    pub fn python(&self) -> Result<String> {
        test_var(self.python.0, self.python.1)
    }

    /// `action` on `space` (a bucket, a container) at `at`, with `arg` and
    /// `input` on stdin.
    pub async fn run(
        &self,
        at: &Endpoint,
        action: &str,
        space: &str,
        arg: &str,
        input: &[u8],
    ) -> Result<String> {
        let mut command = Command::new(self.python()?);
        command
            .args(["-c", &format!("{}{ACTIONS}", self.script)])
            .args([action, space, arg])
            .envs((self.env)(&at.url))
            .env_remove("AWS_PROFILE");
        let what = format!("{} {action} {arg:?} in {space}", self.name);
        output_of(command, input, &what).await
    }
}

#[async_trait::async_trait]
impl Objects for PythonSdk {
    /// The records under `prefix` in `space`.
    async fn records(&self, at: &Endpoint, space: &str, prefix: &str) -> Result<Vec<Record>> {
        let text = self
            .run(at, "list", space, &records_under(prefix), b"")
            .await?;
        let listed: Vec<serde_json::Value> = serde_json::from_str(text.trim())
            .with_context(|| format!("{} printed {text:?}", self.name))?;
        listed
            .into_iter()
            .filter(|o| !o["name"].as_str().is_some_and(super::is_probe))
            .map(|o| {
                let seconds = o["last_modified"].as_f64().context("no last_modified")?;
                Ok(Record {
                    name: o["name"].as_str().context("no name")?.to_string(),
                    written: Some(std::time::UNIX_EPOCH + Duration::from_secs_f64(seconds)),
                    body: o["body"].as_str().context("no body")?.to_string(),
                })
            })
            .collect()
    }

    /// Writes `body` as `object` in `space`, whatever is there.
    async fn put(&self, at: &Endpoint, space: &str, object: &str, body: &[u8]) -> Result<()> {
        self.run(at, "put", space, object, body).await.map(|_| ())
    }

    /// The body of `object` in `space`; `None` if there is none.
    async fn get(&self, at: &Endpoint, space: &str, object: &str) -> Result<Option<String>> {
        let text = self.run(at, "get", space, object, b"").await?;
        serde_json::from_str(text.trim()).with_context(|| format!("{} printed {text:?}", self.name))
    }
}
