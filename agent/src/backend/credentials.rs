//! Which credential source the store a URI names will use, for
//! `check-config`. Each store says it from the same choice it opens with, so
//! the line printed is the source the agent signs in with; never a secret.

use super::BackendOptions;

/// One line naming where the store's credentials come from. Call it after
/// [`super::open`] accepted `uri`: an unknown scheme is only named here.
pub fn source(uri: &str, options: &BackendOptions) -> anyhow::Result<String> {
    // `options` is unused in a build with no network store.
    let _ = options;
    let scheme = uri.split_once("://").map_or(uri, |(scheme, _)| scheme);
    match scheme {
        #[cfg(feature = "s3")]
        "s3" => super::cas::S3Store::describe_credentials(&options.s3),
        #[cfg(feature = "azure")]
        "azure" => super::cas::AzureStore::describe_credentials(&options.azure),
        #[cfg(feature = "gcs")]
        "gs" => super::cas::GcsStore::describe_credentials(&options.gcs),
        #[cfg(feature = "postgres")]
        "postgresql" | "postgres" => super::postgres::Settings::from_uri(uri, None)
            .map(|settings| settings.password_source().describe().to_string())
            .map_err(anyhow::Error::msg),
        #[cfg(feature = "etcd")]
        "etcd" => super::EtcdBackend::describe_credentials(uri, &options.etcd),
        "file" => Ok("none (a local directory: its permissions guard it)".to_string()),
        _ => Ok("none".to_string()),
    }
}
