//! Secrets stay secret for any bytes a password may hold (issue 13): not in
//! `check-config`, not in the exit-78 message, and not in a `RUST_LOG=trace`
//! log, where only the agent's own crates log below `info`.

use crate::agent::config::runlockd;
use crate::support::agent::socket_in_temp_dir;
use crate::support::stores::{Space, S3};
use anyhow::{ensure, Context, Result};

/// Two halves that must never be shown, joined by each character that ends
/// a part of a URI: a redaction that stops at it shows the second half, a
/// parser that splits there shows the first.
const HALVES: (&str, &str) = ("Qz7sekr", "Xw9vrt");

fn passwords() -> Vec<String> {
    ['/', '?', '#', ':', '@']
        .iter()
        .map(|c| format!("{}{c}{}", HALVES.0, HALVES.1))
        .collect()
}

fn ensure_hidden(what: &str, text: &str) -> Result<()> {
    ensure!(
        !text.contains(HALVES.0) && !text.contains(HALVES.1),
        "{what}: part of the password is shown:\n{text}"
    );
    Ok(())
}

#[tokio::test]
async fn check_config_hides_a_password_whatever_it_holds() -> Result<()> {
    for password in passwords() {
        for uri in [
            format!("postgresql://runlock:{password}@db.test:5432/meltano"),
            format!("postgres://runlock:{password}@db.test/meltano?sslmode=disable"),
            format!("postgresql://db.test/meltano?user=runlock&password={password}"),
            format!("etcd://runlock:{password}@etcd.test:2379/locks"),
            format!("s3://runlock:{password}@bucket/prefix"),
            format!("azure://runlock:{password}@container/prefix"),
            format!("gs://runlock:{password}@bucket/prefix"),
        ] {
            let systemdb = format!("postgresql+psycopg2://meltano:{password}@db.test/meltano");
            let env = [("RUNLOCK_LEGACY_MELTANO_SYSTEMDB", systemdb.as_str())];
            let out = runlockd(&["check-config", "--backend", &uri], &env).await?;
            // An object store's URI may not carry credentials (78); the
            // others name hosts that do not exist (69).
            let refused = ["s3", "azure", "gs"].iter().any(|s| uri.starts_with(s));
            out.expect_code(if refused { 78 } else { 69 })
                .with_context(|| uri.clone())?;
            ensure!(out.stdout.contains("backend = \""), "{uri}: {out:?}");
            ensure_hidden(&uri, &format!("{}{}", out.stdout, out.stderr))?;
        }
    }
    Ok(())
}

#[tokio::test]
async fn the_exit_78_message_hides_a_password_whatever_it_holds() -> Result<()> {
    let (_dir, socket) = socket_in_temp_dir()?;
    let socket = socket.as_str();
    for password in passwords() {
        for (uri, says) in [
            (
                format!("postgresql://runlock:{password}@db.test:port/meltano"),
                "not a number",
            ),
            (
                format!("etcd://runlock:{password}@etcd.test:port/locks"),
                "not a port number",
            ),
            (
                format!("etcd://runlock:{password}@etcd.test/locks?bogus=1"),
                "unknown setting",
            ),
            (format!("s3://runlock:{password}@bucket/prefix"), "s3://"),
            (
                format!("azure://runlock:{password}@container/p"),
                "azure://",
            ),
            (format!("gs://runlock:{password}@bucket/prefix"), "gs://"),
            (format!("runlock:{password}@db.test"), "is not a URI"),
        ] {
            let out = runlockd(&["--socket", socket, "--backend", &uri], &[]).await?;
            out.expect_code(78).with_context(|| uri.clone())?;
            ensure!(
                out.stderr.contains(says),
                "{uri}: {says:?} not said: {out:?}"
            );
            ensure_hidden(&uri, &out.stderr)?;
        }
        let systemdb = format!("mysql://meltano:{password}@db.test/meltano");
        let env = [("RUNLOCK_LEGACY_MELTANO_SYSTEMDB", systemdb.as_str())];
        let out = runlockd(&["check-config", "--backend", "memory://"], &env).await?;
        out.expect_code(78)?;
        ensure!(out.stderr.contains("not supported"), "{out:?}");
        ensure_hidden(&systemdb, &out.stderr)?;
    }
    Ok(())
}

/// Every user of the host reads a process's arguments: a password in
/// `--backend` is warned of, naming where to give it instead, and one given
/// there is not.
#[tokio::test]
async fn a_password_on_the_command_line_is_warned_of_and_one_in_the_environment_is_not(
) -> Result<()> {
    const WARNING: &str = "holds a password, which every user of this host can read";
    let password = format!("{}{}", HALVES.0, HALVES.1);
    for uri in [
        format!("postgresql://runlock:{password}@db.test/meltano"),
        format!("postgresql://db.test/meltano?user=runlock&password={password}"),
    ] {
        let out = runlockd(&["check-config", "--backend", &uri], &[]).await?;
        ensure!(
            out.stderr
                .contains(&format!("warning: --backend {WARNING}"))
                && out.stderr.contains("RUNLOCK_BACKEND"),
            "{uri}: no warning: {out:?}"
        );
        ensure_hidden(&uri, &format!("{}{}", out.stdout, out.stderr))?;
        let out = runlockd(&["check-config"], &[("RUNLOCK_BACKEND", &uri)]).await?;
        ensure!(
            !out.stderr.contains(WARNING),
            "{uri} from the environment: {out:?}"
        );
    }
    let user_only = "postgresql://runlock@db.test/meltano";
    let out = runlockd(&["check-config", "--backend", user_only], &[]).await?;
    ensure!(!out.stderr.contains(WARNING), "a user name alone: {out:?}");
    let systemdb = format!("postgresql+psycopg2://meltano:{password}@db.test/meltano");
    let flags = [
        "check-config",
        "--backend",
        "memory://",
        "--legacy-meltano-systemdb",
    ];
    let out = runlockd(&[&flags[..], &[systemdb.as_str()]].concat(), &[]).await?;
    ensure!(
        out.stderr
            .contains(&format!("--legacy-meltano-systemdb {WARNING}")),
        "no warning for the system database: {out:?}"
    );
    Ok(())
}

/// The AWS SDK and the HTTP and TLS stacks under it log headers, strings to
/// sign and signatures at `debug` and `trace`; only the agent's own crates
/// may log below `info`, so `RUST_LOG=trace` shows none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_trace_log_holds_no_secret_and_no_client_library_detail() -> Result<()> {
    const SECRET: &str = "tRaCe-s3cr3t-access-key";
    let space = Space::create(S3, "trace-log").await?;
    let env = [("AWS_SECRET_ACCESS_KEY", SECRET)];
    let log = space
        .trace_log_of_one_run(&["--log-format", "json"], &env)
        .await?;
    let mut ours = 0;
    for line in log.lines() {
        let event: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("not JSON: {line}"))?;
        let level = event["level"].as_str().unwrap_or_default();
        let target = event["target"].as_str().unwrap_or_default();
        if level == "DEBUG" || level == "TRACE" {
            let crate_name = target.split("::").next().unwrap_or_default();
            ensure!(
                ["runlock_agent", "runlockd", "runlock_protocol"].contains(&crate_name),
                "{target} logged at {level}: {line}"
            );
            ours += 1;
        }
    }
    ensure!(ours > 0, "the agent did not log verbosely: {log}");
    for secret in [SECRET, "Authorization", "Signature=", "AWS4-HMAC-SHA256"] {
        ensure!(
            !log.contains(secret),
            "{secret:?} is in the trace log: {log}"
        );
    }
    Ok(())
}

/// Issue 46: with no credentials anywhere, an S3 store says so and where the
/// SDK looked, instead of passing on the last place's failure ("failed to
/// load credentials from IMDS"), and shows no part of a lone secret key.
#[tokio::test]
async fn s3_without_credentials_says_none_were_found_and_where_it_looked() -> Result<()> {
    const LONE_SECRET: &str = "l0ne-s3cret-without-its-key-id";
    let home = crate::support::agent::temp_dir()?;
    let imds = format!("http://127.0.0.1:{}", crate::support::closed_port()?);
    let mut command = tokio::process::Command::new(&crate::support::bins::bins()?.runlockd);
    // Nothing inherited: no credentials, profile or role of the machine's.
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("AWS_REGION", "us-east-1")
        // The instance metadata service answers nothing here, at once.
        .env("AWS_EC2_METADATA_SERVICE_ENDPOINT", &imds)
        .env("AWS_SECRET_ACCESS_KEY", LONE_SECRET)
        .args([
            "check-config",
            "--backend",
            "s3://runlock-test-bucket/locks",
        ]);
    let out = crate::support::run::Run::spawn(command)?.finish().await?;
    out.expect_code(69)?;
    let error = out
        .stderr
        .lines()
        .find(|line| line.starts_with("runlockd: error:"))
        .with_context(|| format!("no error: {out:?}"))?;
    for said in [
        "no AWS credentials found for S3 at AWS region us-east-1: looked in ",
        "the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)",
        "profile \"default\" of ~/.aws/credentials",
        "web identity",
        "the instance metadata service (IMDS)",
        "[s3] access_key_id",
    ] {
        ensure!(error.contains(said), "{said:?} not in {error}");
    }
    ensure!(
        !out.stderr.contains(LONE_SECRET) && !out.stdout.contains(LONE_SECRET),
        "the secret is shown: {out:?}"
    );
    Ok(())
}
