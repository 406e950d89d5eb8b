//! Connecting to etcd: over TLS with client certificates, through a cluster
//! URI with a member down, and with credentials that are wrong or lack a
//! permission (named, never the password).

use super::{endpoint, fresh_prefix, open_at, take, TTL};
use runlock_agent::backend::testing::{lease, spec};
use runlock_agent::backend::{Backend, BackendError, EtcdBackend, EtcdOptions, StoreContext};
use std::path::PathBuf;

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
    let backend = EtcdBackend::open(&uri, &full, &StoreContext::default()).expect("opens");
    assert!(
        backend.describe().ends_with("(TLS)"),
        "{}",
        backend.describe()
    );
    backend.probe().await.expect("etcd answers over TLS");
    let held = take(&backend, "k", "l1", TTL).await;
    backend.renew(&held, TTL).await.expect("renew");
    backend.release(&held).await.expect("release");

    let refused = |options: EtcdOptions, uri: String| async move {
        let backend = EtcdBackend::open(&uri, &options, &StoreContext::default()).expect("opens");
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
    let closed = crate::support::closed_port().expect("a free port");
    let live = endpoint("RUNLOCK_TEST_ETCD_ENDPOINT");
    let prefix = fresh_prefix("member-down");
    let uri = format!("etcd://127.0.0.1:{closed},{live}/{prefix}");
    let backend =
        EtcdBackend::open(&uri, &EtcdOptions::default(), &StoreContext::default()).expect("opens");
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
    let as_root = |args: &[&str]| {
        let ctl = std::env::var("RUNLOCK_TEST_ETCDCTL").expect("set by etcd.sh");
        let done = std::process::Command::new(ctl)
            .args(["--endpoints", &host, "--command-timeout", "5s"])
            .args(["--user", &format!("root:{root}")])
            .args(args)
            .output()
            .expect("etcdctl runs");
        let said = String::from_utf8_lossy(&done.stderr);
        assert!(done.status.success(), "etcdctl {args:?}: {said}");
    };
    as_root(&["role", "add", &reader]);
    let under = format!("{prefix}/");
    as_root(&[
        "role",
        "grant-permission",
        &reader,
        "--prefix=true",
        "read",
        &under,
    ]);
    as_root(&["user", "add", &format!("{reader}:reader-secret")]);
    as_root(&["user", "grant-role", &reader, &reader]);

    let wrong = EtcdBackend::open(
        &format!("etcd://{reader}:not-the-secret@{host}/{prefix}"),
        &EtcdOptions::default(),
        &StoreContext::default(),
    )
    .expect("opens");
    let err = wrong.probe().await.expect_err("wrong password").to_string();
    assert!(err.contains(&reader) && err.contains("password"), "{err}");
    assert!(!err.contains("not-the-secret"), "{err}");
    assert!(!wrong.describe().contains("not-the-secret"));

    let read_only = EtcdBackend::open(
        &format!("etcd://{reader}:reader-secret@{host}/{prefix}"),
        &EtcdOptions::default(),
        &StoreContext::default(),
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
