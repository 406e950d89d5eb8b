//! S3 through moto, which `scripts/test` starts (tests/scripts/moto.sh) and
//! names in `RUNLOCK_TEST_S3_ENDPOINT`; records are read back with boto3
//! (`RUNLOCK_TEST_PYTHON`), the way a person would with AWS's own tools.

use super::{
    object_uri, python_sdk::PythonSdk, Endpoint, Failure, Kind, Objects, OwnServer, Store,
};
use crate::closed_port;
use crate::http;
use anyhow::Result;
use tokio::process::Command;

/// The S3 store, as moto serves it.
#[derive(Debug, Clone, Copy)]
pub struct S3;

const SCRIPT: &str = "moto.sh";

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

const BOTO3: PythonSdk = PythonSdk {
    name: "boto3",
    python: ("RUNLOCK_TEST_PYTHON", SCRIPT),
    script: BOTO,
    env: env_for,
};

#[async_trait::async_trait]
impl Store for S3 {
    fn kind(&self) -> Kind {
        Kind::new("s3", "RUNLOCK_TEST_S3_ENDPOINT", SCRIPT)
    }

    async fn start_own(&self) -> Result<OwnServer> {
        let server = std::path::Path::new(&BOTO3.python()?).with_file_name("moto_server");
        let port = closed_port()?;
        let mut command = Command::new(server);
        command.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
        let url = format!("http://127.0.0.1:{port}");
        let ready = super::http_ready(format!("{url}/moto-api/"), super::not_an_error);
        OwnServer::spawn(command, Endpoint { url }, None, ready).await
    }

    async fn create(&self, at: &Endpoint, name: &str) -> Result<()> {
        // moto accepts an unsigned bucket creation (EMULATORS.md).
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
        &BOTO3
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
        // moto checks no signatures, so a wrong key cannot be shown here.
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
