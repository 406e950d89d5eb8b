//! The object stores through the agent beside raw writes with the same
//! SDKs: S3 (moto), Azure Blob (Azurite), GCS (fake-gcs-server), and the
//! requests each operation costs, counted by a proxy.

use super::*;

/// GCS takes one write per object per second, so each sample is a key of its own.
pub(crate) const GCS_KEYS: usize = 300;

/// moto's endpoint and a new bucket on it, `NAME-PID`; or, when
/// `RUNLOCK_TEST_S3_ENDPOINT` is not set, the row saying `label` was skipped.
async fn moto_bucket(label: &str, name: &str) -> Result<Result<(String, String), Rows>> {
    let Ok(endpoint) = std::env::var("RUNLOCK_TEST_S3_ENDPOINT") else {
        let why = "skipped: RUNLOCK_TEST_S3_ENDPOINT is not set (see BENCHMARKS.md)";
        return Ok(Err(vec![(label.into(), why.into())]));
    };
    let bucket = format!("{name}-{}", std::process::id());
    // moto accepts an unsigned bucket creation.
    http::request("PUT", &format!("{endpoint}/{bucket}"), &[], "")
        .await?
        .success("creating a bucket")?;
    Ok(Ok((endpoint, bucket)))
}

/// S3 on moto: the requests each agent operation costs the store, and acquire
/// through the agent beside a raw conditional PUT with the same SDK, in the
/// same run. Needs `RUNLOCK_TEST_S3_ENDPOINT` (BENCHMARKS.md).
pub(crate) async fn s3_rows(_scratch: &Path) -> Result<Rows> {
    let (endpoint, bucket) = match moto_bucket("S3 (moto)", "runlock-bench").await? {
        Ok(at) => at,
        Err(skipped) => return Ok(skipped),
    };
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
        .http_client(runlock_agent::backend::cas::S3Store::sdk_http_client())
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

/// The Azurite key every Azurite accepts for its development account.
pub(crate) const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// Azure Blob on the Azurite of `tests/scripts/azurite.sh`: the requests each
/// agent operation costs the store, and acquire through the agent beside a
/// raw conditional write with the agent's own Azure client, in the same run.
pub(crate) async fn azure_rows(_scratch: &Path) -> Result<Rows> {
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
    let unobserved = runlock_agent::backend::StoreContext::default();
    let client = AzureStore::open(&format!("azure://{container}/raw"), &options, &unobserved)?;
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
pub(crate) struct CountingProxy {
    pub(crate) url: String,
    pub(crate) requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    pub(crate) accepting: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    /// A proxy to the host and port of `upstream` (an `http://` URL).
    pub(crate) async fn start(upstream: &str) -> Result<CountingProxy> {
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

    pub(crate) fn requests(&self) -> usize {
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
pub(crate) fn is_request_line(line: &[u8]) -> bool {
    line.ends_with(b" HTTP/1.1\r")
}

/// The store requests each operation of an agent on `uri` costs, counted by
/// `proxy` (which `env` points the agents at): acquires of a new key, of a
/// key this agent freed and of one another agent freed, one refused as held,
/// a renewal (TTL `ttl`, by the agent's own count of them) and a release.
pub(crate) async fn requests_per_operation(
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

/// GCS on fake-gcs-server: the requests each agent operation costs the store,
/// and acquire through the agent beside raw multipart
/// uploads with `ifGenerationMatch` over the same HTTP stack (hyper-util's
/// pooled client), in the same run. GCS sustains one write per object per
/// second, so every sample writes an object of its own: acquires of new keys
/// (one create each) beside raw creates, then, a second later, acquires of
/// the keys this agent freed (one replace each) beside raw replaces; and a few
/// acquires right after a release of the same key, which the engine spaces
/// by that second. Needs `RUNLOCK_TEST_GCS_ENDPOINT` (BENCHMARKS.md).
pub(crate) async fn gcs_rows(_scratch: &Path) -> Result<Rows> {
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
pub(crate) async fn gcs_acquire_all(conn: &mut RawClient, round: &str) -> Result<Vec<Duration>> {
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
    match conn.call(runlock_tests::client::release(lease_ids)).await? {
        AgentMessage::Released { .. } => Ok(samples),
        other => bail!("{round} release: {other:?}"),
    }
}

/// S3 on moto: what each operation on a key with 1, 3 and 10 slots costs the
/// store, counted by a proxy; two agents, as two runner hosts.
pub(crate) async fn slot_rows(_scratch: &Path) -> Result<Rows> {
    let (endpoint, bucket) = match moto_bucket("slots", "runlock-bench-slots").await? {
        Ok(at) => at,
        Err(skipped) => return Ok(skipped),
    };
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
