//! The book's and README's picture of `runlock ui` (docs/src/images/ui.png),
//! made from real runs: `scripts/screenshot-ui` runs this ignored test.
//!
//! A day of runs cannot be waited for, so earlier agents run under
//! libfaketime, each starting some hours ago with its clock going 600 times
//! as fast: a run held for 2 s then reads as 20 minutes on the page's 24 h
//! axis. Every agent shares one `file://` directory, so the last agent, on
//! the real clock, lists the whole day. The sleeps here make the runs' lengths.
//!
//! Before it writes the picture it reads the page as a person would: the
//! window fitted to the day, the keys in order, the Meltano add-on's state
//! writes apart, and the axis's labels apart, 1280 and 800 px wide.

use super::{agent_in_the_past_minutes, axis_labels_apart, set_width};
use crate::support::agent::FileBackendDir;
use crate::support::browser::{Browser, WINDOW};
use crate::support::run::HOLD;
use crate::support::{Run, TestAgent};
use anyhow::{ensure, Context, Result};
use nix::sys::signal::Signal;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

/// How much faster the earlier agents' clocks go.
const SPEED: u32 = 600;

const GITHUB: &str = "dev:tap-github-to-target-postgres";
const SALESFORCE: &str = "dev:tap-salesforce-to-target-snowflake";
const WAREHOUSE: &str = "warehouse";
const DBT: &str = "prod:dbt-build";
const EXPORT: &str = "reports:region2-export";
/// After region2 in a person's order, before it in bytes.
const EXPORT_10: &str = "reports:region10-export";

/// The key the Meltano add-on locks while a pipeline's run writes its state.
fn state_write(pipeline: &str) -> String {
    format!("meltano-state-write:{pipeline}")
}

/// An agent on `dir` whose clock starts `hours_ago` and runs `speed` times as fast.
async fn agent_in_the_past(dir: &FileBackendDir, hours_ago: u32, speed: u32) -> Result<TestAgent> {
    agent_in_the_past_minutes(dir, hours_ago * 60, speed).await
}

/// A stand-in for Meltano, so the page shows commands as a pipeline's
/// read: it holds its keys until its stdin closes, as [`HOLD`] does.
struct Pipelines {
    bin: tempfile::TempDir,
}

impl Pipelines {
    fn new() -> Result<Pipelines> {
        let bin = crate::support::agent::temp_dir()?;
        let meltano = bin.path().join("meltano");
        std::fs::write(&meltano, format!("#!/bin/sh\n{HOLD}\n"))?;
        std::fs::set_permissions(&meltano, std::fs::Permissions::from_mode(0o755))?;
        Ok(Pipelines { bin })
    }

    /// `meltano run EL...` under `runlock run --key KEY EXTRA...`, started.
    fn spawn(&self, agent: &TestAgent, key: &str, extra: &[&str], el: &str) -> Result<Run> {
        let path = std::env::var("PATH").unwrap_or_default();
        let mut command = agent.runlock()?;
        command
            .env("PATH", format!("{}:{path}", self.bin.path().display()))
            .args(["run", "--key", key])
            .args(extra)
            .args(["--", "meltano", "run"])
            .args(el.split_whitespace());
        Run::spawn(command)
    }

    /// Like [`Pipelines::spawn`], once the pipeline runs.
    async fn start(&self, agent: &TestAgent, key: &str, extra: &[&str], el: &str) -> Result<Run> {
        let mut run = self.spawn(agent, key, extra, el)?;
        run.ready().await?;
        Ok(run)
    }
}

/// Holds `key` for `seconds` of real time, then releases it.
async fn hold(
    p: &Pipelines,
    agent: &TestAgent,
    key: &str,
    extra: &[&str],
    seconds: f64,
) -> Result<()> {
    let run = p.start(agent, key, extra, &el(key)).await?;
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    run.end_and_expect_success().await
}

/// Holds `key` for `seconds`, then dies with its shim (a crash).
async fn crash(p: &Pipelines, agent: &TestAgent, key: &str, seconds: f64) -> Result<()> {
    let mut run = p.start(agent, key, &[], &el(key)).await?;
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    run.signal(Signal::SIGKILL)?;
    run.kill_group()?;
    run.wait().await?;
    Ok(())
}

/// Holds `key` for `seconds`, when another run takes it over with `--force`
/// and holds it for `then` seconds.
async fn forced(
    p: &Pipelines,
    agent: &TestAgent,
    key: &str,
    seconds: f64,
    then: f64,
) -> Result<()> {
    let run = p.start(agent, key, &[], &el(key)).await?;
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    hold(p, agent, key, &["--force"], then).await?;
    run.finish().await?.expect_code(76)
}

/// The extract-load blocks a key's pipeline runs (`meltano run` arguments);
/// a state write is its pipeline's.
fn el(key: &str) -> String {
    match key.strip_prefix("meltano-state-write:").unwrap_or(key) {
        GITHUB => "tap-github target-postgres",
        SALESFORCE => "tap-salesforce target-snowflake",
        DBT => "dbt-postgres:build",
        EXPORT | EXPORT_10 => "tap-postgres target-s3-csv",
        _ => "tap-x target-warehouse",
    }
    .to_string()
}

#[tokio::test]
#[ignore = "writes the screenshot: scripts/screenshot-ui"]
async fn screenshot_for_the_book() -> Result<()> {
    let out = PathBuf::from(
        std::env::var_os("RUNLOCK_UI_SCREENSHOT")
            .context("RUNLOCK_UI_SCREENSHOT names the PNG to write")?,
    );
    let dir = FileBackendDir::new()?;
    let p = Pipelines::new()?;
    let slots = ["--slots", "3"];
    let (github_write, salesforce_write) = (state_write(GITHUB), state_write(SALESFORCE));

    let a = agent_in_the_past(&dir, 22, SPEED).await?;
    tokio::try_join!(
        hold(&p, &a, GITHUB, &[], 3.0),
        hold(&p, &a, &github_write, &[], 0.5),
        hold(&p, &a, EXPORT_10, &[], 2.0),
        hold(&p, &a, WAREHOUSE, &slots, 4.0),
        hold(&p, &a, WAREHOUSE, &slots, 2.0),
        hold(&p, &a, DBT, &[], 5.0),
    )?;
    drop(a);

    let b = agent_in_the_past(&dir, 17, SPEED).await?;
    tokio::try_join!(
        crash(&p, &b, GITHUB, 2.0),
        forced(&p, &b, SALESFORCE, 4.0, 2.0),
        hold(&p, &b, WAREHOUSE, &slots, 5.0),
        hold(&p, &b, EXPORT, &[], 2.0),
    )?;
    drop(b);

    // An agent killed while a run holds a key: the run ends with no agent to
    // free the record, and the next agent to take the key finds it expired.
    let mut c = agent_in_the_past(&dir, 12, SPEED).await?;
    let mut orphan = p.start(&c, EXPORT, &[], &el(EXPORT)).await?;
    tokio::try_join!(
        hold(&p, &c, GITHUB, &[], 3.0),
        hold(&p, &c, DBT, &[], 2.0),
        hold(&p, &c, WAREHOUSE, &slots, 2.0),
    )?;
    c.kill().await?;
    orphan.end();
    orphan.finish().await?;

    let d = agent_in_the_past(&dir, 7, SPEED).await?;
    tokio::try_join!(
        hold(&p, &d, EXPORT, &[], 2.0),
        hold(&p, &d, EXPORT_10, &[], 3.0),
        hold(&p, &d, &salesforce_write, &[], 0.5),
        hold(&p, &d, GITHUB, &[], 4.0),
        hold(&p, &d, SALESFORCE, &[], 3.0),
        hold(&p, &d, WAREHOUSE, &slots, 3.0),
        hold(&p, &d, DBT, &[], 3.0),
    )?;
    drop(d);

    let e = agent_in_the_past(&dir, 3, SPEED).await?;
    tokio::try_join!(
        crash(&p, &e, DBT, 1.5),
        hold(&p, &e, GITHUB, &[], 2.0),
        hold(&p, &e, &github_write, &[], 0.5),
        hold(&p, &e, WAREHOUSE, &slots, 3.0),
    )?;
    drop(e);

    // The runs held now began from 45 minutes ago: this agent's clock goes
    // 100 times as fast, and is still behind the real one when the page is read.
    let now = agent_in_the_past_minutes(&dir, 45, 100).await?;
    let mut held = Vec::new();
    for (key, extra, el) in [
        (GITHUB, &[][..], el(GITHUB)),
        (WAREHOUSE, &slots[..], "tap-x target-warehouse".to_string()),
        (SALESFORCE, &[][..], el(SALESFORCE)),
        (WAREHOUSE, &slots[..], "tap-y target-warehouse".to_string()),
    ] {
        held.push(p.start(&now, key, extra, &el).await?);
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    // The held pipeline writes its state: a moment's lock, as Meltano's are.
    hold(&p, &now, &github_write, &[], 0.3).await?;
    let waiter = p.spawn(&now, GITHUB, &["--wait", "2h"], &el(GITHUB))?;
    now.run(&[SALESFORCE], &[], "true")?
        .finish()
        .await?
        .expect_code(75)?;

    let mut command = now.runlock()?;
    command.arg("ui");
    let mut ui = Run::spawn(command)?;
    let url = ui.line().await?;
    let mut page = Browser::open(&url).await?;
    page.wait_for(
        "document.querySelector('#held td.waiting')?.textContent === '1' \
         && document.querySelectorAll('#timeline .bar.ending-expired').length > 0",
        "the page to show the waiter and the day's runs",
    )
    .await?;
    let order = page
        .evaluate(
            "[document.body.dataset.window, \
              [...document.querySelectorAll('#timeline .tl-row')].map(r => r.dataset.key), \
              [...document.querySelectorAll('#timeline-state-writes .tl-row')].map(r => r.dataset.key)]",
        )
        .await?;
    let want = serde_json::json!([
        "24h",
        [GITHUB, SALESFORCE, DBT, EXPORT, EXPORT_10, WAREHOUSE],
        [github_write, salesforce_write],
    ]);
    ensure!(
        order == want,
        "the page reads [window, pipelines, state writes] {order}, not {want}"
    );
    for width in [800, WINDOW.0] {
        set_width(&mut page, width).await?;
        axis_labels_apart(&mut page)
            .await
            .with_context(|| format!("{width} px wide"))?;
    }
    page.screenshot(&out).await?;
    println!("wrote {}", out.display());
    drop((held, waiter));
    Ok(())
}
