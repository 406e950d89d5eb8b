//! `cargo bench -p runlock-tests`: runs the release binaries and prints one
//! table: acquire/release round trips on memory:// and file:// beside a raw
//! MessagePack echo over a Unix socket, pair throughput over 16 connections,
//! and crash release (SIGKILL of a run until a waiter holds the key); with
//! the emulators' variables, S3, Azure, GCS, PostgreSQL and etcd beside raw
//! writes with the same clients.
//! The figures go into BENCHMARKS.md; nothing here asserts a time.

use anyhow::{bail, Context, Result};
use futures::{SinkExt, StreamExt};
use runlock_protocol::{
    AgentMessage, ClientMessage, Envelope, MessageCodec, OnLost, PROTOCOL_VERSION,
};
use runlock_tests::bins::bins;
use runlock_tests::client::RawClient;
use runlock_tests::http;
use runlock_tests::{AgentOptions, TestAgent};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::process::Command;
use tokio_util::codec::Framed;

const ECHO_ENV: &str = "RUNLOCK_BENCH_ECHO_SOCKET";
const ROUND_TRIPS: usize = 20_000;
const THROUGHPUT_CONNECTIONS: usize = 16;
const THROUGHPUT_TIME: Duration = Duration::from_secs(3);
const CRASHES: usize = 40;
/// Leases one agent holds in the `leases` group, unless `RUNLOCK_BENCH_LEASES`
/// says how many (issue 28 asks for 100,000), on the store
/// `RUNLOCK_BENCH_LEASES_ON` names (`memory-cas://` unless set).
const MANY_LEASES: usize = 10_000;
/// Acquires through the agent on a store, and raw writes beside them.
const STORE_ROUND_TRIPS: usize = 500;
/// Unmeasured pairs or writes before those (connections, caches, JIT-free but
/// not pool-free).
const WARM_UP: usize = 50;
/// GCS takes one write per object per second, so each sample is a key of its own.
const GCS_KEYS: usize = 300;
/// Release → another agent's waiter holds the key, per backend and wake-up path.
const WAKE_UPS: usize = 20;

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // The echo server runs as a second process of this binary, as the agent does.
    if let Some(path) = std::env::var_os(ECHO_ENV) {
        return runtime.block_on(echo_server(PathBuf::from(path)));
    }
    if std::env::args().any(|a| a == "--list") {
        return Ok(()); // `cargo test --benches` asks for the list of benchmarks
    }
    runtime.block_on(run())
}

/// A group of rows measured against the agent binary, in a scratch directory.
type Group = for<'a> fn(&'a Path) -> futures::future::BoxFuture<'a, Result<Rows>>;
type Rows = Vec<(String, String)>;

async fn run() -> Result<()> {
    // `cargo bench -p runlock-tests -- NAME` measures only the groups whose
    // name contains NAME (memory, file, s3, azure, gcs, postgres, etcd,
    // leases, hostile); the echo always.
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wanted = |group: &str| only.as_deref().is_none_or(|o| group.contains(o));
    // Release binaries (the bench profile is optimised), built as the tests build theirs.
    let bins = bins()?;
    let scratch = tempfile::Builder::new()
        .prefix("runlock-bench")
        .tempdir_in("/tmp")?;
    let mut rows: Vec<(String, String)> = Vec::new();

    let echo = echo_round_trips(scratch.path()).await?;
    rows.push((
        "raw MessagePack echo, one connection".into(),
        percentiles(echo.clone()),
    ));
    let echo_p50 = quantile(&mut echo.clone(), 0.5);

    for (name, uri) in [
        ("memory://", "memory://".to_string()),
        (
            "file://",
            format!("file://{}", scratch.path().join("locks").display()),
        ),
    ] {
        if !wanted(name) {
            continue;
        }
        let mut agent = start_agent(&uri, &[], &[]).await?;
        let (acquire, release, pair) = round_trips(&agent).await?;
        let ratio = quantile(&mut acquire.clone(), 0.5).as_secs_f64() / echo_p50.as_secs_f64();
        rows.push((
            format!("{name} acquire round trip"),
            format!("{}  ({ratio:.2}× echo p50)", percentiles(acquire)),
        ));
        rows.push((format!("{name} release round trip"), percentiles(release)));
        rows.push((format!("{name} acquire+release pair"), percentiles(pair)));
        let shims = [bins.runlock.clone(), static_shim(&bins.runlock)?];
        let (timed, flock) = beside_flock(&shims, agent.socket(), scratch.path()).await?;
        let flock_p50 = quantile(&mut flock.clone(), 0.5).as_secs_f64();
        for (linked, shim) in ["dynamically", "statically"].iter().zip(timed) {
            let ratio = quantile(&mut shim.clone(), 0.5).as_secs_f64() / flock_p50;
            rows.push((
                format!(
                    "{name} `runlock run --key k -- true`, whole process, shim linked {linked}"
                ),
                format!("{}  ({ratio:.2}× flock p50)", percentiles(shim)),
            ));
        }
        rows.push(("`flock FILE true` beside them".into(), percentiles(flock)));
        if name == "memory://" {
            let pairs = throughput(&agent).await?;
            rows.push((
                format!("{name} pairs/s over {THROUGHPUT_CONNECTIONS} connections"),
                format!("{pairs:.0}"),
            ));
        }
        if name == "file://" {
            let crash = crash_release(&agent).await?;
            rows.push((
                "file:// crash release (SIGKILL of a run → waiter holds the key)".into(),
                percentiles(crash),
            ));
        }
        agent.stop().await?;
    }

    let groups: [(&str, Group); 8] = [
        ("s3", |scratch| Box::pin(s3_rows(scratch))),
        ("slots", |scratch| Box::pin(slot_rows(scratch))),
        ("azure", |scratch| Box::pin(azure_rows(scratch))),
        ("gcs", |scratch| Box::pin(gcs_rows(scratch))),
        ("postgres", |scratch| Box::pin(postgres(scratch))),
        ("etcd", |scratch| Box::pin(etcd_rows(scratch))),
        ("leases", |scratch| Box::pin(many_leases(scratch))),
        ("hostile", |scratch| Box::pin(hostile(scratch))),
    ];
    for (name, group) in groups {
        if wanted(name) {
            let measured = group(scratch.path()).await;
            rows.extend(or_failure(name, measured));
        }
    }

    println!();
    println!("| measurement | p50 / p99 (or rate) |");
    println!("| --- | --- |");
    for (what, figure) in rows {
        println!("| {what} | {figure} |");
    }
    Ok(())
}

/// S3 on moto: the requests each agent operation costs the store, and acquire
/// through the agent beside a raw conditional PUT with the same SDK, in the
/// same run. Needs `RUNLOCK_TEST_S3_ENDPOINT` (BENCHMARKS.md).
async fn s3_rows(_scratch: &Path) -> Result<Rows> {
    let Ok(endpoint) = std::env::var("RUNLOCK_TEST_S3_ENDPOINT") else {
        let why = "skipped: RUNLOCK_TEST_S3_ENDPOINT is not set (see BENCHMARKS.md)";
        return Ok(vec![("S3 (moto)".into(), why.into())]);
    };
    let bucket = format!("runlock-bench-{}", std::process::id());
    // moto accepts an unsigned bucket creation.
    http::request("PUT", &format!("{endpoint}/{bucket}"), &[], "")
        .await?
        .success("creating a bucket")?;
    let env = [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
    ];
    let proxy = CountingProxy::start(&endpoint).await?;
    let mut proxied = env;
    proxied[0].1 = &proxy.url;
    let uri = format!("s3://{bucket}/counted");
    let mut rows = requests_per_operation("S3 (moto)", &uri, &proxied, &proxy, "3s").await?;
    let uri = format!("s3://{bucket}/bench");
    let mut agent = start_agent(&uri, &[], &env).await?;
    let acquires = acquire_round_trips(&agent).await?;
    agent.stop().await?;

    // The same SDK, the same endpoint, a body of a record's size, If-Match on the
    // version it wrote last: what one uncontended acquire costs the store.
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(&endpoint)
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            "test", "test", None, None, "bench",
        ))
        .load()
        .await;
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&config)
            .force_path_style(true)
            .build(),
    );
    let body = vec![b'x'; 480];
    let put = |etag: Option<String>| {
        let request = s3
            .put_object()
            .bucket(&bucket)
            .key("raw/record.json")
            .body(body.clone().into());
        match etag {
            Some(etag) => request.if_match(etag),
            None => request.if_none_match("*"),
        }
        .send()
    };
    let first = put(None).await?.e_tag;
    let raw = time_raw(first, |etag| async { Ok(put(etag).await?.e_tag) }).await?;
    rows.extend(beside_raw(
        "S3 (moto)",
        "raw conditional PUT (If-Match), same SDK",
        raw,
        acquires,
    ));
    Ok(rows)
}

/// S3 on moto: what each operation on a key with 1, 3 and 10 slots costs the
/// store, counted by a proxy; two agents, as two runner hosts.
async fn slot_rows(_scratch: &Path) -> Result<Rows> {
    let Ok(endpoint) = std::env::var("RUNLOCK_TEST_S3_ENDPOINT") else {
        let why = "skipped: RUNLOCK_TEST_S3_ENDPOINT is not set (see BENCHMARKS.md)";
        return Ok(vec![("slots".into(), why.into())]);
    };
    let bucket = format!("runlock-bench-slots-{}", std::process::id());
    http::request("PUT", &format!("{endpoint}/{bucket}"), &[], "")
        .await?
        .success("creating a bucket")?;
    let proxy = CountingProxy::start(&endpoint).await?;
    let env = [
        ("AWS_ENDPOINT_URL", proxy.url.as_str()),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
    ];
    let uri = format!("s3://{bucket}/slots");
    let mut a = start_agent(&uri, &[], &env).await?;
    let mut b = start_agent(&uri, &[], &env).await?;
    let mut rows = Vec::new();
    for n in [1u32, 3, 10] {
        let key = format!("warehouse-{n}");
        let take = |wait_ms| acquire_slots(&key, wait_ms, n);
        let mut counted = |what: &str, requests: usize| {
            rows.push((
                format!("S3 (moto), {n} slots: store requests per {what}"),
                requests.to_string(),
            ));
        };
        let mut first = a.client().await?;
        let before = proxy.requests();
        let first_lease = acquired(first.call(take(0)).await?)?;
        counted("acquire of a key never seen", proxy.requests() - before);
        // The other host fills every other slot; the next one is refused.
        let mut others = Vec::new();
        for taken in 1..n {
            let mut conn = b.client().await?;
            let before = proxy.requests();
            let lease = acquired(conn.call(take(0)).await?)?;
            if taken == 1 {
                counted(
                    "acquire of a free slot, another host's slot held",
                    proxy.requests() - before,
                );
            }
            others.push((conn, lease));
        }
        if let Some((mut conn, lease)) = others.pop() {
            release(&mut conn, lease).await?;
        }
        if n > 1 {
            let mut conn = b.client().await?;
            let before = proxy.requests();
            let lease = acquired(conn.call(take(0)).await?)?;
            counted(
                "acquire of the slot this agent let go",
                proxy.requests() - before,
            );
            others.push((conn, lease));
        }
        let mut refused = b.client().await?;
        let before = proxy.requests();
        match refused.call(take(0)).await? {
            AgentMessage::Error(e) if e.code == runlock_protocol::ErrorCode::Held => {}
            other => bail!("an acquire with every slot held: {other:?}"),
        }
        counted(
            "acquire refused, every slot held",
            proxy.requests() - before,
        );
        let before = proxy.requests();
        first
            .call(ClientMessage::Inspect { key: key.clone() })
            .await?;
        counted("inspect", proxy.requests() - before);
        let before = proxy.requests();
        release(&mut first, first_lease).await?;
        counted("release", proxy.requests() - before);
        for (mut conn, lease) in others {
            release(&mut conn, lease).await?;
        }
    }
    a.stop().await?;
    b.stop().await?;
    Ok(rows)
}

/// The Azurite key every Azurite accepts for its development account.
const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// Azure Blob on the Azurite of `tests/scripts/azurite.sh`: the requests each
/// agent operation costs the store, and acquire through the agent beside a
/// raw conditional write with the agent's own Azure client, in the same run.
async fn azure_rows(_scratch: &Path) -> Result<Rows> {
    let (Ok(endpoint), Ok(python)) = (
        std::env::var("RUNLOCK_TEST_AZURE_ENDPOINT"),
        std::env::var("RUNLOCK_TEST_AZURE_PYTHON"),
    ) else {
        let why = "skipped: RUNLOCK_TEST_AZURE_ENDPOINT is not set (see BENCHMARKS.md)";
        return Ok(vec![("Azure (Azurite)".into(), why.into())]);
    };
    let container = format!("runlock-bench-{}", std::process::id());
    let connection_string = |blob_endpoint: &str| {
        format!(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;\
             AccountKey={AZURITE_KEY};BlobEndpoint={blob_endpoint};"
        )
    };
    let direct = connection_string(&endpoint);
    let created = Command::new(&python)
        .args([
            "-c",
            "import os, sys\nfrom azure.storage.blob import BlobServiceClient\n\
             BlobServiceClient.from_connection_string(os.environ['CS'])\
             .get_container_client(sys.argv[1]).create_container()",
            &container,
        ])
        .env("CS", &direct)
        .output()
        .await?;
    if !created.status.success() {
        bail!(
            "creating container {container}: {}",
            String::from_utf8_lossy(&created.stderr)
        );
    }

    let proxy = CountingProxy::start(&endpoint).await?;
    let proxied = connection_string(&format!("{}/devstoreaccount1", proxy.url));
    let env = [("AZURE_STORAGE_CONNECTION_STRING", proxied.as_str())];
    let uri = format!("azure://{container}/counted");
    let mut rows = requests_per_operation("Azure (Azurite)", &uri, &env, &proxy, "3s").await?;

    let env = [("AZURE_STORAGE_CONNECTION_STRING", direct.as_str())];
    let uri = format!("azure://{container}/timed");
    let mut agent = start_agent(&uri, &[], &env).await?;
    let acquires = acquire_round_trips(&agent).await?;
    agent.stop().await?;

    // The agent's own Azure client (the adapter it wraps its engine around), a
    // body of a record's size, If-Match on the ETag it wrote last: what one
    // uncontended acquire costs the store.
    use runlock_agent::backend::cas::{AzureOptions, AzureStore, CasStore, Precondition};
    let options = AzureOptions {
        connection_string: Some(direct.clone().into()),
        ..AzureOptions::default()
    };
    let client = AzureStore::open(&format!("azure://{container}/raw"), &options)?;
    let name = "raw/record.json";
    let body = vec![b'x'; 480];
    let first = client.put(name, body.clone(), Precondition::Absent).await?;
    let raw = time_raw(first, |etag| {
        let (client, body) = (&client, body.clone());
        async move { Ok(client.put(name, body, Precondition::Matches(&etag)).await?) }
    })
    .await?;
    rows.extend(beside_raw(
        "Azure (Azurite)",
        "raw conditional PUT (If-Match), the agent's client",
        raw,
        acquires,
    ));
    Ok(rows)
}

/// A TCP proxy in front of an HTTP store that counts the requests it passes
/// (request lines in the client's stream): what an agent's operations cost
/// the store, read the same way for every object store. A request is counted
/// before it is forwarded, so once its answer is back it is in the count.
struct CountingProxy {
    url: String,
    requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    accepting: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    /// A proxy to the host and port of `upstream` (an `http://` URL).
    async fn start(upstream: &str) -> Result<CountingProxy> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let upstream = upstream
            .strip_prefix("http://")
            .and_then(|rest| rest.split('/').next())
            .with_context(|| format!("{upstream:?} is not an http:// URL"))?
            .to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let requests = std::sync::Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, counter) = (upstream.clone(), counter.clone());
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut from_client, mut to_client) = client.into_split();
                    let (mut from_server, mut to_server) = server.into_split();
                    let up = async {
                        let (mut buf, mut line) = (vec![0; 64 * 1024], Vec::new());
                        loop {
                            let n = from_client.read(&mut buf).await?;
                            if n == 0 {
                                break;
                            }
                            for &byte in &buf[..n] {
                                if byte == b'\n' {
                                    if is_request_line(&line) {
                                        counter.fetch_add(1, Ordering::SeqCst);
                                    }
                                    line.clear();
                                } else if line.len() < 8192 {
                                    line.push(byte);
                                }
                            }
                            to_server.write_all(&buf[..n]).await?;
                        }
                        to_server.shutdown().await
                    };
                    let down = tokio::io::copy(&mut from_server, &mut to_client);
                    let _ = tokio::join!(up, down);
                });
            }
        });
        Ok(CountingProxy {
            url,
            requests,
            accepting,
        })
    }

    fn requests(&self) -> usize {
        self.requests.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// A request line, `METHOD /target HTTP/1.1` (without its `\n`). Only
/// those end so in a client's stream; a body without a final newline runs
/// into the next request's line, so the start is not checked.
fn is_request_line(line: &[u8]) -> bool {
    line.ends_with(b" HTTP/1.1\r")
}

/// The store requests each operation of an agent on `uri` costs, counted by
/// `proxy` (which `env` points the agents at): acquires of a new key, of a
/// key this agent freed and of one another agent freed, one refused as held,
/// a renewal (TTL `ttl`, by the agent's own count of them) and a release.
async fn requests_per_operation(
    store: &str,
    uri: &str,
    env: &[(&str, &str)],
    proxy: &CountingProxy,
    ttl: &str,
) -> Result<Rows> {
    let metrics = format!(
        "127.0.0.1:{}",
        std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port()
    );
    let extra = ["--ttl", ttl, "--metrics", metrics.as_str()];
    let mut a = start_agent(uri, &extra, env).await?;
    let mut b = start_agent(uri, &["--ttl", ttl], env).await?;
    let mut a_conn = a.client().await?;
    let mut b_conn = b.client().await?;
    let mut rows = Vec::new();
    let mut counted = |what: &str, before: usize, after: usize, per: f64| {
        rows.push((
            format!("{store}: store requests per {what}"),
            format!("{}", (after - before) as f64 / per),
        ));
    };

    let before = proxy.requests();
    let lease = acquired(a_conn.call(acquire("new-key", 0)).await?)?;
    let after = proxy.requests();
    counted("acquire of a key never seen", before, after, 1.0);

    // Holding: only renewals reach the store (at least two of them).
    let renewed = renewals(&metrics).await?;
    let ttl_time = humantime::parse_duration(ttl)?;
    tokio::time::sleep(ttl_time + ttl_time / 2).await;
    let held = proxy.requests();
    let renewed = renewals(&metrics).await? - renewed;
    counted("renewal", after, held, renewed);

    release(&mut a_conn, lease).await?;
    let released = proxy.requests();
    counted("release", held, released, 1.0);

    let lease = acquired(a_conn.call(acquire("new-key", 0)).await?)?;
    let again = proxy.requests();
    counted("acquire of a key this agent freed", released, again, 1.0);

    match b_conn.call(acquire("new-key", 0)).await? {
        AgentMessage::Error(e) if e.code == runlock_protocol::ErrorCode::Held => {}
        other => bail!("B's acquire of a held key: {other:?}"),
    }
    let refused = proxy.requests();
    counted("acquire refused as held", again, refused, 1.0);
    release(&mut a_conn, lease).await?;

    // A key another agent wrote last: this agent's guess fails, then it reads.
    let lease = acquired(b_conn.call(acquire("b-key", 0)).await?)?;
    release(&mut b_conn, lease).await?;
    let before = proxy.requests();
    let lease = acquired(a_conn.call(acquire("b-key", 0)).await?)?;
    let after = proxy.requests();
    counted("acquire of a key another agent freed", before, after, 1.0);
    release(&mut a_conn, lease).await?;

    drop((a_conn, b_conn));
    a.stop().await?;
    b.stop().await?;
    Ok(rows)
}

/// The agent's count of successful renewals, from its metrics endpoint.
async fn renewals(metrics: &str) -> Result<f64> {
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
async fn warm_up(conn: &mut RawClient, key: &str) -> Result<()> {
    for _ in 0..WARM_UP {
        pair(conn, key).await?;
    }
    Ok(())
}

/// `pairs` acquire+release pairs of `key` on `conn`: their acquire and their
/// release round trips.
async fn timed_pairs(
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
async fn acquire_round_trips(agent: &TestAgent) -> Result<Vec<Duration>> {
    let mut conn = agent.client().await?;
    let key = "dev:tap-x-to-target-y";
    warm_up(&mut conn, key).await?;
    Ok(timed_pairs(&mut conn, key, STORE_ROUND_TRIPS).await?.0)
}

/// Times `STORE_ROUND_TRIPS` raw writes after `WARM_UP` untimed ones; each
/// write gets what the one before returned (an ETag, a revision).
async fn time_raw<S, W>(first: S, mut write: impl FnMut(S) -> W) -> Result<Vec<Duration>>
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
fn beside_raw(store: &str, raw_what: &str, raw: Vec<Duration>, acquires: Vec<Duration>) -> Rows {
    vec![
        (format!("{store}: {raw_what}"), percentiles(raw.clone())),
        (
            format!("{store}: acquire round trip through the agent"),
            against(acquires, &raw),
        ),
    ]
}

/// The agent's samples, with their p50 as a multiple of the raw p50.
fn against(agent: Vec<Duration>, raw: &[Duration]) -> String {
    let ratio = quantile(&mut agent.clone(), 0.5).as_secs_f64()
        / quantile(&mut raw.to_vec(), 0.5).as_secs_f64();
    format!("{}  ({ratio:.2}× raw p50)", percentiles(agent))
}

/// A group's rows, or one row saying why it failed: one store's trouble does
/// not lose the figures of the others.
fn or_failure(group: &str, rows: Result<Rows>) -> Rows {
    rows.unwrap_or_else(|err| {
        eprintln!("{group} failed: {err:?}");
        vec![(group.to_string(), format!("FAILED: {err:#}"))]
    })
}

fn acquired(reply: AgentMessage) -> Result<String> {
    match reply {
        AgentMessage::Acquired { mut leases, .. } => Ok(leases.pop().context("no lease")?.lease_id),
        other => bail!("acquire: {other:?}"),
    }
}

async fn release(conn: &mut RawClient, lease_id: String) -> Result<()> {
    let request = ClientMessage::Release {
        slot: None,
        lease_ids: vec![lease_id],
        key: None,
    };
    match conn.call(request).await? {
        AgentMessage::Released { count: 1 } => Ok(()),
        other => bail!("release: {other:?}"),
    }
}

/// GCS on fake-gcs-server: the requests each agent operation costs the store,
/// and acquire through the agent beside raw multipart
/// uploads with `ifGenerationMatch` over the same HTTP stack (hyper-util's
/// pooled client), in the same run. GCS sustains one write per object per
/// second, so every sample writes an object of its own: acquires of new keys
/// (one create each) beside raw creates, then, a second later, acquires of
/// the keys this agent freed (one replace each) beside raw replaces; and a few
/// acquires right after a release of the same key, which the engine spaces
/// by that second. Needs `RUNLOCK_TEST_GCS_ENDPOINT` (BENCHMARKS.md).
async fn gcs_rows(_scratch: &Path) -> Result<Rows> {
    let Ok(endpoint) = std::env::var("RUNLOCK_TEST_GCS_ENDPOINT") else {
        let why = "skipped: RUNLOCK_TEST_GCS_ENDPOINT is not set (see BENCHMARKS.md)";
        return Ok(vec![("GCS (fake-gcs-server)".into(), why.into())]);
    };
    let bucket = format!("runlock-bench-{}", std::process::id());
    http::request(
        "POST",
        &format!("{endpoint}/storage/v1/b?project=bench"),
        &[("content-type", "application/json")],
        format!("{{\"name\":\"{bucket}\"}}"),
    )
    .await?
    .success("creating a bucket")?;
    let proxy = CountingProxy::start(&endpoint).await?;
    let env = [("STORAGE_EMULATOR_HOST", proxy.url.as_str())];
    let uri = format!("gs://{bucket}/counted");
    // TTL 6 s: GCS's shortest is 5 s.
    let mut rows =
        requests_per_operation("GCS (fake-gcs-server)", &uri, &env, &proxy, "6s").await?;
    drop(proxy);
    let uri = format!("gs://{bucket}/bench");
    let env = [("STORAGE_EMULATOR_HOST", endpoint.as_str())];
    let mut agent = start_agent(&uri, &[], &env).await?;
    let mut conn = agent.client().await?;
    let new_keys = gcs_acquire_all(&mut conn, "new").await?;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let freed_keys = gcs_acquire_all(&mut conn, "freed").await?;
    let mut right_after = Vec::new();
    for i in 0..5 {
        let started = Instant::now();
        pair(&mut conn, "dev:gcs-right-after").await?;
        if i > 0 {
            right_after.push(started.elapsed());
        }
    }
    agent.stop().await?;

    // Raw: the same requests the adapter sends, over the same client stack.
    let client: hyper_util::client::legacy::Client<_, http_body_util::Full<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(470));
    let upload = |name: String, generation: String| {
        let boundary = "runlock-bench-boundary";
        let multipart = format!(
            "--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n\
             {{\"name\":\"{name}\",\"contentType\":\"application/json\"}}\r\n--{boundary}\r\n\
             Content-Type: application/json\r\n\r\n{body}\r\n--{boundary}--\r\n"
        );
        let request = hyper::Request::post(format!(
            "{endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=multipart\
             &ifGenerationMatch={generation}&fields=generation"
        ))
        .header(
            "content-type",
            format!("multipart/related; boundary={boundary}"),
        )
        .body(http_body_util::Full::new(bytes::Bytes::from(multipart)));
        let client = client.clone();
        async move {
            let response = client.request(request?).await?;
            let status = response.status();
            let answer = http_body_util::BodyExt::collect(response.into_body())
                .await?
                .to_bytes();
            if !status.is_success() {
                bail!("raw upload of {name}: {status}");
            }
            let answer: serde_json::Value = serde_json::from_slice(&answer)?;
            answer["generation"]
                .as_str()
                .map(str::to_string)
                .context("no generation")
        }
    };
    let (mut raw_creates, mut generations) = (Vec::new(), Vec::new());
    for i in 0..(30 + GCS_KEYS) {
        let started = Instant::now();
        generations.push(upload(format!("raw/{i}.json"), "0".into()).await?);
        if i >= 30 {
            raw_creates.push(started.elapsed());
        }
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut raw_replaces = Vec::new();
    for (i, generation) in generations.into_iter().enumerate() {
        let started = Instant::now();
        upload(format!("raw/{i}.json"), generation).await?;
        if i >= 30 {
            raw_replaces.push(started.elapsed());
        }
    }
    rows.push((
        "GCS (fake-gcs-server): raw create (multipart, ifGenerationMatch=0), same HTTP client"
            .into(),
        percentiles(raw_creates.clone()),
    ));
    rows.push((
        "GCS (fake-gcs-server): acquire of a new key through the agent".into(),
        against(new_keys, &raw_creates),
    ));
    rows.push((
        "GCS (fake-gcs-server): raw replace (multipart, ifGenerationMatch=<generation>)".into(),
        percentiles(raw_replaces.clone()),
    ));
    rows.push((
        "GCS (fake-gcs-server): acquire of a key this agent freed ≥ 1 s before".into(),
        against(freed_keys, &raw_replaces),
    ));
    rows.push((
        "GCS (fake-gcs-server): acquire+release pair of one key, back to back".into(),
        percentiles(right_after),
    ));
    Ok(rows)
}

/// Acquires keys `dev:gcs-0..` one request at a time, then releases them in
/// one request; the samples leave out the first 30 (warm-up).
async fn gcs_acquire_all(conn: &mut RawClient, round: &str) -> Result<Vec<Duration>> {
    let (mut samples, mut lease_ids) = (Vec::new(), Vec::new());
    for i in 0..(30 + GCS_KEYS) {
        let started = Instant::now();
        match conn.call(acquire(&format!("dev:gcs-{i}"), 0)).await? {
            AgentMessage::Acquired { mut leases, .. } => {
                lease_ids.push(leases.pop().context("no lease")?.lease_id)
            }
            other => bail!("{round} acquire: {other:?}"),
        }
        if i >= 30 {
            samples.push(started.elapsed());
        }
    }
    let release = ClientMessage::Release {
        slot: None,
        lease_ids,
        key: None,
    };
    match conn.call(release).await? {
        AgentMessage::Released { .. } => Ok(samples),
        other => bail!("{round} release: {other:?}"),
    }
}

/// etcd through the agent, with `RUNLOCK_TEST_ETCD_ENDPOINT` (tests/scripts/etcd.sh):
/// the requests each operation makes, counted by etcd itself (its `/metrics`,
/// so nothing else may use that etcd meanwhile); acquire beside one raw
/// transaction made with the same client crate; and how soon a waiter on a
/// second agent gets a key released on the first, woken by the watch or,
/// with `?watch=false`, by its polling.
async fn etcd_rows(_scratch: &Path) -> Result<Rows> {
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
    let mut client = etcd_client::Client::connect([endpoint.as_str()], None).await?;
    let raw_key = format!("runlock-bench-raw-{}", std::process::id());
    let body = vec![b'x'; 300];
    let raw = time_raw(0, |revision| {
        use etcd_client::{Compare, CompareOp, Txn, TxnOp};
        let txn = Txn::new()
            .when([Compare::mod_revision(
                raw_key.as_str(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::put(raw_key.as_str(), body.clone(), None)]);
        let mut client = client.clone();
        async move {
            let answer = client.txn(txn).await?;
            if !answer.succeeded() {
                bail!("the raw transaction's condition failed");
            }
            Ok(answer.header().context("no header")?.revision())
        }
    })
    .await?;
    client.delete(raw_key.as_str(), None).await?;
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
struct EtcdRequests(std::collections::BTreeMap<String, u64>);

async fn etcd_requests(endpoint: &str) -> Result<EtcdRequests> {
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
    fn count(&self, method: &str) -> u64 {
        self.0.get(method).copied().unwrap_or(0)
    }

    /// What was started since `before`, per operation (of `operations`).
    fn since(&self, before: &EtcdRequests, operations: usize) -> String {
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
async fn postgres(scratch: &Path) -> Result<Rows> {
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
async fn counted_pairs(
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
async fn wake_ups(holder: &TestAgent, waiter: &TestAgent, key: &str) -> Result<Vec<Duration>> {
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

/// One agent holding [`MANY_LEASES`] leases (TTL 30 s) on the in-memory CAS
/// store: how late renewals go out (the agent's own once-a-minute report),
/// its resident memory, and its share of one core over that minute.
async fn many_leases(_scratch: &Path) -> Result<Rows> {
    let count = match std::env::var("RUNLOCK_BENCH_LEASES") {
        Ok(text) => text.parse::<usize>().context("RUNLOCK_BENCH_LEASES")?,
        Err(_) => MANY_LEASES,
    };
    let store = std::env::var("RUNLOCK_BENCH_LEASES_ON").unwrap_or_else(|_| "memory-cas://".into());
    let mut agent = start_agent(&store, &["--ttl", "30s"], &[]).await?;
    let pid = agent.pid().context("agent pid")?;
    let mut conns = Vec::new();
    for c in 0..count.div_ceil(1000) {
        let mut conn = agent.client().await?;
        let keys: Vec<String> = (c * 1000..((c + 1) * 1000).min(count))
            .map(|i| format!("lease-{i}"))
            .collect();
        let asked = keys.len();
        let request = ClientMessage::Acquire {
            slots: 1,
            keys,
            ttl_ms: None,
            wait_ms: 0,
            force: false,
            command: "bench".into(),
            on_lost: OnLost::Term,
        };
        match conn.call(request).await? {
            AgentMessage::Acquired { leases, .. } if leases.len() == asked => {}
            other => bail!("acquire of {asked} keys: {other:?}"),
        }
        conns.push(conn);
    }
    let held_rss_kib = rss_kib(pid)?;
    if store == "memory://" {
        // Its leases never lapse, so nothing renews them: only the memory.
        agent.stop().await?;
        return Ok(vec![(
            format!("{count} leases on {store}: agent resident memory"),
            format!("{:.1} MiB", held_rss_kib as f64 / 1024.0),
        )]);
    }
    // The first report made after every lease is held: on a store where
    // taking them takes most of a minute (etcd), the one before counts only
    // a part of a minute of renewals.
    let reports = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains("renewal lateness"))
            .map(str::to_string)
            .collect()
    };
    let earlier = reports(&agent.log()).len();
    let (cpu_before, started) = (cpu_seconds(pid)?, Instant::now());
    let report = loop {
        if let Some(line) = reports(&agent.log()).get(earlier) {
            break serde_json::from_str::<serde_json::Value>(line)?;
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!("no renewal report from the agent in 120 s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let cpu_share = (cpu_seconds(pid)? - cpu_before) / started.elapsed().as_secs_f64();
    let rss_kib = rss_kib(pid)?;
    let fields = &report["fields"];
    let figure = |name: &str| fields[name].as_f64().unwrap_or(f64::NAN);
    agent.stop().await?;
    drop(conns);
    Ok(vec![
        (
            format!("{count} leases on {store}, TTL 30 s: renewals in a minute once all are held"),
            format!("{}", figure("renewals")),
        ),
        (
            "renewal lateness (bucket bounds) p50 / p99 / max".into(),
            format!(
                "≤ {} ms / ≤ {} ms / {:.1} ms",
                figure("late_p50_ms"),
                figure("late_p99_ms"),
                figure("late_max_ms")
            ),
        ),
        (
            "agent resident memory with those leases".into(),
            format!("{:.1} MiB", rss_kib as f64 / 1024.0),
        ),
        (
            "agent CPU share of one core while renewing".into(),
            format!("{:.2} %", cpu_share * 100.0),
        ),
    ])
}

/// Hostile connections a member of the socket group opens at once.
const HOSTILE: usize = 2_000;
/// Pings of a good client, quiet and beside the hostile connections.
const PINGS: usize = 2_000;

/// Opens N connections as whoever runs it and holds them until stdin closes:
/// `silent` ones say nothing; `partial` ones say hello, then send 1 MiB − 1 of
/// a 1 MiB frame. Prints `held N refused M` once all are open.
const HOSTILE_PEER: &str = r#"
import socket, sys, struct, time
path, count, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
hello = bytes.fromhex(sys.argv[4])
refused, socks = 0, []
for _ in range(count):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    try:
        if mode == "partial":
            s.sendall(struct.pack(">I", len(hello)) + hello)
            head = s.recv(4)
            body = s.recv(struct.unpack(">I", head)[0]) if len(head) == 4 else b""
            if b"welcome" not in body:
                raise OSError("refused")
            s.sendall(struct.pack(">I", 1 << 20) + b"\x90" * ((1 << 20) - 1))
        socks.append(s)
    except OSError:
        refused += 1
        s.close()
if mode == "silent":
    # A refused connection has its answer (or its end) waiting by now.
    time.sleep(1)
    for s in list(socks):
        s.setblocking(False)
        try:
            s.recv(1)
            socks.remove(s)
            refused += 1
        except BlockingIOError:
            pass
held = len(socks)
print(f"held {held} refused {refused}", flush=True)
sys.stdin.read()
"#;

/// A member of the socket group (`nobody`) opens [`HOSTILE`] silent, then
/// partial-frame, connections: the agent's memory and a good client's ping
/// beside them, under the default limits and with the limits raised to
/// admit them all (what the limits spare the agent).
async fn hostile(scratch: &Path) -> Result<Rows> {
    use std::os::unix::fs::PermissionsExt;
    // nobody must reach the socket: the scratch directory is root's 0700.
    let dir = scratch.join("hostile");
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(scratch, std::fs::Permissions::from_mode(0o755))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    let hello = runlock_protocol::codec::encode_body(&Envelope::event(ClientMessage::Hello {
        version: PROTOCOL_VERSION,
        client: "hostile".into(),
        pid: 1,
        takes_locks: false,
    }))?;
    let hex: String = hello.iter().map(|b| format!("{b:02x}")).collect();
    let mut rows = Vec::new();
    for (setting, config) in [
        ("default limits", "[limits]\nhandshake_timeout = \"10m\"\n"),
        (
            "limits raised to admit all",
            "[limits]\nconnections = 4096\nconnections_per_user = 4096\nhandshake_timeout = \"10m\"\n",
        ),
    ] {
        let file = dir.join("runlockd.toml");
        std::fs::write(&file, config)?;
        let extra = ["--config", file.to_str().context("utf-8")?, "--socket-group", "65534"];
        let mut options = agent_options("memory://", &extra);
        options.socket = Some(dir.join("hostile.sock"));
        let mut agent = TestAgent::start_with_env(options, &agent_env(&[])).await?;
        let pid = agent.pid().context("agent pid")?;
        let mut good = agent.client().await?;
        let quiet = pings(&mut good).await?;
        let quiet_p50 = quantile(&mut quiet.clone(), 0.5);
        rows.push((
            format!("{setting}: agent memory, quiet"),
            format!("{:.1} MiB", rss_kib(pid)? as f64 / 1024.0),
        ));
        rows.push((format!("{setting}: good client ping, quiet"), percentiles(quiet)));
        for mode in ["silent", "partial"] {
            let mut peer = runlock_tests::setpriv(65534, 65534, &[])
                // Debian's python3: root's pyenv shims are not reachable by nobody.
                .args(["/usr/bin/python3", "-c", HOSTILE_PEER])
                .arg(agent.socket())
                .args([&HOSTILE.to_string(), mode, &hex])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()?;
            let stdout = peer.stdout.take().context("peer stdout")?;
            let mut lines = BufReader::new(stdout).lines();
            let opened = tokio::time::timeout(Duration::from_secs(300), lines.next_line())
                .await
                .context("the hostile peer did not finish opening")??
                .context("the hostile peer exited")?;
            let under = pings(&mut good).await?;
            let ratio = quantile(&mut under.clone(), 0.5).as_secs_f64() / quiet_p50.as_secs_f64();
            rows.push((
                format!("{setting}: {HOSTILE} {mode} connections from nobody"),
                opened.replace("held", "admitted"),
            ));
            rows.push((
                format!("{setting}: agent memory with them open"),
                format!("{:.1} MiB", rss_kib(pid)? as f64 / 1024.0),
            ));
            rows.push((
                format!("{setting}: good client ping beside them"),
                format!("{}  ({ratio:.2}× quiet p50)", percentiles(under)),
            ));
            drop(peer.stdin.take());
            tokio::time::timeout(Duration::from_secs(60), peer.wait()).await??;
            // The agent sees them close a moment later; give it that moment.
            tokio::time::sleep(Duration::from_secs(1)).await;
            rows.push((
                format!("{setting}: agent memory after they closed"),
                format!("{:.1} MiB", rss_kib(pid)? as f64 / 1024.0),
            ));
        }
        agent.stop().await?;
    }
    Ok(rows)
}

async fn pings(conn: &mut RawClient) -> Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(PINGS);
    for _ in 0..PINGS {
        let started = Instant::now();
        match conn.call(ClientMessage::Ping).await? {
            AgentMessage::Pong => samples.push(started.elapsed()),
            other => bail!("ping: {other:?}"),
        }
    }
    Ok(samples)
}

fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after_name = stat.rsplit_once(')').context("stat format")?.1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // After the name: state is field 3 of the whole line, utime 14 and stime 15.
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / per_second)
}

fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS")?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("VmRSS value")?
        .parse()?)
}

/// The agent's flags for the bench: JSON logs (the 10,000-lease group reads
/// its renewal report from them), then `extra`.
fn agent_options(uri: &str, extra: &[&str]) -> AgentOptions {
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
fn agent_env(env: &[(&str, &str)]) -> Vec<(String, String)> {
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
async fn start_agent(uri: &str, extra: &[&str], env: &[(&str, &str)]) -> Result<TestAgent> {
    TestAgent::start_with_env(agent_options(uri, extra), &agent_env(env)).await
}

fn acquire(key: &str, wait_ms: u64) -> ClientMessage {
    acquire_slots(key, wait_ms, 1)
}

fn acquire_slots(key: &str, wait_ms: u64, slots: u32) -> ClientMessage {
    ClientMessage::Acquire {
        slots,
        keys: vec![key.to_string()],
        ttl_ms: None,
        wait_ms,
        force: false,
        command: "meltano run tap-x target-y".into(),
        on_lost: OnLost::Term,
    }
}

async fn pair(conn: &mut RawClient, key: &str) -> Result<(Duration, Duration)> {
    let started = Instant::now();
    let lease_id = match conn.call(acquire(key, 0)).await? {
        AgentMessage::Acquired { mut leases, .. } => leases.pop().context("no lease")?.lease_id,
        other => bail!("acquire: {other:?}"),
    };
    let acquired = Instant::now();
    match conn
        .call(ClientMessage::Release {
            slot: None,
            lease_ids: vec![lease_id],
            key: None,
        })
        .await?
    {
        AgentMessage::Released { count: 1 } => {}
        other => bail!("release: {other:?}"),
    }
    Ok((acquired - started, acquired.elapsed()))
}

async fn round_trips(agent: &TestAgent) -> Result<(Vec<Duration>, Vec<Duration>, Vec<Duration>)> {
    let mut conn = agent.client().await?;
    let key = "dev:tap-x-to-target-y";
    for _ in 0..1_000 {
        pair(&mut conn, key).await?;
    }
    let (mut acquires, mut releases, mut pairs) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUND_TRIPS {
        let (a, r) = pair(&mut conn, key).await?;
        acquires.push(a);
        releases.push(r);
        pairs.push(a + r);
    }
    Ok((acquires, releases, pairs))
}

async fn throughput(agent: &TestAgent) -> Result<f64> {
    let deadline = Instant::now() + THROUGHPUT_TIME;
    let mut tasks = Vec::new();
    for n in 0..THROUGHPUT_CONNECTIONS {
        let mut conn = agent.client().await?;
        tasks.push(tokio::spawn(async move {
            let key = format!("bench-{n}");
            let mut count = 0u64;
            while Instant::now() < deadline {
                pair(&mut conn, &key).await?;
                count += 1;
            }
            anyhow::Ok(count)
        }));
    }
    let started = Instant::now();
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// A run holds the key; a waiter queues for it; SIGKILL takes the shim and
/// its child's group at once; the figure is kill → the waiter's `acquired`.
async fn crash_release(agent: &TestAgent) -> Result<Vec<Duration>> {
    let mut samples = Vec::new();
    for i in 0..CRASHES {
        let key = format!("crash-{i}");
        let mut run = agent
            .runlock()?
            .args(["run", "--key", &key, "--"])
            .args(["sh", "-c", "echo ready; exec sleep 60"])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = BufReader::new(run.stdout.take().context("stdout")?).lines();
        tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await??
            .context("no ready line")?;
        let mut waiter = agent.client().await?;
        let waiting = waiter.send(acquire(&key, 10_000)).await?;
        // A ping answered after the acquire was sent means the acquire is queued.
        match waiter.call(ClientMessage::Ping).await? {
            AgentMessage::Pong => {}
            other => bail!("ping: {other:?}"),
        }
        let shim_pid = run.id().context("shim pid")? as i32;
        let child_group = child_group_of(shim_pid)?;
        let killed = Instant::now();
        use nix::sys::signal::{kill, killpg, Signal};
        use nix::unistd::Pid;
        kill(Pid::from_raw(shim_pid), Signal::SIGKILL)?;
        killpg(Pid::from_raw(child_group), Signal::SIGKILL)?;
        match waiter.reply(waiting).await? {
            AgentMessage::Acquired { .. } => {}
            other => bail!("waiter: {other:?}"),
        }
        samples.push(killed.elapsed());
        let _ = run.wait().await;
    }
    Ok(samples)
}

/// Whole commands, each waited for: `runlock run --key k -- true` through
/// the agent on `socket` with each of `shims`, and `flock(1)` on a file,
/// taken in turn so that all see the same machine.
async fn beside_flock(
    shims: &[PathBuf],
    socket: &Path,
    scratch: &Path,
) -> Result<(Vec<Vec<Duration>>, Vec<Duration>)> {
    const RUNS: usize = 300;
    let file = scratch.join("flock-beside");
    let timed = |mut command: tokio::process::Command| async move {
        let started = Instant::now();
        let status = command.status().await?;
        anyhow::ensure!(status.success(), "{command:?} exited with {status}");
        Ok::<_, anyhow::Error>(started.elapsed())
    };
    let (mut runs, mut flocks) = (vec![Vec::new(); shims.len()], Vec::new());
    for i in 0..RUNS + 20 {
        for (shim, times) in shims.iter().zip(&mut runs) {
            let mut run = tokio::process::Command::new(shim);
            run.arg("--socket")
                .arg(socket)
                .args(["run", "--key", "beside-flock", "--", "true"]);
            let took = timed(run).await?;
            if i >= 20 {
                times.push(took);
            }
        }
        let mut flock = tokio::process::Command::new("flock");
        flock.arg(&file).arg("true");
        let took = timed(flock).await?;
        if i >= 20 {
            flocks.push(took);
        }
    }
    Ok((runs, flocks))
}

/// The shim linked statically (docs/src/install.md, "Building and installing"), built beside
/// `shim` in a target directory of its own so that neither build undoes the
/// other: most of a dynamically linked shim's extra start-up is the loader's.
fn static_shim(shim: &Path) -> Result<PathBuf> {
    let target = shim
        .parent()
        .and_then(Path::parent)
        .context("the shim is not in a target directory")?
        .join("static-shim");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("no workspace")?;
    let status = std::process::Command::new(env!("CARGO"))
        .current_dir(workspace)
        .args([
            "rustc",
            "--release",
            "-p",
            "runlock-shim",
            "--bin",
            "runlock",
        ])
        .arg("--target-dir")
        .arg(&target)
        .args(["--", "-C", "target-feature=+crt-static"])
        .env_remove("CARGO_PRIMARY_PACKAGE")
        .status()
        .context("running cargo rustc")?;
    anyhow::ensure!(status.success(), "building the static shim: {status}");
    Ok(target.join("release").join("runlock"))
}

/// The process group of the shim's only child (the run).
fn child_group_of(shim_pid: i32) -> Result<i32> {
    let children = std::fs::read_to_string(format!("/proc/{shim_pid}/task/{shim_pid}/children"))?;
    let child: i32 = children
        .split_whitespace()
        .next()
        .context("shim has no child")?
        .parse()?;
    Ok(nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(child)))?.as_raw())
}

/// Raw echo: frames of the acquire request's size, decoded and re-encoded.
async fn echo_round_trips(scratch: &Path) -> Result<Vec<Duration>> {
    let socket = scratch.join("echo.sock");
    let exe = std::env::current_exe()?;
    let mut server = Command::new(exe)
        .env(ECHO_ENV, &socket)
        .kill_on_drop(true)
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(server.stdout.take().context("stdout")?).lines();
    tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await??
        .context("echo server not ready")?;
    let mut conn: Framed<UnixStream, MessageCodec<ClientMessage, ClientMessage>> =
        Framed::new(UnixStream::connect(&socket).await?, MessageCodec::new());
    let mut samples = Vec::new();
    for i in 0..(1_000 + ROUND_TRIPS as u64) {
        let started = Instant::now();
        conn.send(Envelope::request(i, acquire("dev:tap-x-to-target-y", 0)))
            .await?;
        conn.next()
            .await
            .context("echo closed")??
            .map_err(|e| anyhow::anyhow!(e.reason))?;
        if i >= 1_000 {
            samples.push(started.elapsed());
        }
    }
    server.kill().await?;
    Ok(samples)
}

async fn echo_server(socket: PathBuf) -> Result<()> {
    let listener = UnixListener::bind(&socket)?;
    println!("ready");
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            let mut conn: Framed<UnixStream, MessageCodec<ClientMessage, ClientMessage>> =
                Framed::new(stream, MessageCodec::new());
            while let Some(frame) = conn.next().await {
                let message = match frame {
                    Ok(Ok(message)) => message,
                    Ok(Err(bad)) => return eprintln!("echo: undecodable frame: {}", bad.reason),
                    Err(err) => return eprintln!("echo: {err}"),
                };
                if let Err(err) = conn.send(message).await {
                    return eprintln!("echo: {err}");
                }
            }
        });
    }
}

fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort_unstable();
    samples[((samples.len() - 1) as f64 * q).round() as usize]
}

fn percentiles(mut samples: Vec<Duration>) -> String {
    let p50 = quantile(&mut samples, 0.5);
    let p99 = quantile(&mut samples, 0.99);
    format!("{} / {} (n={})", micros(p50), micros(p99), samples.len())
}

fn micros(d: Duration) -> String {
    if d >= Duration::from_millis(1) {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    }
}
