//! The PostgreSQL backend against a real PostgreSQL: the throwaway cluster
//! that tests/scripts/postgres.sh starts (`scripts/test` does) and names in
//! `RUNLOCK_TEST_PG_*`. Without it these tests fail; they never skip. Each
//! test works in a schema (or database) of its own. (Moved here from
//! agent/src, so that the agent's own tests need no store running.)

use crate::support::stores::{Postgres, Space};
use anyhow::{bail, ensure, Context, Result};
use runlock_agent::backend::postgres::{Link, Settings, DEFAULT_SCHEMA};
use runlock_agent::backend::testing::{adopter, lease, spec};
use runlock_agent::backend::{
    AcquireSpec, Backend, BackendError, PostgresBackend, PostgresOptions, StoreContext,
};
use runlock_protocol::timing::grace;
use runlock_protocol::{Key, KeyState};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);
const HOW: &str = "start the test cluster with `source tests/scripts/postgres.sh && pg_start` \
                   (scripts/test does) and keep its RUNLOCK_TEST_PG_* variables";

fn var(name: &str) -> Result<String> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .with_context(|| format!("{name} is not set: {HOW}"))
}

/// The superuser URI of the test cluster, with `path` as its database.
fn uri_for(database: &str) -> Result<String> {
    let uri = var("RUNLOCK_TEST_PG_URI")?;
    let (server, _) = uri
        .rsplit_once('/')
        .context("RUNLOCK_TEST_PG_URI has no database")?;
    Ok(format!("{server}/{database}"))
}

/// A connection of the test's own, made as the backend makes its own.
async fn admin(uri: &str) -> Result<Link> {
    Settings::from_uri(uri, None)
        .map_err(anyhow::Error::msg)?
        .link(&StoreContext::default())
        .await
        .map_err(anyhow::Error::msg)
}

/// A backend on a fresh, empty schema `schema` of the `postgres` database.
async fn fresh(schema: &str) -> Result<PostgresBackend> {
    let uri = var("RUNLOCK_TEST_PG_URI")?;
    admin(&uri)
        .await?
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .await?;
    on(&uri, schema)
}

fn on(uri: &str, schema: &str) -> Result<PostgresBackend> {
    let options = PostgresOptions {
        schema: Some(schema.to_string()),
        listen: None,
    };
    PostgresBackend::open(uri, &options, &StoreContext::default())
}

/// The row of `key`, as psql would show it.
async fn row(
    schema: &str,
    key: &str,
) -> Result<(String, i64, Option<serde_json::Value>, Option<i64>)> {
    let client = admin(&var("RUNLOCK_TEST_PG_URI")?).await?;
    let row = client
        .query_one(
            &format!(
                "SELECT state, token, holder::text, forced_from FROM {schema}.locks WHERE key = $1"
            ),
            &[&key],
        )
        .await?;
    let holder: Option<String> = row.get(2);
    Ok((
        row.get(0),
        row.get(1),
        holder.map(|h| serde_json::from_str(&h)).transpose()?,
        row.get(3),
    ))
}

#[tokio::test]
async fn agents_exclude_each_other_naming_the_holder_and_tokens_outlive_release() -> Result<()> {
    let one = fresh("t_exclude").await?;
    let two = on(&var("RUNLOCK_TEST_PG_URI")?, "t_exclude")?;
    let granted = one.acquire(&spec("k", "l1", false, TTL)).await?;
    ensure!(
        granted.holder.token == 1,
        "first token: {}",
        granted.holder.token
    );
    match two.acquire(&spec("k", "l2", false, TTL)).await {
        Err(BackendError::Held(Some(h), _)) => {
            ensure!((h.host.as_str(), h.token) == ("host-of-l1", 1), "{h:?}")
        }
        other => bail!("expected held with its holder, got {other:?}"),
    }
    let inspected = two.inspect(&Key::new("k")?).await?;
    ensure!(inspected.state == KeyState::Held && inspected.token == 1);
    ensure!(inspected
        .holder
        .as_ref()
        .is_some_and(|h| h.agent_id == "agent-of-l1"));
    ensure!(inspected
        .expires_in_ms
        .is_some_and(|ms| ms > 5_000 && ms <= TTL.as_millis() as u64));
    let (_, _, holder, _) = row("t_exclude", "k").await?;
    let holder = holder.context("a held row names its holder")?;
    ensure!(
        holder["token"] == 1 && holder["agent_id"] == "agent-of-l1",
        "{holder}"
    );

    one.renew(&lease("k", "l1", 1), TTL).await?;
    // Renew and release are conditioned on the lease id and the token.
    ensure!(matches!(
        two.renew(&lease("k", "l2", 1), TTL).await,
        Err(BackendError::LeaseMismatch)
    ));
    ensure!(matches!(
        two.renew(&lease("k", "l1", 2), TTL).await,
        Err(BackendError::LeaseMismatch)
    ));
    two.release(&lease("k", "l1", 2)).await?;
    ensure!(
        row("t_exclude", "k").await?.0 == "held",
        "a wrong token freed the key"
    );

    one.release(&lease("k", "l1", 1)).await?;
    let (state, token, holder, _) = row("t_exclude", "k").await?;
    ensure!((state.as_str(), token, holder) == ("free", 1, None));
    let again = two.acquire(&spec("k", "l2", false, TTL)).await?;
    ensure!(
        again.holder.token == 2,
        "the token grows past a release: {}",
        again.holder.token
    );
    let inspected = one.inspect(&Key::new("absent")?).await?;
    ensure!((inspected.state, inspected.token) == (KeyState::Free, 0));
    Ok(())
}

#[tokio::test]
async fn a_silent_holder_is_taken_over_only_after_ttl_and_grace_by_the_database_clock() -> Result<()>
{
    let ttl = Duration::from_secs(1);
    let one = fresh("t_expiry").await?;
    let two = on(&var("RUNLOCK_TEST_PG_URI")?, "t_expiry")?;
    let sent = one.acquire(&spec("k", "l1", false, ttl)).await?.sent;
    let earliest = sent + ttl + grace(ttl);
    let taken = loop {
        match two.acquire(&spec("k", "l2", false, ttl)).await {
            Ok(grant) => break grant,
            Err(BackendError::Held(..)) => {}
            Err(other) => bail!("{other}"),
        }
        ensure!(
            Instant::now() < earliest + Duration::from_secs(3),
            "never taken over"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    ensure!(
        taken.sent >= earliest,
        "taken over {:?} early",
        earliest - taken.sent
    );
    ensure!(taken.holder.token == 2);
    ensure!(matches!(
        one.renew(&lease("k", "l1", 1), ttl).await,
        Err(BackendError::LeaseMismatch)
    ));
    // An expired row that nobody took is free to inspect, and its lease can no longer renew.
    let three = on(&var("RUNLOCK_TEST_PG_URI")?, "t_expiry")?;
    three.acquire(&spec("j", "l3", false, ttl)).await?;
    tokio::time::sleep(ttl + grace(ttl) + Duration::from_millis(100)).await;
    ensure!(three.inspect(&Key::new("j")?).await?.state == KeyState::Free);
    ensure!(matches!(
        three.renew(&lease("j", "l3", 1), ttl).await,
        Err(BackendError::LeaseMismatch)
    ));
    Ok(())
}

#[tokio::test]
async fn force_records_whom_it_took_from_and_the_old_lease_can_neither_renew_nor_free() -> Result<()>
{
    let one = fresh("t_force").await?;
    let two = on(&var("RUNLOCK_TEST_PG_URI")?, "t_force")?;
    one.acquire(&spec("k", "l1", false, TTL)).await?;
    let forced = two.acquire(&spec("k", "l2", true, TTL)).await?;
    ensure!(forced.holder.token == 2);
    let (state, token, _, forced_from) = row("t_force", "k").await?;
    ensure!((state.as_str(), token, forced_from) == ("held", 2, Some(1)));
    ensure!(matches!(
        one.renew(&lease("k", "l1", 1), TTL).await,
        Err(BackendError::LeaseMismatch)
    ));
    one.release(&lease("k", "l1", 1)).await?;
    ensure!(row("t_force", "k").await?.0 == "held");
    // Acquiring again with the same lease id (an attempt whose answer was
    // lost) keeps the token and what it was forced from.
    let repeated = two.acquire(&spec("k", "l2", true, TTL)).await?;
    ensure!(repeated.holder.token == 2);
    ensure!(row("t_force", "k").await?.3 == Some(1));
    Ok(())
}

#[tokio::test]
async fn agents_starting_together_make_the_table_once_and_racing_acquires_have_one_winner(
) -> Result<()> {
    fresh("t_race").await?;
    let uri = var("RUNLOCK_TEST_PG_URI")?;
    let agents: Vec<Arc<PostgresBackend>> = (0..8)
        .map(|_| on(&uri, "t_race").map(Arc::new))
        .collect::<Result<_>>()?;
    let probes = futures::future::join_all(agents.iter().map(|a| a.probe())).await;
    for probe in probes {
        probe.map_err(anyhow::Error::msg)?;
    }
    let specs: Vec<AcquireSpec> = (0..8)
        .map(|i| spec("k", &format!("l{i}"), false, TTL))
        .collect();
    let results =
        futures::future::join_all(agents.iter().zip(&specs).map(|(a, s)| a.acquire(s))).await;
    let winners = results.iter().filter(|r| r.is_ok()).count();
    let held = results
        .iter()
        .filter(|r| matches!(r, Err(BackendError::Held(..))))
        .count();
    ensure!((winners, held) == (1, 7), "{results:?}");
    Ok(())
}

#[tokio::test]
async fn a_release_is_announced_to_other_agents() -> Result<()> {
    let one = fresh("t_notify").await?;
    let two = on(&var("RUNLOCK_TEST_PG_URI")?, "t_notify")?;
    two.probe().await.map_err(anyhow::Error::msg)?; // listening from now on
    let mut releases = two.releases().context("postgres announces releases")?;
    let granted = one.acquire(&spec("k", "l1", false, TTL)).await?;
    one.release(&lease("k", "l1", granted.holder.token)).await?;
    let heard = tokio::time::timeout(Duration::from_secs(5), releases.recv())
        .await
        .context("no announcement within 5 s")??;
    ensure!(heard.as_str() == "k");
    // Releasing a lease that is not held announces nothing.
    one.release(&lease("k", "l1", granted.holder.token)).await?;
    ensure!(
        tokio::time::timeout(Duration::from_millis(300), releases.recv())
            .await
            .is_err()
    );
    // Without LISTEN there is nothing to subscribe to: waiters poll.
    let quiet = PostgresBackend::open(
        &var("RUNLOCK_TEST_PG_URI")?,
        &PostgresOptions {
            schema: Some("t_notify".into()),
            listen: Some(false),
        },
        &StoreContext::default(),
    )?;
    ensure!(quiet.releases().is_none());
    Ok(())
}

#[tokio::test]
async fn a_dropped_connection_is_made_again_and_the_lease_renewed() -> Result<()> {
    let one = fresh("t_reconnect").await?;
    let granted = one.acquire(&spec("k", "l1", false, TTL)).await?;
    let admin = admin(&var("RUNLOCK_TEST_PG_URI")?).await?;
    let killed = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = 'runlockd' AND query LIKE '%\"t_reconnect\"%' \
               AND pid <> pg_backend_pid()",
            &[],
        )
        .await?;
    ensure!(killed.len() == 1, "terminated {} connections", killed.len());
    one.renew(&lease("k", "l1", granted.holder.token), TTL)
        .await?;
    ensure!(row("t_reconnect", "k").await?.0 == "held");
    Ok(())
}

#[tokio::test]
async fn a_restarted_agent_adopts_a_lease_that_is_still_held() -> Result<()> {
    let old = fresh("t_adopt").await?;
    let new = on(&var("RUNLOCK_TEST_PG_URI")?, "t_adopt")?;
    let granted = old.acquire(&spec("k", "l1", false, TTL)).await?;
    let token = granted.holder.token;
    ensure!(matches!(
        new.adopt(&lease("k", "l1", token + 1), &adopter("agent-new"))
            .await,
        Err(BackendError::LeaseMismatch)
    ));
    let adopted = new
        .adopt(&lease("k", "l1", token), &adopter("agent-new"))
        .await?;
    ensure!(adopted.ttl == TTL);
    ensure!(adopted.grant.holder.agent_id == "agent-new" && adopted.grant.holder.token == token);
    let holder = new
        .inspect(&Key::new("k")?)
        .await?
        .holder
        .context("still held")?;
    ensure!(holder.agent_id == "agent-new" && holder.host == "host-of-l1");
    new.renew(&lease("k", "l1", token), TTL).await?;
    new.release(&lease("k", "l1", token)).await?;
    ensure!(matches!(
        new.adopt(&lease("k", "l1", token), &adopter("agent-new"))
            .await,
        Err(BackendError::LeaseMismatch)
    ));
    Ok(())
}

/// BENCHMARKS.md quotes these counts.
#[tokio::test]
async fn each_operation_is_one_statement() -> Result<()> {
    let backend = fresh("t_statements").await?;
    backend.probe().await.map_err(anyhow::Error::msg)?;
    let count = |before: u64| backend.statements_sent() - before;
    let before = backend.statements_sent();
    let granted = backend.acquire(&spec("k", "l1", false, TTL)).await?;
    ensure!(
        count(before) == 1,
        "acquire of a new key: {}",
        count(before)
    );
    let lease = lease("k", "l1", granted.holder.token);
    for (what, statements) in [
        ("renew", {
            let before = backend.statements_sent();
            backend.renew(&lease, TTL).await?;
            count(before)
        }),
        ("inspect", {
            let before = backend.statements_sent();
            backend.inspect(&lease.key).await?;
            count(before)
        }),
        ("release", {
            let before = backend.statements_sent();
            backend.release(&lease).await?;
            count(before)
        }),
        ("acquire of a freed key", {
            let before = backend.statements_sent();
            backend.acquire(&spec("k", "l2", false, TTL)).await?;
            count(before)
        }),
        ("acquire of a held key, naming its holder", {
            let before = backend.statements_sent();
            let held = backend.acquire(&spec("k", "l3", false, TTL)).await;
            ensure!(matches!(held, Err(BackendError::Held(Some(_), _))));
            count(before)
        }),
    ] {
        ensure!(statements == 1, "{what}: {statements} statements");
    }
    Ok(())
}

#[tokio::test]
async fn meltanos_tables_beside_the_lock_table_are_left_alone() -> Result<()> {
    // A database of its own, as Meltano's system database would be.
    let uri = Space::create(Postgres, "beside-meltano").await?.uri("");
    let meltano = admin(&uri).await?;
    // Meltano's system database keeps `runs` (and others) in `public`; a table
    // named like ours must not be mistaken for ours either.
    meltano
        .batch_execute(
            "CREATE TABLE runs (id serial PRIMARY KEY, job_name text, state text);
             INSERT INTO runs (job_name, state) VALUES ('dev:tap-to-target', 'RUNNING');
             CREATE TABLE locks (key text PRIMARY KEY, note text);
             INSERT INTO locks VALUES ('k', 'not runlock''s');",
        )
        .await?;
    let backend = on(&uri, DEFAULT_SCHEMA)?;
    let granted = backend.acquire(&spec("k", "l1", false, TTL)).await?;
    backend
        .release(&lease("k", "l1", granted.holder.token))
        .await?;
    let snapshot = meltano
        .query_one(
            "SELECT (SELECT string_agg(job_name || '/' || state, ',') FROM public.runs),
                    (SELECT string_agg(key || '/' || note, ',') FROM public.locks),
                    (SELECT string_agg(table_schema || '.' || table_name, ',' ORDER BY table_schema, table_name)
                     FROM information_schema.tables
                     WHERE table_schema NOT IN ('pg_catalog', 'information_schema'))",
            &[],
        )
        .await?;
    let (runs, locks, tables): (String, String, String) =
        (snapshot.get(0), snapshot.get(1), snapshot.get(2));
    ensure!(runs == "dev:tap-to-target/RUNNING", "{runs}");
    ensure!(locks == "k/not runlock's", "{locks}");
    ensure!(
        tables == "public.locks,public.runs,runlock.agents,runlock.locks,runlock.stopped",
        "{tables}"
    );
    Ok(())
}

/// Every failure: unavailable, naming the cause and what to check, never the password.
async fn fails_with(backend: &PostgresBackend, says: &[&str], secret: Option<&str>) -> Result<()> {
    let probe = backend.probe().await;
    let acquired = backend.acquire(&spec("k", "l1", false, TTL)).await;
    let Err(probe) = probe else {
        bail!("the probe passed")
    };
    let message = match acquired {
        Err(BackendError::Unavailable(message)) => message,
        other => bail!("expected unavailable, got {other:?}"),
    };
    for text in [&probe, &message] {
        for part in says {
            ensure!(text.contains(part), "{text:?} does not say {part:?}");
        }
        if let Some(secret) = secret {
            ensure!(!text.contains(secret), "{text:?} shows the password");
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_wrong_password_is_refused_clearly_and_the_right_one_works() -> Result<()> {
    let uri = var("RUNLOCK_TEST_PG_PW_URI")?;
    let password = var("RUNLOCK_TEST_PG_PASSWORD")?;
    let with = |password: &str| uri.replacen("runlock_pw@", &format!("runlock_pw:{password}@"), 1);
    let wrong = "not-the-pa55word";
    fails_with(
        &on(&with(wrong), "t_password")?,
        &[
            "refused the login",
            "password authentication failed",
            "runlock_pw",
        ],
        Some(wrong),
    )
    .await?;
    fails_with(&on(&uri, "t_password")?, &["asks for a password"], None).await?;
    // The right one logs in over scram-sha-256 (the schema exists: runlock_pw may not create one).
    fresh("t_password")
        .await?
        .probe()
        .await
        .map_err(anyhow::Error::msg)?;
    let admin = admin(&var("RUNLOCK_TEST_PG_URI")?).await?;
    admin
        .batch_execute(
            "GRANT USAGE ON SCHEMA t_password TO runlock_pw;
             GRANT SELECT, INSERT, UPDATE ON t_password.locks TO runlock_pw;",
        )
        .await?;
    let right = on(&with(&password), "t_password")?;
    right.acquire(&spec("k", "l1", false, TTL)).await?;
    ensure!(right.inspect(&Key::new("k")?).await?.state == KeyState::Held);
    Ok(())
}

#[tokio::test]
async fn missing_database_refused_port_and_missing_permissions_are_named() -> Result<()> {
    fails_with(
        &on(&uri_for("no_such_database")?, "t_errors")?,
        &["database \"no_such_database\" does not exist", "create it"],
        None,
    )
    .await?;
    fails_with(
        &on("postgresql://u:pa55@127.0.0.1:1/postgres", "t_errors")?,
        &["127.0.0.1:1", "refused the connection"],
        Some("pa55"),
    )
    .await?;

    // The script's role that may neither create the schema nor use it once it exists.
    admin(&var("RUNLOCK_TEST_PG_URI")?)
        .await?
        .batch_execute("DROP SCHEMA IF EXISTS t_denied CASCADE")
        .await?;
    let limited = var("RUNLOCK_TEST_PG_URI")?.replacen("postgres@", "runlock_limited@", 1);
    fails_with(
        &on(&limited, "t_denied")?,
        &[
            "permission denied for database",
            "runlock_limited",
            "USAGE on schema \"t_denied\"",
        ],
        None,
    )
    .await?;
    fresh("t_denied")
        .await?
        .probe()
        .await
        .map_err(anyhow::Error::msg)?;
    fails_with(
        &on(&limited, "t_denied")?,
        &[
            "permission denied for schema t_denied",
            "SELECT, INSERT, UPDATE",
        ],
        None,
    )
    .await
}

/// The connection's `ssl` flag from the server's own view.
async fn uses_tls(uri: &str) -> Result<bool> {
    let client = admin(uri).await?;
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

#[tokio::test]
async fn tls_is_used_and_checked_as_sslmode_asks() -> Result<()> {
    let uri = var("RUNLOCK_TEST_PG_URI")?;
    let ca = var("RUNLOCK_TEST_PG_CA")?;
    ensure!(!uses_tls(&format!("{uri}?sslmode=disable")).await?);
    ensure!(uses_tls(&format!("{uri}?sslmode=require")).await?);
    ensure!(uses_tls(&format!("{uri}?sslmode=verify-full&sslrootcert={ca}")).await?);
    let by_name = uri.replacen("127.0.0.1", "localhost", 1);
    ensure!(uses_tls(&format!("{by_name}?sslmode=verify-full&sslrootcert={ca}")).await?);
    // The test CA is not among the system's roots.
    let err = admin(&format!("{uri}?sslmode=verify-ca&sslrootcert=system"))
        .await
        .map(|_| ())
        .expect_err("an unknown CA passed")
        .to_string();
    ensure!(err.contains("TLS") && err.contains("sslrootcert"), "{err}");
    // The backend itself, over verified TLS.
    fresh("t_tls").await?;
    let backend = on(
        &format!("{uri}?sslmode=verify-full&sslrootcert={ca}"),
        "t_tls",
    )?;
    backend.acquire(&spec("k", "l1", false, TTL)).await?;
    Ok(())
}

#[tokio::test]
async fn a_table_made_before_the_history_gains_one_and_keeps_its_rows() -> Result<()> {
    let schema = "runlock_test_history_upgrade";
    let uri = var("RUNLOCK_TEST_PG_URI")?;
    let client = admin(&uri).await?;
    // The table as agents made it before they kept a history, with a free row.
    client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE;
             CREATE SCHEMA {schema};
             CREATE TABLE {schema}.locks (
                 key text PRIMARY KEY,
                 state text NOT NULL CHECK (state IN ('held', 'free')),
                 token bigint NOT NULL CHECK (token > 0),
                 lease_id text, holder jsonb,
                 ttl_ms bigint NOT NULL, grace_ms bigint NOT NULL,
                 written timestamptz NOT NULL, forced_from bigint);
             INSERT INTO {schema}.locks VALUES ('k', 'free', 7, NULL, NULL, 1000, 500, now(), NULL);"
        ))
        .await?;
    let backend = on(&uri, schema)?;
    backend.probe().await.map_err(anyhow::Error::msg)?;
    let key = Key::new("k")?;
    ensure!(backend.history(&key).await?.is_empty());
    let grant = backend.acquire(&spec("k", "l1", false, TTL)).await?;
    ensure!(grant.holder.token == 8, "{grant:?}");
    backend.release(&lease("k", "l1", 8)).await?;
    let events: Vec<_> = backend
        .history(&key)
        .await?
        .into_iter()
        .map(|e| (e.kind, e.token, e.clock))
        .collect();
    use runlock_protocol::{Clock, EventKind};
    ensure!(
        events
            == [
                (EventKind::Granted, 8, Clock::Store),
                (EventKind::Released, 8, Clock::Store)
            ],
        "{events:?}"
    );
    // What an older agent's statements write still works beside it: a row
    // inserted without the column gets an empty history.
    client
        .batch_execute(&format!(
            "INSERT INTO {schema}.locks (key, state, token, ttl_ms, grace_ms, written)
             VALUES ('old', 'free', 3, 1000, 500, now())"
        ))
        .await?;
    ensure!(backend.history(&Key::new("old")?).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn list_pages_through_held_released_slot_and_unreadable_rows() -> Result<()> {
    let one = fresh("t_list").await?;
    let two = on(&var("RUNLOCK_TEST_PG_URI")?, "t_list")?;
    super::listing::lists_every_record(&one, &two, || async {
        admin(&var("RUNLOCK_TEST_PG_URI")?)
            .await?
            .batch_execute(&format!(
                "UPDATE t_list.locks SET holder = '{{\"not\": \"a holder\"}}' WHERE key = '{}'",
                super::listing::UNREADABLE
            ))
            .await?;
        Ok(())
    })
    .await
}

/// `%`, `_` and `!` in a prefix are themselves; pages go in byte order,
/// whatever the database's collation, one statement each.
#[tokio::test]
async fn list_matches_a_prefix_literally_in_byte_order_one_statement_a_page() -> Result<()> {
    let one = fresh("t_list_prefix").await?;
    let keys = ["a_b", "aXb", "a!c", "B", "50%off", "50Xoff"];
    for (n, key) in keys.iter().enumerate() {
        one.acquire(&spec(key, &format!("l{n}"), false, TTL))
            .await?;
    }
    let listed = |prefix: &'static str| {
        let one = &one;
        async move {
            let (listed, _) = super::listing::list_all(one, prefix, 10).await?;
            anyhow::Ok(super::listing::keys_of(&listed))
        }
    };
    ensure!(listed("50%").await? == ["50%off"]);
    ensure!(listed("a_").await? == ["a_b"]);
    ensure!(listed("a!").await? == ["a!c"]);
    let before = one.statements_sent();
    let (all, pages) = super::listing::list_all(&one, "", 2).await?;
    ensure!(
        one.statements_sent() - before == pages as u64 && pages == 3,
        "{pages} pages in {} statements",
        one.statements_sent() - before
    );
    let mut in_byte_order = keys.map(String::from).to_vec();
    in_byte_order.sort();
    ensure!(super::listing::keys_of(&all) == in_byte_order);
    Ok(())
}
