//! A service-account key given as JSON text rather than a file (`[gcs]
//! credentials_json`, `RUNLOCK_GCS_CREDENTIALS_JSON` or Meltano's
//! `MELTANO_STATE_BACKEND_GCS_APPLICATION_CREDENTIALS_JSON`). It is checked
//! when the store opens, so a bad key stops the agent at start-up; errors name
//! the setting and the field at fault and never quote the text.

use crate::backend::Secret;
use gcp_auth::CustomServiceAccount;
use std::sync::Arc;

/// The fields Google's token exchange needs.
const REQUIRED_FIELDS: [&str; 3] = ["client_email", "private_key", "token_uri"];

/// A key that parsed and whose private key can sign.
pub(super) struct InlineKey {
    pub(super) account: Arc<CustomServiceAccount>,
    /// Who the key is for: not a secret, and what an operator recognises.
    pub(super) client_email: String,
    /// Where it came from, for messages.
    pub(super) setting: &'static str,
}

/// Checks `json` (from `setting`) field by field, then lets gcp_auth load it.
pub(super) fn load(json: &Secret, setting: &'static str) -> anyhow::Result<InlineKey> {
    let client_email = client_email(json.expose(), setting)?;
    let account = CustomServiceAccount::from_json(json.expose()).map_err(|err| match err {
        // The only failure left once the fields are strings; its source may quote the key.
        gcp_auth::Error::Other("failed to parse PKCS#8 RSA key pair", _) => anyhow::anyhow!(
            "{setting}: field `private_key` is not a PEM-encoded PKCS#8 RSA private key"
        ),
        other => anyhow::anyhow!(
            "{setting}: the service-account key cannot be used: {}",
            fixed_text(&other)
        ),
    })?;
    Ok(InlineKey {
        account: Arc::new(account),
        client_email,
        setting,
    })
}

/// The key's `client_email`, once every required field is a non-empty string.
pub(super) fn client_email(json: &str, setting: &str) -> anyhow::Result<String> {
    // serde_json's syntax errors give a position only, never the text.
    let value: serde_json::Value = serde_json::from_str(json).map_err(|err| {
        anyhow::anyhow!(
            "{setting} is not JSON (error at line {}, column {}): give the service-account key \
             file's contents",
            err.line(),
            err.column()
        )
    })?;
    let Some(fields) = value.as_object() else {
        anyhow::bail!(
            "{setting} is not a JSON object: give the service-account key file's contents"
        );
    };
    if let Some(kind) = fields.get("type") {
        if kind.as_str() != Some("service_account") {
            anyhow::bail!(
                "{setting}: field `type` is not \"service_account\": only service-account keys \
                 are accepted here (user credentials go through Application Default Credentials)"
            );
        }
    }
    for field in REQUIRED_FIELDS {
        match fields.get(field) {
            None => anyhow::bail!("{setting}: field `{field}` is missing"),
            Some(serde_json::Value::String(text)) if !text.trim().is_empty() => {}
            Some(serde_json::Value::String(_)) => {
                anyhow::bail!("{setting}: field `{field}` is empty")
            }
            Some(_) => anyhow::bail!("{setting}: field `{field}` is not a string"),
        }
    }
    Ok(fields["client_email"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// gcp_auth's own words for `err`, without a source that could quote the key.
fn fixed_text(err: &gcp_auth::Error) -> String {
    match err {
        gcp_auth::Error::Other(what, _)
        | gcp_auth::Error::Str(what)
        | gcp_auth::Error::Http(what, _)
        | gcp_auth::Error::Io(what, _)
        | gcp_auth::Error::Json(what, _) => what.to_string(),
        gcp_auth::Error::NoAuthMethod(..) => "no way to authenticate".to_string(),
    }
}
