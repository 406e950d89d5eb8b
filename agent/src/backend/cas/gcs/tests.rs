//! The GCS adapter's own tests that need no emulator: URIs, answers and
//! credentials. Those against fake-gcs-server are in tests/stores/backends/gcs.rs.

use super::settings::{self, emulator_url, parse_uri};
use super::transport::{encode, generation_of, Answer};
use super::*;
use crate::backend::failure::refusal_and_message;
use bytes::Bytes;
use hyper::header::HeaderMap;
use hyper::StatusCode;
use std::io::Write as _;
use std::path::PathBuf;
use tokio::sync::OnceCell;

/// Would-be secrets planted in answers and key files: no message may carry them.
const SECRET: &str = "s3cr3t-ya29-token";

#[test]
fn uris_name_a_bucket_and_an_optional_prefix() {
    // The rest of what an object store's URI may be: cas/site.rs's tests.
    let parsed = parse_uri("gs://b/meltano/state/").expect("valid");
    assert_eq!(parsed, ("b".into(), "meltano/state".into()));
    assert!(parse_uri("s3://b").is_err());
    let err = parse_uri(&format!("gs://user:{SECRET}@b/x")).expect_err("refused");
    assert!(!err.to_string().contains(SECRET), "{err}");
}

#[test]
fn the_emulator_host_may_be_written_with_or_without_a_scheme() {
    assert_eq!(
        emulator_url("127.0.0.1:4443").expect("host:port"),
        "http://127.0.0.1:4443"
    );
    assert_eq!(
        emulator_url("http://localhost:9023/").expect("url"),
        "http://localhost:9023"
    );
    assert!(emulator_url("ftp://h:1").is_err());
    let err = emulator_url(&format!("http://u:{SECRET}@[bad")).expect_err("bad");
    assert!(!err.to_string().contains(SECRET), "{err}");
}

#[test]
fn object_names_are_one_escaped_path_segment() {
    assert_eq!(
        encode("p/.runlock/locks/dev%3Aa.json"),
        "p%2F.runlock%2Flocks%2Fdev%253Aa.json"
    );
}

fn store_with(credentials: Credentials) -> GcsStore {
    let mut store =
        GcsStore::with("gs://my-bucket/p", &GcsOptions::default(), &|_| None).expect("opens");
    store.credentials = credentials;
    store
}

fn key_file(path: &std::path::Path) -> Credentials {
    Credentials::KeyFile {
        path: path.to_path_buf(),
        setting: "GOOGLE_APPLICATION_CREDENTIALS",
        account: OnceCell::new(),
    }
}

/// The store's reading of an answer `status` whose JSON error has `message`
/// and `reason`, both carrying a would-be secret.
fn answer(status: u16, message: &str, reason: &str) -> Option<Failure> {
    let body = serde_json::json!({"error": {"code": status, "message": message,
        "errors": [{"reason": reason, "message": format!("{message} {SECRET}")}]}});
    let answer = Answer {
        status: StatusCode::from_u16(status).expect("a status"),
        headers: HeaderMap::new(),
        body: Bytes::from(body.to_string()),
    };
    store_with(Credentials::Default(OnceCell::new()))
        .classify(&answer, "gs://my-bucket/p/.runlock/locks/k.json")
}

#[test]
fn answers_are_sorted_by_status_and_reason_without_echoing_them() {
    assert_eq!(answer(200, "", ""), None);
    assert_eq!(
        answer(412, "Precondition failed", "conditionNotMet"),
        Some(Failure::Expected(Handled::PreconditionFailed))
    );
    // A bucket named like this one must not make a missing object a missing bucket.
    assert_eq!(
        answer(404, "No such object: my-bucket/p/k.json", "notFound"),
        Some(Failure::Expected(Handled::NotFound))
    );
    let (refused, text) = refusal_and_message(answer(
        404,
        "The specified bucket does not exist.",
        "notFound",
    ));
    assert!(refused);
    assert_eq!(
        text,
        "bucket my-bucket does not exist at Google Cloud Storage"
    );
    for status in [401, 403] {
        let (refused, text) = refusal_and_message(answer(status, SECRET, "forbidden"));
        assert!(refused, "{status}");
        assert!(
            text.starts_with(&format!(
                "access denied to bucket my-bucket at Google Cloud Storage ({status} forbidden)"
            )),
            "{text}"
        );
        assert!(text.contains("GOOGLE_APPLICATION_CREDENTIALS"), "{text}");
        assert!(text.contains("gs://my-bucket/p/.runlock/locks/*"), "{text}");
    }
    for status in [429, 500, 503] {
        let (refused, _) = refusal_and_message(answer(status, SECRET, "backendError"));
        assert!(!refused, "{status} is worth retrying");
    }
    let (refused, text) = refusal_and_message(answer(400, SECRET, "invalid"));
    assert!(refused);
    assert!(text.ends_with(": 400 invalid"), "{text}");
    // A reason that is not plain words is dropped, not echoed.
    let (_, text) = refusal_and_message(answer(400, SECRET, &format!("bad {SECRET}!")));
    assert!(text.ends_with(": 400"), "{text}");
    for status in [400, 401, 403, 404, 409, 429, 500] {
        if let Some(Failure::Refused(err) | Failure::Transient(err)) =
            answer(status, SECRET, SECRET)
        {
            assert!(!err.contains(SECRET), "{status}: {err}");
        }
    }
}

#[test]
fn a_write_answer_gives_its_generation() {
    assert_eq!(
        generation_of(br#"{"generation":"1796032005656719"}"#).as_deref(),
        Some("1796032005656719")
    );
    assert_eq!(
        generation_of(br#"{"generation":17}"#).as_deref(),
        Some("17")
    );
    assert_eq!(generation_of(br#"{"name":"x"}"#), None);
    assert_eq!(generation_of(b"not json"), None);
}

/// A credentials problem, as a read reports it (no request reaches GCS:
/// the token comes first).
async fn credentials_failure(credentials: Credentials) -> CasError {
    let store = store_with(credentials);
    store
        .get("p/.runlock/locks/k.json")
        .await
        .expect_err("no usable credentials")
}

#[tokio::test]
async fn unusable_key_files_are_named_without_their_contents() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing.json");
    let err = credentials_failure(key_file(&missing)).await;
    let CasError::Refused(text) = err else {
        panic!("{err:?}")
    };
    assert!(text.contains(&missing.display().to_string()), "{text}");
    assert!(text.contains("GOOGLE_APPLICATION_CREDENTIALS"), "{text}");
    assert!(text.contains("cannot read it"), "{text}");

    let cases = [
        format!("{{\"private_key\": \"{SECRET}\", oops"),
        format!("{{\"type\": \"service_account\", \"private_key\": {{\"k\": \"{SECRET}\"}}}}"),
        format!("{{\"private_key\": 17, \"client_email\": \"{SECRET}\"}}"),
        format!(
            "{{\"type\": \"service_account\", \"private_key\": \"-----BEGIN PRIVATE KEY-----\\n\
             {SECRET}\\n-----END PRIVATE KEY-----\\n\", \"client_email\": \"a@b\", \
             \"token_uri\": \"http://127.0.0.1:9/token\"}}"
        ),
    ];
    for (i, contents) in cases.iter().enumerate() {
        let path = dir.path().join(format!("key-{i}.json"));
        std::fs::write(&path, contents).expect("write");
        let err = credentials_failure(key_file(&path)).await;
        let CasError::Refused(text) = &err else {
            panic!("{i}: {err:?}")
        };
        assert!(text.contains(&path.display().to_string()), "{i}: {text}");
        assert!(!text.contains(SECRET), "{i}: {text}");
    }
}

/// A service-account key file with a real RSA key, whose token service is `token_uri`.
fn real_key_file(dir: &std::path::Path, token_uri: &str) -> (PathBuf, String) {
    let (json, secret) = crate::backend::fixtures::service_account_key(token_uri);
    let path = dir.join("real-key.json");
    let mut file = std::fs::File::create(&path).expect("create");
    file.write_all(json.as_bytes()).expect("write");
    (path, secret)
}

#[tokio::test]
async fn a_token_service_that_refuses_the_key_or_cannot_be_reached_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A local token service that refuses every key, as Google does a deleted one.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut peer, _)) = listener.accept().await {
            let mut request = vec![0; 64 * 1024];
            let _ = peer.read(&mut request).await;
            let body = r#"{"error":"invalid_grant","error_description":"Invalid JWT Signature."}"#;
            let reply = format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = peer.write_all(reply.as_bytes()).await;
        }
    });
    let (path, secret) = real_key_file(dir.path(), &format!("http://127.0.0.1:{port}/token"));
    let err = credentials_failure(key_file(&path)).await;
    let CasError::Refused(text) = &err else {
        panic!("{err:?}")
    };
    assert!(text.contains("token service refused"), "{text}");
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(!text.contains(&secret), "{text}");

    let port = crate::backend::fixtures::closed_port();
    let (path, secret) = real_key_file(dir.path(), &format!("http://127.0.0.1:{port}/token"));
    let err = credentials_failure(key_file(&path)).await;
    let CasError::Unavailable(text) = &err else {
        panic!("{err:?}")
    };
    assert!(
        text.contains("cannot reach Google's token service"),
        "{text}"
    );
    assert!(!text.contains(&secret), "{text}");
}

/// `GcsStore::with` on `options` and the variables `vars`, as the agent opens it at start-up.
fn open_with(options: &GcsOptions, vars: &[(&str, &str)]) -> anyhow::Result<GcsStore> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let env = move |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    GcsStore::with("gs://my-bucket/p", options, &env)
}

fn inline(json: &str) -> GcsOptions {
    GcsOptions {
        credentials_json: Some(json.into()),
        ..GcsOptions::default()
    }
}

/// A key whose fields are all there, with `SECRET` as its private key.
fn key_json_with(private_key: &str) -> serde_json::Value {
    serde_json::json!({"type": "service_account", "project_id": "p",
        "private_key": private_key, "client_email": "runlock@p.iam.gserviceaccount.com",
        "token_uri": "https://oauth2.googleapis.com/token"})
}

#[test]
fn a_malformed_inline_key_is_refused_naming_the_field_never_the_key() {
    let unusable = |json: String| {
        let Err(err) = open_with(&inline(&json), &[]) else {
            panic!("a bad key was accepted: {json}")
        };
        let text = format!("{err:#}");
        assert!(!text.contains(SECRET), "{text}");
        assert!(text.starts_with("[gcs] credentials_json"), "{text}");
        text
    };
    let text = unusable(format!(
        "{{\"private_key\": \"{SECRET}\" \"client_email\": 1}}"
    ));
    assert!(
        text.contains("is not JSON (error at line 1, column"),
        "{text}"
    );
    let text = unusable(format!("[\"{SECRET}\"]"));
    assert!(text.contains("is not a JSON object"), "{text}");
    for field in ["client_email", "private_key", "token_uri"] {
        let mut key = key_json_with(SECRET);
        key.as_object_mut().expect("an object").remove(field);
        let text = unusable(key.to_string());
        assert!(
            text.contains(&format!("field `{field}` is missing")),
            "{text}"
        );
        key[field] = serde_json::json!(["x"]);
        let text = unusable(key.to_string());
        assert!(
            text.contains(&format!("field `{field}` is not a string")),
            "{text}"
        );
    }
    let mut key = key_json_with(SECRET);
    key["type"] = serde_json::json!("authorized_user");
    assert!(unusable(key.to_string()).contains("field `type`"));
    let pem = format!("-----BEGIN PRIVATE KEY-----\n{SECRET}\n-----END PRIVATE KEY-----\n");
    let text = unusable(key_json_with(&pem).to_string());
    assert!(
        text.contains("field `private_key` is not a PEM-encoded PKCS#8 RSA private key"),
        "{text}"
    );
}

#[test]
fn a_bad_key_in_a_variable_is_named_by_the_variable() {
    for variable in [
        settings::CREDENTIALS_JSON_ENV,
        settings::MELTANO_CREDENTIALS_JSON_ENV,
    ] {
        let Err(err) = open_with(&GcsOptions::default(), &[(variable, "{}")]) else {
            panic!("{variable}: an empty key was accepted")
        };
        let text = format!("{err:#}");
        assert!(text.starts_with(&format!("{variable}: field `")), "{text}");
    }
}

#[test]
fn only_one_of_credentials_json_and_credentials_file_may_be_set() {
    let options = GcsOptions {
        credentials_file: Some("/etc/runlock/key.json".into()),
        ..inline("{}")
    };
    let Err(err) = open_with(&options, &[]) else {
        panic!("both were accepted")
    };
    assert!(
        err.to_string()
            .contains("credentials_json and credentials_file are both set"),
        "{err}"
    );
}

#[tokio::test]
async fn an_inline_key_is_loaded_at_open_and_shown_by_its_account_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, secret) = real_key_file(dir.path(), "http://127.0.0.1:9/token");
    let json = std::fs::read_to_string(&path).expect("read the key");
    let store = open_with(&inline(&json), &[]).expect("a good key opens");
    let Credentials::Inline(key) = &store.credentials else {
        panic!("the inline key was not used")
    };
    assert_eq!(key.client_email, "runlock@p.iam.gserviceaccount.com");
    assert!(!store.credentials_hint().contains(&secret));
    let described = settings::Source::find(&inline(&json), &|_| None)
        .expect("one source")
        .describe();
    assert_eq!(
        described,
        "service-account key from [gcs] credentials_json \
         (client_email runlock@p.iam.gserviceaccount.com)"
    );
    // The configuration file's key comes first; then RUNLOCK_'s variable, then Meltano's.
    let vars = [
        (settings::MELTANO_CREDENTIALS_JSON_ENV, "{}"),
        (settings::CREDENTIALS_JSON_ENV, json.as_str()),
    ];
    let store = open_with(&GcsOptions::default(), &vars).expect("the RUNLOCK_ variable wins");
    assert!(
        matches!(&store.credentials, Credentials::Inline(key) if key.setting == settings::CREDENTIALS_JSON_ENV)
    );
    // An emulator needs no credentials, but a key given is still checked.
    let store = open_with(&inline(&json), &[(EMULATOR_ENV, "127.0.0.1:4443")]).expect("opens");
    assert!(matches!(store.credentials, Credentials::Emulator));
    assert!(open_with(&inline("{}"), &[(EMULATOR_ENV, "127.0.0.1:4443")]).is_err());
    // A token request with it goes to the key's token_uri; nobody is there.
    let err = store_with(store_credentials(&json))
        .token()
        .await
        .expect_err("no token service");
    assert!(!format!("{err:?}").contains(&secret), "{err:?}");
}

fn store_credentials(json: &str) -> Credentials {
    settings::Source::find(&inline(json), &|_| None)
        .and_then(settings::Source::credentials)
        .expect("loads")
}
