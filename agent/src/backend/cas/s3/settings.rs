//! What `s3://bucket/prefix` and the `[s3]` settings name; everything else
//! comes from the AWS SDK's own configuration chain.

/// `s3://bucket/prefix` → (bucket, prefix without surrounding slashes).
pub(super) fn parse_uri(uri: &str) -> anyhow::Result<(String, String)> {
    crate::backend::cas::place_and_prefix(
        uri,
        "s3",
        "bucket",
        "credentials and the endpoint come from the AWS configuration (AWS_PROFILE, \
         AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, ...)",
    )
}
