//! Azure without an account key (issue 31): real agents on Azurite with a
//! shared access signature in the connection string, as Meltano's
//! `state_backend.azure.connection_string` may carry one. An account SAS and
//! a container SAS lock across hosts and free a crashed run's key; a
//! read-only SAS is refused by name, and the agent's log never holds the
//! signature. An Entra ID identity that cannot be had is named too.

use crate::support::run::HOLD;
use crate::support::stores::{azure, test_var, unique_name, Azure, Store};
use crate::support::{closed_port, key, AgentOptions, Run, TestAgent};
use anyhow::{ensure, Context, Result};
use nix::sys::signal::Signal;

/// A SAS for Azurite's account signed with its well-known key, by Azure's
/// own Python SDK: `account` (blob service, containers and objects) or
/// `container` (that container alone), with `permissions` (`rwdlac`…), for
/// an hour.
const MAKE_SAS: &str = r#"
import datetime, sys
from azure.storage.blob import (AccountSasPermissions, ContainerSasPermissions, ResourceTypes,
                                generate_account_sas, generate_container_sas)
kind, account, key, container, permissions = sys.argv[1:6]
expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
if kind == "account":
    print(generate_account_sas(account, key, ResourceTypes(container=True, object=True),
                               AccountSasPermissions.from_string(permissions), expiry))
else:
    print(generate_container_sas(account, container, account_key=key,
                                 permission=ContainerSasPermissions.from_string(permissions),
                                 expiry=expiry))
"#;

async fn sas(kind: &str, container: &str, permissions: &str) -> Result<String> {
    let python = test_var("RUNLOCK_TEST_AZURE_PYTHON", "azurite.sh")?;
    let out = tokio::process::Command::new(python)
        .args(["-c", MAKE_SAS, kind, azure::ACCOUNT, azure::KEY, container])
        .arg(permissions)
        .output()
        .await
        .context("running the Azure SDK")?;
    ensure!(
        out.status.success(),
        "the SDK made no SAS: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout)?.trim().to_string();
    ensure!(token.contains("sig="), "not a SAS: {} bytes", token.len());
    Ok(token)
}

/// The agent's environment for a container on Azurite reached with `token`
/// alone: no AccountName, no AccountKey.
fn sas_env(endpoint: &str, token: &str) -> Vec<(String, String)> {
    vec![(
        "AZURE_STORAGE_CONNECTION_STRING".to_string(),
        format!("BlobEndpoint={endpoint};SharedAccessSignature={token}"),
    )]
}

/// The signature of `token` (the value of its `sig=`), which no log may show.
fn signature(token: &str) -> &str {
    token
        .split('&')
        .find_map(|pair| pair.strip_prefix("sig="))
        .unwrap_or(token)
}

/// The holder's run `held` of `k` dies whole: the key is free for a run
/// through `other`, another host.
async fn crash_frees_the_key(mut held: Run, other: &TestAgent, k: &str) -> Result<()> {
    held.signal(Signal::SIGKILL)?;
    held.kill_group()?;
    held.wait().await?;
    let next = other
        .run(&[k], &["--wait", "30s"], "echo acquired")?
        .finish()
        .await?;
    next.expect_code(0)?;
    ensure!(next.stdout.contains("acquired"), "{next:?}");
    Ok(())
}

/// A run through `agent` is refused with 69 (the store cannot lock: not a
/// key held by another), in words naming each of `named`, and neither the
/// refusal nor the agent's log shows `secret`.
async fn refused_naming(agent: &TestAgent, named: &[&str], secret: &str) -> Result<()> {
    let run = agent
        .run(&[&key("refused")], &[], "echo should-not-run")?
        .finish()
        .await?;
    run.expect_code(69)?;
    ensure!(!run.stdout.contains("should-not-run"), "{run:?}");
    let said = format!("{}\n{}", run.stderr, agent.log());
    for name in named {
        ensure!(
            said.contains(name),
            "the refusal does not name {name:?}: {said}"
        );
    }
    ensure!(!said.contains(secret), "a secret is shown: {said}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_lock_across_hosts_with_an_account_or_a_container_sas() -> Result<()> {
    let at = Azure.shared()?;
    for (kind, permissions) in [("account", "rwdlac"), ("container", "rwdlc")] {
        let container = unique_name("sas");
        Azure.create(&at, &container).await?;
        let token = sas(kind, &container, permissions).await?;
        let env = sas_env(&at.url, &token);
        let uri = Azure.uri(&at, &container, "p");
        let one = TestAgent::start_with_env(AgentOptions::new(&uri), &env).await?;
        let two = TestAgent::start_with_env(AgentOptions::new(&uri), &env).await?;
        let k = key("sas");

        let mut held = one.run(&[&k], &[], HOLD)?;
        held.ready()
            .await
            .with_context(|| format!("{kind} SAS: {}", one.log()))?;
        let refused = two.run(&[&k], &[], "echo should-not-run")?.finish().await?;
        refused.expect_code(75).context(format!("{kind} SAS"))?;
        ensure!(!refused.stdout.contains("should-not-run"), "{refused:?}");

        crash_frees_the_key(held, &two, &k)
            .await
            .context(format!("{kind} SAS"))?;

        for agent in [&one, &two] {
            let log = agent.log();
            ensure!(
                !log.contains(signature(&token)),
                "{kind} SAS: the agent's log shows the signature"
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_sas_is_refused_by_name_at_start() -> Result<()> {
    let at = Azure.shared()?;
    let container = unique_name("sas-ro");
    Azure.create(&at, &container).await?;
    let token = sas("container", &container, "rl").await?;
    let uri = Azure.uri(&at, &container, "p");
    let agent =
        TestAgent::start_with_env(AgentOptions::new(&uri), &sas_env(&at.url, &token)).await?;
    let named = ["shared access signature", "AZURE_STORAGE_CONNECTION_STRING"];
    refused_naming(&agent, &named, signature(&token)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entra_id_identity_that_answers_no_token_is_named_and_grants_nothing() -> Result<()> {
    let at = Azure.shared()?;
    let container = unique_name("entra");
    Azure.create(&at, &container).await?;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("runlockd.toml");
    std::fs::write(
        &config,
        format!("[azure]\nstorage_account_url = \"{}\"\n", at.url),
    )?;
    let mut options = AgentOptions::new(Azure.uri(&at, &container, "p"));
    options.args = vec!["--config".into(), config.display().to_string()];
    // A managed identity endpoint where nothing listens, and no Azure CLI.
    let nowhere = format!("http://127.0.0.1:{}/token", closed_port()?);
    let env = vec![
        ("IDENTITY_ENDPOINT".to_string(), nowhere),
        ("IDENTITY_HEADER".to_string(), "not-a-secret".to_string()),
        ("PATH".to_string(), "/usr/bin:/bin".to_string()),
    ];
    let agent = TestAgent::start_with_env(options, &env).await?;
    let named = ["Entra ID identity", "[azure] account_url"];
    refused_naming(&agent, &named, "not-a-secret").await
}

/// A stand-in for a managed identity's token endpoint, as App Service's
/// (`IDENTITY_ENDPOINT`, with its secret header) or a VM's instance metadata
/// service (`AZURE_POD_IDENTITY_AUTHORITY_HOST`, `Metadata: true`) for the
/// user-assigned identity [`CLIENT_ID`]: it answers each request with a
/// fresh token for Azure Storage that expires `LIFETIME` later, and counts
/// those App Service hosts take; anything else is refused.
struct TokenEndpoint {
    url: String,
    served: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    more: std::sync::Arc<tokio::sync::Notify>,
    /// Set: the identity is revoked, every request refused.
    revoked: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

/// Long enough for a request, short enough that the token is fetched again
/// while a run holds its key (the agent does so with 5 minutes left, so
/// here for each request).
const LIFETIME: u64 = 25;
/// The header App Service sets and the endpoint checks.
const IDENTITY_HEADER: &str = "identity-header-for-tests";
/// A user-assigned managed identity's client id (`AZURE_CLIENT_ID`).
const CLIENT_ID: &str = "0f7e2a4c-1b3d-4e5f-8a9b-0c1d2e3f4a5b";

impl TokenEndpoint {
    async fn start() -> Result<TokenEndpoint> {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let more = std::sync::Arc::new(tokio::sync::Notify::new());
        let revoked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (count, notify, refusing) = (served.clone(), more.clone(), revoked.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
                let app_service = text.contains(&format!("x-identity-header: {IDENTITY_HEADER}"));
                let vm = text.starts_with("get /metadata/identity/oauth2/token?")
                    && text.contains("metadata: true")
                    && text.contains(&format!("client_id={CLIENT_ID}"));
                let granted = (app_service || vm) && !refusing.load(Ordering::SeqCst);
                let (status, body) = if granted {
                    if app_service {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    notify.notify_waiters();
                    ("200 OK", token_answer())
                } else {
                    ("401 Unauthorized", "{}".to_string())
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        Ok(TokenEndpoint {
            url,
            served,
            more,
            revoked,
            task,
        })
    }

    fn revoke(&self) {
        self.revoked
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn served(&self) -> usize {
        self.served.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits (at most a minute) until `count` tokens have been served to App
    /// Service hosts.
    async fn until_served(&self, count: usize) -> Result<()> {
        let waiting = async {
            loop {
                let more = self.more.notified();
                if self.served() >= count {
                    return;
                }
                more.await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(60), waiting)
            .await
            .with_context(|| format!("{} tokens served, waiting for {count}", self.served()))
    }
}

impl Drop for TokenEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A managed identity endpoint's answer: an Entra ID access token for Azure
/// Storage as Azurite's `--oauth basic` reads it (issuer, audience and
/// times; it checks no signature).
fn token_answer() -> String {
    use base64::Engine;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let tenant = "ab1f708d-50f6-404c-a006-d71b2ac7a606";
    let encode = |json: serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json.to_string())
    };
    let header = encode(serde_json::json!({"alg": "RS256", "typ": "JWT"}));
    let claims = encode(serde_json::json!({
        "aud": "https://storage.azure.com",
        "iss": format!("https://sts.windows.net/{tenant}/"),
        "tid": tenant,
        "oid": "6a4f3c3e-0000-4000-8000-000000000001",
        "iat": now - 60,
        "nbf": now - 60,
        "exp": now + LIFETIME,
    }));
    serde_json::json!({
        "access_token": format!("{header}.{claims}.c2lnbmF0dXJl"),
        "expires_on": (now + LIFETIME).to_string(),
        "resource": "https://storage.azure.com",
        "token_type": "Bearer",
    })
    .to_string()
}

/// An Azurite of the test's own that takes Entra ID tokens (`--oauth
/// basic`, which it serves only over HTTPS, with the emulators' throwaway
/// CA's server certificate), with `container` created in it.
async fn azurite_with_oauth(
    container: &str,
) -> Result<(crate::support::stores::OwnServer, String)> {
    use crate::support::stores::{Endpoint, OwnServer};
    let bin = test_var("RUNLOCK_TEST_AZURITE", "azurite.sh")?;
    let tls = test_var("RUNLOCK_TEST_ETCD_TLS_DIR", "etcd.sh")?;
    let data = tempfile::Builder::new()
        .prefix("runlock-azurite-oauth")
        .tempdir_in("/tmp")?;
    let port = closed_port()?;
    let mut command = tokio::process::Command::new(bin);
    command
        .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
        .arg("--location")
        .arg(data.path())
        .args([
            "--skipApiVersionCheck",
            "--loose",
            "--disableTelemetry",
            "--oauth",
            "basic",
        ])
        .arg("--cert")
        .arg(format!("{tls}/server.crt"))
        .arg("--key")
        .arg(format!("{tls}/server.key"));
    let url = format!("https://127.0.0.1:{port}/{}", azure::ACCOUNT);
    let ready = move || -> crate::support::stores::Ready {
        Box::pin(async move {
            Ok(tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok())
        })
    };
    let server =
        OwnServer::spawn(command, Endpoint { url: url.clone() }, Some(data), ready).await?;
    // The container, made with the account key (Azurite takes both) by Azure's SDK.
    let ca = format!("{tls}/ca.crt");
    let script = "import sys\nfrom azure.storage.blob import BlobServiceClient\n\
                  url, key, container, ca = sys.argv[1:5]\n\
                  BlobServiceClient(url, credential={'account_name': 'devstoreaccount1', 'account_key': key}, \
                  connection_verify=ca).create_container(container)\n";
    let python = test_var("RUNLOCK_TEST_AZURE_PYTHON", "azurite.sh")?;
    let out = tokio::process::Command::new(python)
        .args(["-c", script, &url, azure::KEY, container, &ca])
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "creating the container: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((server, ca))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_identity_s_tokens_lock_across_hosts_and_are_fetched_again_while_held(
) -> Result<()> {
    let container = unique_name("entra");
    let (azurite, ca) = azurite_with_oauth(&container).await?;
    let tokens = TokenEndpoint::start().await?;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("runlockd.toml");
    std::fs::write(
        &config,
        format!(
            "[azure]\nstorage_account_url = \"{}\"\nca_file = \"{ca}\"\n",
            azurite.endpoint.url
        ),
    )?;
    // One host is an App Service with its system-assigned identity, the
    // other a VM with a user-assigned one.
    let app_service = vec![
        (
            "IDENTITY_ENDPOINT".to_string(),
            format!("{}/msi/token", tokens.url),
        ),
        ("IDENTITY_HEADER".to_string(), IDENTITY_HEADER.to_string()),
    ];
    let vm = vec![
        (
            "AZURE_POD_IDENTITY_AUTHORITY_HOST".to_string(),
            tokens.url.clone(),
        ),
        ("AZURE_CLIENT_ID".to_string(), CLIENT_ID.to_string()),
    ];
    let uri = format!("azure://{container}/p");
    let start = |env| {
        let mut options = AgentOptions::new(&uri);
        // A short TTL: the holder renews about every second, each time
        // with a token fetched again.
        options.args = vec![
            "--config".into(),
            config.display().to_string(),
            "--ttl".into(),
            "3s".into(),
        ];
        TestAgent::start_with_env(options, env)
    };
    let one = start(&app_service).await?;
    let two = start(&vm).await?;
    let k = key("entra");

    let mut held = one.run(&[&k], &[], HOLD)?;
    held.ready().await.with_context(|| one.log())?;
    let refused = two.run(&[&k], &[], "echo should-not-run")?.finish().await?;
    refused.expect_code(75).with_context(|| two.log())?;

    // The holder (the App Service host, whose requests alone are counted)
    // asks for no more than renewals while it holds: three more tokens are
    // three renewals, each with a token fetched again, and the lease lives on.
    let before = tokens.served();
    tokens.until_served(before + 3).await?;
    let still = two.run(&[&k], &[], "echo should-not-run")?.finish().await?;
    still
        .expect_code(75)
        .context("after the tokens were fetched again")?;

    crash_frees_the_key(held, &two, &k)
        .await
        .with_context(|| two.log())?;

    // The identity revoked: the next run is refused, naming the identity,
    // where it was looked for, and what the managed identity answered.
    tokens.revoke();
    let named = [
        "Entra ID identity",
        "[azure] account_url",
        "managed identity",
        "401",
    ];
    refused_naming(&two, &named, IDENTITY_HEADER).await?;
    for agent in [&one, &two] {
        ensure!(
            !agent.log().contains("c2lnbmF0dXJl"),
            "an agent's log shows a token"
        );
    }
    Ok(())
}
