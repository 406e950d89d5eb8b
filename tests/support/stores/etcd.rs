//! etcd, which `scripts/test` starts (tests/scripts/etcd.sh): a plain server
//! named in `RUNLOCK_TEST_ETCD_ENDPOINT` and one with authentication in
//! `RUNLOCK_TEST_ETCD_AUTH_ENDPOINT`. A space is a fresh key prefix; records
//! are read back with `etcdctl get --prefix -w json`.

use super::{
    output_of, test_var, unique_name, Endpoint, Failure, Kind, Objects, OwnServer, Record, Store,
};
use crate::closed_port;
use anyhow::{bail, Context, Result};
use tokio::process::Command;

/// The etcd store.
#[derive(Debug, Clone, Copy)]
pub struct Etcd;

const SCRIPT: &str = "etcd.sh";

fn host(at: &Endpoint) -> &str {
    at.url.trim_start_matches("http://")
}

fn etcdctl(at: &Endpoint) -> Result<Command> {
    let mut command = Command::new(test_var("RUNLOCK_TEST_ETCDCTL", SCRIPT)?);
    command
        .args(["--endpoints", &at.url, "--command-timeout", "5s"])
        .env_remove("ETCDCTL_USER")
        .env_remove("ETCDCTL_PASSWORD");
    Ok(command)
}

/// Runs etcdctl as root on the server with authentication.
async fn as_root(at: &Endpoint, args: &[&str]) -> Result<String> {
    let mut command = etcdctl(at)?;
    let password = test_var("RUNLOCK_TEST_ETCD_ROOT_PASSWORD", SCRIPT)?;
    command
        .args(["--user", &format!("root:{password}")])
        .args(args);
    output_of(command, b"", &format!("etcdctl {}", args.join(" "))).await
}

/// Standard base64 (etcdctl's JSON carries keys and values so).
fn base64_decode(text: &str) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut bits, mut count) = (0u32, 0);
    for c in text.bytes().filter(|&c| c != b'=') {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => bail!("{text:?} is not base64"),
        };
        bits = (bits << 6) | u32::from(value);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    Ok(out)
}

#[async_trait::async_trait]
impl Store for Etcd {
    fn kind(&self) -> Kind {
        Kind::new("etcd", "RUNLOCK_TEST_ETCD_ENDPOINT", SCRIPT)
    }

    async fn start_own(&self) -> Result<OwnServer> {
        let bin = test_var("RUNLOCK_TEST_ETCD_BIN", SCRIPT)?;
        let (port, peer) = (closed_port()?, closed_port()?);
        let dir = tempfile::Builder::new()
            .prefix("runlock-etcd")
            .tempdir_in("/tmp")?;
        let url = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut command = Command::new(bin);
        command
            .args(["--name", "own", "--log-level", "warn", "--data-dir"])
            .arg(dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("own={peer_url}")]);
        let ready = super::http_ready(format!("{url}/health"), super::not_an_error);
        OwnServer::spawn(command, Endpoint { url }, Some(dir), ready).await
    }

    async fn create(&self, at: &Endpoint, name: &str) -> Result<()> {
        // A prefix needs no making; a fresh name is empty unless a run before left keys.
        let mut command = etcdctl(at)?;
        command.args([
            "get",
            "--prefix",
            "--keys-only",
            "-w",
            "json",
            &format!("{name}/"),
        ]);
        let text = output_of(command, b"", "etcdctl get --keys-only").await?;
        let listed: serde_json::Value = serde_json::from_str(text.trim())?;
        if listed["kvs"].as_array().is_some_and(|kvs| !kvs.is_empty()) {
            bail!("{name}/ already holds keys");
        }
        Ok(())
    }

    fn uri(&self, at: &Endpoint, name: &str, prefix: &str) -> String {
        if prefix.is_empty() {
            format!("etcd://{}/{name}", host(at))
        } else {
            format!("etcd://{}/{name}/{prefix}", host(at))
        }
    }

    fn env(&self, _at: &Endpoint) -> Vec<(String, String)> {
        Vec::new()
    }

    fn objects(&self) -> &dyn Objects {
        self
    }

    async fn failures(&self, _at: &Endpoint) -> Result<Vec<Failure>> {
        let auth = Endpoint {
            url: test_var("RUNLOCK_TEST_ETCD_AUTH_ENDPOINT", SCRIPT)?,
        };
        let tls_host = test_var("RUNLOCK_TEST_ETCD_TLS_ENDPOINT", SCRIPT)?
            .trim_start_matches("https://")
            .to_string();
        let tls_file = |name: &str| -> Result<String> {
            Ok(format!(
                "{}/{name}",
                test_var("RUNLOCK_TEST_ETCD_TLS_DIR", SCRIPT)?
            ))
        };
        let secret = "sEcReT-must-not-leak";
        let refusing = format!("127.0.0.1:{}", closed_port()?);
        // A user whose role grants nothing under the prefix it is given.
        let prefix = unique_name("denied");
        let user = unique_name("no-rights");
        as_root(&auth, &["role", "add", &user]).await?;
        as_root(
            &auth,
            &["role", "grant-permission", &user, "read", "elsewhere"],
        )
        .await?;
        as_root(&auth, &["user", "add", &format!("{user}:{secret}")]).await?;
        as_root(&auth, &["user", "grant-role", &user, &user]).await?;
        Ok(vec![
            Failure {
                what: "an endpoint where nothing listens".into(),
                uri: format!("etcd://runlock:{secret}@{refusing}/x"),
                env: Vec::new(),
                names: vec![refusing, "cannot reach".into()],
                secret: Some(secret.into()),
            },
            Failure {
                what: "a wrong password".into(),
                uri: format!("etcd://{user}:not-{secret}@{}/x", host(&auth)),
                env: Vec::new(),
                names: vec![
                    format!("refused user \"{user}\""),
                    "check the etcd user name and password".into(),
                ],
                secret: Some(format!("not-{secret}")),
            },
            Failure {
                what: "no user where etcd requires one".into(),
                uri: format!("etcd://{}/x", host(&auth)),
                env: Vec::new(),
                names: vec!["requires authentication".into(), host(&auth).to_string()],
                secret: None,
            },
            Failure {
                what: "a user without permission on the prefix (credentials from ETCDCTL_*)".into(),
                uri: format!("etcd://{}/{prefix}", host(&auth)),
                env: vec![
                    ("ETCDCTL_USER".into(), user.clone()),
                    ("ETCDCTL_PASSWORD".into(), secret.into()),
                ],
                names: vec![
                    format!("denied user \"{user}\" access to {prefix}/"),
                    "readwrite".into(),
                ],
                secret: Some(secret.into()),
            },
            Failure {
                what: "TLS without the client certificate etcd requires (CA from ETCDCTL_CACERT)"
                    .into(),
                uri: format!("etcd://{tls_host}/x?tls=true"),
                env: vec![("ETCDCTL_CACERT".into(), tls_file("ca.crt")?)],
                // etcd refuses in the handshake or drops the connection after it.
                names: vec!["cert_file".into(), tls_host.clone()],
                secret: None,
            },
            Failure {
                what: "a server certificate from a CA this host does not trust".into(),
                uri: format!("etcd://{tls_host}/x"),
                env: vec![
                    ("ETCDCTL_CERT".into(), tls_file("client.crt")?),
                    ("ETCDCTL_KEY".into(), tls_file("client.key")?),
                ],
                names: vec!["the TLS handshake failed".into(), "ca_file".into()],
                secret: None,
            },
        ])
    }
}

#[async_trait::async_trait]
impl Objects for Etcd {
    /// The token is not in the value (it is the key's create revision, known
    /// only once the key is written): it is added here from etcdctl's
    /// `create_revision`, at the top and in the holder, as `runlock inspect`
    /// shows it. etcd keeps no wall-clock time, so `written` is `None`.
    async fn records(&self, at: &Endpoint, name: &str, prefix: &str) -> Result<Vec<Record>> {
        let under = if prefix.is_empty() {
            format!("{name}/")
        } else {
            format!("{name}/{prefix}/")
        };
        let mut command = etcdctl(at)?;
        command.args(["get", "--prefix", "-w", "json", &under]);
        let text = output_of(command, b"", &format!("etcdctl get --prefix {under}")).await?;
        let listed: serde_json::Value = serde_json::from_str(text.trim())
            .with_context(|| format!("etcdctl printed {text:?}"))?;
        let kvs = listed["kvs"].as_array().cloned().unwrap_or_default();
        kvs.into_iter()
            .map(|kv| {
                let key = base64_decode(kv["key"].as_str().context("no key")?)?;
                Ok((key, kv))
            })
            // The agent's own keys (`.history/`, `.force/`) are not lock records.
            .filter(|entry: &Result<(Vec<u8>, serde_json::Value)>| {
                entry
                    .as_ref()
                    .map_or(true, |(key, _)| !key[under.len()..].starts_with(b"."))
            })
            .map(|entry| {
                let (key, kv) = entry?;
                let value = base64_decode(kv["value"].as_str().context("no value")?)?;
                let token = kv["create_revision"]
                    .as_u64()
                    .context("no create_revision")?;
                let mut body: serde_json::Value = serde_json::from_slice(&value)
                    .with_context(|| format!("{} is not JSON", String::from_utf8_lossy(&value)))?;
                body["token"] = token.into();
                if body["holder"].is_object() {
                    body["holder"]["token"] = token.into();
                }
                Ok(Record {
                    name: String::from_utf8_lossy(&key).into_owned(),
                    written: None,
                    body: body.to_string(),
                })
            })
            .collect()
    }

    async fn put(&self, _at: &Endpoint, _name: &str, _object: &str, _body: &[u8]) -> Result<()> {
        bail!("etcd is not an object store")
    }

    async fn get(&self, _at: &Endpoint, _name: &str, _object: &str) -> Result<Option<String>> {
        bail!("etcd is not an object store")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_decodes_what_etcdctl_prints() {
        assert_eq!(
            super::base64_decode("cnVubG9jay9kZXYlM0F4").expect("valid"),
            b"runlock/dev%3Ax"
        );
        assert_eq!(super::base64_decode("e30=").expect("valid"), b"{}");
        assert!(super::base64_decode("not base64!").is_err());
    }
}
