//! S3 through two emulators written apart: moto, which `scripts/test` starts
//! (tests/scripts/moto.sh) and names in `RUNLOCK_TEST_S3_ENDPOINT`, and
//! ministack (tests/scripts/ministack.sh, `RUNLOCK_TEST_MINISTACK_ENDPOINT`),
//! so that the agent's S3 backend is held to S3's behaviour rather than to one
//! emulator's. Records are read back with boto3 from each emulator's own venv,
//! the way a person would with AWS's own tools. All but the server is shared.

use super::{
    object_uri, python_sdk::PythonSdk, Endpoint, Failure, Kind, Objects, OwnServer, Store,
};
use crate::closed_port;
use crate::http;
use anyhow::Result;
use std::path::Path;
use tokio::process::Command;

/// The S3 store, as moto serves it.
#[derive(Debug, Clone, Copy)]
pub struct S3;

/// The S3 store, as ministack serves it.
#[derive(Debug, Clone, Copy)]
pub struct Ministack;

/// What sets one S3 emulator apart from another; the rest of [`Store`] is
/// the same for both.
pub trait Emulator: Send + Sync + 'static {
    /// Its name, the variable holding the shared instance's endpoint, its script.
    const KIND: Kind;
    /// boto3, from the emulator's venv.
    fn boto3(&self) -> &'static PythonSdk;
    /// A server of a test's own on `port`, from the venv of `python` (the
    /// one with boto3), and the path that answers once it is ready.
    fn server(&self, python: &Path, port: u16) -> (Command, &'static str);
}

impl Emulator for S3 {
    const KIND: Kind = Kind::new("s3", "RUNLOCK_TEST_S3_ENDPOINT", "moto.sh");

    fn boto3(&self) -> &'static PythonSdk {
        &MOTO_BOTO3
    }

    fn server(&self, python: &Path, port: u16) -> (Command, &'static str) {
        // As tests/scripts/moto.sh starts it: moto_server as it comes lets
        // concurrent conditional PUTs of one object all succeed, which the
        // agent's proof catches under load and then refuses the store.
        let serial = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/moto_serial.py");
        let mut command = Command::new(python);
        command.args([serial, "-H", "127.0.0.1", "-p", &port.to_string()]);
        (command, "/moto-api/")
    }
}

impl Emulator for Ministack {
    const KIND: Kind = Kind::new(
        "ministack",
        "RUNLOCK_TEST_MINISTACK_ENDPOINT",
        "ministack.sh",
    );

    fn boto3(&self) -> &'static PythonSdk {
        &MINISTACK_BOTO3
    }

    fn server(&self, python: &Path, port: u16) -> (Command, &'static str) {
        // As tests/scripts/ministack.sh starts it: S3 alone, on loopback.
        let mut command = Command::new(python.with_file_name("ministack"));
        command
            .env("GATEWAY_PORT", port.to_string())
            .env("BIND_HOST", "127.0.0.1")
            .env("SERVICES", "s3")
            .env("LOG_LEVEL", "WARNING");
        (command, "/_ministack/health")
    }
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

/// boto3's side of [`PythonSdk`]'s script.
const BOTO: &str = r#"
import boto3
s3 = boto3.client("s3")
def listed(bucket, prefix):
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            try:
                got = s3.get_object(Bucket=bucket, Key=o["Key"])
            except s3.exceptions.NoSuchKey:
                continue  # removed between the listing and the read (a probe)
            yield o["Key"], got["LastModified"], got["Body"].read()
def read(bucket, key):
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None
def write(bucket, key, body):
    s3.put_object(Bucket=bucket, Key=key, Body=body)
"#;

const MOTO_BOTO3: PythonSdk = PythonSdk {
    name: "boto3",
    python: ("RUNLOCK_TEST_PYTHON", S3::KIND.script),
    script: BOTO,
    env: env_for,
};

const MINISTACK_BOTO3: PythonSdk = PythonSdk {
    name: "boto3",
    python: ("RUNLOCK_TEST_MINISTACK_PYTHON", Ministack::KIND.script),
    script: BOTO,
    env: env_for,
};

#[async_trait::async_trait]
impl<E: Emulator> Store for E {
    fn kind(&self) -> Kind {
        E::KIND
    }

    fn backend(&self) -> &'static str {
        "s3"
    }

    async fn start_own(&self) -> Result<OwnServer> {
        let python = self.boto3().python()?;
        let port = closed_port()?;
        let (command, ready_path) = self.server(Path::new(&python), port);
        let url = format!("http://127.0.0.1:{port}");
        let ready = super::http_ready(format!("{url}{ready_path}"), super::not_an_error);
        OwnServer::spawn(command, Endpoint { url }, None, ready).await
    }

    async fn create(&self, at: &Endpoint, name: &str) -> Result<()> {
        // Both emulators accept an unsigned bucket creation (EMULATORS.md).
        http::request("PUT", &format!("{}/{name}", at.url), &[], "")
            .await?
            .success("creating a bucket")
            .map(|_| ())
    }

    fn uri(&self, _at: &Endpoint, name: &str, prefix: &str) -> String {
        object_uri("s3", name, prefix)
    }

    fn env(&self, at: &Endpoint) -> Vec<(String, String)> {
        env_for(&at.url)
    }

    fn objects(&self) -> &dyn Objects {
        self.boto3()
    }

    async fn failures(&self, at: &Endpoint) -> Result<Vec<Failure>> {
        let missing = super::unique_name("missing");
        let secret = "sEcReT-must-not-leak";
        let refusing = format!("http://127.0.0.1:{}", closed_port()?);
        let mut env = env_for(&refusing);
        for (name, value) in env.iter_mut() {
            if name == "AWS_SECRET_ACCESS_KEY" {
                *value = secret.to_string();
            }
        }
        // Neither emulator checks signatures (ministack only with AUTH=true,
        // and IAM users to match), so a wrong key cannot be shown here.
        Ok(vec![
            Failure {
                what: "a missing bucket".into(),
                uri: format!("s3://{missing}/x"),
                env: env_for(&at.url),
                names: vec![missing, "does not exist".into()],
                secret: None,
            },
            Failure {
                what: "an endpoint where nothing listens".into(),
                uri: "s3://locks/x".into(),
                env,
                names: vec![refusing, "cannot reach".into()],
                secret: Some(secret.into()),
            },
        ])
    }
}
