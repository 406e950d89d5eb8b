//! The agent's configuration: file < `RUNLOCK_*` < flags, errors that name the
//! file, line and setting, `check-config` without secrets, and
//! `on_unavailable` end to end through the shim.

use crate::support::agent::{socket_in_temp_dir, temp_dir};
use crate::support::bins::bins;
use crate::support::closed_port;
use crate::support::run::Finished;
use crate::support::stores::s3_env_for as env_for;
use crate::support::{key, AgentOptions, Run, TestAgent};
use anyhow::{ensure, Context, Result};
use std::path::Path;
use tokio::process::Command;

/// `runlockd ARGS...` to its end, with `env` added and no inherited `RUNLOCK_*`.
pub(crate) async fn runlockd(args: &[&str], env: &[(&str, &str)]) -> Result<Finished> {
    let mut command = Command::new(&bins()?.runlockd);
    for (name, _) in std::env::vars().filter(|(n, _)| n.starts_with("RUNLOCK_")) {
        command.env_remove(name);
    }
    command.args(args).envs(env.iter().copied());
    Run::spawn(command)?.finish().await
}

fn write(dir: &Path, name: &str, text: &str) -> Result<String> {
    let path = dir.join(name);
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path.display().to_string())
}

#[tokio::test]
async fn settings_come_from_the_file_then_the_environment_then_flags() -> Result<()> {
    let dir = temp_dir()?;
    let file = write(
        dir.path(),
        "runlockd.toml",
        "socket = \"/tmp/from-file.sock\"\nbackend = \"memory://\"\nttl = \"10s\"\n\
         on_unavailable = \"skip\"\npoll_interval = \"2s\"\n",
    )?;
    let only_file = runlockd(&["check-config", "--config", &file], &[]).await?;
    only_file.expect_code(0)?;
    only_file.expect_stdout_has(&[
        "socket = \"/tmp/from-file.sock\"",
        "ttl = \"10s\"",
        "on_unavailable = \"skip\"",
        "poll_interval = \"2s\"",
        "backend = \"memory://\"",
        "socket_mode = \"0660\"",
    ])?;
    let env = [
        ("RUNLOCK_TTL", "45s"),
        ("RUNLOCK_ON_UNAVAILABLE", "warn"),
        ("RUNLOCK_POLL_INTERVAL", "3s"),
    ];
    let with_env = runlockd(&["check-config", "--config", &file], &env).await?;
    with_env.expect_stdout_has(&[
        "ttl = \"45s\"",
        "poll_interval = \"3s\"",
        "on_unavailable = \"warn\"",
    ])?;
    let with_flag = runlockd(
        &[
            "check-config",
            "--config",
            &file,
            "--ttl",
            "50s",
            "--poll-interval",
            "250ms",
        ],
        &env,
    )
    .await?;
    with_flag.expect_stdout_has(&[
        "ttl = \"50s\"",
        "poll_interval = \"250ms\"",
        "socket = \"/tmp/from-file.sock\"",
    ])?;
    Ok(())
}

#[tokio::test]
async fn check_config_never_prints_a_secret() -> Result<()> {
    let dir = temp_dir()?;
    let file = write(
        dir.path(),
        "runlockd.toml",
        "backend = \"s3://locks/meltano\"\n[s3]\nendpoint_url = \"http://user:pa55word@s3.test:9000\"\n\
         access_key_id = \"AKIDEXAMPLE\"\nsecret_access_key = \"s3cr3t-v4lue\"\n\
         [azure]\nconnection_string = \"AccountName=acct1;AccountKey=YXp1cmUtc2VjcmV0\"\n\
         account_name = \"acct1\"\naccount_key = \"YXp1cmUta2V5\"\n",
    )?;
    let out = runlockd(&["check-config", "--config", &file], &[]).await?;
    // The configuration is printed, then the store is found unreachable.
    out.expect_code(69)?;
    out.expect_stderr_has(&[
        "s3.test",
        "credentials: static access key AKIDEXAMPLE from [s3] access_key_id / secret_access_key",
    ])?;
    for secret in [
        "s3cr3t-v4lue",
        "pa55word",
        "YXp1cmUtc2VjcmV0",
        "YXp1cmUta2V5",
    ] {
        ensure!(!out.stderr.contains(secret), "a secret was shown: {out:?}");
    }
    out.expect_stdout_has(&[
        "backend = \"s3://locks/meltano\"",
        "access_key_id = \"AKIDEXAMPLE\"",
        "<redacted>",
    ])?;
    ensure!(
        !out.stdout.contains("s3cr3t-v4lue") && !out.stdout.contains("pa55word"),
        "a secret was printed: {out:?}"
    );
    out.expect_stdout_has(&["account_name = \"acct1\""])?;
    ensure!(
        !out.stdout.contains("YXp1cmUtc2VjcmV0") && !out.stdout.contains("YXp1cmUta2V5"),
        "an Azure secret was printed: {out:?}"
    );
    Ok(())
}

/// Issue 31: `check-config` names the credential source each store will
/// sign in with, never the secret itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_names_the_credential_source_never_the_secret() -> Result<()> {
    let dir = temp_dir()?;
    let port = closed_port()?;
    // Each case: (the file, what the credentials line says, the secret it must not show).
    let (gcs_json, private_key_line) = crate::stores::gcs::service_account_key()?;
    let gcs_file = crate::stores::gcs::config_with_inline_key(dir.path(), &gcs_json)?;
    let gcs = std::fs::read_to_string(&gcs_file)?;
    let cases = [
        (
            format!("backend = \"s3://locks/p\"\n[s3]\nendpoint_url = \"http://127.0.0.1:{port}\"\n"),
            "credentials: AWS SDK default chain (environment / profile / instance role)".to_string(),
            None,
        ),
        (
            format!("backend = \"s3://locks/p\"\n[s3]\nendpoint_url = \"http://127.0.0.1:{port}\"\nprofile = \"ci\"\n"),
            "credentials: AWS profile \"ci\" ([s3] profile)".to_string(),
            None,
        ),
        (
            format!("backend = \"gs://locks/p\"\n{gcs}"),
            "credentials: service-account key from [gcs] credentials_json (client_email ".to_string(),
            Some(private_key_line.as_str()),
        ),
        (
            format!(
                "backend = \"azure://locks/p\"\n[azure]\nconnection_string = \"AccountName=acct1;\
                 AccountKey=YXp1cmUtc2VjcmV0;BlobEndpoint=http://127.0.0.1:{port}/acct1\"\n"
            ),
            "credentials: account key from [azure] connection_string (account acct1)".to_string(),
            Some("YXp1cmUtc2VjcmV0"),
        ),
        (
            format!("backend = \"postgresql://u:pw-s3cret@127.0.0.1:{port}/db\"\n"),
            "credentials: password from the URI (redacted)".to_string(),
            Some("pw-s3cret"),
        ),
        (
            format!("backend = \"etcd://etl:etcd-s3cret@127.0.0.1:{port}/p\"\n"),
            "credentials: user etl with a password".to_string(),
            Some("etcd-s3cret"),
        ),
        (
            format!("backend = \"file://{}\"\n", dir.path().display()),
            "credentials: none".to_string(),
            None,
        ),
    ];
    for (text, want, secret) in cases {
        let file = write(dir.path(), "runlockd.toml", &text)?;
        // No emulator: the source named is the one the real service would get.
        let env = [("STORAGE_EMULATOR_HOST", ""), ("PGPASSWORD", "")];
        let out = runlockd(&["check-config", "--config", &file], &env).await?;
        ensure!(out.stderr.contains(&want), "{want:?} missing: {out:?}");
        if let Some(secret) = secret {
            ensure!(
                !out.stdout.contains(secret) && !out.stderr.contains(secret),
                "check-config showed the secret: {out:?}"
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_bad_file_is_refused_naming_file_line_and_setting() -> Result<()> {
    let dir = temp_dir()?;
    let unknown = write(
        dir.path(),
        "unknown.toml",
        "ttl = \"30s\"\n\n[access]\nforce_user = [0]\n",
    )?;
    let out = runlockd(&["--config", &unknown, "--backend", "memory://"], &[]).await?;
    out.expect_code(78)?;
    out.expect_stderr_has(&[&format!("{unknown}:4: `access.force_user`: unknown field")])?;
    let bad = write(
        dir.path(),
        "bad.toml",
        "backend = \"memory://\"\nttl = \"forever\"\n",
    )?;
    let out = runlockd(&["check-config", "--config", &bad], &[]).await?;
    out.expect_code(78)?;
    out.expect_stderr_has(&[&format!("{bad}:2: `ttl`: ")])?;
    let missing = dir.path().join("absent.toml").display().to_string();
    let out = runlockd(&["check-config", "--config", &missing], &[]).await?;
    out.expect_code(78)?;
    out.expect_stderr_has(&[&missing])?;
    Ok(())
}

/// A backend the agent cannot use as given is a configuration error too
/// (78, which systemd need not restart): a malformed URI, a certificate
/// file that is not there. Nothing is listening afterwards.
#[tokio::test]
async fn an_unusable_backend_setting_stops_the_agent_with_78() -> Result<()> {
    let (_dir, socket) = socket_in_temp_dir()?;
    let socket = socket.as_str();
    for (backend, env, says) in [
        ("s3://", vec![], "needs a bucket"),
        ("etcd://127.0.0.1:x/p", vec![], "\"x\" is not a port number"),
        (
            "etcd://127.0.0.1:2379/p",
            vec![("ETCDCTL_CACERT", "/nonexistent/ca.pem")],
            "reading the CA file /nonexistent/ca.pem",
        ),
    ] {
        let out = runlockd(&["--socket", socket, "--backend", backend], &env).await?;
        out.expect_code(78)
            .with_context(|| format!("backend {backend}"))?;
        ensure!(out.stderr.contains(says), "{backend}: {out:?}");
        ensure!(!Path::new(socket).exists(), "{backend}: a socket was left");
    }
    Ok(())
}

/// `runlock run` against a socket nobody listens on, with `env` added.
async fn run_without_agent(env: &[(&str, &str)]) -> Result<Finished> {
    let dir = temp_dir()?;
    let mut command = Command::new(&bins()?.runlock);
    for (name, _) in std::env::vars().filter(|(n, _)| n.starts_with("RUNLOCK_")) {
        command.env_remove(name);
    }
    command
        .arg("--socket")
        .arg(dir.path().join("nobody.sock"))
        .args(["run", "--key", &key("unreachable"), "--"])
        .args([
            "sh",
            "-c",
            "echo ran token=${RUNLOCK_TOKEN-unset} key=$RUNLOCK_KEY",
        ])
        .envs(env.iter().copied());
    Run::spawn(command)?.finish().await
}

#[tokio::test]
async fn an_unreachable_agent_fails_the_run_unless_the_policy_says_otherwise() -> Result<()> {
    let fail = run_without_agent(&[]).await?;
    fail.expect_code(69)?;
    ensure!(!fail.stdout.contains("ran"), "the command ran: {fail:?}");

    let warn = run_without_agent(&[("RUNLOCK_ON_UNAVAILABLE", "warn")]).await?;
    warn.expect_code(0)?;
    warn.expect_stdout_has(&["ran token=unset key=test:unreachable"])?;
    ensure!(warn.stderr.contains("WITHOUT A LOCK"), "not loud: {warn:?}");

    let dir = temp_dir()?;
    let file = write(dir.path(), "runlockd.toml", "on_unavailable = \"skip\"\n")?;
    let skip = run_without_agent(&[("RUNLOCK_CONFIG", &file)]).await?;
    skip.expect_code(0)?;
    skip.expect_stdout_has(&["ran"])?;
    ensure!(skip.stderr.is_empty(), "skip is silent: {skip:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_backend_follows_the_agents_policy() -> Result<()> {
    let endpoint = format!("http://127.0.0.1:{}", closed_port()?);
    let env = env_for(&endpoint);
    let k = key("backend-down");
    for (policy, code, ran, loud) in [
        ("fail", 69, false, false),
        ("warn", 0, true, true),
        ("skip", 0, true, false),
    ] {
        let mut options = AgentOptions::new("s3://nowhere/locks");
        options.args = vec!["--on-unavailable".into(), policy.into()];
        let agent = TestAgent::start_with_env(options, &env).await?;
        let out = agent.run(&[&k], &[], "echo ran")?.finish().await?;
        out.expect_code(code)?;
        ensure!(out.stdout.contains("ran") == ran, "{policy}: {out:?}");
        ensure!(
            out.stderr.contains("WITHOUT A LOCK") == loud,
            "{policy}: {out:?}"
        );
        ensure!(
            out.stderr.contains(&endpoint) == (policy != "skip"),
            "{policy}: the cause is named unless skipped: {out:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn the_shipped_example_configuration_is_valid() -> Result<()> {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../systemd/runlockd.toml");
    ensure!(
        std::fs::read_to_string(example)?.contains("\nbackend = \"file:///var/lib/runlock\"\n"),
        "the example's backend changed"
    );
    // Its socket group, `runlock`, exists only where the sysusers snippet
    // ran, and its directory is the package's: both replaced here.
    let dir = temp_dir()?;
    let backend = format!("file://{}", dir.path().join("locks").display());
    let out = runlockd(
        &[
            "check-config",
            "--config",
            example,
            "--socket-group",
            "0",
            "--backend",
            &backend,
        ],
        &[],
    )
    .await?;
    out.expect_code(0)?;
    out.expect_stderr_has(&["is ready"])?;
    Ok(())
}
