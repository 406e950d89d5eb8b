//! The Azure adapter's own tests: URIs, connection strings and the reading of
//! answers.

use super::errors::{Failure, Handled};
use super::settings::{
    account, parse_connection_string, parse_uri, ACCOUNT_ENV, CONNECTION_STRING_ENV, DEV_ENDPOINT,
    KEY_ENV, SAS_ENV,
};
use super::*;
use crate::backend::failure::refusal_and_message;

/// A made-up key, base64 like a real one.
const KEY: &str = "c2VjcmV0LWtleS1ieXRlcy1mb3ItdGVzdHMtb25seQ==";

fn no_env(_: &str) -> Option<String> {
    None
}

#[test]
fn uris_name_a_container_and_an_optional_prefix() {
    // The rest of what an object store's URI may be: cas/site.rs's tests.
    let parsed = parse_uri("azure://my-locks/meltano/state/").expect("valid");
    assert_eq!(parsed, ("my-locks".into(), "meltano/state".into()));
    // A container's name has rules of its own.
    for bad in ["azure://ab", "azure://Locks", "azure://a--b", "azure://-ab"] {
        assert!(parse_uri(bad).is_err(), "{bad}");
    }
    let err = parse_uri("azure://acct:SECRET@locks/x").expect_err("refused");
    assert!(!err.to_string().contains("SECRET"), "{err}");
}

#[test]
fn a_connection_string_with_a_blob_endpoint_points_at_it() {
    let text = format!(
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};\
         BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1/;"
    );
    let account = parse_connection_string(&text, CONNECTION_STRING_ENV).expect("valid");
    assert_eq!(account.name, "devstoreaccount1");
    assert_eq!(account.credential, Credential::Key(KEY.into()));
    assert_eq!(account.endpoint, "http://127.0.0.1:10000/devstoreaccount1");
    let public = parse_connection_string(
        &format!("accountname=prod1;accountkey={KEY};EndpointSuffix=core.chinacloudapi.cn"),
        CONNECTION_STRING_ENV,
    )
    .expect("valid");
    assert_eq!(public.endpoint, "https://prod1.blob.core.chinacloudapi.cn");
    let dev = parse_connection_string("UseDevelopmentStorage=true", CONNECTION_STRING_ENV)
        .expect("valid");
    assert_eq!(dev.endpoint, DEV_ENDPOINT);
}

#[test]
fn a_bad_connection_string_is_named_without_its_secret() {
    let secret = "c2VjcmV0";
    for text in [
        format!("AccountName=a1;AccountKey={secret}!!;BlobEndpoint=http://x"),
        format!("AccountName=a1;{secret}"),
        format!("AccountKey={secret}"),
        format!("AccountName=a1;SharedAccessSignature=se=2030&{secret}"),
        format!("SharedAccessSignature=sv=2020&sig={secret}"),
        format!("AccountName=a1;AccountKey={secret};BlobEndpoint=not a url {secret}"),
    ] {
        let err = parse_connection_string(&text, CONNECTION_STRING_ENV).expect_err(&text);
        let shown = format!("{err:#}");
        assert!(shown.starts_with(CONNECTION_STRING_ENV), "{shown}");
        assert!(!shown.contains(secret), "{shown}");
    }
    let account =
        parse_connection_string(&format!("AccountName=a1;AccountKey={KEY}"), "x").expect("valid");
    assert!(!format!("{account:?}").contains(KEY));
}

#[test]
fn the_configuration_file_wins_over_the_environment() {
    let env = |name: &str| match name {
        CONNECTION_STRING_ENV => Some(format!(
            "AccountName=fromenv;AccountKey={KEY};BlobEndpoint=http://127.0.0.1:1/fromenv"
        )),
        ACCOUNT_ENV => Some("other".into()),
        KEY_ENV => Some(KEY.into()),
        _ => None,
    };
    let from_env = account(&AzureOptions::default(), env).expect("env");
    assert_eq!(
        (from_env.name.as_str(), from_env.source),
        ("fromenv", CONNECTION_STRING_ENV)
    );
    let options = AzureOptions {
        account_name: Some("fromfile".into()),
        account_key: Some(KEY.into()),
        ..AzureOptions::default()
    };
    let from_file = account(&options, env).expect("file");
    assert_eq!(from_file.endpoint, "https://fromfile.blob.core.windows.net");
    let key_only = |name: &str| (name == KEY_ENV).then(|| KEY.to_string());
    let err = account(&AzureOptions::default(), key_only).expect_err("no account");
    assert!(err.to_string().contains("AZURE_STORAGE_ACCOUNT"), "{err}");
    let err = account(&AzureOptions::default(), no_env).expect_err("nothing");
    assert!(err.to_string().contains(CONNECTION_STRING_ENV), "{err}");
    let half = AzureOptions {
        account_key: Some(KEY.into()),
        ..AzureOptions::default()
    };
    assert!(account(&half, no_env).is_err());
}

/// A made-up SAS, shaped like the portal's.
const SAS: &str = "sv=2022-11-02&ss=b&srt=co&sp=rwdlac&se=2030-01-01T00:00:00Z&sig=c2lnbmF0dXJl";

#[test]
fn a_shared_access_signature_comes_from_a_connection_string_the_settings_or_the_environment() {
    let from_text = |text: &str| parse_connection_string(text, CONNECTION_STRING_ENV);
    let parsed = from_text(&format!(
        "BlobEndpoint=https://prod1.blob.core.windows.net/;SharedAccessSignature={SAS}"
    ))
    .expect("valid");
    assert_eq!(
        (parsed.name.as_str(), parsed.endpoint.as_str()),
        ("prod1", "https://prod1.blob.core.windows.net")
    );
    assert_eq!(parsed.credential, Credential::Sas(SAS.into()));
    let named =
        from_text(&format!("AccountName=prod2;SharedAccessSignature=?{SAS}")).expect("valid");
    assert_eq!(named.endpoint, "https://prod2.blob.core.windows.net");
    assert_eq!(
        named.credential,
        Credential::Sas(SAS.into()),
        "the '?' dropped"
    );

    let options = AzureOptions {
        account_url: Some(DEV_ENDPOINT.into()),
        sas_token: Some(SAS.into()),
        ..AzureOptions::default()
    };
    let emulator = account(&options, no_env).expect("valid");
    assert_eq!(
        (emulator.name.as_str(), emulator.source),
        ("devstoreaccount1", "[azure] sas_token")
    );
    let env = |name: &str| match name {
        ACCOUNT_ENV => Some("prod3".into()),
        SAS_ENV => Some(SAS.into()),
        _ => None,
    };
    let from_env = account(&AzureOptions::default(), env).expect("valid");
    assert_eq!(
        (from_env.endpoint.as_str(), from_env.source),
        ("https://prod3.blob.core.windows.net", SAS_ENV)
    );
    let alone = |name: &str| (name == SAS_ENV).then(|| SAS.to_string());
    let err = account(&AzureOptions::default(), alone).expect_err("no account");
    assert!(err.to_string().contains("account_url"), "{err}");
    let torn = |name: &str| match name {
        ACCOUNT_ENV => Some("prod3".into()),
        SAS_ENV => Some("se=2030-01-01&sp=r".into()),
        _ => None,
    };
    let err = account(&AzureOptions::default(), torn).expect_err("no signature");
    assert!(err.to_string().contains("sig="), "{err}");
    assert!(!format!("{emulator:?}").contains("c2lnbmF0dXJl"));
}

#[test]
fn an_account_url_alone_means_an_entra_id_identity() {
    let options = AzureOptions {
        account_url: Some("https://prod1.blob.core.windows.net/".into()),
        ..AzureOptions::default()
    };
    let identity = account(&options, no_env).expect("valid");
    assert_eq!(identity.credential, Credential::EntraId);
    assert_eq!(
        (identity.name.as_str(), identity.endpoint.as_str()),
        ("prod1", "https://prod1.blob.core.windows.net")
    );
    // A key or a SAS beside it wins: the identity is only what is left.
    let keyed = AzureOptions {
        account_name: Some("prod1".into()),
        account_key: Some(KEY.into()),
        ..options.clone()
    };
    assert_eq!(
        account(&keyed, no_env).expect("valid").credential,
        Credential::Key(KEY.into())
    );
    let bad = AzureOptions {
        account_url: Some("prod1.blob.core.windows.net".into()),
        ..AzureOptions::default()
    };
    let err = account(&bad, no_env).expect_err("not a URL");
    assert!(err.to_string().starts_with("[azure] account_url"), "{err}");
}

#[test]
fn meltano_s_storage_account_url_is_read_as_account_url() {
    let options: AzureOptions = toml::from_str(&format!(
        "storage_account_url = \"https://prod1.blob.core.windows.net\"\nsas_token = \"{SAS}\"\n"
    ))
    .expect("valid");
    assert_eq!(
        options.account_url.as_deref(),
        Some("https://prod1.blob.core.windows.net")
    );
}

#[test]
fn printed_options_hide_the_secrets() {
    let options = AzureOptions {
        connection_string: Some(format!("AccountName=a1;AccountKey={KEY}").into()),
        account_name: Some("a1".into()),
        account_key: Some(KEY.into()),
        sas_token: Some(format!("sv=2022-11-02&sig={KEY}").into()),
        ..AzureOptions::default()
    };
    let shown = toml::to_string(&options).expect("toml");
    assert!(!shown.contains(KEY), "{shown}");
    assert!(shown.contains("account_name = \"a1\""), "{shown}");
}

fn store() -> AzureStore {
    let options = AzureOptions {
        connection_string: Some(
            format!(
                "AccountName=devstoreaccount1;AccountKey={KEY};\
                 BlobEndpoint=http://azure.test/devstoreaccount1"
            )
            .into(),
        ),
        ..AzureOptions::default()
    };
    AzureStore::open_with(
        "azure://locks/p",
        &options,
        &StoreContext::default(),
        no_env,
    )
    .expect("opens")
}

/// The store's reading of an answer `status` with error `code`, whose
/// message carries a would-be secret.
fn answer(status: u16, code: &str) -> Failure {
    let status = azure_core::StatusCode::try_from(status).expect("a status");
    let code = (!code.is_empty()).then(|| code.to_string());
    let err = azure_core::Error::message(
        ErrorKind::http_response(status, code),
        format!("signature 0123abcd key {KEY}"),
    );
    store().classify(&err, "p/.runlock/locks/k.json")
}

#[test]
fn answers_are_sorted_by_status_and_code() {
    let precondition_failed = Failure::Expected(Handled::PreconditionFailed);
    assert_eq!(answer(409, "BlobAlreadyExists"), precondition_failed);
    assert_eq!(answer(412, "ConditionNotMet"), precondition_failed);
    assert_eq!(
        answer(404, "BlobNotFound"),
        Failure::Expected(Handled::NoSuchBlob)
    );
    let (refused, text) = refusal_and_message(answer(404, "ContainerNotFound"));
    assert!(refused);
    assert!(
        text.starts_with("container locks does not exist at http://azure.test/devstoreaccount1"),
        "{text}"
    );
    for code in [
        "AuthorizationFailure",
        "AuthenticationFailed",
        "AuthorizationPermissionMismatch",
        "",
    ] {
        let (refused, text) = refusal_and_message(answer(403, code));
        assert!(refused, "{code}");
        assert!(
            text.starts_with("access denied to container locks"),
            "{text}"
        );
        assert!(
            text.contains("check the account key (AZURE_STORAGE_CONNECTION_STRING)")
                || text.contains("[azure] connection_string"),
            "{text}"
        );
        assert!(!text.contains(KEY) && !text.contains("0123abcd"), "{text}");
    }
    let (refused, text) = refusal_and_message(answer(412, "LeaseIdMissing"));
    assert!(refused && text.contains("lease"), "{text}");
    for (status, code) in [(503, "ServerBusy"), (500, "InternalError"), (429, "")] {
        let (refused, text) = refusal_and_message(answer(status, code));
        assert!(!refused, "{text}");
        assert!(!text.contains(KEY), "{text}");
    }
    let (refused, text) = refusal_and_message(answer(400, "InvalidHeaderValue"));
    assert!(
        refused && text.contains("400 InvalidHeaderValue") && !text.contains(KEY),
        "{text}"
    );
    assert!(matches!(
        answer(409, "LeaseAlreadyPresent"),
        Failure::Refused(_)
    ));
}

#[test]
fn transport_failures_are_unavailable_and_name_the_endpoint() {
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    let err = azure_core::Error::full(
        ErrorKind::Io,
        refused,
        "failed to execute `reqwest` request",
    );
    let (refused, text) = refusal_and_message(store().classify(&err, "k"));
    assert!(!refused);
    assert!(
        text.starts_with("cannot reach Azure Blob at http://azure.test/devstoreaccount1: "),
        "{text}"
    );
    let store = store();
    assert_eq!(
        store.site().description,
        "azure://locks/p (endpoint http://azure.test/devstoreaccount1)"
    );
    assert_eq!(store.site().records, "p/.runlock/locks/");
}

#[tokio::test]
async fn a_refused_endpoint_is_unavailable_within_the_operation_timeout() {
    let port = crate::backend::fixtures::closed_port();
    let options = AzureOptions {
        connection_string: Some(
            format!(
                "AccountName=devstoreaccount1;AccountKey={KEY};\
                 BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1"
            )
            .into(),
        ),
        ..AzureOptions::default()
    };
    let store = AzureStore::open_with("azure://locks", &options, &StoreContext::default(), no_env)
        .expect("opens");
    let started = std::time::Instant::now();
    let err = store.probe().await.expect_err("nothing listens");
    assert!(started.elapsed() <= TIMEOUTS.operation + Duration::from_secs(1));
    match err {
        CasError::Unavailable(text) => {
            assert!(
                text.starts_with(&format!(
                    "cannot reach Azure Blob at http://127.0.0.1:{port}/"
                )),
                "{text}"
            );
            assert!(!text.contains(KEY), "{text}");
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
}
