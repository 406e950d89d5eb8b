//! `runlockd check-config --from-meltano PROJECT_DIR` (issue 31 item 4): a
//! Meltano project's state backend printed as the agent's TOML, secrets named
//! by the variable to set and never shown, and the TOML accepted by
//! `check-config --config` with those variables set.

use crate::agent::config::runlockd;
use crate::support::agent::temp_dir;
use crate::support::closed_port;
use anyhow::{ensure, Context, Result};
use std::path::Path;

/// A project directory holding `meltano_yml` as its meltano.yml.
fn project(root: &Path, name: &str, meltano_yml: &str) -> Result<String> {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("meltano.yml"), meltano_yml).context("writing meltano.yml")?;
    Ok(dir.display().to_string())
}

/// Imports `project`, checks the output holds `want` and not `secret`, then
/// runs `check-config` on it with `env` set: the agent must accept it (an
/// unreachable store exits 69, not 78).
async fn imports(
    project: &str,
    import_env: &[(&str, &str)],
    want: &[&str],
    secret: &str,
    env: &[(&str, &str)],
) -> Result<()> {
    let out = runlockd(&["check-config", "--from-meltano", project], import_env).await?;
    out.expect_code(0)?;
    for want in want {
        ensure!(out.stdout.contains(want), "{want:?} missing: {out:?}");
    }
    ensure!(
        !out.stdout.contains(secret) && !out.stderr.contains(secret),
        "the import showed a secret: {out:?}"
    );
    let file = Path::new(project).join("runlockd.toml");
    std::fs::write(&file, &out.stdout)?;
    let file = file.display().to_string();
    let check = runlockd(&["check-config", "--config", &file], env).await?;
    ensure!(
        check.status.code() != Some(78),
        "the printed configuration was refused: {check:?}"
    );
    ensure!(
        !check.stdout.contains(secret) && !check.stderr.contains(secret),
        "check-config showed a secret: {check:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_meltano_state_backend_becomes_the_agents_configuration() -> Result<()> {
    let dir = temp_dir()?;
    let root = dir.path();
    let port = closed_port()?;
    let endpoint = format!("http://127.0.0.1:{port}");
    let no_emulator = ("STORAGE_EMULATOR_HOST", "");

    let s3 = project(
        root,
        "s3",
        &format!(
            "project_id: p\nstate_backend:\n  uri: s3://locks/meltano\n  s3:\n    \
             aws_access_key_id: AKIDEXAMPLE\n    aws_secret_access_key: s3-s3cr3t\n    \
             endpoint_url: {endpoint}\n"
        ),
    )?;
    let s3_want = [
        "backend = \"s3://locks/meltano\"",
        &format!("endpoint_url = \"{endpoint}\""),
        "AWS_SECRET_ACCESS_KEY",
    ];
    let s3_env = [
        ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
        ("AWS_SECRET_ACCESS_KEY", "s3-s3cr3t"),
    ];
    imports(&s3, &[], &s3_want, "s3-s3cr3t", &s3_env).await?;

    let connection_string =
        format!("AccountName=acct1;AccountKey=YXp1cmUtc2VjcmV0;BlobEndpoint={endpoint}/acct1");
    let azure = project(
        root,
        "azure",
        &format!(
            "state_backend:\n  uri: azure://locks/meltano\n  azure:\n    \
             connection_string: \"{connection_string}\"\n"
        ),
    )?;
    let azure_want = [
        "backend = \"azure://locks/meltano\"",
        "AZURE_STORAGE_CONNECTION_STRING",
    ];
    let azure_env = [(
        "AZURE_STORAGE_CONNECTION_STRING",
        connection_string.as_str(),
    )];
    imports(&azure, &[], &azure_want, "YXp1cmUtc2VjcmV0", &azure_env).await?;

    // The variable wins over meltano.yml's key file, as in Meltano.
    let (json, private_key_line) = crate::stores::gcs::service_account_key()?;
    let gcs = project(
        root,
        "gcs",
        "state_backend:\n  uri: gs://locks/meltano\n  gcs:\n    \
         application_credentials_path: key.json\n",
    )?;
    let import_env = [(
        "MELTANO_STATE_BACKEND_GCS_APPLICATION_CREDENTIALS_JSON",
        json.as_str(),
    )];
    let gcs_want = [
        "backend = \"gs://locks/meltano\"",
        "RUNLOCK_GCS_CREDENTIALS_JSON",
    ];
    let gcs_env = [("RUNLOCK_GCS_CREDENTIALS_JSON", json.as_str()), no_emulator];
    imports(&gcs, &import_env, &gcs_want, &private_key_line, &gcs_env).await?;

    let postgres = project(
        root,
        "postgres",
        &format!("state_backend:\n  uri: postgresql://meltano:pw-s3cret@127.0.0.1:{port}/state\n"),
    )?;
    let postgres_want = [
        &format!("backend = \"postgresql://meltano@127.0.0.1:{port}/state\"") as &str,
        "PGPASSWORD",
    ];
    let postgres_env = [("PGPASSWORD", "pw-s3cret")];
    imports(&postgres, &[], &postgres_want, "pw-s3cret", &postgres_env).await?;

    // MELTANO_STATE_BACKEND_URI wins over the file's URI.
    let state_dir = root.join("state");
    std::fs::create_dir_all(&state_dir)?;
    let file_uri = format!("file://{}", state_dir.display());
    let local = project(root, "local", "state_backend:\n  uri: s3://elsewhere/p\n")?;
    let local_env = [("MELTANO_STATE_BACKEND_URI", file_uri.as_str())];
    let local_want = [&format!("backend = \"{file_uri}\"") as &str];
    imports(&local, &local_env, &local_want, "no secret here", &[]).await?;

    // A project with no state backend keeps state in its system database.
    let systemdb = project(root, "systemdb", "project_id: p\n")?;
    let out = runlockd(&["check-config", "--from-meltano", &systemdb], &[]).await?;
    out.expect_code(78)?;
    ensure!(out.stderr.contains("system database"), "{out:?}");
    Ok(())
}
