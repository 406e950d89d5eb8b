//! The etcd backend's own tests that need no etcd: URIs, credentials,
//! records, and an unreachable cluster. Those against a real etcd are in
//! tests/stores/backends/etcd/.

use super::settings::{credentials, parse_uri};
use super::*;
use crate::backend::fixtures::spec;
use crate::backend::EtcdOptions;

const TTL: Duration = Duration::from_secs(10);

#[test]
fn uris_name_hosts_prefix_user_and_watch() {
    let target = parse_uri("etcd://h1:2380,h2/team/locks/").expect("valid");
    assert_eq!(target.hosts, ["h1:2380", "h2:2379"]);
    assert_eq!(target.prefix, "team/locks/");
    assert_eq!((target.user, target.watch), (None, true));

    let target = parse_uri("etcd://ops:p%40ss%3Aword@[::1]?watch=false").expect("valid");
    assert_eq!(target.hosts, ["[::1]:2379"]);
    assert_eq!(target.prefix, "runlock/");
    assert_eq!(
        target.user,
        Some(("ops".to_string(), Some("p@ss:word".into())))
    );
    assert!(!target.watch);

    assert!(parse_uri("etcd://h/p?tls=true").expect("valid").tls);
    for bad in ["etcd://", "etcd://h:port/x", "etcd://h?tls=1", "s3://b"] {
        assert!(parse_uri(bad).is_err(), "{bad} was accepted");
    }
    let Err(err) = parse_uri("etcd://u:secret@h:x/p") else {
        panic!("a bad port was accepted");
    };
    assert!(!err.to_string().contains("secret"), "{err}");
    for password in ["pa/ss", "p?w", "p#w", "p:w", "p@w", "a/b?c#d:e@f"] {
        let uri = format!("etcd://ops:{password}@h1,h2:2380/team?watch=false");
        let target = parse_uri(&uri).expect("valid");
        assert_eq!(target.hosts, ["h1:2379", "h2:2380"]);
        assert_eq!((target.prefix.as_str(), target.watch), ("team/", false));
        assert_eq!(
            target.user,
            Some(("ops".to_string(), Some((*password).into())))
        );
        let Err(err) = parse_uri(&format!("etcd://ops:{password}@h:x/p?tls=1")) else {
            panic!("a bad port was accepted");
        };
        assert!(!err.to_string().contains(password), "{err}");
    }
}

#[test]
fn credentials_come_from_the_uri_before_the_file() {
    let file = EtcdOptions {
        user: Some("file-user".into()),
        password: Some("file-pw".into()),
        ..EtcdOptions::default()
    };
    let from_uri = Some(("uri-user".to_string(), Some("uri-pw".into())));
    assert_eq!(
        credentials(from_uri, &file).expect("both"),
        Some(("uri-user".into(), "uri-pw".into()))
    );
    // A user in the URI may take the file's password.
    let from_uri = Some(("uri-user".to_string(), None));
    assert_eq!(
        credentials(from_uri, &file).expect("both"),
        Some(("uri-user".into(), "file-pw".into()))
    );
    assert_eq!(
        credentials(None, &file).expect("file"),
        Some(("file-user".into(), "file-pw".into()))
    );
    let shown = format!("{file:?}");
    assert!(
        !shown.contains("file-pw") && shown.contains("file-user"),
        "{shown}"
    );
}

#[test]
fn leases_last_ttl_and_grace_in_whole_seconds() {
    assert_eq!(lease_seconds(Duration::from_secs(1)), 2); // 1 s + 0.5 s
    assert_eq!(lease_seconds(Duration::from_secs(30)), 33);
    assert_eq!(lease_seconds(Duration::from_millis(5500)), 7); // 5.5 + 0.55
}

#[test]
fn a_record_keeps_the_holder_but_not_its_token() {
    let spec = spec("dev:tap-a-to-target-b", "l1", false, TTL);
    let record = EtcdRecord::new(&spec);
    let body: serde_json::Value = serde_json::from_slice(&record.body()).expect("json");
    assert_eq!(body["state"], "held");
    assert_eq!(body["key"], "dev:tap-a-to-target-b");
    assert_eq!(body["holder"]["host"], "host-of-l1");
    assert!(body["holder"].get("token").is_none(), "{body}");
    let holder = record.holder(42).expect("holder");
    assert_eq!(
        holder,
        Holder {
            token: 42,
            ..spec.holder
        }
    );
}

#[tokio::test]
async fn an_unreachable_etcd_is_named_within_the_bound() {
    let closed = crate::backend::fixtures::closed_port();
    let backend = EtcdBackend::open(
        &format!("etcd://127.0.0.1:{closed}/x"),
        &EtcdOptions::default(),
        &StoreContext::default(),
    )
    .expect("opens");
    let started = Instant::now();
    let err = backend
        .acquire(&spec("k", "l1", false, TTL))
        .await
        .expect_err("nothing listens");
    assert!(started.elapsed() <= TIMEOUTS.operation + Duration::from_millis(500));
    match err {
        BackendError::Unavailable(why) => {
            assert!(why.contains(&format!("127.0.0.1:{closed}")), "{why}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_listing_reads_the_records_around_the_dot_names_and_their_histories() {
    let range = |start: &[u8], end: &[u8]| (start.to_vec(), end.to_vec());
    let names = listing::Names::new("", None, None);
    assert_eq!(
        names.record_ranges("p/"),
        [range(b"p/", b"p/."), range(b"p//", b"p0")]
    );
    assert_eq!(
        names.range("p/.history/"),
        range(b"p/.history/", b"p/.history0")
    );

    // A prefix's names never start with `.`: one range.
    let names = listing::Names::new("app%2F", Some("app%2Fk1"), None);
    assert_eq!(
        names.record_ranges("p/"),
        [range(b"p/app%2Fk1\0", b"p/app%2G")]
    );
    assert_eq!(
        names.range("p/.history/"),
        range(b"p/.history/app%2Fk1\0", b"p/.history/app%2G")
    );

    // Resumed past the `.` names: only the range above them is left; the
    // later of two bounds counts.
    let names = listing::Names::new("", Some("0a"), Some(b"-"));
    assert_eq!(names.record_ranges("p/"), [range(b"p/0a\0", b"p0")]);
    let names = listing::Names::new("", Some("-"), Some(b"0a"));
    assert_eq!(names.record_ranges("p/"), [range(b"p/0a\0", b"p0")]);
}

#[test]
fn a_page_merges_records_and_histories_by_name_and_ends_where_the_next_starts() {
    let named = |names: &[&str]| -> Vec<(Vec<u8>, char)> {
        names
            .iter()
            .map(|n| (n.as_bytes().to_vec(), n.chars().next().unwrap_or(' ')))
            .collect()
    };
    let found = |record: Option<char>, history: Option<char>| listing::Found { record, history };
    let page = listing::page(named(&["a", "c"]), named(&["a", "b", "d"]), 3);
    assert_eq!(
        page.names,
        [
            ("a".to_string(), found(Some('a'), Some('a'))),
            ("b".to_string(), found(None, Some('b'))),
            ("c".to_string(), found(Some('c'), None)),
        ]
    );
    assert_eq!(page.last, Some(b"c".to_vec()), "d follows");
    let page = listing::page(named(&["a", "c"]), named(&["a", "b", "d"]), 4);
    assert_eq!((page.names.len(), page.last), (4, None));
    // A name that is not UTF-8 is no record, but the next page starts after it.
    let odd = vec![(vec![b'a', 0xff], 'x')];
    let page = listing::page(odd, named(&["b"]), 1);
    let last = page.last.clone().unwrap_or_default();
    assert_eq!(
        (page.names, last.as_slice()),
        (Vec::new(), &[b'a', 0xff][..])
    );
    let cursor = listing::to_hex(&last);
    assert_eq!(cursor, "61ff");
    assert_eq!(listing::from_hex(&cursor), Some(vec![b'a', 0xff]));
    for not_hex in ["6", "6g", "é"] {
        assert_eq!(listing::from_hex(not_hex), None, "{not_hex}");
    }
}
