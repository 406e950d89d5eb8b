//! `runlock list`: the keys held in the store, from every host, read through
//! one agent a page at a time (issue 29). Two agents on one space play two
//! hosts, on every shared store and on `file://`.

use crate::support::agent::Backend;
use crate::support::client::{acquire, release, RawClient};
use crate::support::rewriting_proxy::{Canned, RequestHead, RewritingProxy};
use crate::support::run::{Run, HOLD};
use crate::support::stores::{
    unique_name, Azure, Etcd, Gcs, Ministack, Postgres, Space, Store, RECORDS, S3,
};
use crate::support::{host_name, AgentOptions, Deadline, TestAgent, WAIT};
use anyhow::{ensure, Context, Result};
use runlock_protocol::{AgentMessage, ClientMessage, ErrorCode, ListKeysRequest};
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

test_matrix!(
    [s3: S3, ministack: Ministack, azure: Azure, gcs: Gcs, postgres: Postgres, etcd: Etcd];
    every_host_s_keys_are_listed_as_this_user_may_see_them,
    a_listing_pages_through_more_keys_than_one_reply_holds,
);

test_matrix!(
    [s3: S3, ministack: Ministack, azure: Azure, gcs: Gcs];
    a_listing_reads_again_only_the_records_that_changed,
    an_unreadable_record_is_listed_with_its_name_not_dropped,
    a_page_that_fails_says_which_and_the_pages_before_it_are_shown,
);

/// How long an acquire or a release of hundreds of keys may take: one store
/// write each, in turn, on an emulator the rest of the suite is busy with too
/// (through ministack on a loaded machine, 0.1 to 0.3 s a write).
const MANY_KEYS_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// An `acquire` of `keys` for a test's whole length: an hour's TTL, so that
/// no renewal of hundreds of leases weighs on an emulator the other tests
/// share (600 leases of 30 s took 60 writes a second, and Azurite answered
/// a loaded CI machine's acquires in over 200 ms each).
fn acquire_for_the_test(keys: &[&str]) -> ClientMessage {
    let mut request = acquire(keys);
    if let ClientMessage::Acquire(req) = &mut request {
        req.ttl_ms = Some(60 * 60 * 1000);
    }
    request
}

/// `runlock list ARGS --json` through `agent`, parsed; it must succeed.
/// A listing reads one record per key, so it is given as long as an acquire
/// of many keys: 600 keys on a loaded Azurite or moto took more than the
/// usual 15 s in CI.
async fn list_json(agent: &TestAgent, args: &[&str]) -> Result<Value> {
    let mut all = vec!["list", "--json"];
    all.extend_from_slice(args);
    let mut command = agent.runlock()?;
    command.args(&all);
    let out = Run::spawn(command)?.finish_within(MANY_KEYS_WAIT).await?;
    out.expect_code(0)?;
    serde_json::from_str(out.stdout.trim())
        .with_context(|| format!("list --json printed non-JSON: {out:?}"))
}

/// The listed key called `name`.
fn listed<'a>(listing: &'a Value, name: &str) -> Option<&'a Value> {
    listing["keys"]
        .as_array()?
        .iter()
        .find(|k| k["key"] == name)
}

/// The names of every listed key.
fn names(listing: &Value) -> Vec<String> {
    listing["keys"]
        .as_array()
        .map(|keys| {
            keys.iter()
                .filter_map(|k| k["key"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Two hosts' runs, a key with slots shared by both, a key released, a key
/// too long for its name to be spelled, and a key under another prefix.
async fn keys_on_two_hosts(a: &TestAgent, b: &TestAgent, ttl_ms: u64) -> Result<Vec<String>> {
    let long = format!("list/{}", "x".repeat(300));
    let mut runs = Vec::new();
    for (agent, key, extra) in [
        (a, "list/a", vec![]),
        (b, "list/b", vec![]),
        (a, "list/slots", vec!["--slots", "3"]),
        (b, "list/slots", vec!["--slots", "3"]),
        (a, long.as_str(), vec![]),
        (b, "other/c", vec![]),
    ] {
        let mut run = agent.run(&[key], &extra, &format!("{HOLD} # secret-argument"))?;
        run.ready().await?;
        runs.push(run);
    }
    a.run(&["list/done"], &[], "true")?
        .finish()
        .await?
        .expect_code(0)?;

    // Through B: every host's keys, held ones only.
    let listing = list_json(b, &[]).await?;
    ensure!(listing["complete"] == true, "{listing}");
    let mut got = names(&listing);
    got.sort();
    let mut want = vec!["list/a", "list/b", "list/slots", long.as_str(), "other/c"];
    want.sort();
    ensure!(got == want, "listed {got:?}, not {want:?}");
    let (a_id, b_id) = (a.agent_id().await?, b.agent_id().await?);
    let one = listed(&listing, "list/a").context("list/a")?;
    ensure!(
        one["state"] == "held"
            && one["slots"] == 1
            && one["slots_held"] == 1
            && one["holders"][0]["agent_id"] == a_id.as_str()
            && one["holders"][0]["host"] == host_name()?.as_str()
            && one["token"].as_u64().is_some_and(|t| t > 0),
        "{one}"
    );
    if ttl_ms > 0 {
        ensure!(
            one["expires_in_ms"].as_u64().is_some_and(|ms| ms <= ttl_ms),
            "a held key says when it expires: {one}"
        );
    }
    let slots = listed(&listing, "list/slots").context("list/slots")?;
    let holders: BTreeSet<&str> = slots["holders"]
        .as_array()
        .context("holders")?
        .iter()
        .filter_map(|h| h["agent_id"].as_str())
        .collect();
    ensure!(
        slots["slots"] == 3 && slots["slots_held"] == 2 && holders.len() == 2,
        "{slots}"
    );
    ensure!(
        holders.contains(a_id.as_str()) && holders.contains(b_id.as_str()),
        "{slots}"
    );

    // A refusal is the refusing agent's to tell: its report tells the fleet.
    b.run(&["list/a"], &[], "true")?
        .finish()
        .await?
        .expect_code(75)?;
    let refused = |agent: &TestAgent| {
        let socket = agent.socket().to_path_buf();
        async move {
            let mut client = RawClient::connect(&socket).await?;
            client.hello().await?;
            let request = ClientMessage::ListKeys(ListKeysRequest {
                prefix: "list/a".into(),
                cursor: None,
                free: false,
                events_since_ms: Some(0),
            });
            match client.call(request).await? {
                AgentMessage::Keys { keys, .. } => Ok::<_, anyhow::Error>(
                    keys.into_iter().flat_map(|k| k.refused).collect::<Vec<_>>(),
                ),
                other => anyhow::bail!("list_keys: {other:?}"),
            }
        }
    };
    let through_b = refused(b).await?;
    let host = host_name()?;
    ensure!(
        through_b.len() == 1
            && through_b[0].user == "root"
            && through_b[0].waited_ms == 0
            && through_b[0].host == host,
        "{through_b:?}"
    );
    // A has nothing to report, and learns of B's refusal from B's report.
    let deadline = Deadline::new(WAIT, "B's refusal listed through A");
    while refused(a).await? != through_b {
        deadline.tick().await?;
    }

    // So with a run waiting through B, while it waits and no longer.
    let waiter = b.run(&["list/a"], &["--wait", "5m"], "true")?;
    let waiters_through_a = || async {
        let listing = list_json(a, &["list/a"]).await?;
        let key = listed(&listing, "list/a").context("list/a")?;
        Ok::<_, anyhow::Error>(key["waiters"].as_array().cloned().unwrap_or_default())
    };
    let deadline = Deadline::new(WAIT, "B's waiter listed through A");
    let waiters = loop {
        let waiters = waiters_through_a().await?;
        if !waiters.is_empty() {
            break waiters;
        }
        deadline.tick().await?;
    };
    ensure!(
        waiters.len() == 1
            && waiters[0]["host"] == host.as_str()
            && waiters[0]["user"] == "root"
            && waiters[0]["pid"].as_u64() == Some(u64::from(waiter.pid()?)),
        "{waiters:?}"
    );
    let table = a.runlock_output(&["list", "list/a"]).await?;
    ensure!(
        table.stdout.contains("held +1"),
        "the waiter counted: {table:?}"
    );
    waiter.signal(nix::sys::signal::Signal::SIGTERM)?;
    waiter.finish().await?;
    let deadline = Deadline::new(WAIT, "B's waiter gone from the listing through A");
    while !waiters_through_a().await?.is_empty() {
        deadline.tick().await?;
    }

    // A prefix, and free keys with `--all`.
    let under = list_json(b, &["list/"]).await?;
    ensure!(
        names(&under).len() == 4 && listed(&under, "other/c").is_none(),
        "{under}"
    );
    let all = list_json(a, &["--all", "list/"]).await?;
    let done = listed(&all, "list/done").context("--all lists a released key")?;
    ensure!(
        done["state"] == "free" && done["slots_held"] == 0 && done["token"].as_u64() > Some(0),
        "{done}"
    );

    // The table fits a terminal and names what a person looks for.
    let table = b.runlock_output(&["list"]).await?;
    table.expect_code(0)?;
    table.expect_stdout_has(&["list/a", "list/b", "2/3 held", "other/c", "5 held (1 page)"])?;
    ensure!(
        table.stdout.lines().all(|line| line.chars().count() <= 120),
        "wider than the terminal's 120 columns: {table:?}"
    );
    for run in runs {
        run.end_and_expect_success().await?;
    }
    // Released, a key too long for its name to be spelled is still named.
    let after = list_json(b, &["--all", "list/"]).await?;
    let gone = listed(&after, &long).context("--all lists a released long key")?;
    ensure!(
        gone["state"] == "free" && gone["token"].as_u64() > Some(0),
        "{gone}"
    );
    Ok(names(&all))
}

async fn every_host_s_keys_are_listed_as_this_user_may_see_them(store: impl Store) -> Result<()> {
    let space = Space::create(store, "list").await?;
    let a = space.agent("", &["--ttl", "20s"]).await?;
    let b = space.agent("", &["--ttl", "20s"]).await?;
    keys_on_two_hosts(&a, &b, 20_000).await?;
    Ok(())
}

#[tokio::test]
async fn on_file_every_run_s_key_is_listed_too() -> Result<()> {
    let a = TestAgent::start_on(Backend::File).await?;
    let mut options = AgentOptions::new(a.backend().to_string());
    options.args = vec![];
    let b = TestAgent::start_with(options).await?;
    keys_on_two_hosts(&a, &b, 0).await?;
    Ok(())
}

/// More keys than one `keys` reply lists, taken in one acquire: every one
/// is listed once, over several pages, and once half are released,
/// `--all` still lists every one.
async fn a_listing_pages_through_more_keys_than_one_reply_holds(store: impl Store) -> Result<()> {
    const KEYS: usize = 600;
    let space = Space::create(store, "list-pages").await?;
    let agent = space.agent("", &[]).await?;
    let keys: Vec<String> = (0..KEYS).map(|i| format!("page/{i:04}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut client = agent.client().await?;
    let leases = match client
        .call_within(MANY_KEYS_WAIT, acquire_for_the_test(&refs))
        .await?
    {
        AgentMessage::Acquired { leases, .. } => leases,
        other => anyhow::bail!("acquire: {other:?}"),
    };
    let listing = list_json(&agent, &[]).await?;
    // A reply holds about 250 keys (300 on etcd, whose store pages are 100).
    ensure!(
        listing["pages"].as_u64() >= Some(2),
        "pages: {}",
        listing["pages"]
    );
    let got = names(&listing);
    let unique: BTreeSet<&String> = got.iter().collect();
    ensure!(
        got.len() == KEYS && unique.len() == KEYS,
        "{} listed, {} distinct",
        got.len(),
        unique.len()
    );

    let half: Vec<String> = leases[..KEYS / 2]
        .iter()
        .map(|l| l.lease_id.clone())
        .collect();
    let released = client.call_within(MANY_KEYS_WAIT, release(half)).await?;
    ensure!(
        matches!(released, AgentMessage::Released { count } if count as usize == KEYS / 2),
        "{released:?}"
    );
    let held = list_json(&agent, &[]).await?;
    ensure!(
        names(&held).len() == KEYS / 2,
        "{} held",
        names(&held).len()
    );
    let all = list_json(&agent, &["--all"]).await?;
    ensure!(names(&all).len() == KEYS, "{} in all", names(&all).len());

    // A cursor the agent did not give is refused, not followed.
    let refused = client
        .call(ClientMessage::ListKeys(ListKeysRequest {
            prefix: String::new(),
            cursor: Some("{\"page\":".to_string()),
            free: false,
            events_since_ms: None,
        }))
        .await?;
    ensure!(
        matches!(&refused, AgentMessage::Error(e) if e.code == ErrorCode::BadRequest),
        "{refused:?}"
    );
    Ok(())
}

async fn an_unreadable_record_is_listed_with_its_name_not_dropped(store: impl Store) -> Result<()> {
    let space = Space::create(store, "list-unreadable").await?;
    let agent = space.agent("", &[]).await?;
    agent
        .run(&["fine"], &[], "true")?
        .finish()
        .await?
        .expect_code(0)?;
    space
        .put(&format!("{RECORDS}broken.json"), b"{ not a record")
        .await?;
    let all = list_json(&agent, &["--all"]).await?;
    let broken = listed(&all, "broken.json").with_context(|| format!("{all}"))?;
    ensure!(
        broken["state"] == "unreadable"
            && broken["unreadable"]
                .as_str()
                .is_some_and(|why| why.contains("not a runlock record")),
        "{broken}"
    );
    ensure!(listed(&all, "fine").is_some(), "{all}");
    let table = agent.runlock_output(&["list", "--all"]).await?;
    table.expect_stdout_has(&["unreadable", "1 unreadable"])?;
    Ok(())
}

/// Whether `head` lists lock records (not the agents' reports beside them).
fn lists_records(head: &RequestHead) -> bool {
    is_listing(head) && head.target.contains("locks")
}

/// Whether `head` asks the store for a listing of object names.
fn is_listing(head: &RequestHead) -> bool {
    head.method == "GET"
        && (head.target.contains("list-type=2")
            || head.target.contains("comp=list")
            || head.target.contains("/o?prefix="))
}

/// A store that fails every listing after the first: the first page is
/// shown, and the failure names page 2 and the last key shown before it.
async fn a_page_that_fails_says_which_and_the_pages_before_it_are_shown(
    store: impl Store,
) -> Result<()> {
    const KEYS: usize = 300;
    let at = store.shared()?;
    let name = unique_name("list-fails");
    store.create(&at, &name).await?;
    let listings = Arc::new(AtomicUsize::new(0));
    let answer = {
        let listings = listings.clone();
        Arc::new(move |head: &RequestHead| {
            if !lists_records(head) || listings.fetch_add(1, Ordering::SeqCst) == 0 {
                return None;
            }
            Some(Canned {
                status: 500,
                reason: "Internal Server Error",
                headers: vec![("Content-Type", "text/plain".into())],
                body: "the listing broke".into(),
            })
        })
    };
    let proxy = RewritingProxy::start_answering(&at, Arc::new(|_| {}), answer).await?;
    let proxied = proxy.endpoint.clone();
    // The keys are taken past the proxy, by another host: only the listing goes through it.
    let holder = TestAgent::start_with_env(
        AgentOptions::new(store.uri(&at, &name, "")),
        &store.env(&at),
    )
    .await?;
    let options = AgentOptions::new(store.uri(&at, &name, ""));
    let agent = TestAgent::start_with_env(options, &store.env(&proxied)).await?;
    let keys: Vec<String> = (0..KEYS).map(|i| format!("fails/{i:04}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut client = holder.client().await?;
    ensure!(
        matches!(
            client
                .call_within(MANY_KEYS_WAIT, acquire_for_the_test(&refs))
                .await?,
            AgentMessage::Acquired { .. }
        ),
        "the keys were not taken"
    );
    listings.store(0, Ordering::SeqCst);
    let out = agent.runlock_output(&["list"]).await?;
    ensure!(out.code() == Some(69), "{out:?}");
    out.expect_stderr_has(&["page 2 of the listing (after key \"fails/0249\") failed"])?;
    ensure!(
        out.stdout.contains("fails/0000")
            && out.stdout.contains("fails/0249")
            && !out.stdout.contains("fails/0250")
            && out
                .stdout
                .contains("page 2 failed, the listing is incomplete"),
        "{out:?}"
    );
    Ok(())
}

/// The fleet page lists every few seconds: on an object store, whose listing
/// gives each object's version, a record unchanged since the last listing
/// costs no read, a slot's record as much as a key's.
async fn a_listing_reads_again_only_the_records_that_changed(store: impl Store) -> Result<()> {
    const KEYS: usize = 20;
    let at = store.shared()?;
    let name = unique_name("list-reads");
    store.create(&at, &name).await?;
    let reads = Arc::new(AtomicUsize::new(0));
    let rewrite = {
        let reads = reads.clone();
        Arc::new(move |head: &mut RequestHead| {
            if head.method == "GET" && !is_listing(head) {
                reads.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let proxy = RewritingProxy::start(&at, rewrite).await?;
    let proxied = proxy.endpoint.clone();
    // A TTL long enough that no renewal rewrites a record meanwhile.
    let options = AgentOptions::with_ttl(store.uri(&at, &name, ""), "1h");
    let agent = TestAgent::start_with_env(options, &store.env(&proxied)).await?;
    let keys: Vec<String> = (0..KEYS).map(|i| format!("reads/{i:02}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut client = agent.client().await?;
    let leases = match client
        .call_within(MANY_KEYS_WAIT, acquire_for_the_test(&refs))
        .await?
    {
        AgentMessage::Acquired { leases, .. } => leases,
        other => anyhow::bail!("acquire: {other:?}"),
    };
    // A key with slots, two of its four held: listed once, from five records.
    let slot_holders = take_slots(&agent, "reads/slots", 4, 2).await?;
    const LISTED: usize = KEYS + 1;
    let listing_reads = || {
        let reads = reads.clone();
        let agent = &agent;
        async move {
            let before = reads.load(Ordering::SeqCst);
            let listing = list_json(agent, &["--all"]).await?;
            Ok::<_, anyhow::Error>((names(&listing).len(), reads.load(Ordering::SeqCst) - before))
        }
    };
    let (listed, first) = listing_reads().await?;
    ensure!(
        listed == LISTED && first >= KEYS + 2,
        "{listed} listed with {first} reads"
    );
    let (listed, second) = listing_reads().await?;
    ensure!(
        listed == LISTED && second == 0,
        "{listed} listed with {second} reads"
    );
    let released = client
        .call(release(vec![leases[0].lease_id.clone()]))
        .await?;
    ensure!(
        matches!(released, AgentMessage::Released { count: 1 }),
        "{released:?}"
    );
    let (listed, third) = listing_reads().await?;
    ensure!(
        listed == LISTED && third == 1,
        "{listed} listed with {third} reads"
    );
    drop(slot_holders);
    Ok(())
}

/// The keys that `ListKeys` pages through with events since 0, as `runlock
/// ui` and the Python client ask; at most `pages` replies, so that a listing
/// that stopped moving fails here instead of asking forever.
async fn keys_with_events(
    client: &mut RawClient,
    prefix: &str,
    pages: usize,
) -> Result<Vec<runlock_protocol::KeyListing>> {
    let mut cursor = None;
    let mut listed = Vec::new();
    for _ in 0..pages {
        let page = client
            .call(ClientMessage::ListKeys(ListKeysRequest {
                prefix: prefix.to_string(),
                cursor: cursor.take(),
                free: true,
                events_since_ms: Some(0),
            }))
            .await?;
        let AgentMessage::Keys { keys, cursor: next } = page else {
            anyhow::bail!("list_keys: {page:?}");
        };
        listed.extend(keys);
        match next {
            Some(next) => cursor = Some(next),
            None => return Ok(listed),
        }
    }
    anyhow::bail!(
        "the listing had not ended after {pages} pages: {} keys so far",
        listed.len()
    )
}

/// 64 slots, each keeping 32 events with strings as long as the agent shows
/// them: the key's events alone are about 2 MiB, twice a frame. A listing
/// that asks for events ends, lists the key after it too, and says how many
/// of its events it left out; `runlock list` shows every key.
#[tokio::test]
async fn a_key_larger_than_a_frame_is_cut_and_the_listing_goes_on() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    // `start_on(Backend::File)` keeps the lock directory beside the socket.
    let dir = agent.dir().join("locks");
    release_slots(take_slots(&agent, "big/key", 64, 64).await?).await?;
    for key in ["big/a", "big/z"] {
        agent
            .run(&[key], &[], "true")?
            .finish()
            .await?
            .expect_code(0)?;
    }
    let long = "x".repeat(250);
    let mut newest = 0;
    let mut rewritten = 0;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !(name.starts_with("big%2Fkey") && name.ends_with(".lock")) {
            continue;
        }
        let mut record: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
        let first = record["history"][0].clone();
        let at = first["at_ms"].as_u64().context("an event's time")?;
        let events: Vec<Value> = (0..32)
            .map(|i| {
                let mut event = first.clone();
                event["at_ms"] = (at + i).into();
                for field in ["host", "agent_id", "user", "reason"] {
                    event[field] = long.clone().into();
                }
                event
            })
            .collect();
        record["history"] = events.into();
        std::fs::write(&path, serde_json::to_vec(&record)?)?;
        newest = newest.max(at + 31);
        rewritten += 1;
    }
    ensure!(rewritten == 64, "{rewritten} slot records");

    let mut client = agent.client().await?;
    let listed = keys_with_events(&mut client, "big/", 10).await?;
    let keys: Vec<&str> = listed.iter().map(|k| k.key.as_str()).collect();
    ensure!(keys == ["big/a", "big/key", "big/z"], "{keys:?}");
    let big = &listed[1];
    let record = big.record.as_ref().context("the large key's record")?;
    ensure!(record.slots == Some(64), "{:?}", record.slots);
    ensure!(
        !big.events.is_empty()
            && big.events_omitted > 0
            && big.events.len() + big.events_omitted as usize == 64 * 32,
        "{} events, {} omitted",
        big.events.len(),
        big.events_omitted
    );
    ensure!(
        big.events.iter().map(|e| e.at_ms).max() == Some(newest),
        "the newest events are kept"
    );
    let shown = list_json(&agent, &["--all", "big/"]).await?;
    ensure!(names(&shown) == ["big/a", "big/key", "big/z"], "{shown}");
    Ok(())
}

/// A socket member (`nobody`) lists, inspects and reads the history of a
/// few free keys of 16 slots in a loop over 120 connections, for three TTLs,
/// while root's run holds a key on S3 with the shortest TTL the store
/// allows. Each user's store reads are answered one at a time (an
/// `inspect` reads every slot, whatever a listing keeps), so root's run
/// keeps its lease and exits 0, and the member's reads still end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_s_listing_loops_do_not_cost_root_s_run_its_lease() -> Result<()> {
    use crate::trust::access::{agent_on_with_env, NOBODY, RUNLOCK_GROUP};
    const LOOPS: usize = 120;
    const SLOTTED: [&str; 3] = ["fair/a", "fair/b", "fair/c"];
    let space = Space::create(S3, "list-fair").await?;
    let agent = agent_on_with_env(&space.uri(""), "", &["--ttl", "5s"], &space.env()).await?;
    for key in SLOTTED {
        release_slots(take_slots(&agent, key, 16, 16).await?).await?;
    }
    let (run, _) = agent.hold("root-run").await?;

    let answered = Arc::new(AtomicUsize::new(0));
    let mut loops = Vec::new();
    for _ in 0..LOOPS {
        let mut member =
            RawClient::connect_as(agent.socket(), NOBODY, NOBODY, &[RUNLOCK_GROUP]).await?;
        member.hello().await?;
        loops.push(tokio::spawn(read_in_a_loop(
            member,
            &SLOTTED,
            answered.clone(),
        )));
    }
    // The attack lasts three TTLs: root's run renews nine times meanwhile.
    tokio::time::sleep(std::time::Duration::from_secs(15)).await;
    for member in &loops {
        member.abort();
    }
    run.end_and_expect_success().await?;
    for member in loops {
        match member.await {
            Err(stopped) if stopped.is_cancelled() => {}
            Err(panicked) => return Err(panicked.into()),
            Ok(failed) => failed.context("a member's loop of reads")?,
        }
    }
    // Waiting its turns, the member is still answered.
    let answered = answered.load(Ordering::SeqCst);
    ensure!(answered > 0, "none of the member's reads was answered");
    Ok(())
}

/// `list_keys` of every `fair/` key with events, page after page, then
/// `inspect` and `history` of each of `keys`, again and again, each answer
/// counted in `answered`; returns only on a failure.
async fn read_in_a_loop(
    mut member: RawClient,
    keys: &[&str],
    answered: Arc<AtomicUsize>,
) -> Result<()> {
    loop {
        let mut cursor = None;
        loop {
            let page = member
                .call_within(
                    std::time::Duration::from_secs(600),
                    ClientMessage::ListKeys(ListKeysRequest {
                        prefix: "fair/".to_string(),
                        cursor: cursor.take(),
                        free: true,
                        events_since_ms: Some(0),
                    }),
                )
                .await?;
            answered.fetch_add(1, Ordering::SeqCst);
            match page {
                AgentMessage::Keys {
                    cursor: Some(next), ..
                } => cursor = Some(next),
                AgentMessage::Keys { cursor: None, .. } => break,
                other => anyhow::bail!("list_keys: {other:?}"),
            }
        }
        for key in keys {
            let key = key.to_string();
            let long = std::time::Duration::from_secs(600);
            let record = member
                .call_within(long, ClientMessage::Inspect { key: key.clone() })
                .await?;
            ensure!(matches!(record, AgentMessage::Record(_)), "{record:?}");
            answered.fetch_add(1, Ordering::SeqCst);
            let events = member
                .call_within(long, ClientMessage::History { key, limit: None })
                .await?;
            ensure!(matches!(events, AgentMessage::Events { .. }), "{events:?}");
            answered.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// `count` slots of `key`, taken as a key of `slots`, each through a
/// connection of its own as runs would: each connection and its lease id.
async fn take_slots(
    agent: &TestAgent,
    key: &str,
    slots: u32,
    count: usize,
) -> Result<Vec<(RawClient, String)>> {
    let mut taken = Vec::new();
    for _ in 0..count {
        let mut client = agent.client().await?;
        let mut take = acquire(&[key]);
        if let ClientMessage::Acquire(req) = &mut take {
            req.slots = slots;
        }
        match client.call_within(MANY_KEYS_WAIT, take).await? {
            AgentMessage::Acquired { leases, .. } => {
                taken.push((client, leases[0].lease_id.clone()))
            }
            other => anyhow::bail!("taking a slot of {key}: {other:?}"),
        }
    }
    Ok(taken)
}

/// Releases the slots [`take_slots`] took, leaving their records free.
async fn release_slots(taken: Vec<(RawClient, String)>) -> Result<()> {
    for (mut client, lease) in taken {
        let released = client
            .call_within(MANY_KEYS_WAIT, release(vec![lease]))
            .await?;
        ensure!(
            matches!(released, AgentMessage::Released { count: 1 }),
            "{released:?}"
        );
    }
    Ok(())
}
