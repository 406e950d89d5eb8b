//! The etcd backend against a real etcd: the servers tests/scripts/etcd.sh
//! starts (`scripts/test` does) and names in `RUNLOCK_TEST_ETCD_*`. Without
//! them these tests fail; they never skip. Each test works under a key prefix
//! of its own. (Moved here from agent/src, so that the agent's own tests need
//! no store running.)

use etcd_client::{Client, ConnectOptions, Permission};
use runlock_agent::backend::testing::{
    adopter, etcd_force_marker, etcd_lease_seconds, etcd_watching, lease, spec,
};
use runlock_agent::backend::{AcquireSpec, Backend, BackendError, EtcdBackend, EtcdOptions};
use runlock_protocol::{Key, KeyState, Scope};
use std::path::PathBuf;
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
    let host = endpoint("RUNLOCK_TEST_ETCD_ENDPOINT");
    EtcdBackend::open(&format!("etcd://{host}/{prefix}"), &EtcdOptions::default()).expect("opens")
}

fn key(name: &str) -> Key {
    Key::new(name).expect("valid")
}

#[tokio::test]
async fn agents_exclude_each_other_and_every_grant_has_a_larger_token() {
    let prefix = fresh_prefix("exclude");
    let (one, two) = (open(&prefix), open(&prefix));
    one.probe().await.expect("etcd answers");
    let first = one
        .acquire(&spec("k", "l1", false, TTL))
        .await
        .expect("free");
    match two.acquire(&spec("k", "l2", false, TTL)).await {
        Err(BackendError::Held(Some(h), _)) => {
            assert_eq!(
                (h.host.as_str(), h.token),
                ("host-of-l1", first.holder.token)
            )
        }
        other => panic!("expected held, got {other:?}"),
    }
    let record = two.inspect(&key("k")).await.expect("inspect");
    assert_eq!(
        (record.state, record.token, record.scope),
        (KeyState::Held, first.holder.token, Scope::Global)
    );
    let left = record.expires_in_ms.expect("a lease expires");
    assert!(left <= TTL.as_millis() as u64 && left > 0, "{left}");

    let first_lease = lease("k", "l1", first.holder.token);
    one.renew(&first_lease, TTL).await.expect("renew");
    one.release(&first_lease).await.expect("release");
    let record = two.inspect(&key("k")).await.expect("inspect");
    assert_eq!((record.state, record.holder), (KeyState::Free, None));
    let second = two
        .acquire(&spec("k", "l2", false, TTL))
        .await
        .expect("freed");
    assert!(second.holder.token > first.holder.token, "{second:?}");
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
    let first = one
        .acquire(&spec("k", "l1", false, TTL))
        .await
        .expect("free");
    let forced = two
        .acquire(&spec("k", "l2", true, TTL))
        .await
        .expect("forced");
    assert!(forced.holder.token > first.holder.token);
    let old = lease("k", "l1", first.holder.token);
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
    let mut etcd = Client::connect([at], None).await.expect("connects");
    etcd.put(marker.as_str(), b"{}".to_vec(), None)
        .await
        .expect("marker written");
    assert!(matches!(
        waiter.acquire(&spec("k", "w1", false, TTL)).await,
        Err(BackendError::Held(None, _))
    ));
    etcd.delete(marker.as_str(), None)
        .await
        .expect("marker deleted");
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
    let read = etcd.get(marker.as_str(), None).await.expect("read");
    assert!(read.kvs().is_empty());
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
        let probe = one
            .acquire(&spec("probe", "p", false, TTL))
            .await
            .expect("free");
        one.release(&lease("probe", "p", probe.holder.token))
            .await
            .expect("release");
        match tokio::time::timeout(Duration::from_millis(200), reports.recv()).await {
            Ok(Ok(k)) if k == key("probe") => break,
            _ => assert!(Instant::now() < deadline, "the watch never reported"),
        }
    }
    let held = one
        .acquire(&spec("dev:x", "l1", false, TTL))
        .await
        .expect("free");
    one.release(&lease("dev:x", "l1", held.holder.token))
        .await
        .expect("release");
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
    )
    .expect("opens");
    assert!(polling.releases().is_none());
}

#[tokio::test]
async fn another_agent_adopts_a_live_lease_and_names_itself() {
    let prefix = fresh_prefix("adopt");
    let (old, new) = (open(&prefix), open(&prefix));
    let granted = old
        .acquire(&spec("k", "l1", false, TTL))
        .await
        .expect("free");
    let taken = lease("k", "l1", granted.holder.token);
    assert!(matches!(
        new.adopt(&lease("k", "l1", granted.holder.token + 1), &adopter("new"))
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
        ("new", granted.holder.token)
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

/// The etcd served over TLS that requires client certificates, and the
/// directory of the CA that signed its certificate and the client's.
fn tls_etcd() -> (String, PathBuf) {
    let host = endpoint("RUNLOCK_TEST_ETCD_TLS_ENDPOINT");
    let host = host.trim_start_matches("https://").to_string();
    let dir = std::env::var_os("RUNLOCK_TEST_ETCD_TLS_DIR")
        .map(PathBuf::from)
        .expect("RUNLOCK_TEST_ETCD_TLS_DIR is set with RUNLOCK_TEST_ETCD_TLS_ENDPOINT");
    (host, dir)
}

#[tokio::test]
async fn tls_with_the_ca_and_a_client_certificate_serves_and_without_them_is_named() {
    let (host, dir) = tls_etcd();
    let prefix = fresh_prefix("tls");
    let uri = format!("etcd://{host}/{prefix}");
    let full = EtcdOptions {
        ca_file: Some(dir.join("ca.crt")),
        cert_file: Some(dir.join("client.crt")),
        key_file: Some(dir.join("client.key")),
        ..EtcdOptions::default()
    };
    let backend = EtcdBackend::open(&uri, &full).expect("opens");
    assert!(
        backend.describe().ends_with("(TLS)"),
        "{}",
        backend.describe()
    );
    backend.probe().await.expect("etcd answers over TLS");
    let granted = backend
        .acquire(&spec("k", "l1", false, TTL))
        .await
        .expect("free");
    let held = lease("k", "l1", granted.holder.token);
    backend.renew(&held, TTL).await.expect("renew");
    backend.release(&held).await.expect("release");

    let refused = |options: EtcdOptions, uri: String| async move {
        let backend = EtcdBackend::open(&uri, &options).expect("opens");
        match backend.probe().await {
            Err(BackendError::Unavailable(text)) => text,
            other => panic!("expected a refusal, got {other:?}"),
        }
    };
    // etcd requires a client certificate; none is given. etcd closes the
    // connection after the handshake, so the message can only point at it.
    let ca_only = EtcdOptions {
        ca_file: full.ca_file.clone(),
        ..EtcdOptions::default()
    };
    let text = refused(ca_only, uri.clone()).await;
    assert!(text.contains("cert_file"), "{text}");
    assert!(text.contains(&host), "{text}");
    // The system's roots do not know the test CA.
    let no_ca = EtcdOptions {
        ca_file: None,
        ..full.clone()
    };
    let text = refused(no_ca, format!("{uri}?tls=true")).await;
    assert!(text.contains("the TLS handshake failed"), "{text}");
    assert!(text.contains("ca_file"), "{text}");
}

/// A cluster URI names every member; one of them down (here: the first,
/// where nothing listens) must not fail the runs the others can serve.
#[tokio::test]
async fn a_member_down_leaves_the_others_serving() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let live = endpoint("RUNLOCK_TEST_ETCD_ENDPOINT");
    let prefix = fresh_prefix("member-down");
    let uri = format!("etcd://127.0.0.1:{closed},{live}/{prefix}");
    let backend = EtcdBackend::open(&uri, &EtcdOptions::default()).expect("opens");
    backend.probe().await.expect("the live member answers");
    let mut last_token = 0;
    for round in 0..20 {
        let granted = backend
            .acquire(&spec("k", &format!("l{round}"), false, TTL))
            .await
            .unwrap_or_else(|err| panic!("acquire {round}: {err}"));
        assert!(granted.holder.token > last_token);
        last_token = granted.holder.token;
        let held = lease("k", &format!("l{round}"), last_token);
        backend.renew(&held, TTL).await.expect("renew");
        backend.release(&held).await.expect("release");
    }
}

#[tokio::test]
async fn a_wrong_password_and_a_missing_permission_are_named_without_the_password() {
    let host = endpoint("RUNLOCK_TEST_ETCD_AUTH_ENDPOINT");
    let root = std::env::var("RUNLOCK_TEST_ETCD_ROOT_PASSWORD").expect("set by etcd.sh");
    let prefix = fresh_prefix("auth");
    let reader = format!("reader-{}", fastrand::u32(..));
    let mut admin = Client::connect(
        [format!("http://{host}")],
        Some(ConnectOptions::new().with_user("root", root)),
    )
    .await
    .expect("root connects");
    admin.role_add(&reader).await.expect("role");
    admin
        .role_grant_permission(
            &reader,
            Permission::read(format!("{prefix}/")).with_prefix(),
        )
        .await
        .expect("grant");
    admin
        .user_add(&reader, "reader-secret", None)
        .await
        .expect("user");
    admin
        .user_grant_role(&reader, &reader)
        .await
        .expect("user role");

    let wrong = EtcdBackend::open(
        &format!("etcd://{reader}:not-the-secret@{host}/{prefix}"),
        &EtcdOptions::default(),
    )
    .expect("opens");
    let err = wrong.probe().await.expect_err("wrong password").to_string();
    assert!(err.contains(&reader) && err.contains("password"), "{err}");
    assert!(!err.contains("not-the-secret"), "{err}");
    assert!(!wrong.describe().contains("not-the-secret"));

    let read_only = EtcdBackend::open(
        &format!("etcd://{reader}:reader-secret@{host}/{prefix}"),
        &EtcdOptions::default(),
    )
    .expect("opens");
    read_only.probe().await.expect("may read");
    let err = read_only
        .acquire(&spec("k", "l1", false, TTL))
        .await
        .expect_err("may not write")
        .to_string();
    assert!(err.contains("denied") && err.contains(&prefix), "{err}");
    assert!(!err.contains("reader-secret"), "{err}");

    let anonymous = open_at(&host, &prefix);
    let err = anonymous.probe().await.expect_err("no user").to_string();
    assert!(err.contains("requires authentication"), "{err}");
}

fn open_at(host: &str, prefix: &str) -> EtcdBackend {
    EtcdBackend::open(&format!("etcd://{host}/{prefix}"), &EtcdOptions::default()).expect("opens")
}

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
    let one = EtcdBackend::open(&uri, &EtcdOptions::default()).expect("opens");
    let mut held = Vec::new();
    for n in 0..KEYS {
        let (name, id) = (format!("k{n}"), format!("l{n}"));
        let granted = one
            .acquire(&spec(&name, &id, false, ttl))
            .await
            .expect("free");
        held.push(lease(&name, &id, granted.holder.token));
    }
    let mut etcd = Client::connect([url.as_str()], None)
        .await
        .expect("connects");
    let listed = etcd
        .get(
            format!("{prefix}/k"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .expect("lists");
    let leases: std::collections::HashSet<i64> = listed.kvs().iter().map(|kv| kv.lease()).collect();
    assert_eq!(listed.kvs().len(), KEYS);
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
    let one = EtcdBackend::open(&uri, &EtcdOptions::default()).expect("opens");
    let two = EtcdBackend::open(&uri, &EtcdOptions::default()).expect("opens");
    let a = one
        .acquire(&spec("a", "la", false, TTL))
        .await
        .expect("free");
    let b = one
        .acquire(&spec("b", "lb", false, TTL))
        .await
        .expect("free");
    let (a, b) = (
        lease("a", "la", a.holder.token),
        lease("b", "lb", b.holder.token),
    );
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
    let kept = old
        .acquire(&spec("kept", "l1", false, ttl))
        .await
        .expect("free");
    let orphan = old
        .acquire(&spec("orphan", "l2", false, ttl))
        .await
        .expect("free");
    let kept = lease("kept", "l1", kept.holder.token);
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
    assert!(orphan.holder.token > 0);
}

#[tokio::test]
async fn a_waiters_tries_at_a_held_key_are_reads_that_write_nothing_to_raft() {
    use crate::support::stores::{Etcd, Store};
    // An etcd of the test's own: nothing else proposes anything to it.
    let own = Etcd.start_own().await.expect("an etcd of our own");
    let host = own.endpoint.url.trim_start_matches("http://");
    let uri = format!("etcd://{host}/{}", fresh_prefix("reads"));
    let one = EtcdBackend::open(&uri, &EtcdOptions::default()).expect("opens");
    let two = EtcdBackend::open(&uri, &EtcdOptions::default()).expect("opens");
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
    super::listing::lists_every_record(&one, &two, || async {
        let mut etcd = Client::connect([at], None).await?;
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
    let mut etcd = Client::connect([url.as_str()], None).await?;
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
    let spelled = one.list("app/", &ListFrom::default(), 250).await?;
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
    let keys = super::listing::keys_of(&spelled.records);
    let mut expected: Vec<String> = (1..=7).map(|n| format!("app/k{n}")).collect();
    expected.insert(0, "!app%2F%ZZ".to_string());
    assert_eq!(keys, expected);

    // Then the names of keys too long to spell, which their records name.
    let hashed = spelled.next.expect("the hashed names follow");
    assert!(hashed.hashed, "{hashed:?}");
    let page = one.list("app/", &hashed, 250).await?;
    assert_eq!(super::listing::keys_of(&page.records), [long]);
    assert_eq!(page.next, None);
    let elsewhere = one.list("zzz/", &hashed, 250).await?;
    assert!(elsewhere.records.is_empty(), "{elsewhere:?}");
    Ok(())
}
