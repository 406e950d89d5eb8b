//! The S3 tests' view of moto, which `scripts/test` installs and starts
//! (tests/scripts/moto.sh) and names in `RUNLOCK_TEST_S3_ENDPOINT`: a fresh
//! bucket per test, agents pointed at it, and its objects read back with boto3
//! (`RUNLOCK_TEST_PYTHON`), the way a person would with the cloud's own tools.

use super::agent::{AgentOptions, TestAgent};
use anyhow::{bail, Context, Result};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::process::Command;

const HOW: &str = "run the tests with `bash scripts/test`, which starts moto \
                   (or start it with `bash tests/scripts/moto.sh` and export what it prints)";

fn var(name: &str) -> Result<String> {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => Ok(value),
        _ => bail!("{name} is not set: the S3 tests need moto; {HOW}"),
    }
}

/// Where the agent keeps lock records, under its URI's prefix.
pub const RECORDS: &str = ".runlock/locks/";

/// libfaketime's multi-threaded library, which `scripts/test` installs.
fn faketime_library() -> Result<String> {
    let found = std::fs::read_dir("/usr/lib")?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("faketime/libfaketimeMT.so.1"))
        .find(|p| p.exists());
    match found {
        Some(path) => Ok(path.display().to_string()),
        None => bail!("libfaketime is not installed (apt-get install faketime); {HOW}"),
    }
}

/// A moto of one test's own, so that pausing it disturbs no other test.
pub struct Moto {
    child: tokio::process::Child,
    pid: i32,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

impl Moto {
    /// Starts `moto_server` from the tests' venv on a free port; ready when it answers.
    pub async fn start() -> Result<Moto> {
        let python = python()?;
        let server = std::path::Path::new(&python).with_file_name("moto_server");
        let port = closed_port()?;
        let child = Command::new(&server)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", server.display()))?;
        let pid = child.id().context("moto pid")? as i32;
        let endpoint = format!("http://127.0.0.1:{port}");
        let deadline = super::Deadline::new(Duration::from_secs(30), "moto to answer");
        loop {
            let probe = Command::new("curl")
                .args(["-sf", "-m", "2", &format!("{endpoint}/moto-api/")])
                .stdout(std::process::Stdio::null())
                .status()
                .await?;
            if probe.success() {
                return Ok(Moto {
                    child,
                    pid,
                    endpoint,
                });
            }
            deadline.tick().await?;
        }
    }

    /// Stops the store dead (SIGSTOP): connections open, nothing answers.
    pub fn pause(&self) -> Result<()> {
        let pid = nix::unistd::Pid::from_raw(self.pid);
        Ok(nix::sys::signal::kill(
            pid,
            nix::sys::signal::Signal::SIGSTOP,
        )?)
    }

    /// Lets it go on (SIGCONT).
    pub fn resume(&self) -> Result<()> {
        let pid = nix::unistd::Pid::from_raw(self.pid);
        Ok(nix::sys::signal::kill(
            pid,
            nix::sys::signal::Signal::SIGCONT,
        )?)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.resume();
        let _ = self.child.start_kill();
    }
}

/// moto's endpoint, `http://127.0.0.1:PORT`.
pub fn endpoint() -> Result<String> {
    var("RUNLOCK_TEST_S3_ENDPOINT")
}

/// A Python with boto3.
pub fn python() -> Result<String> {
    var("RUNLOCK_TEST_PYTHON")
}

/// The environment an agent (or boto3) needs to use `endpoint` as its S3.
pub fn env_for(endpoint: &str) -> Vec<(String, String)> {
    [
        ("AWS_ENDPOINT_URL", endpoint),
        ("AWS_ENDPOINT_URL_S3", endpoint),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// A port on 127.0.0.1 where nothing listens (bound, then closed).
pub fn closed_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding a local port")?;
    Ok(listener.local_addr()?.port())
}

/// One object as boto3 read it.
#[derive(Debug, Clone)]
pub struct Object {
    /// Its key in the bucket.
    pub key: String,
    /// Its `Last-Modified`, by the store's clock (whole seconds).
    pub last_modified: SystemTime,
    /// Its body.
    pub body: String,
}

impl Object {
    /// The body as JSON.
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_str(&self.body)
            .with_context(|| format!("{} is not JSON: {:?}", self.key, self.body))
    }
}

/// A bucket of its own for one test.
pub struct Bucket {
    /// The bucket's name.
    pub name: String,
    endpoint: String,
}

const BOTO: &str = r#"
import boto3, json, sys
action, bucket, arg = sys.argv[1], sys.argv[2], sys.argv[3]
s3 = boto3.client("s3")
if action == "list":
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=arg):
        for o in page.get("Contents", []):
            got = s3.get_object(Bucket=bucket, Key=o["Key"])
            out.append({"key": o["Key"], "last_modified": got["LastModified"].timestamp(),
                        "body": got["Body"].read().decode()})
    print(json.dumps(out))
elif action == "put":
    s3.put_object(Bucket=bucket, Key=arg, Body=sys.stdin.buffer.read())
    print("[]")
"#;

impl Bucket {
    /// A name no other test uses: `runlock-HINT-PID-N`.
    fn unique(hint: &str) -> Result<(String, String)> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let endpoint = endpoint()?;
        let hint: String = hint
            .chars()
            .map(|c| c.to_ascii_lowercase())
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .take(30)
            .collect();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Ok((
            format!("runlock-{hint}-{}-{n}", std::process::id()),
            endpoint,
        ))
    }

    /// Creates a new, empty bucket.
    pub async fn create(hint: &str) -> Result<Bucket> {
        let (name, endpoint) = Bucket::unique(hint)?;
        Bucket::create_named(name, endpoint).await
    }

    /// Creates a new, empty bucket in the S3 at `endpoint` (a test's own moto).
    pub async fn create_at(endpoint: &str, hint: &str) -> Result<Bucket> {
        let (name, _) = Bucket::unique(hint)?;
        Bucket::create_named(name, endpoint.to_string()).await
    }

    async fn create_named(name: String, endpoint: String) -> Result<Bucket> {
        let url = format!("{endpoint}/{name}");
        // moto accepts an unsigned bucket creation (EMULATORS.md).
        let out = Command::new("curl")
            .args(["-sS", "-f", "-m", "10", "-X", "PUT", &url])
            .output()
            .await
            .context("running curl")?;
        if !out.status.success() {
            bail!(
                "creating bucket {url} failed ({}): {}; is moto running? {HOW}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(Bucket { name, endpoint })
    }

    /// A bucket name that nobody creates.
    pub fn missing(hint: &str) -> Result<Bucket> {
        let (name, endpoint) = Bucket::unique(hint)?;
        Ok(Bucket { name, endpoint })
    }

    /// `s3://NAME/PREFIX` (or `s3://NAME` for an empty prefix).
    pub fn uri(&self, prefix: &str) -> String {
        if prefix.is_empty() {
            format!("s3://{}", self.name)
        } else {
            format!("s3://{}/{prefix}", self.name)
        }
    }

    /// Starts an agent on `uri(prefix)` with moto's environment and `args`.
    pub async fn agent(&self, prefix: &str, args: &[&str]) -> Result<TestAgent> {
        self.agent_with_env(prefix, args, Vec::new()).await
    }

    /// Like [`Bucket::agent`], with the agent's wall clock moved by `offset`
    /// (libfaketime, e.g. `+5h`): as if the host's clock were that far off.
    /// Its monotonic clock is left alone, as a real host's would be.
    pub async fn agent_with_clock_offset(
        &self,
        prefix: &str,
        args: &[&str],
        offset: &str,
    ) -> Result<TestAgent> {
        let library = faketime_library()?;
        let env = vec![
            ("LD_PRELOAD".to_string(), library),
            ("FAKETIME".to_string(), offset.to_string()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".to_string(), "1".to_string()),
        ];
        self.agent_with_env(prefix, args, env).await
    }

    /// Like [`Bucket::agent`], listening on `socket`: the next agent of a host
    /// whose previous agent stopped.
    pub async fn agent_on_socket(
        &self,
        prefix: &str,
        args: &[&str],
        socket: &std::path::Path,
    ) -> Result<TestAgent> {
        let mut options = AgentOptions::new(self.uri(prefix));
        options.args = args.iter().map(|a| a.to_string()).collect();
        options.socket = Some(socket.to_path_buf());
        TestAgent::start_with_env(options, &env_for(&self.endpoint)).await
    }

    async fn agent_with_env(
        &self,
        prefix: &str,
        args: &[&str],
        mut env: Vec<(String, String)>,
    ) -> Result<TestAgent> {
        let mut options = AgentOptions::new(self.uri(prefix));
        options.args = args.iter().map(|a| a.to_string()).collect();
        env.extend(env_for(&self.endpoint));
        TestAgent::start_with_env(options, &env).await
    }

    async fn boto(&self, action: &str, arg: &str, input: Option<&[u8]>) -> Result<String> {
        use tokio::io::AsyncWriteExt;
        let mut command = Command::new(python()?);
        command
            .args(["-c", BOTO, action, &self.name, arg])
            .envs(env_for(&self.endpoint))
            .env_remove("AWS_PROFILE")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().context("starting python with boto3")?;
        let mut stdin = child.stdin.take().context("no stdin pipe")?;
        stdin.write_all(input.unwrap_or_default()).await?;
        drop(stdin);
        let out = super::within(Duration::from_secs(30), "boto3", child.wait_with_output())
            .await?
            .context("running python with boto3")?;
        if !out.status.success() {
            bail!(
                "boto3 {action} {arg:?} in {} failed ({}): {}",
                self.name,
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Every object under `prefix`, read with boto3.
    pub async fn objects(&self, prefix: &str) -> Result<Vec<Object>> {
        let text = self.boto("list", prefix, None).await?;
        let listed: Vec<serde_json::Value> =
            serde_json::from_str(text.trim()).with_context(|| format!("boto3 printed {text:?}"))?;
        listed
            .into_iter()
            .map(|o| {
                let seconds = o["last_modified"].as_f64().context("no last_modified")?;
                Ok(Object {
                    key: o["key"].as_str().context("no key")?.to_string(),
                    last_modified: UNIX_EPOCH + Duration::from_secs_f64(seconds),
                    body: o["body"].as_str().context("no body")?.to_string(),
                })
            })
            .collect()
    }

    /// The one object under `prefix` (fails if there are none or several).
    pub async fn only_object(&self, prefix: &str) -> Result<Object> {
        let mut objects = self.objects(prefix).await?;
        if objects.len() != 1 {
            bail!("expected one object under {prefix:?}, found {objects:?}");
        }
        Ok(objects.remove(0))
    }

    /// Writes an object with boto3.
    pub async fn put(&self, key: &str, body: &[u8]) -> Result<()> {
        self.boto("put", key, Some(body)).await.map(|_| ())
    }
}
