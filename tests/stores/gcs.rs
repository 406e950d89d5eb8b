//! What only gs:// has: GCS takes about one write per object per second, so
//! the agent refuses TTLs it could not renew at that pace and spaces its own
//! writes of one key. Against fake-gcs-server, which `scripts/test` starts.

use crate::agent::config::runlockd;
use crate::support::agent::temp_dir;
use crate::support::key;
use crate::support::stores::{Gcs, Space};
use anyhow::{ensure, Context, Result};
use std::path::Path;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_too_short_to_renew_once_a_second_is_refused() -> Result<()> {
    let space = Space::create(Gcs, "short-ttl").await?;
    let agent = space.agent("p", &[]).await?;
    let out = agent
        .run_refused(&[&key("short-ttl")], &["--ttl", "4s"], 64)
        .await?;
    out.expect_stderr_has(&["between 5000 and", "gs://"])?;
    // The shortest TTL itself works.
    agent
        .run(&[&key("short-ttl")], &["--ttl", "5s"], "true")?
        .finish()
        .await?
        .expect_code(0)?;
    // An agent whose default TTL is too short does not start.
    let Err(refused) = space.agent("p", &["--ttl", "2s"]).await else {
        anyhow::bail!("runlockd started on gs:// with a 2 s TTL");
    };
    ensure!(
        format!("{refused:#}").contains("ttl 2s is too short for gs://"),
        "{refused:#}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_runs_on_one_key_write_its_record_a_second_apart() -> Result<()> {
    let space = Space::create(Gcs, "spacing").await?;
    let agent = space.agent("p", &[]).await?;
    let k = key("spacing");
    let started = Instant::now();
    for _ in 0..3 {
        agent
            .run(&[&k], &[], "true")?
            .finish()
            .await?
            .expect_code(0)?;
    }
    // Six writes of one record (acquire and release, three times): five intervals.
    let took = started.elapsed();
    ensure!(
        took >= Duration::from_secs(5),
        "three short runs took {took:?}: the record was written more than once a second"
    );
    let record = space.only_record("p").await?.json()?;
    ensure!(
        record["state"] == "free" && record["token"] == 3,
        "{record}"
    );
    Ok(())
}

/// A service-account key's JSON with a fresh RSA key, and one line of that
/// key, to look for in what the agent shows.
pub(crate) fn service_account_key() -> Result<(String, String)> {
    Ok(runlock_agent::backend::testing::service_account_key(
        "http://127.0.0.1:9/token",
    ))
}

/// A configuration file with `[gcs] credentials_json = json`.
pub(crate) fn config_with_inline_key(dir: &Path, json: &str) -> Result<String> {
    let path = dir.join("runlockd.toml");
    let text = format!("[gcs]\ncredentials_json = {}\n", toml_string(json));
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path.display().to_string())
}

/// `text` as a TOML basic string (JSON's escapes are TOML's).
fn toml_string(text: &str) -> String {
    serde_json::Value::String(text.to_string()).to_string()
}

/// Issue 31: the agent starts with a key given inline where it starts with a
/// key file, serves runs, and never shows the private key: not in
/// `check-config`, not in its log, not in the error that refuses a bad key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_service_account_key_serves_and_never_shows() -> Result<()> {
    let (json, key_line) = service_account_key()?;
    let dir = temp_dir()?;
    let config = config_with_inline_key(dir.path(), &json)?;
    let space = Space::create(Gcs, "inline-key").await?;
    let agent = space.agent("p", &["--config", &config]).await?;
    agent
        .run(&[&key("inline-key")], &[], "echo ran")?
        .finish()
        .await?
        .expect_code(0)?;
    ensure!(!agent.log().contains(&key_line), "the key is in the log");

    let mut env = space.env();
    env.push(("RUNLOCK_BACKEND".into(), space.uri("p")));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = runlockd(&["check-config", "--config", &config], &env).await?;
    out.expect_code(0)?;
    out.expect_stdout_has(&["credentials_json = \"<redacted>\""])?;
    ensure!(
        !out.stdout.contains(&key_line) && !out.stderr.contains(&key_line),
        "check-config showed the key: {out:?}"
    );

    let log = space
        .trace_log_of_one_run(&[], &[("RUNLOCK_GCS_CREDENTIALS_JSON", json.as_str())])
        .await?;
    ensure!(!log.contains(&key_line), "the key is in the trace log");

    // A key whose private key is broken stops the agent, naming the field.
    let broken = json.replace(&key_line, &format!("{key_line}!"));
    let config = config_with_inline_key(dir.path(), &broken)?;
    let Err(refused) = space.agent("p", &["--config", &config]).await else {
        anyhow::bail!("runlockd started with a broken key");
    };
    let refused = format!("{refused:#}");
    ensure!(
        refused.contains("[gcs] credentials_json: field `private_key`"),
        "{refused}"
    );
    ensure!(
        !refused.contains(&key_line),
        "the error shows the key: {refused}"
    );
    Ok(())
}
