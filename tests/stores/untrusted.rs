//! An object store must prove it can lock (agent/src/backend/cas/proof.rs).
//! Each emulator is put behind a proxy that drops one kind of condition from
//! every write, as a store that ignores it would: `If-None-Match: *` or
//! `If-Match` on S3 and Azure Blob, `ifGenerationMatch=0` or
//! `ifGenerationMatch=N` on GCS. The agent must grant nothing on it, every
//! run must exit 69 naming what the store lacks, and `check-config` must exit
//! 78 saying the same. Through the same proxy rewriting nothing, all works,
//! so it is the missing condition that the agent caught.

use crate::agent::config::runlockd;
use crate::support::rewriting_proxy::{RequestHead, Rewrite, RewritingProxy};
use crate::support::stores::{azure, unique_name, Azure, Gcs, Ministack, Store, S3};
use crate::support::{key, AgentOptions, TestAgent};
use anyhow::{ensure, Context, Result};
use std::sync::Arc;

/// The conditional writes a store may ignore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Condition {
    /// Create only if absent.
    Absent,
    /// Replace only if the version is the one given.
    Matches,
}

impl Condition {
    /// What the refusing agent says the store lacks.
    fn named(self) -> &'static str {
        match self {
            Condition::Absent => "ignores If-None-Match: * or its equivalent",
            Condition::Matches => "ignores If-Match or its equivalent",
        }
    }
}

/// A rewrite that drops `condition` from every request to `store`, or with
/// `None`, changes nothing (Azure's requests are signed again either way).
fn dropping(store: &str, condition: Option<Condition>) -> Rewrite {
    let store = store.to_string();
    Arc::new(move |head: &mut RequestHead| {
        match (store.as_str(), condition) {
            (_, None) => {}
            ("gcs", Some(condition)) => drop_generation_match(head, condition),
            (_, Some(Condition::Absent)) => {
                head.remove("If-None-Match");
            }
            (_, Some(Condition::Matches)) => {
                head.remove("If-Match");
            }
        }
        if store == "azure" {
            azure::sign_again(head);
        }
    })
}

/// GCS puts its conditions in the query: generation 0 means "absent".
fn drop_generation_match(head: &mut RequestHead, condition: Condition) {
    let Some((path, query)) = head.target.split_once('?') else {
        return;
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|param| match param.strip_prefix("ifGenerationMatch=") {
            Some("0") => condition != Condition::Absent,
            Some(_) => condition != Condition::Matches,
            None => true,
        })
        .collect();
    head.target = format!("{path}?{}", kept.join("&"));
}

async fn a_store_that_ignores_a_condition_is_never_trusted(store: impl Store) -> Result<()> {
    let at = store.shared()?;
    let bucket = unique_name("untrusted");
    store.create(&at, &bucket).await?;
    let uri = store.uri(&at, &bucket, "p");
    for condition in [None, Some(Condition::Absent), Some(Condition::Matches)] {
        let what = format!("{} ignoring {condition:?}", store.name());
        let proxy = RewritingProxy::start(&at, dropping(store.name(), condition)).await?;
        let env = store.env(&proxy.endpoint);
        let agent = TestAgent::start_with_env(AgentOptions::new(&uri), &env)
            .await
            .with_context(|| format!("starting an agent on {what}"))?;
        let run = agent
            .run(&[&key("untrusted")], &[], "echo ran")?
            .finish()
            .await?;
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let check = runlockd(&["check-config", "--backend", &uri], &env).await?;
        let Some(condition) = condition else {
            run.expect_code(0).context(what.clone())?;
            ensure!(run.stdout.contains("ran"), "{what}: {run:?}");
            check.expect_code(0).context(what.clone())?;
            ensure!(check.stderr.contains("is ready"), "{what}: {check:?}");
            continue;
        };
        run.expect_code(69).context(what.clone())?;
        ensure!(!run.stdout.contains("ran"), "{what}: {run:?}");
        let log = agent.log();
        for (whose, text) in [
            ("the run", &run.stderr),
            ("the agent's log", &log),
            ("check-config", &check.stderr),
        ] {
            ensure!(
                text.contains("cannot be trusted to lock") && text.contains(condition.named()),
                "{what}: {whose} does not say what the store lacks:\n{text}"
            );
        }
        check.expect_code(78).context(what.clone())?;
    }
    Ok(())
}

// As the test `a_store_that_ignores_a_condition_is_never_trusted::STORE`.
test_matrix!(
    [s3: S3, ministack: Ministack, azure: Azure, gcs: Gcs];
    a_store_that_ignores_a_condition_is_never_trusted,
);

/// A store that refuses every conditional write that comes alone, but lets
/// concurrent ones all through (it checks, then writes): the agent's proof
/// races writers, so no run is granted on it, and both the run and
/// check-config say what the store lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_atomic_only_one_request_at_a_time_is_never_trusted() -> Result<()> {
    let agent = TestAgent::start("memory-cas://racy").await?;
    let run = agent
        .run(&[&key("racy")], &[], "echo ran")?
        .finish()
        .await?;
    run.expect_code(69)?;
    ensure!(!run.stdout.contains("ran"), "{run:?}");
    let check = runlockd(&["check-config", "--backend", "memory-cas://racy"], &[]).await?;
    check.expect_code(78)?;
    for (whose, text) in [
        ("the run", &run.stderr),
        ("the agent's log", &agent.log()),
        ("check-config", &check.stderr),
    ] {
        ensure!(
            text.contains("cannot be trusted to lock")
                && text.contains("concurrent")
                && text.contains("two steps"),
            "{whose} does not say what the store lacks:\n{text}"
        );
    }
    // The same engine over a store that is atomic under concurrency: all works.
    let sound = TestAgent::start("memory-cas://").await?;
    sound.run_to_success(&key("sound")).await?;
    Ok(())
}

/// A store whose check-then-write window opens only under load: the two
/// racers of every agent's start do not meet it, so runs are granted, but
/// `check-config`, racing many writers on several objects, refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_races_harder_than_the_start() -> Result<()> {
    let uri = "memory-cas://racy-under-load";
    let agent = TestAgent::start(uri).await?;
    agent.run_to_success(&key("under-load")).await?;
    let check = runlockd(&["check-config", "--backend", uri], &[]).await?;
    check.expect_code(78)?;
    ensure!(
        check.stderr.contains("cannot be trusted to lock")
            && check.stderr.contains("8 concurrent")
            && check.stderr.contains("two steps"),
        "check-config does not say what the store lacks:\n{}",
        check.stderr
    );
    Ok(())
}
