//! The etcd backend against a real etcd: the servers tests/scripts/etcd.sh
//! starts (`scripts/test` does) and names in `RUNLOCK_TEST_ETCD_*`. Without
//! them these tests fail; they never skip. Each test works under a key prefix
//! of its own. (Moved here from agent/src, so that the agent's own tests need
//! no store running.)
//!
//! Locking against etcd is here; connecting (TLS, a member down, credentials)
//! and what each operation costs etcd have files of their own.

mod connecting;
mod costs;

use runlock_agent::backend::testing::{
    adopter, etcd_client, etcd_force_marker, etcd_lease_seconds, etcd_rpc::Get, lease, spec,
};
use runlock_agent::backend::{
    AcquireSpec, Backend, BackendError, EtcdBackend, EtcdOptions, LeaseRef, StoreContext,
};
use runlock_protocol::{Key, KeyState, Scope};
use std::time::Duration;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

/// The etcd that `tests/scripts/etcd.sh` started (scripts/test does); its
/// absence is a failure, never a skip.
fn endpoint(var: &str) -> String {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => url.trim_start_matches("http://").to_string(),
        _ => panic!(
            "{var} is not set: these tests need etcd; run `bash scripts/test`, or \
             `bash tests/scripts/etcd.sh` and export what it prints"
        ),
    }
}

/// A prefix no other test (or earlier run) uses.
fn fresh_prefix(test: &str) -> String {
    format!("unit-{test}-{}-{}", std::process::id(), fastrand::u64(..))
}

fn open(prefix: &str) -> EtcdBackend {
    open_at(&endpoint("RUNLOCK_TEST_ETCD_ENDPOINT"), prefix)
}

fn key(name: &str) -> Key {
    Key::new(name).expect("valid")
}

fn open_at(host: &str, prefix: &str) -> EtcdBackend {
    EtcdBackend::open(
        &format!("etcd://{host}/{prefix}"),
        &EtcdOptions::default(),
        &StoreContext::default(),
    )
    .expect("opens")
}

/// Takes the free key `name` as lease `lease_id` for `ttl`, and gives back
/// the lease to renew, release or adopt (its token is the grant's).
async fn take(backend: &EtcdBackend, name: &str, lease_id: &str, ttl: Duration) -> LeaseRef {
    let granted = backend
        .acquire(&spec(name, lease_id, false, ttl))
        .await
        .expect("free");
    lease(name, lease_id, granted.holder.token)
}

#[tokio::test]
async fn agents_exclude_each_other_and_every_grant_has_a_larger_token() {
    let prefix = fresh_prefix("exclude");
    let (one, two) = (open(&prefix), open(&prefix));
    one.probe().await.expect("etcd answers");
    let first_lease = take(&one, "k", "l1", TTL).await;
    match two.acquire(&spec("k", "l2", false, TTL)).await {
        Err(BackendError::Held(Some(h), _)) => {
            assert_eq!(
                (h.host.as_str(), h.token),
                ("host-of-l1", first_lease.token)
            )
        }
        other => panic!("expected held, got {other:?}"),
    }
    let record = two.inspect(&key("k")).await.expect("inspect");
    assert_eq!(
        (record.state, record.token, record.scope),
        (KeyState::Held, first_lease.token, Scope::Global)
    );
    let left = record.expires_in_ms.expect("a lease expires");
    assert!(left <= TTL.as_millis() as u64 && left > 0, "{left}");

    one.renew(&first_lease, TTL).await.expect("renew");
    one.release(&first_lease).await.expect("release");
    let record = two.inspect(&key("k")).await.expect("inspect");
    assert_eq!((record.state, record.holder), (KeyState::Free, None));
    let second = two
        .acquire(&spec("k", "l2", false, TTL))
        .await
        .expect("freed");
    assert!(second.holder.token > first_lease.token, "{second:?}");
    // A lease already let go releases quietly, and frees nothing of the new holder's.
    one.release(&first_lease).await.expect("quiet");
    assert!(matches!(
        one.renew(&first_lease, TTL).await,
        Err(BackendError::LeaseMismatch)
    ));
    assert_eq!(
        one.inspect(&key("k")).await.expect("inspect").state,
        KeyState::Held
    );
}

#[tokio::test]
async fn force_takes_the_key_with_a_larger_token_and_the_old_holder_loses_it() {
    let prefix = fresh_prefix("force");
    let (one, two) = (open(&prefix), open(&prefix));
    let old = take(&one, "k", "l1", TTL).await;
    let forced = two
        .acquire(&spec("k", "l2", true, TTL))
        .await
        .expect("forced");
    assert!(forced.holder.token > old.token);
    assert!(matches!(
        one.renew(&old, TTL).await,
        Err(BackendError::LeaseMismatch)
    ));
    one.release(&old)
        .await
        .expect("a lost lease releases quietly");
    let record = one.inspect(&key("k")).await.expect("inspect");
    assert_eq!(record.holder.map(|h| h.host), Some("host-of-l2".into()));
    two.renew(&lease("k", "l2", forced.holder.token), TTL)
        .await
        .expect("the new holder renews");
}

/// Between a force's delete and its create, a waiter woken by the delete
/// must find the key held, never take it (chaos run, issue 15).
#[tokio::test]
async fn in_the_middle_of_a_force_the_key_is_held_for_the_forcer() {
    let prefix = fresh_prefix("mid-force");
    let (forcer, waiter) = (open(&prefix), open(&prefix));
    let marker = etcd_force_marker(&forcer, &key("k"));
    let at = format!("http://{}", endpoint("RUNLOCK_TEST_ETCD_ENDPOINT"));
    let etcd = etcd_client(&at).await.expect("connects");
    etcd.put(marker.as_str(), b"{}".to_vec(), None)
        .await
        .expect("marker written");
    assert!(matches!(
        waiter.acquire(&spec("k", "w1", false, TTL)).await,
        Err(BackendError::Held(None, _))
    ));
    etcd.delete(marker.as_str()).await.expect("marker deleted");
    let granted = waiter
        .acquire(&spec("k", "w1", false, TTL))
        .await
        .expect("free once the marker is gone");
    // A force leaves no marker behind.
    let forced = forcer
        .acquire(&spec("k", "f1", true, TTL))
        .await
        .expect("forced");
    assert!(forced.holder.token > granted.holder.token);
    let read = etcd.get(Get::key(marker.as_str())).await.expect("read");
    assert!(read.kvs.is_empty());
}

#[tokio::test]
async fn an_unrenewed_lease_is_taken_over_after_ttl_and_grace_by_etcd_s_clock() {
    let prefix = fresh_prefix("expiry");
    let (one, two) = (open(&prefix), open(&prefix));
    let short = AcquireSpec {
        ttl: Duration::from_secs(1),
        ..spec("k", "l1", false, TTL)
    };
    let granted = one.acquire(&short).await.expect("free");
    // The holder trusts its lease until sent + TTL - TTL/6; nobody may take
    // it before sent + TTL (etcd gives TTL + grace, in whole seconds).
    let earliest = granted.sent + short.ttl;
    let mut reports = two.releases().expect("etcd reports releases");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match two.acquire(&spec("k", "l2", false, TTL)).await {
            Ok(_) => break,
            Err(BackendError::Held(..)) => {}
            Err(other) => panic!("{other}"),
        }
        assert!(Instant::now() < deadline, "never expired");
        // The watch reports the expiry; the timeout only bounds the wait.
        let _ = tokio::time::timeout(Duration::from_secs(1), reports.recv()).await;
    }
    let at = Instant::now();
    assert!(at >= earliest, "taken {:?} too early", earliest - at);
    assert!(
        at <= granted.sent + Duration::from_secs(etcd_lease_seconds(short.ttl) as u64 + 2),
        "taken {:?} after the grant",
        at - granted.sent
    );
    assert!(matches!(
        one.renew(&lease("k", "l1", granted.holder.token), short.ttl)
            .await,
        Err(BackendError::LeaseMismatch)
    ));
}

#[tokio::test]
async fn a_release_is_reported_to_other_agents_watching() {
    let prefix = fresh_prefix("watch");
    let (one, two) = (open(&prefix), open(&prefix));
    let mut reports = two.releases().expect("etcd reports releases");
    // The watch starts in the background: wait until it reports a first release.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let probe = take(&one, "probe", "p", TTL).await;
        one.release(&probe).await.expect("release");
        match tokio::time::timeout(Duration::from_millis(200), reports.recv()).await {
            Ok(Ok(k)) if k == key("probe") => break,
            _ => assert!(Instant::now() < deadline, "the watch never reported"),
        }
    }
    let held = take(&one, "dev:x", "l1", TTL).await;
    one.release(&held).await.expect("release");
    let reported = tokio::time::timeout(Duration::from_secs(5), reports.recv())
        .await
        .expect("reported within 5 s")
        .expect("open");
    assert_eq!(reported, key("dev:x"));

    let polling = EtcdBackend::open(
        &format!(
            "etcd://{}/{prefix}?watch=false",
            endpoint("RUNLOCK_TEST_ETCD_ENDPOINT")
        ),
        &EtcdOptions::default(),
        &StoreContext::default(),
    )
    .expect("opens");
    assert!(polling.releases().is_none());
}

#[tokio::test]
async fn another_agent_adopts_a_live_lease_and_names_itself() {
    let prefix = fresh_prefix("adopt");
    let (old, new) = (open(&prefix), open(&prefix));
    let taken = take(&old, "k", "l1", TTL).await;
    assert!(matches!(
        new.adopt(&lease("k", "l1", taken.token + 1), &adopter("new"))
            .await,
        Err(BackendError::LeaseMismatch)
    ));
    let adopted = new.adopt(&taken, &adopter("new")).await.expect("adopted");
    assert_eq!(adopted.ttl, TTL);
    assert_eq!(
        (
            adopted.grant.holder.agent_id.as_str(),
            adopted.grant.holder.token
        ),
        ("new", taken.token)
    );
    let record = new.inspect(&key("k")).await.expect("inspect");
    assert_eq!(record.holder.map(|h| h.agent_id), Some("new".into()));
    new.renew(&taken, TTL).await.expect("renews");
    new.release(&taken).await.expect("releases");
    assert_eq!(
        new.inspect(&key("k")).await.expect("inspect").state,
        KeyState::Free
    );
}
