//! The S3 adapter's own tests: URIs and the reading of answers.

use super::errors::{Failure, Handled};
use super::settings::{parse_uri, CredentialSource};
use super::*;
use crate::backend::failure::refusal_and_message;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::SdkError;
use aws_sdk_s3::error::{ConnectorError, ErrorMetadata};
use aws_sdk_s3::operation::put_object::PutObjectError;
use aws_sdk_s3::primitives::SdkBody;

#[test]
fn uris_name_a_bucket_and_an_optional_prefix() {
    // The rest of what an object store's URI may be: cas/site.rs's tests.
    let parsed = parse_uri("s3://b/meltano/state/").expect("valid");
    assert_eq!(parsed, ("b".into(), "meltano/state".into()));
    assert!(parse_uri("gs://b").is_err());
    let err = parse_uri("s3://KEY:SECRET@b/x").expect_err("refused");
    assert!(err.to_string().contains("AWS_PROFILE"), "{err}");
}

fn store() -> S3Store {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .build();
    S3Store {
        client: Client::from_conf(config),
        bucket: "locks".into(),
        site: Site::object_store(
            "s3",
            "locks",
            "p",
            Some("endpoint http://s3.test".into()),
            Duration::ZERO,
        ),
        location: "http://s3.test".into(),
        credentials_looked_in: CredentialSource::DefaultChain.looked_in(None),
    }
}

#[test]
fn no_credentials_is_said_as_such_with_where_the_sdk_looked() {
    use aws_credential_types::provider::error::CredentialsError;
    let imds = CredentialsError::provider_error("failed to load credentials from IMDS");
    let err = SdkError::<PutObjectError, HttpResponse>::dispatch_failure(ConnectorError::other(
        Box::new(imds),
        None,
    ));
    let Failure::Transient(message) = store().classify(err, "k") else {
        panic!("not transient");
    };
    assert!(
        message.starts_with("no AWS credentials found for S3 at http://s3.test: looked in the environment (AWS_ACCESS_KEY_ID"),
        "{message}"
    );
    assert!(message.contains("profile \"default\""), "{message}");
    assert!(
        message.contains("(the last said: failed to load credentials from IMDS)"),
        "{message}"
    );
}

/// The store's reading of an answer `status` with error `code`; the error's
/// message carries a would-be secret.
fn answer(status: u16, code: &str) -> Failure {
    let meta = ErrorMetadata::builder()
        .code(code)
        .message("AKIASECRETKEY signature 0123abcd")
        .build();
    let raw = HttpResponse::new(status.try_into().expect("a status"), SdkBody::empty());
    store().classify(
        SdkError::service_error(PutObjectError::generic(meta), raw),
        "p/.runlock/locks/k.json",
    )
}

#[test]
fn answers_are_sorted_by_status_and_code() {
    assert_eq!(
        answer(412, "PreconditionFailed"),
        Failure::Expected(Handled::PreconditionFailed)
    );
    assert_eq!(
        answer(409, "ConditionalRequestConflict"),
        Failure::Expected(Handled::Busy)
    );
    assert_eq!(
        answer(404, "NoSuchKey"),
        Failure::Expected(Handled::NoSuchKey)
    );
    let (refused, text) = refusal_and_message(answer(404, "NoSuchBucket"));
    assert!(refused);
    assert_eq!(text, "bucket locks does not exist at http://s3.test");
    for code in [
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "",
    ] {
        let (refused, text) = refusal_and_message(answer(403, code));
        assert!(refused, "{code}");
        assert!(text.starts_with("access denied to bucket locks"), "{text}");
        assert!(text.contains("check the credentials"), "{text}");
        assert!(
            !text.contains("AKIA") && !text.contains("0123abcd"),
            "{text}"
        );
    }
    let (refused, text) = refusal_and_message(answer(503, "SlowDown"));
    assert!(!refused, "{text}");
    assert!(!text.contains("AKIA"), "{text}");
    let (refused, text) = refusal_and_message(answer(400, "InvalidRequest"));
    assert!(refused && !text.contains("AKIA"), "{text}");
    assert!(refusal_and_message(answer(501, "NotImplemented"))
        .1
        .contains("conditional writes"));
}

#[test]
fn transport_failures_are_unavailable_and_name_the_endpoint() {
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    let err: SdkError<PutObjectError, HttpResponse> =
        SdkError::dispatch_failure(ConnectorError::io(refused.into()));
    let (refused, text) = refusal_and_message(store().classify(err, "k"));
    assert!(!refused);
    assert!(
        text.starts_with("cannot reach S3 at http://s3.test: "),
        "{text}"
    );
    let err: SdkError<PutObjectError, HttpResponse> = SdkError::timeout_error("slow");
    let (refused, text) = refusal_and_message(store().classify(err, "k"));
    assert!(!refused && text.contains("did not answer"), "{text}");
}
