//! Azure without an account key (issue 31): real agents on Azurite with a
//! shared access signature in the connection string, as Meltano's
//! `state_backend.azure.connection_string` may carry one. An account SAS and
//! a container SAS lock across hosts and free a crashed run's key; a
//! read-only SAS is refused by name, and the agent's log never holds the
//! signature. An Entra ID identity that cannot be had is named too.

use crate::support::run::HOLD;
use crate::support::stores::{azure, test_var, unique_name, Azure, Store};
use crate::support::{closed_port, key, AgentOptions, TestAgent};
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

        // The holder's run dies whole: its key is free for the other host.
        held.signal(Signal::SIGKILL)?;
        held.kill_group()?;
        held.wait().await?;
        let next = two
            .run(&[&k], &["--wait", "30s"], "echo acquired")?
            .finish()
            .await?;
        next.expect_code(0).context(format!("{kind} SAS"))?;
        ensure!(next.stdout.contains("acquired"), "{next:?}");

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
    let run = agent
        .run(&[&key("ro")], &[], "echo should-not-run")?
        .finish()
        .await?;
    ensure!(
        run.code() != Some(0),
        "a read-only SAS granted a lease: {run:?}"
    );
    ensure!(!run.stdout.contains("should-not-run"), "{run:?}");
    let said = format!("{}\n{}", run.stderr, agent.log());
    ensure!(
        said.contains("shared access signature")
            && said.contains("AZURE_STORAGE_CONNECTION_STRING"),
        "the refusal does not name the credential and where it came from: {said}"
    );
    ensure!(
        !said.contains(signature(&token)),
        "the signature is shown: {said}"
    );
    Ok(())
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
    let run = agent
        .run(&[&key("entra")], &[], "echo should-not-run")?
        .finish()
        .await?;
    run.expect_code(69)?;
    ensure!(!run.stdout.contains("should-not-run"), "{run:?}");
    let said = format!("{}\n{}", run.stderr, agent.log());
    ensure!(
        said.contains("Entra ID identity") && said.contains("[azure] account_url"),
        "the refusal does not name the identity and its setting: {said}"
    );
    ensure!(
        !said.contains("not-a-secret"),
        "the identity header is shown: {said}"
    );
    Ok(())
}
