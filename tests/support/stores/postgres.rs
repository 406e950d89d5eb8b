//! PostgreSQL: the throwaway cluster `scripts/test` starts
//! (tests/scripts/postgres.sh, `RUNLOCK_TEST_PG_*`). A space is a database of
//! its own; records are the rows of its `runlock.locks` table, read with psql.
//! The schema is a setting of the agent, not of the URI, so a prefix plays no
//! part: each space holds one test's records only.

use super::{output_of, test_var, Endpoint, Failure, Kind, Objects, OwnServer, Record, Store};
use crate::closed_port;
use anyhow::{Context, Result};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, UNIX_EPOCH};
use tokio::process::Command;

/// The PostgreSQL store.
#[derive(Debug, Clone, Copy)]
pub struct Postgres;

const SCRIPT: &str = "postgres.sh";

fn bin(name: &str) -> Result<std::path::PathBuf> {
    Ok(std::path::Path::new(&test_var("RUNLOCK_TEST_PG_BIN", SCRIPT)?).join(name))
}

/// `at` with database `name` in place of its own.
fn database(at: &Endpoint, name: &str) -> Result<String> {
    let (server, _) = at
        .url
        .rsplit_once('/')
        .with_context(|| format!("{} names no database", at.url))?;
    Ok(format!("{server}/{name}"))
}

/// Runs `sql` with psql on `uri`, unaligned and tuples only; returns what it printed.
async fn psql(uri: &str, sql: &str) -> Result<String> {
    let mut command = Command::new(bin("psql")?);
    command
        .args([
            "-X",
            "-w",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-F",
            "\t",
        ])
        .args(["-d", uri, "-c", sql])
        .env_remove("PGPASSWORD");
    output_of(command, b"", &format!("psql {sql:?}")).await
}

/// Starts the server (argv[3:]) as a child in this process group, then
/// forwards 127.0.0.1:argv[1] to its port argv[2] until killed.
const PAUSABLE: &str = r#"
import asyncio, subprocess, sys
listen, target, server = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
subprocess.Popen(server, stdin=subprocess.DEVNULL)

async def pump(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()

async def forward(reader, writer):
    try:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
    except OSError:
        writer.close()
        return
    await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

async def main():
    proxy = await asyncio.start_server(forward, "127.0.0.1", listen)
    async with proxy:
        await proxy.serve_forever()

asyncio.run(main())
"#;

/// Runs `command` as the cluster's owner: `postgres` when we are root (the
/// server refuses to run as root), else ourselves.
fn as_owner(command: &mut Command) -> Result<Option<(nix::unistd::Uid, nix::unistd::Gid)>> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let user = nix::unistd::User::from_name("postgres")?
        .context("no user postgres to run the server as")?;
    command.uid(user.uid.as_raw()).gid(user.gid.as_raw());
    Ok(Some((user.uid, user.gid)))
}

#[async_trait::async_trait]
impl Store for Postgres {
    fn kind(&self) -> Kind {
        Kind::new("postgres", "RUNLOCK_TEST_PG_URI", SCRIPT)
    }

    async fn start_own(&self) -> Result<OwnServer> {
        let dir = tempfile::Builder::new().prefix("runlock-pg-").tempdir()?;
        let data = dir.path().join("data");
        let mut initdb = Command::new(bin("initdb")?);
        initdb.args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "-D",
        ]);
        initdb.arg(&data);
        if let Some((uid, gid)) = as_owner(&mut initdb)? {
            nix::unistd::chown(dir.path(), Some(uid), Some(gid))?;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))?;
        }
        output_of(initdb, b"", "initdb").await?;
        let (port, server_port) = (closed_port()?.to_string(), closed_port()?.to_string());
        // PostgreSQL's backends each call setsid(), so stopping the server's
        // process group would stop only the postmaster, and connections made
        // before the pause would go on being served. The agents reach the server
        // through a proxy in the group instead: stopping the group stops all
        // traffic, as a hung store would.
        let mut server = Command::new("python3");
        server.args(["-c", PAUSABLE, &port, &server_port]);
        server.arg(bin("postgres")?).arg("-D").arg(&data);
        server
            .args(["-p", &server_port, "-k"])
            .arg(dir.path())
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "client_connection_check_interval=1s",
            ]);
        as_owner(&mut server)?;
        let url = format!("postgresql://postgres@127.0.0.1:{port}/postgres");
        let ready = bin("pg_isready")?;
        OwnServer::spawn(server, Endpoint { url }, Some(dir), move || {
            let mut probe = Command::new(&ready);
            probe
                .args(["-q", "-h", "127.0.0.1", "-p", &port, "-t", "2"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            Box::pin(async move { Ok(probe.status().await?.success()) })
        })
        .await
    }

    async fn create(&self, at: &Endpoint, name: &str) -> Result<()> {
        psql(&at.url, &format!("CREATE DATABASE \"{name}\""))
            .await
            .map(|_| ())
    }

    fn uri(&self, at: &Endpoint, name: &str, _prefix: &str) -> String {
        // invariant: every endpoint here names a database (see `shared`, `start_own`)
        database(at, name).unwrap_or_default()
    }

    fn env(&self, _at: &Endpoint) -> Vec<(String, String)> {
        Vec::new() // the superuser logs in without a password
    }

    fn objects(&self) -> &dyn Objects {
        self
    }

    async fn failures(&self, at: &Endpoint) -> Result<Vec<Failure>> {
        let missing = super::unique_name("missing").replace('-', "_");
        let password_uri = test_var("RUNLOCK_TEST_PG_PW_URI", SCRIPT)?;
        let wrong = "sEcReT-must-not-leak";
        let refusing = format!("127.0.0.1:{}", closed_port()?);
        let limited = at.url.replacen("postgres@", "runlock_limited@", 1);
        Ok(vec![
            Failure {
                what: "a missing database".into(),
                uri: database(at, &missing)?,
                env: Vec::new(),
                names: vec![missing.clone(), "does not exist".into()],
                secret: None,
            },
            Failure {
                what: "a wrong password".into(),
                uri: password_uri.replacen("runlock_pw@", &format!("runlock_pw:{wrong}@"), 1),
                env: Vec::new(),
                names: vec!["password authentication failed".into(), "runlock_pw".into()],
                secret: Some(wrong.into()),
            },
            Failure {
                what: "a wrong password in PGPASSWORD".into(),
                uri: password_uri,
                env: vec![("PGPASSWORD".into(), wrong.into())],
                names: vec!["password authentication failed".into(), "PGPASSWORD".into()],
                secret: Some(wrong.into()),
            },
            Failure {
                what: "a port where nothing listens".into(),
                uri: format!("postgresql://u:{wrong}@{refusing}/postgres"),
                env: Vec::new(),
                names: vec![refusing, "refused the connection".into()],
                secret: Some(wrong.into()),
            },
            Failure {
                what: "a role that may not create the lock table".into(),
                uri: limited,
                env: Vec::new(),
                names: vec!["permission denied".into(), "runlock_limited".into()],
                secret: None,
            },
        ])
    }

    fn stamp_resolution(&self) -> Duration {
        Duration::ZERO // timestamptz: microseconds
    }
}

#[async_trait::async_trait]
impl Objects for Postgres {
    async fn records(&self, at: &Endpoint, name: &str, _prefix: &str) -> Result<Vec<Record>> {
        let exists = psql(
            &database(at, name)?,
            "SELECT to_regclass('runlock.locks') IS NOT NULL",
        )
        .await?;
        if exists.trim() != "t" {
            return Ok(Vec::new());
        }
        let text = psql(
            &database(at, name)?,
            "SELECT key, extract(epoch FROM written),
                    json_build_object('key', key, 'state', state, 'token', token,
                        'lease_id', lease_id, 'holder', holder, 'ttl_ms', ttl_ms,
                        'grace_ms', grace_ms, 'forced_from', forced_from)
             FROM runlock.locks ORDER BY key",
        )
        .await?;
        text.lines()
            .filter(|line| !line.is_empty())
            .map(|line| {
                let mut fields = line.splitn(3, '\t');
                let (key, epoch, body) = (fields.next(), fields.next(), fields.next());
                let (Some(key), Some(epoch), Some(body)) = (key, epoch, body) else {
                    anyhow::bail!("psql printed {line:?}");
                };
                let seconds: f64 = epoch.parse().with_context(|| format!("epoch {epoch:?}"))?;
                Ok(Record {
                    name: key.to_string(),
                    written: Some(UNIX_EPOCH + Duration::from_secs_f64(seconds)),
                    body: body.to_string(),
                })
            })
            .collect()
    }

    async fn put(&self, _at: &Endpoint, _name: &str, _object: &str, _body: &[u8]) -> Result<()> {
        anyhow::bail!("PostgreSQL holds rows, not objects")
    }

    async fn get(&self, _at: &Endpoint, _name: &str, _object: &str) -> Result<Option<String>> {
        anyhow::bail!("PostgreSQL holds rows, not objects")
    }
}

/// PostgreSQL through PgBouncer in transaction pooling mode
/// (tests/scripts/pgbouncer.sh, `RUNLOCK_TEST_PGBOUNCER_URI`), in front of
/// the cluster [`Postgres`] uses: every database name passes through, so a
/// space is a database of that cluster, made and read through PgBouncer
/// with psql's simple queries. Its own instance and its failures are
/// [`Postgres`]'s business.
#[derive(Debug, Clone, Copy)]
pub struct PgBouncer;

#[async_trait::async_trait]
impl Store for PgBouncer {
    fn kind(&self) -> Kind {
        Kind::new("pgbouncer", "RUNLOCK_TEST_PGBOUNCER_URI", "pgbouncer.sh")
    }

    async fn start_own(&self) -> Result<OwnServer> {
        anyhow::bail!("the pause scenarios run on PostgreSQL itself")
    }

    async fn create(&self, at: &Endpoint, name: &str) -> Result<()> {
        Postgres.create(at, name).await
    }

    fn uri(&self, at: &Endpoint, name: &str, prefix: &str) -> String {
        Postgres.uri(at, name, prefix)
    }

    fn env(&self, at: &Endpoint) -> Vec<(String, String)> {
        Postgres.env(at)
    }

    fn objects(&self) -> &dyn Objects {
        &Postgres
    }

    async fn failures(&self, _at: &Endpoint) -> Result<Vec<Failure>> {
        anyhow::bail!("the failure scenarios run on PostgreSQL itself")
    }

    fn stamp_resolution(&self) -> Duration {
        Postgres.stamp_resolution()
    }
}
