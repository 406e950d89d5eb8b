//! `legacy_meltano_systemdb`: while Meltano's system database records a live
//! `RUNNING` run of a state ID (Meltano's own staleness rule), the agent does
//! not grant that key. Each case runs on SQLite (a file written here) and on
//! PostgreSQL (`RUNLOCK_TEST_PG_URI`, from tests/scripts/postgres.sh; a
//! missing server fails the test, it is never skipped).

use crate::agent::config::runlockd;
use crate::support::agent::temp_dir;
use crate::support::bins::bins;
use crate::support::{key, within, AgentOptions, Run, TestAgent, WAIT};
use anyhow::{ensure, Context, Result};
use std::path::{Path, PathBuf};
use tempfile::TempDir;
use tokio::process::Command;

test_matrix!(
    [sqlite: Dialect::Sqlite, postgres: Dialect::Postgres];
    a_fresh_running_row_refuses_the_key_naming_the_run,
    a_stale_or_finished_run_does_not_hold_the_key,
    a_run_without_heartbeat_holds_the_key_for_24_hours,
    force_bypasses_the_check,
    a_waiting_run_starts_once_the_legacy_run_ends,
    an_unreadable_database_fails_as_unavailable,
);

/// Meltano's `runs` table, as its migrations leave it (types per dialect).
const RUNS_TABLE: &str = "CREATE TABLE runs (
    id INTEGER PRIMARY KEY, job_name VARCHAR, run_id VARCHAR, state VARCHAR,
    started_at TIMESTAMP, last_heartbeat_at TIMESTAMP, ended_at TIMESTAMP,
    payload TEXT, payload_flags INTEGER, trigger VARCHAR)";

#[derive(Debug, Clone, Copy)]
enum Dialect {
    Sqlite,
    Postgres,
}

/// One test's system database: a SQLite file, or a schema of its own in the
/// test PostgreSQL server (chosen with libpq's `options=-csearch_path=`).
struct SystemDb {
    dialect: Dialect,
    setting: String,
    _dir: TempDir,
    path: PathBuf,
    next_id: u32,
}

impl SystemDb {
    /// A database with an empty `runs` table.
    async fn new(dialect: Dialect, name: &str) -> Result<SystemDb> {
        let db = SystemDb::without_table(dialect, name).await?;
        db.exec(RUNS_TABLE).await?;
        Ok(db)
    }

    /// A database (or schema) that has no `runs` table.
    async fn without_table(dialect: Dialect, name: &str) -> Result<SystemDb> {
        let dir = temp_dir()?;
        let path = dir.path().join("meltano.db");
        let setting = match dialect {
            Dialect::Sqlite => format!("sqlite://{}", path.display()),
            Dialect::Postgres => {
                let base = std::env::var("RUNLOCK_TEST_PG_URI").context(
                    "RUNLOCK_TEST_PG_URI is not set: run `source tests/scripts/postgres.sh; \
                     pg_start` (scripts/test does)",
                )?;
                let schema = format!("legacy_{name}");
                postgres_exec(
                    &base,
                    &format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"),
                )
                .await?;
                let sep = if base.contains('?') { '&' } else { '?' };
                format!("{base}{sep}options=-csearch_path%3D{schema}")
            }
        };
        let db = SystemDb {
            dialect,
            setting,
            _dir: dir,
            path,
            next_id: 1,
        };
        if let Dialect::Sqlite = dialect {
            db.exec("PRAGMA user_version = 1").await?; // creates the file
        }
        Ok(db)
    }

    /// "now minus `interval`" in UTC, as the database computes it.
    fn ago(&self, interval: &str) -> String {
        match self.dialect {
            Dialect::Sqlite => format!("strftime('%Y-%m-%d %H:%M:%f', 'now', '-{interval}')"),
            Dialect::Postgres => format!("(now() AT TIME ZONE 'utc') - interval '{interval}'"),
        }
    }

    /// Records a run of `job` in `state`, started and last beating (if at
    /// all) the given intervals ago; returns its run id.
    async fn insert(
        &mut self,
        job: &str,
        state: &str,
        started: &str,
        heartbeat: Option<&str>,
    ) -> Result<String> {
        let id = self.next_id;
        self.next_id += 1;
        let run_id = format!("{:032x}", 0x5eed_0000_u64 + u64::from(id));
        let heartbeat = heartbeat.map_or("NULL".to_string(), |h| self.ago(h));
        self.exec(&format!(
            "INSERT INTO runs (id, job_name, run_id, state, started_at, last_heartbeat_at, \
             payload, payload_flags, trigger) VALUES ({id}, '{job}', '{run_id}', '{state}', \
             {}, {heartbeat}, '{{}}', 0, 'cli')",
            self.ago(started)
        ))
        .await?;
        Ok(run_id)
    }

    async fn exec(&self, sql: &str) -> Result<()> {
        match self.dialect {
            Dialect::Postgres => postgres_exec(&self.setting, sql).await,
            Dialect::Sqlite => sqlite_exec(&self.path, sql).await,
        }
    }

    /// An agent on `memory://` that checks this database.
    async fn agent(&self) -> Result<TestAgent> {
        let mut options = AgentOptions::new("memory://");
        options.args = vec![
            "--legacy-meltano-systemdb".to_string(),
            self.setting.clone(),
        ];
        TestAgent::start_with(options).await
    }
}

/// Runs `sql` (statements separated by `;`) on the PostgreSQL server at `uri`.
async fn postgres_exec(uri: &str, sql: &str) -> Result<()> {
    let run = async {
        let (client, connection) = tokio_postgres::connect(uri, tokio_postgres::NoTls).await?;
        let connection = tokio::spawn(connection);
        client.batch_execute(sql).await?;
        drop(client);
        connection.await??;
        anyhow::Ok(())
    };
    within(WAIT, "PostgreSQL to run a fixture", run)
        .await?
        .with_context(|| format!("running {sql:?} on PostgreSQL"))
}

/// Runs `sql` on the SQLite database at `path`, creating the file if there is none.
async fn sqlite_exec(path: &Path, sql: &str) -> Result<()> {
    let (path, script) = (path.to_path_buf(), sql.to_string());
    let run = tokio::task::spawn_blocking(move || {
        let db = rusqlite::Connection::open(&path)?;
        // The agent may be reading the file: wait for its lock as sqlite3 would.
        db.busy_timeout(WAIT)?;
        db.execute_batch(&script)
    });
    within(WAIT, "SQLite to run a fixture", run)
        .await??
        .with_context(|| format!("running {sql:?} on SQLite"))
}

/// A state ID of Meltano's shape, unique to the test.
fn state_id(name: &str) -> String {
    key(&format!("dev:tap-{name}-to-target-y"))
}

/// A system database where Meltano's own run of `state_id(name)` is
/// RUNNING, started a minute ago and beating now, and an agent that checks
/// it: the key, the database and the agent.
async fn a_live_legacy_run(dialect: Dialect, name: &str) -> Result<(String, SystemDb, TestAgent)> {
    let mut db = SystemDb::new(dialect, name).await?;
    let k = state_id(name);
    db.insert(&k, "RUNNING", "1 minute", Some("0 seconds"))
        .await?;
    let agent = db.agent().await?;
    Ok((k, db, agent))
}

async fn run_once(
    agent: &TestAgent,
    k: &str,
    extra: &[&str],
) -> Result<crate::support::run::Finished> {
    agent.run(&[k], extra, "echo started")?.finish().await
}

fn expect_started(out: &crate::support::run::Finished) -> Result<()> {
    out.expect_code(0)?;
    out.expect_stdout_has(&["started"])?;
    Ok(())
}

async fn a_fresh_running_row_refuses_the_key_naming_the_run(dialect: Dialect) -> Result<()> {
    let mut db = SystemDb::new(dialect, "fresh").await?;
    let k = state_id("fresh");
    let run_id = db
        .insert(&k, "RUNNING", "2 minutes", Some("0 seconds"))
        .await?;
    let agent = db.agent().await?;
    let out = run_once(&agent, &k, &[]).await?;
    out.expect_code(75)?;
    ensure!(!out.stdout.contains("started"), "the run started: {out:?}");
    out.expect_stderr_has(&[
        run_id.as_str(),
        "RUNNING in the system database",
        "meltano system database",
    ])?;
    // Another state ID is not held by it.
    expect_started(&run_once(&agent, &state_id("fresh-other"), &[]).await?)
}

async fn a_stale_or_finished_run_does_not_hold_the_key(dialect: Dialect) -> Result<()> {
    let mut db = SystemDb::new(dialect, "stale").await?;
    let stale = state_id("stale");
    db.insert(&stale, "RUNNING", "1 hour", Some("6 minutes"))
        .await?;
    let done = state_id("done");
    db.insert(&done, "SUCCESS", "1 minute", Some("0 seconds"))
        .await?;
    let agent = db.agent().await?;
    expect_started(&run_once(&agent, &stale, &[]).await?)?;
    expect_started(&run_once(&agent, &done, &[]).await?)
}

async fn a_run_without_heartbeat_holds_the_key_for_24_hours(dialect: Dialect) -> Result<()> {
    let mut db = SystemDb::new(dialect, "noheartbeat").await?;
    let recent = state_id("nohb-recent");
    db.insert(&recent, "RUNNING", "1 hour", None).await?;
    let old = state_id("nohb-old");
    db.insert(&old, "RUNNING", "25 hours", None).await?;
    let agent = db.agent().await?;
    run_once(&agent, &recent, &[]).await?.expect_code(75)?;
    expect_started(&run_once(&agent, &old, &[]).await?)
}

async fn force_bypasses_the_check(dialect: Dialect) -> Result<()> {
    let (k, _db, agent) = a_live_legacy_run(dialect, "force").await?;
    run_once(&agent, &k, &[]).await?.expect_code(75)?;
    expect_started(&run_once(&agent, &k, &["--force"]).await?)
}

async fn a_waiting_run_starts_once_the_legacy_run_ends(dialect: Dialect) -> Result<()> {
    let (k, db, agent) = a_live_legacy_run(dialect, "wait").await?;
    let mut waiting: Run = agent.run(&[&k], &["--wait", "20s"], "echo started")?;
    // Still refused well after its first try: it is waiting, not started.
    let early = tokio::time::timeout(std::time::Duration::from_millis(700), waiting.wait()).await;
    ensure!(
        early.is_err(),
        "ended while the legacy run was RUNNING: {early:?}"
    );
    db.exec(&format!(
        "UPDATE runs SET state = 'SUCCESS' WHERE job_name = '{k}'"
    ))
    .await?;
    let out = waiting.finish().await?;
    expect_started(&out)?;
    ensure!(
        out.elapsed >= std::time::Duration::from_millis(700),
        "{out:?}"
    );
    Ok(())
}

async fn an_unreadable_database_fails_as_unavailable(dialect: Dialect) -> Result<()> {
    let db = SystemDb::without_table(dialect, "unreadable").await?;
    let agent = db.agent().await?;
    let out = run_once(&agent, &state_id("unreadable"), &[]).await?;
    out.expect_code(69)?;
    ensure!(!out.stdout.contains("started"), "{out:?}");
    ensure!(
        out.stderr.contains("runs"),
        "the table is not named: {out:?}"
    );
    if let Dialect::Sqlite = dialect {
        std::fs::remove_file(&db.path)?;
        let out = run_once(&agent, &state_id("unreadable"), &[]).await?;
        out.expect_code(69)?;
        let path = db.path.display().to_string();
        ensure!(out.stderr.contains(&path), "{path} is not named: {out:?}");
        ensure!(
            !db.path.exists(),
            "the agent created the missing database file"
        );
    }
    Ok(())
}

#[tokio::test]
async fn check_config_shows_the_system_database_without_its_password() -> Result<()> {
    let systemdb = "postgresql://meltano:pa55word@db.test:5432/meltano?password=pa55word";
    let out = runlockd(
        &["check-config", "--backend", "memory://"],
        &[("RUNLOCK_LEGACY_MELTANO_SYSTEMDB", systemdb)],
    )
    .await?;
    out.expect_code(0)?;
    out.expect_stdout_has(&[
        "legacy_meltano_systemdb = \"postgresql://***@db.test:5432/meltano?password=***\"",
    ])?;
    ensure!(
        !out.stdout.contains("pa55word"),
        "a secret was printed: {out:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_bad_setting_is_a_config_error() -> Result<()> {
    let dir = temp_dir()?;
    let file = dir.path().join("runlockd.toml");
    std::fs::write(
        &file,
        "legacy_meltano_systemdb = \"mysql://u:pa55word@db/m\"\n",
    )?;
    let mut command = Command::new(&bins()?.runlockd);
    command.arg("check-config").arg("--config").arg(&file);
    let out = Run::spawn(command)?.finish().await?;
    out.expect_code(78)?;
    out.expect_stderr_has(&["legacy_meltano_systemdb"])?;
    ensure!(!out.stderr.contains("pa55word"), "{out:?}");
    Ok(())
}
