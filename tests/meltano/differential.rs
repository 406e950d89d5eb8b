//! The differential test of `runlock run --meltano` against Meltano itself
//! (issue 44, item 2). tests/meltano/differential/run.py generates a few
//! hundred Meltano project shapes, asks the installed Meltano 4.4.1 (its own
//! CLI, forked per shape) which state IDs each forms and what its
//! `state_backend` settings are, asks the built `runlock --print-keys` and
//! `runlockd check-config --from-meltano` the same, and reports every
//! mismatch. This runs it with a bound and fails on any mismatch, or on
//! fewer shapes than the matrix promises. Meltano's venv comes from
//! `RUNLOCK_TEST_MELTANO` (tests/scripts/meltano.sh); unset, the test fails.

use crate::support::agent::temp_dir;
use crate::support::bins::bins;
use crate::support::within;
use anyhow::{ensure, Context, Result};
use serde::Deserialize;
use std::path::Path;
use std::time::Duration;
use tokio::process::Command;

/// The whole run: about 70 s of CPU (Meltano's work per shape dominates),
/// so half a minute on two idle cores; four minutes on two cores shared
/// with ten other busy processes.
const BOUND: Duration = Duration::from_secs(420);

/// What run.py writes with `--summary`.
#[derive(Debug, Deserialize)]
struct Summary {
    run_shapes: usize,
    backend_shapes: usize,
    failed_run: usize,
    failed_backend: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runlock_locks_the_state_ids_meltano_forms() -> Result<()> {
    let meltano = crate::support::meltano_installed("RUNLOCK_TEST_MELTANO")?;
    let python = Path::new(&meltano).with_file_name("python");
    let bins = bins()?;
    let harness = Path::new(env!("CARGO_MANIFEST_DIR")).join("meltano/differential/run.py");
    let dir = temp_dir()?;
    let summary_file = dir.path().join("summary.json");
    let mut command = Command::new(&python);
    command
        .arg(&harness)
        .arg("--runlock")
        .arg(&bins.runlock)
        .arg("--runlockd")
        .arg(&bins.runlockd)
        .arg("--meltano-python")
        .arg(&python)
        .arg("--summary")
        .arg(&summary_file)
        .kill_on_drop(true);
    let output = within(BOUND, "the Meltano differential harness", command.output())
        .await?
        .with_context(|| format!("running {}", python.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The summary, and the report of what failed, belong in the log.
    eprintln!("{stdout}");
    let summary: Summary = serde_json::from_str(
        &std::fs::read_to_string(&summary_file)
            .with_context(|| format!("the harness wrote no summary: {stderr}"))?,
    )?;
    ensure!(
        summary.run_shapes >= 200,
        "only {} run/el/elt shapes",
        summary.run_shapes
    );
    ensure!(
        summary.backend_shapes >= 20,
        "only {} state_backend shapes",
        summary.backend_shapes
    );
    ensure!(
        summary.failed_run == 0 && summary.failed_backend == 0,
        "{} run/el/elt and {} state_backend shapes differ from Meltano (the report \
         is printed above, and kept in /tmp/meltano-diff-report.txt)",
        summary.failed_run,
        summary.failed_backend
    );
    ensure!(
        output.status.success(),
        "the harness exited with {}: {stderr}",
        output.status
    );
    Ok(())
}
