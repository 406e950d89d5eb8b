//! PostgreSQL and etcd through the agent beside raw statements and
//! transactions, the requests each operation costs, and how fast a waiter
//! on another agent wakes.

use super::*;

/// Release → another agent's waiter holds the key, per backend and wake-up path.
pub(crate) const WAKE_UPS: usize = 20;

/// etcd through the agent, with `RUNLOCK_TEST_ETCD_ENDPOINT` (tests/scripts/etcd.sh):
/// the requests each operation makes, counted by etcd itself (its `/metrics`,
/// so nothing else may use that etcd meanwhile); acquire beside one raw
/// transaction made with the same client crate; and how soon a waiter on a
/// second agent gets a key released on the first, woken by the watch or,
/// with `?watch=false`, by its polling.
pub(crate) async fn etcd_rows(_scratch: &Path) -> Result<Rows> {
    let Ok(endpoint) = std::env::var("RUNLOCK_TEST_ETCD_ENDPOINT") else {
        let why = "skipped: RUNLOCK_TEST_ETCD_ENDPOINT is not set (see BENCHMARKS.md)";
        return Ok(vec![("etcd".into(), why.into())]);
    };
    let host = endpoint.trim_start_matches("http://");
    let uri = format!("etcd://{host}/runlock-bench-{}", std::process::id());
    let mut rows = Vec::new();
    let key = "dev:tap-x-to-target-y";

    // Acquire + release pairs: their latency, and what each cost etcd.
    let mut agent = start_agent(&uri, &[], &[]).await?;
    let mut conn = agent.client().await?;
    warm_up(&mut conn, key).await?;
    let before = etcd_requests(&endpoint).await?;
    let (acquires, _) = timed_pairs(&mut conn, key, STORE_ROUND_TRIPS).await?;
    let per_pair = etcd_requests(&endpoint)
        .await?
        .since(&before, STORE_ROUND_TRIPS);
    rows.push(("etcd: requests per acquire + release".into(), per_pair));

    // A waiter on another agent polls a held key for 5 s.
    let mut other = start_agent(&uri, &[], &[]).await?;
    let lease_id = acquired(conn.call(acquire(key, 0)).await?)?;
    let mut waiter = other.client().await?;
    let before = etcd_requests(&endpoint).await?;
    match waiter.call(acquire(key, 5_000)).await? {
        AgentMessage::Error(_) => {}
        unexpected => bail!("a held key was granted: {unexpected:?}"),
    }
    rows.push((
        "etcd: requests of one waiter on another agent, 5 s on a held key".into(),
        etcd_requests(&endpoint).await?.since(&before, 1),
    ));
    release(&mut conn, lease_id).await?;
    agent.stop().await?;
    other.stop().await?;

    // Renewals: TTL 3 s renews about every second.
    let mut agent = start_agent(&uri, &["--ttl", "3s"], &[]).await?;
    let mut conn = agent.client().await?;
    let lease_id = acquired(conn.call(acquire(key, 0)).await?)?;
    let before = etcd_requests(&endpoint).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let during = etcd_requests(&endpoint).await?;
    let renewals = during.count("LeaseKeepAlive") - before.count("LeaseKeepAlive");
    rows.push((
        format!("etcd: requests per renewal (TTL 3 s, {renewals} renewals in 10 s)"),
        during.since(&before, renewals.max(1) as usize),
    ));
    release(&mut conn, lease_id).await?;
    agent.stop().await?;

    // The same client crate and etcd: one conditional put, as an acquire's
    // transaction is (an acquire also grants its lease first).
    let client = runlock_agent::backend::testing::etcd_client(&endpoint).await?;
    let raw_key = format!("runlock-bench-raw-{}", std::process::id());
    let body = vec![b'x'; 300];
    let raw = time_raw(0, |revision| {
        use runlock_agent::backend::testing::etcd_rpc::{Compare, Txn, TxnOp};
        let txn = Txn::new()
            .when([Compare::mod_revision(raw_key.as_str(), revision)])
            .and_then([TxnOp::put(raw_key.as_str(), body.clone(), None)]);
        let client = client.clone();
        async move {
            let answer = client.txn(txn).await?;
            if !answer.succeeded {
                bail!("the raw transaction's condition failed");
            }
            Ok(answer.revision())
        }
    })
    .await?;
    client.delete(raw_key.as_str()).await?;
    rows.extend(beside_raw(
        "etcd",
        "raw conditional put (one Txn), same client crate",
        raw,
        acquires,
    ));

    // Wake-ups across agents: a waiter on B gets the key A releases.
    for (name, b_uri) in [
        ("watch", uri.clone()),
        ("polling", format!("{uri}?watch=false")),
    ] {
        let mut a = start_agent(&uri, &[], &[]).await?;
        let mut b = start_agent(&b_uri, &[], &[]).await?;
        rows.push((
            format!("etcd: release on one agent → a waiter on another holds the key ({name})"),
            percentiles(wake_ups(&a, &b, key).await?),
        ));
        a.stop().await?;
        b.stop().await?;
    }
    Ok(rows)
}

/// etcd's count of requests started, per gRPC method, from its `/metrics`.
pub(crate) struct EtcdRequests(std::collections::BTreeMap<String, u64>);

pub(crate) async fn etcd_requests(endpoint: &str) -> Result<EtcdRequests> {
    let text = http::get(&format!("{endpoint}/metrics"))
        .await?
        .success("reading etcd's metrics")?;
    let mut counts = std::collections::BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("grpc_server_started_total{grpc_method=\"") else {
            continue;
        };
        let (method, rest) = rest.split_once('"').context("metrics format")?;
        let value = rest.rsplit(' ').next().context("metrics format")?;
        counts.insert(method.to_string(), value.parse::<f64>()? as u64);
    }
    Ok(EtcdRequests(counts))
}

impl EtcdRequests {
    pub(crate) fn count(&self, method: &str) -> u64 {
        self.0.get(method).copied().unwrap_or(0)
    }

    /// What was started since `before`, per operation (of `operations`).
    pub(crate) fn since(&self, before: &EtcdRequests, operations: usize) -> String {
        let parts: Vec<String> = self
            .0
            .iter()
            .filter_map(|(method, &now)| {
                let delta = now - before.count(method);
                (delta > 0).then(|| format!("{method} {:.2}", delta as f64 / operations as f64))
            })
            .collect();
        parts.join(" + ")
    }
}

/// PostgreSQL (the test cluster, `RUNLOCK_TEST_PG_URI`): statements per
/// operation by the server's own count, acquire through the agent beside a raw
/// `INSERT … ON CONFLICT` on the same server in the same run, and how soon an
/// agent on another "host" takes a key after its release, woken by NOTIFY or
/// by its own polling (`[postgres] listen = false`). Plain TCP for both the
/// agent and the raw client (`sslmode=disable`), so TLS is not measured.
pub(crate) async fn postgres(scratch: &Path) -> Result<Rows> {
    let Ok(server_uri) = std::env::var("RUNLOCK_TEST_PG_URI") else {
        let why = "skipped: RUNLOCK_TEST_PG_URI is not set (see BENCHMARKS.md)";
        return Ok(vec![("PostgreSQL".into(), why.into())]);
    };
    let (server, _) = server_uri
        .rsplit_once('/')
        .context("RUNLOCK_TEST_PG_URI names no database")?;
    let database = format!("runlock_bench_{}", std::process::id());
    let uri = format!("{server}/{database}?sslmode=disable");
    let pg = |uri: String| async move {
        let (client, connection) = tokio_postgres::connect(&uri, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        anyhow::Ok(client)
    };
    // The counting connection sits in another database, so its own
    // transactions do not count.
    let admin = pg(format!("{server}/postgres?sslmode=disable")).await?;
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {database}"))
        .await?;
    admin
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .await?;
    let quiet_config = scratch.join("pg-poll.toml");
    std::fs::write(&quiet_config, "[postgres]\nlisten = false\n")?;
    let quiet = ["--config", quiet_config.to_str().context("utf-8 path")?];
    let agent = start_agent(&uri, &[], &[]).await?;
    let polling = start_agent(&uri, &quiet, &[]).await?;
    let key = "dev:tap-x-to-target-y";
    let mut conn = agent.client().await?;
    let (listening_count, acquires, releases) =
        counted_pairs(&mut conn, &admin, &database, key, STORE_ROUND_TRIPS).await?;
    let mut quiet_conn = polling.client().await?;
    let (quiet_count, _, _) = counted_pairs(
        &mut quiet_conn,
        &admin,
        &database,
        key,
        STORE_ROUND_TRIPS / 2,
    )
    .await?;
    drop(quiet_conn);

    // Raw: the same upsert shape on a table of its own, prepared, one connection.
    let raw_client = pg(uri.clone()).await?;
    raw_client
        .batch_execute("CREATE TABLE raw (key text PRIMARY KEY, token bigint NOT NULL)")
        .await?;
    let upsert = raw_client
        .prepare(
            "INSERT INTO raw AS r VALUES ($1, 1) \
             ON CONFLICT (key) DO UPDATE SET token = r.token + 1 RETURNING token",
        )
        .await?;
    let raw = time_raw((), |()| async {
        raw_client.query_one(&upsert, &[&key]).await?;
        Ok(())
    })
    .await?;

    // Wake-ups: the holder on `agent`, waiters on two more agents (hosts).
    let listening = start_agent(&uri, &[], &[]).await?;
    let notified = wake_ups(&agent, &listening, "wake-notify").await?;
    let polled = wake_ups(&agent, &polling, "wake-poll").await?;
    for mut agent in [agent, listening, polling] {
        agent.stop().await?;
    }
    drop(raw_client);
    admin
        .batch_execute(&format!("DROP DATABASE {database} WITH (FORCE)"))
        .await?;

    let mut rows = vec![(
        "PostgreSQL: transactions per acquire or release, by the server's count".into(),
        format!(
            "{:.3} with the agent not listening ({} for {}); {:.3} listening ({} for {}: \
                 a listening connection reads each NOTIFY in a transaction of its own)",
            quiet_count as f64 / STORE_ROUND_TRIPS as f64,
            quiet_count,
            STORE_ROUND_TRIPS,
            listening_count as f64 / (2 * STORE_ROUND_TRIPS) as f64,
            listening_count,
            2 * STORE_ROUND_TRIPS
        ),
    )];
    rows.extend(beside_raw(
        "PostgreSQL",
        "raw INSERT … ON CONFLICT, prepared, one connection",
        raw,
        acquires,
    ));
    rows.push((
        "PostgreSQL: release round trip through the agent".into(),
        percentiles(releases),
    ));
    rows.push((
        "PostgreSQL: another host's waiter takes the key after a release, LISTEN/NOTIFY".into(),
        percentiles(notified),
    ));
    rows.push((
        "PostgreSQL: the same, polling (`listen = false`)".into(),
        percentiles(polled),
    ));
    Ok(rows)
}

/// `pairs` acquire+release pairs of `key` through `conn`, after `WARM_UP` unmeasured:
/// the transactions the server counted in `database` for them, and the
/// acquire and release round trips.
pub(crate) async fn counted_pairs(
    conn: &mut RawClient,
    admin: &tokio_postgres::Client,
    database: &str,
    key: &str,
    pairs: usize,
) -> Result<(i64, Vec<Duration>, Vec<Duration>)> {
    let transactions = || async {
        let row = admin
            .query_one(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1",
                &[&database],
            )
            .await?;
        anyhow::Ok(row.get::<_, i64>(0))
    };
    warm_up(conn, key).await?;
    // A backend publishes its counts at most once a second: an inspect more
    // than a second after the last statement publishes everything before it.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    conn.call(ClientMessage::Inspect { key: key.into() })
        .await?;
    let before = transactions().await?;
    let (acquires, releases) = timed_pairs(conn, key, pairs).await?;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    conn.call(ClientMessage::Inspect { key: key.into() })
        .await?;
    let counted = transactions().await? - before - 1; // less the settling inspect
    Ok((counted, acquires, releases))
}

/// From a release through the agent `holder` to the grant of a client
/// waiting for that key on the agent `waiter`, `WAKE_UPS` times. Each
/// waiter waits 1.5 s first, so its polling has backed off to its cap, as
/// for any wait that lasts.
pub(crate) async fn wake_ups(
    holder: &TestAgent,
    waiter: &TestAgent,
    key: &str,
) -> Result<Vec<Duration>> {
    let (mut holder, mut waiter) = (holder.client().await?, waiter.client().await?);
    let mut samples = Vec::new();
    for _ in 0..WAKE_UPS {
        let lease_id = acquired(holder.call(acquire(key, 0)).await?)?;
        let waiting = waiter.send(acquire(key, 30_000)).await?;
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let released = Instant::now();
        release(&mut holder, lease_id).await?;
        let reply = waiter.reply(waiting).await?;
        samples.push(released.elapsed());
        let lease_id = acquired(reply)?;
        release(&mut waiter, lease_id).await?;
    }
    Ok(samples)
}
