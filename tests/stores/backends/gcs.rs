//! The GCS adapter against fake-gcs-server, in this process: the conditional
//! writes as the JSON API answers them, the lease engine over it, and a
//! missing bucket or a refused endpoint named. The emulator is started by
//! `scripts/test` (tests/scripts/fake_gcs.sh); without it these tests fail
//! (they never skip). (Moved here from agent/src, so that the agent's own
//! tests need no store running.)

use crate::support::stores::{Gcs, Space, RECORDS};
use runlock_agent::backend::cas::{CasEngine, CasError, CasStore, GcsStore, Precondition};
use runlock_agent::backend::testing::{gcs_on_emulator, lease, spec, TIMEOUTS};
use runlock_agent::backend::{Backend, BackendError};
use runlock_protocol::{Key, KeyState};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

/// A new, empty bucket on the emulator, and a store on it under prefix `p`.
async fn bucket(what: &str) -> (GcsStore, String) {
    let space = Space::create(Gcs, what).await.expect("a bucket");
    let store = gcs_on_emulator(&format!("gs://{}/p", space.name), &space.at.url).expect("opens");
    (store, space.name)
}

/// The emulator's endpoint.
fn emulator() -> String {
    use crate::support::stores::Store;
    Gcs.shared().expect("fake-gcs-server runs").url
}

#[tokio::test]
async fn creates_and_replaces_only_on_the_generation_read_with_the_body() {
    let (store, _) = bucket("cas").await;
    store.probe().await.expect("the bucket answers");
    let name = "p/.runlock/locks/k.json";
    let absent = store.get(name).await.expect("read");
    assert_eq!(absent.object, None);
    assert!(
        absent.date.is_some(),
        "the store's clock comes with a miss too"
    );

    let first = store
        .put(name, b"{\"n\":1}".to_vec(), Precondition::Absent)
        .await
        .expect("created");
    assert_eq!(
        store
            .put(name, b"{\"n\":2}".to_vec(), Precondition::Absent)
            .await,
        Err(CasError::Conflict)
    );
    let read = store.get(name).await.expect("read");
    let stored = read.object.expect("present");
    assert_eq!(
        (stored.body.as_slice(), stored.version.as_str()),
        (&b"{\"n\":1}"[..], first.as_str())
    );
    let (written, now) = (
        stored.last_modified.expect("Last-Modified"),
        read.date.expect("Date"),
    );
    assert!(
        now + Duration::from_secs(1) >= written,
        "{written:?} after {now:?}"
    );

    let second = store
        .put(name, b"{\"n\":3}".to_vec(), Precondition::Matches(&first))
        .await
        .expect("replaced");
    assert_ne!(first, second);
    assert_eq!(
        store
            .put(name, b"{\"n\":4}".to_vec(), Precondition::Matches(&first))
            .await,
        Err(CasError::Conflict),
        "a stale generation"
    );
    assert_eq!(
        store
            .put(
                "p/.runlock/locks/none.json",
                b"{}".to_vec(),
                Precondition::Matches(&first)
            )
            .await,
        Err(CasError::Conflict),
        "a generation of an object that does not exist"
    );
    let read = store.get(name).await.expect("read");
    assert_eq!(
        read.object.map(|o| (o.body, o.version)),
        Some((b"{\"n\":3}".to_vec(), second))
    );
}

#[tokio::test]
async fn of_racing_creates_exactly_one_wins() {
    let (store, _) = bucket("race").await;
    let store = Arc::new(store);
    let writers: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .put(
                        "p/.runlock/locks/r.json",
                        format!("{{\"w\":{i}}}").into(),
                        Precondition::Absent,
                    )
                    .await
            })
        })
        .collect();
    let mut won = 0;
    for writer in writers {
        match writer.await.expect("joins") {
            Ok(_) => won += 1,
            Err(CasError::Conflict) => {}
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!(won, 1);
}

#[tokio::test]
async fn the_engine_on_gcs_excludes_frees_and_spaces_its_writes() {
    let (store, bucket) = bucket("engine").await;
    let prefix = store.site().records.clone();
    let store: Arc<dyn CasStore> = Arc::new(store);
    let one = CasEngine::new(store.clone());
    let two = CasEngine::new(store.clone());
    assert_eq!(one.min_ttl(), Duration::from_secs(5));

    let started = Instant::now();
    let grant = one
        .acquire(&spec("dev:k", "l1", false, TTL))
        .await
        .expect("free");
    assert_eq!(grant.holder.token, 1);
    match two.acquire(&spec("dev:k", "l2", false, TTL)).await {
        Err(BackendError::Held(Some(holder), _)) => {
            assert_eq!((holder.host.as_str(), holder.token), ("host-of-l1", 1))
        }
        other => panic!("expected held, got {other:?}"),
    }
    one.release(&lease("dev:k", "l1", 1))
        .await
        .expect("release");
    assert!(
        started.elapsed() >= store.site().min_write_interval,
        "the release went out {:?} after the acquire",
        started.elapsed()
    );
    let name = format!("{prefix}dev%3Ak.json");
    let record: serde_json::Value = serde_json::from_slice(
        &store
            .get(&name)
            .await
            .expect("read")
            .object
            .expect("kept")
            .body,
    )
    .expect("a JSON record");
    assert_eq!(record["state"], "free");
    assert_eq!(record["token"], 1);
    assert!(
        name.starts_with(&format!("p/{}", RECORDS)),
        "{name} in {bucket}"
    );

    let grant = two
        .acquire(&spec("dev:k", "l2", false, TTL))
        .await
        .expect("freed");
    assert_eq!(grant.holder.token, 2);
    two.renew(&lease("dev:k", "l2", 2), Duration::from_secs(10))
        .await
        .expect("renew");
    let inspected = one
        .inspect(&Key::new("dev:k").expect("valid"))
        .await
        .expect("inspect");
    assert_eq!((inspected.state, inspected.token), (KeyState::Held, 2));
    assert!(
        inspected.expires_in_ms.is_some_and(|ms| ms <= 10_000),
        "{inspected:?}"
    );
}

#[tokio::test]
async fn a_missing_bucket_and_a_refused_endpoint_are_named() {
    let endpoint = emulator();
    let store = gcs_on_emulator("gs://no-such-bucket-here/p", &endpoint).expect("opens");
    let expected = format!("bucket no-such-bucket-here does not exist at {endpoint}");
    assert_eq!(
        store.probe().await,
        Err(CasError::Refused(expected.clone()))
    );
    let engine = CasEngine::new(Arc::new(store));
    match engine.acquire(&spec("k", "l1", false, TTL)).await {
        Err(BackendError::Unavailable(text)) => assert_eq!(text, expected),
        other => panic!("{other:?}"),
    }

    let port = crate::support::closed_port().expect("a free port");
    let store = gcs_on_emulator("gs://b/p", &format!("127.0.0.1:{port}")).expect("opens");
    let started = Instant::now();
    match store.probe().await {
        Err(CasError::Unavailable(text)) => assert!(
            text.starts_with(&format!("cannot reach GCS at http://127.0.0.1:{port}: ")),
            "{text}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(
        started.elapsed() <= TIMEOUTS.operation,
        "{:?}",
        started.elapsed()
    );
}
