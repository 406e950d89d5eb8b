//! What every group measures with: agents started alike, timed acquire and
//! release pairs, and the quantiles the table prints.

use super::*;

/// Acquires through the agent on a store, and raw writes beside them.
pub(crate) const STORE_ROUND_TRIPS: usize = 500;

/// Unmeasured pairs or writes before those (connections, caches, JIT-free but
/// not pool-free).
pub(crate) const WARM_UP: usize = 50;

/// The agent's count of successful renewals, from its metrics endpoint.
pub(crate) async fn renewals(metrics: &str) -> Result<f64> {
    let text = http::get(&format!("http://{metrics}/metrics"))
        .await?
        .success("reading the agent's metrics")?;
    text.lines()
        .find_map(|l| l.strip_prefix(r#"runlock_renewals_total{result="ok"} "#))
        .context("no renewal count in the agent's metrics")?
        .trim()
        .parse()
        .context("a renewal count")
}

/// `WARM_UP` acquire+release pairs of `key` on `conn`, unmeasured.
pub(crate) async fn warm_up(conn: &mut RawClient, key: &str) -> Result<()> {
    for _ in 0..WARM_UP {
        pair(conn, key).await?;
    }
    Ok(())
}

/// `pairs` acquire+release pairs of `key` on `conn`: their acquire and their
/// release round trips.
pub(crate) async fn timed_pairs(
    conn: &mut RawClient,
    key: &str,
    pairs: usize,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut acquires, mut releases) = (Vec::new(), Vec::new());
    for _ in 0..pairs {
        let (acquire, release) = pair(conn, key).await?;
        acquires.push(acquire);
        releases.push(release);
    }
    Ok((acquires, releases))
}

/// `STORE_ROUND_TRIPS` acquire round trips through `agent`, after the
/// warm-up, on one key: an uncontended acquire on a store.
pub(crate) async fn acquire_round_trips(agent: &TestAgent) -> Result<Vec<Duration>> {
    let mut conn = agent.client().await?;
    let key = "dev:tap-x-to-target-y";
    warm_up(&mut conn, key).await?;
    Ok(timed_pairs(&mut conn, key, STORE_ROUND_TRIPS).await?.0)
}

/// Times `STORE_ROUND_TRIPS` raw writes after `WARM_UP` untimed ones; each
/// write gets what the one before returned (an ETag, a revision).
pub(crate) async fn time_raw<S, W>(first: S, mut write: impl FnMut(S) -> W) -> Result<Vec<Duration>>
where
    W: std::future::Future<Output = Result<S>>,
{
    let (mut last, mut samples) = (first, Vec::new());
    for i in 0..(WARM_UP + STORE_ROUND_TRIPS) {
        let started = Instant::now();
        last = write(last).await?;
        if i >= WARM_UP {
            samples.push(started.elapsed());
        }
    }
    Ok(samples)
}

/// Two rows for `store`: its raw write, and the agent's acquire beside it.
pub(crate) fn beside_raw(
    store: &str,
    raw_what: &str,
    raw: Vec<Duration>,
    acquires: Vec<Duration>,
) -> Rows {
    vec![
        (format!("{store}: {raw_what}"), percentiles(raw.clone())),
        (
            format!("{store}: acquire round trip through the agent"),
            against(acquires, &raw),
        ),
    ]
}

/// The agent's samples, with their p50 as a multiple of the raw p50.
pub(crate) fn against(agent: Vec<Duration>, raw: &[Duration]) -> String {
    let ratio = quantile(&mut agent.clone(), 0.5).as_secs_f64()
        / quantile(&mut raw.to_vec(), 0.5).as_secs_f64();
    format!("{}  ({ratio:.2}× raw p50)", percentiles(agent))
}

/// A group's rows, or one row saying why it failed: one store's trouble does
/// not lose the figures of the others.
pub(crate) fn or_failure(group: &str, rows: Result<Rows>) -> Rows {
    rows.unwrap_or_else(|err| {
        eprintln!("{group} failed: {err:?}");
        vec![(group.to_string(), format!("FAILED: {err:#}"))]
    })
}

pub(crate) fn acquired(reply: AgentMessage) -> Result<String> {
    match reply {
        AgentMessage::Acquired { mut leases, .. } => Ok(leases.pop().context("no lease")?.lease_id),
        other => bail!("acquire: {other:?}"),
    }
}

pub(crate) async fn release(conn: &mut RawClient, lease_id: String) -> Result<()> {
    match conn
        .call(runlock_tests::client::release(vec![lease_id]))
        .await?
    {
        AgentMessage::Released { count: 1 } => Ok(()),
        other => bail!("release: {other:?}"),
    }
}

/// The agent's flags for the bench: JSON logs (the 10,000-lease group reads
/// its renewal report from them), then `extra`.
pub(crate) fn agent_options(uri: &str, extra: &[&str]) -> AgentOptions {
    let mut options = AgentOptions::new(uri);
    options.args = ["--log-format", "json"]
        .iter()
        .chain(extra)
        .map(|a| a.to_string())
        .collect();
    // No harness holds stderr back here: the logs stay in their files.
    options.log_on_drop = false;
    options
}

/// `env` for the agent, and a log of `info` and up without the lease layer's
/// line per lease, which would be timed with every acquire; the renewal
/// scheduler's once-a-minute report (in the lease layer) stays, `many_leases` reads it.
pub(crate) fn agent_env(env: &[(&str, &str)]) -> Vec<(String, String)> {
    [(
        "RUST_LOG",
        "info,runlock_agent::lease=warn,runlock_agent::lease::renewal=info",
    )]
    .iter()
    .chain(env)
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// An agent on `uri` with `extra` flags and `env`, ready.
pub(crate) async fn start_agent(
    uri: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Result<TestAgent> {
    TestAgent::start_with_env(agent_options(uri, extra), &agent_env(env)).await
}

pub(crate) fn acquire(key: &str, wait_ms: u64) -> ClientMessage {
    acquire_slots(key, wait_ms, 1)
}

pub(crate) fn acquire_slots(key: &str, wait_ms: u64, slots: u32) -> ClientMessage {
    ClientMessage::Acquire(AcquireRequest {
        slots,
        keys: vec![key.to_string()],
        ttl_ms: None,
        wait_ms,
        force: false,
        command: "meltano run tap-x target-y".into(),
        on_lost: OnLost::Term,
    })
}

pub(crate) async fn pair(conn: &mut RawClient, key: &str) -> Result<(Duration, Duration)> {
    let started = Instant::now();
    let lease_id = match conn.call(acquire(key, 0)).await? {
        AgentMessage::Acquired { mut leases, .. } => leases.pop().context("no lease")?.lease_id,
        other => bail!("acquire: {other:?}"),
    };
    let acquired = Instant::now();
    match conn
        .call(runlock_tests::client::release(vec![lease_id]))
        .await?
    {
        AgentMessage::Released { count: 1 } => {}
        other => bail!("release: {other:?}"),
    }
    Ok((acquired - started, acquired.elapsed()))
}

pub(crate) fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort_unstable();
    samples[((samples.len() - 1) as f64 * q).round() as usize]
}

pub(crate) fn percentiles(mut samples: Vec<Duration>) -> String {
    let p50 = quantile(&mut samples, 0.5);
    let p99 = quantile(&mut samples, 0.99);
    format!("{} / {} (n={})", micros(p50), micros(p99), samples.len())
}

pub(crate) fn micros(d: Duration) -> String {
    if d >= Duration::from_millis(1) {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    }
}
