//! A store that throttles (S3 `503 SlowDown`, GCS `429`, Azure `503
//! ServerBusy`) is weather, not a verdict (issue 28): its answers are
//! retried within the caller's wait and counted in
//! `runlock_store_throttled_total`, and a wait that runs out names the
//! throttling, never "cannot be trusted to lock". Through a proxy in front of
//! the emulator that answers some requests itself, as a throttling store would.

use crate::agent::metrics::{metrics_address, scrape, value};
use crate::support::rewriting_proxy::{Canned, RequestHead, RewritingProxy};
use crate::support::stores::{unique_name, Azure, Gcs, Ministack, Store, S3};
use crate::support::{key, AgentOptions, TestAgent};
use anyhow::{ensure, Result};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

test_matrix!(
    [s3: S3, ministack: Ministack, gcs: Gcs, azure: Azure];
    a_throttling_store_is_waited_out_counted_and_named,
);

/// What `store` answers when it throttles.
fn slow_down(store: &str) -> Canned {
    match store {
        "gcs" => Canned {
            status: 429,
            reason: "Too Many Requests",
            headers: vec![("Content-Type", "application/json".into())],
            body: r#"{"error":{"code":429,"message":"The rate of change requests to the object is too high.","errors":[{"reason":"rateLimitExceeded"}]}}"#.into(),
        },
        "azure" => Canned {
            status: 503,
            reason: "Server Busy",
            headers: vec![
                ("Content-Type", "application/xml".into()),
                ("x-ms-error-code", "ServerBusy".into()),
            ],
            body: "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>ServerBusy</Code>\
                   <Message>The server is busy.</Message></Error>"
                .into(),
        },
        _ => Canned {
            status: 503,
            reason: "Slow Down",
            headers: vec![("Content-Type", "application/xml".into())],
            body: "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code>\
                   <Message>Please reduce your request rate.</Message></Error>"
                .into(),
        },
    }
}

/// How the store names its throttling in an error.
fn named(store: &str) -> &'static str {
    match store {
        "gcs" => "is throttling",
        "azure" => "503",
        _ => "SlowDown",
    }
}

async fn a_throttling_store_is_waited_out_counted_and_named(store: impl Store) -> Result<()> {
    let at = store.shared()?;
    let bucket = unique_name("throttled");
    store.create(&at, &bucket).await?;
    // Every other request is throttled, from the agent's start on; with
    // `all`, every one.
    let (requests, all) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let canned = slow_down(store.backend());
    let answer = {
        let (requests, all) = (requests.clone(), all.clone());
        Arc::new(move |_: &RequestHead| {
            let n = requests.fetch_add(1, Ordering::SeqCst);
            (all.load(Ordering::SeqCst) || n % 2 == 0).then(|| canned.clone())
        })
    };
    let proxy = RewritingProxy::start_answering(&at, Arc::new(|_| {}), answer).await?;
    let proxied = proxy.endpoint.clone();
    let mut options = AgentOptions::new(store.uri(&at, &bucket, "p"));
    options.args = ["--metrics", "127.0.0.1:0"].map(String::from).to_vec();
    let agent = TestAgent::start_with_env(options, &store.env(&proxied)).await?;
    let metrics = metrics_address(&agent)?;

    let k = key("throttled");
    let served = agent
        .run(&[&k], &["--wait", "60s"], "echo served")?
        .finish()
        .await?;
    served.expect_output("served\n")?;
    let series = format!(
        "runlock_store_throttled_total{{store=\"{}\"}}",
        store.backend()
    );
    let counted = value(&scrape(metrics).await?, &series).unwrap_or(0.0);
    ensure!(counted >= 1.0, "{series} is {counted}");

    // Throttled throughout a short wait: refused as unavailable, naming it.
    all.store(true, Ordering::SeqCst);
    let refused = agent
        .run_refused(&[&key("throttled-out")], &["--wait", "3s"], 69)
        .await?;
    ensure!(
        refused.stderr.contains(named(store.backend())) && !refused.stderr.contains("trusted"),
        "the refusal does not name the throttling: {refused:?}"
    );
    let more = value(&scrape(metrics).await?, &series).unwrap_or(0.0);
    ensure!(more > counted, "{series} stayed at {more}");
    Ok(())
}
