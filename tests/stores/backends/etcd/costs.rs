//! What locking costs etcd (issue 28): one etcd lease per agent kept alive
//! for all its keys, watches instead of reads, waiters that write nothing to
//! raft, and list pages of one transaction; counted on etcd's `/metrics`.

use super::{endpoint, fresh_prefix, key, open, open_at, take, TTL};
use runlock_agent::backend::testing::{
    adopter, etcd_client, etcd_lease_seconds, etcd_rpc::Get, etcd_watching, lease, spec,
};
use runlock_agent::backend::{Backend, BackendError, EtcdBackend, EtcdOptions, StoreContext};
use runlock_protocol::KeyState;
use std::time::Duration;
use tokio::time::Instant;

/// The sum of the samples of `series` in the etcd at `url`'s `/metrics`
/// whose labels include `label` (`""`: all of them).
async fn metric(url: &str, series: &str, label: &str) -> u64 {
    let metrics = crate::support::http::get(&format!("{url}/metrics"))
        .await
        .expect("etcd's metrics")
        .body;
    let samples: Vec<f64> = metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{series} ")) || l.starts_with(&format!("{series}{{")))
        .filter(|l| l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    assert!(
        !samples.is_empty() || !label.is_empty(),
        "etcd has no {series}"
    );
    samples.iter().sum::<f64>() as u64
}

/// Raft proposals the etcd at `url` has committed.
async fn proposals(url: &str) -> u64 {
    metric(url, "etcd_server_proposals_committed_total", "").await
}

/// Lease keep-alives sent to the etcd at `url` (the client opens a stream for each).
async fn keep_alives(url: &str) -> u64 {
    metric(
        url,
        "grpc_server_started_total",
        "grpc_method=\"LeaseKeepAlive\"",
    )
    .await
}

/// Plain reads (`Range`) the etcd at `url` has answered.
async fn ranges(url: &str) -> u64 {
    metric(url, "grpc_server_started_total", "grpc_method=\"Range\"").await
}

/// Waits (bounded) for the backend's watch on its prefix to be established.
async fn until_watching(backend: &EtcdBackend) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !etcd_watching(backend) {
        assert!(
            Instant::now() < deadline,
            "the watch was not established in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Issue 28: one etcd lease per agent and TTL, kept alive once for all its
/// keys, and no read per renewal while the watch vouches for the keys.
#[tokio::test]
async fn an_agents_keys_share_one_etcd_lease_and_renewing_them_all_costs_one_keep_alive() {
    use crate::support::stores::{Etcd, Store};
    const KEYS: usize = 20;
    let ttl = Duration::from_secs(3);
    let own = Etcd.start_own().await.expect("an etcd of our own");
    let url = own.endpoint.url.clone();
    let prefix = fresh_prefix("shared");
    let uri = format!("etcd://{}/{prefix}", url.trim_start_matches("http://"));
    let one =
        EtcdBackend::open(&uri, &EtcdOptions::default(), &StoreContext::default()).expect("opens");
    let mut held = Vec::new();
    for n in 0..KEYS {
        let (name, id) = (format!("k{n}"), format!("l{n}"));
        held.push(take(&one, &name, &id, ttl).await);
    }
    let etcd = etcd_client(&url).await.expect("connects");
    let listed = etcd
        .get(Get::key(format!("{prefix}/k")).with_prefix())
        .await
        .expect("lists");
    let leases: std::collections::HashSet<i64> = listed.kvs.iter().map(|kv| kv.lease()).collect();
    assert_eq!(listed.kvs.len(), KEYS);
    assert_eq!(
        leases.len(),
        1,
        "each key on a lease of its own: {leases:?}"
    );
    assert!(!leases.contains(&0));

    until_watching(&one).await;
    // The first round reads each key once: some were granted before the
    // watch was established. After that, the watch vouches for them.
    for taken in &held {
        one.renew(taken, ttl).await.expect("renews");
    }
    let (keep_alives_before, ranges_before) = (keep_alives(&url).await, ranges(&url).await);
    const ROUNDS: u64 = 3;
    for _ in 0..ROUNDS {
        // A renewal's period (TTL/3) passes: the workload, not a synchronisation.
        tokio::time::sleep(ttl / 3).await;
        for taken in &held {
            one.renew(taken, ttl).await.expect("renews");
        }
    }
    let kept = keep_alives(&url).await - keep_alives_before;
    assert!(
        (1..=ROUNDS).contains(&kept),
        "{kept} keep-alives for {KEYS} keys over {ROUNDS} renewals (one lease each would send {})",
        KEYS as u64 * ROUNDS
    );
    assert_eq!(
        ranges(&url).await - ranges_before,
        0,
        "renewals read their keys"
    );
    let record = one.inspect(&key("k0")).await.expect("inspect");
    assert_eq!(record.state, KeyState::Held);
}

/// A `--force` takes one key and no other: the forced-out holder's lease is
/// its agent's, shared by its other keys, so it is not revoked; the holder
/// learns from its watch (no read) that its key went.
#[tokio::test]
async fn a_forced_key_is_lost_through_the_watch_and_the_holders_other_keys_stay() {
    use crate::support::stores::{Etcd, Store};
    let own = Etcd.start_own().await.expect("an etcd of our own");
    let url = own.endpoint.url.clone();
    let uri = format!(
        "etcd://{}/{}",
        url.trim_start_matches("http://"),
        fresh_prefix("forced")
    );
    let one =
        EtcdBackend::open(&uri, &EtcdOptions::default(), &StoreContext::default()).expect("opens");
    let two =
        EtcdBackend::open(&uri, &EtcdOptions::default(), &StoreContext::default()).expect("opens");
    let a = take(&one, "a", "la", TTL).await;
    let b = take(&one, "b", "lb", TTL).await;
    until_watching(&one).await;
    one.renew(&a, TTL).await.expect("renews");
    one.renew(&b, TTL).await.expect("renews");
    let ranges_before = ranges(&url).await;
    let forced = two
        .acquire(&spec("a", "l2", true, TTL))
        .await
        .expect("forced");
    assert!(forced.holder.token > a.token);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match one.renew(&a, TTL).await {
            Err(BackendError::LeaseMismatch) => break,
            Ok(_) => assert!(
                Instant::now() < deadline,
                "the watch never reported the force"
            ),
            Err(other) => panic!("{other}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        ranges(&url).await - ranges_before,
        0,
        "the holder read its key"
    );
    one.renew(&b, TTL)
        .await
        .expect("the holder's other key is untouched");
    assert_eq!(
        one.inspect(&key("b")).await.expect("inspect").state,
        KeyState::Held
    );
}

/// A new agent adopts a run's key onto its own lease; the stopped agent's
/// other keys (runs that nobody adopted) go when its lease runs out.
#[tokio::test]
async fn an_adopted_key_moves_to_the_adopters_lease_and_the_unadopted_go_with_the_old_one() {
    let prefix = fresh_prefix("adopt-move");
    let ttl = Duration::from_secs(2);
    let (old, new) = (open(&prefix), open(&prefix));
    let kept = take(&old, "kept", "l1", ttl).await;
    let orphan = take(&old, "orphan", "l2", ttl).await;
    new.adopt(&kept, &adopter("new")).await.expect("adopted");
    drop(old); // stops: nothing keeps its lease alive any more
    let deadline = Instant::now()
        + Duration::from_secs(etcd_lease_seconds(ttl) as u64)
        + Duration::from_secs(5);
    loop {
        // The adopter renews its key, as its agent does, every TTL/3.
        new.renew(&kept, ttl).await.expect("the adopted key renews");
        if new.inspect(&key("orphan")).await.expect("inspect").state == KeyState::Free {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the unadopted key outlived its agent's lease"
        );
        tokio::time::sleep(ttl / 3).await;
    }
    let record = new.inspect(&key("kept")).await.expect("inspect");
    assert_eq!((record.state, record.token), (KeyState::Held, kept.token));
    assert!(orphan.token > 0);
}

#[tokio::test]
async fn a_waiters_tries_at_a_held_key_are_reads_that_write_nothing_to_raft() {
    use crate::support::stores::{Etcd, Store};
    // An etcd of the test's own: nothing else proposes anything to it.
    let own = Etcd.start_own().await.expect("an etcd of our own");
    let host = own.endpoint.url.trim_start_matches("http://");
    let uri = format!("etcd://{host}/{}", fresh_prefix("reads"));
    let one =
        EtcdBackend::open(&uri, &EtcdOptions::default(), &StoreContext::default()).expect("opens");
    let two =
        EtcdBackend::open(&uri, &EtcdOptions::default(), &StoreContext::default()).expect("opens");
    let first = one
        .acquire(&spec("k", "l1", false, TTL))
        .await
        .expect("free");
    // The first try is a conditional create: a write, even refused.
    assert!(matches!(
        two.acquire(&spec("k", "l2", false, TTL)).await,
        Err(BackendError::Held(Some(_), _))
    ));
    let before = proposals(&own.endpoint.url).await;
    for _ in 0..5 {
        match two.acquire(&spec("k", "l2", false, TTL)).await {
            Err(BackendError::Held(Some(h), _)) => assert_eq!(h.token, first.holder.token),
            other => panic!("expected held by l1, got {other:?}"),
        }
    }
    assert_eq!(
        proposals(&own.endpoint.url).await,
        before,
        "a waiter's tries at a held key wrote to Raft"
    );
    // Once it is free, the next try takes it.
    one.release(&lease("k", "l1", first.holder.token))
        .await
        .expect("released");
    let second = two
        .acquire(&spec("k", "l2", false, TTL))
        .await
        .expect("free again");
    assert!(second.holder.token > first.holder.token);
}

#[tokio::test]
async fn list_pages_through_held_released_slot_and_unreadable_records() -> anyhow::Result<()> {
    let prefix = fresh_prefix("list");
    let (one, two) = (open(&prefix), open(&prefix));
    let at = format!("http://{}", endpoint("RUNLOCK_TEST_ETCD_ENDPOINT"));
    crate::stores::backends::listing::lists_every_record(&one, &two, || async {
        let etcd = etcd_client(&at).await?;
        etcd.put(format!("{prefix}/app%2Fbad"), "not a record", None)
            .await?;
        Ok(())
    })
    .await
}

/// A page is one transaction, and one request per etcd lease its held keys
/// are on, whatever its number of keys; what lives beside the records
/// (histories, force markers, `stopped` words) is not listed, and a name
/// that is no key's is listed as unreadable.
#[tokio::test]
async fn a_page_of_list_is_one_transaction_and_skips_what_is_not_a_record() -> anyhow::Result<()> {
    use crate::stores::backends::listing::list_page;
    use crate::support::stores::{Etcd, Store};
    use runlock_agent::backend::ListFrom;
    let own = Etcd.start_own().await?;
    let url = own.endpoint.url.clone();
    let prefix = fresh_prefix("list-cost");
    let one = open_at(url.trim_start_matches("http://"), &prefix);
    for n in 1..=7 {
        let name = format!("app/k{n}");
        one.acquire(&spec(&name, &format!("l{n}"), false, TTL))
            .await?;
    }
    // Escaped, far longer than a name may be: named by its hash.
    let long = format!("app/{}", "é".repeat(150));
    one.acquire(&spec(&long, "long", false, TTL)).await?;
    let etcd = etcd_client(&url).await?;
    for beside in [
        format!("{prefix}/.force/app%2Fk1"),
        format!("{prefix}/.stopped/app%2Fk1/3"),
    ] {
        etcd.put(beside, "{}", None).await?;
    }
    etcd.put(format!("{prefix}/.history/app%2F%ZZ"), "[]", None)
        .await?;

    let requests = |method: &'static str| {
        let url = url.clone();
        async move {
            metric(
                &url,
                "grpc_server_started_total",
                &format!("grpc_method=\"{method}\""),
            )
            .await
        }
    };
    let before = (
        requests("Txn").await,
        requests("LeaseTimeToLive").await,
        ranges(&url).await,
    );
    let spelled = list_page(&one, "app/", &ListFrom::default(), 250).await?;
    let after = (
        requests("Txn").await,
        requests("LeaseTimeToLive").await,
        ranges(&url).await,
    );
    assert_eq!(
        (after.0 - before.0, after.1 - before.1, after.2 - before.2),
        (1, 1, 0),
        "a page of 8 names: one transaction, one lease asked, no plain read"
    );
    let keys = crate::stores::backends::listing::keys_of(&spelled.records);
    let mut expected: Vec<String> = (1..=7).map(|n| format!("app/k{n}")).collect();
    expected.insert(0, "!app%2F%ZZ".to_string());
    assert_eq!(keys, expected);

    // Then the names of keys too long to spell, which their records name.
    let hashed = spelled.next.expect("the hashed names follow");
    assert!(hashed.hashed, "{hashed:?}");
    let page = list_page(&one, "app/", &hashed, 250).await?;
    assert_eq!(
        crate::stores::backends::listing::keys_of(&page.records),
        [long]
    );
    assert_eq!(page.next, None);
    let elsewhere = list_page(&one, "zzz/", &hashed, 250).await?;
    assert!(elsewhere.records.is_empty(), "{elsewhere:?}");
    Ok(())
}
