//! What `azure://container/prefix`, the `[azure]` settings and the
//! environment name: the container, the records' prefix, and the storage
//! account to sign for. Errors name the setting at fault, never a key.

use crate::backend::{AzureOptions, Secret};

/// The Azure CLI's variables, also read by the Azure SDKs' samples.
pub(super) const CONNECTION_STRING_ENV: &str = "AZURE_STORAGE_CONNECTION_STRING";
pub(super) const ACCOUNT_ENV: &str = "AZURE_STORAGE_ACCOUNT";
pub(super) const KEY_ENV: &str = "AZURE_STORAGE_KEY";
/// Azurite's well-known development account (`UseDevelopmentStorage=true`); not a secret.
pub(super) const DEV_ACCOUNT: &str = "devstoreaccount1";
pub(super) const DEV_ENDPOINT: &str = "http://127.0.0.1:10000/devstoreaccount1";

/// A storage account to sign requests for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Account {
    pub(super) name: String,
    /// The base64 account key.
    pub(super) key: Secret,
    /// The blob service's URL, without a trailing slash.
    pub(super) endpoint: String,
    /// The setting the key came from, for "check …" advice.
    pub(super) source: &'static str,
}

/// The account from `options`, else from the environment (`env` looks a variable up).
pub(super) fn account(
    options: &AzureOptions,
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Account> {
    let env = |name: &str| env(name).filter(|value| !value.trim().is_empty());
    if let Some(text) = &options.connection_string {
        return parse_connection_string(text.expose(), "[azure] connection_string");
    }
    match (&options.account_name, &options.account_key) {
        (Some(name), Some(key)) => {
            return public_account(name, key.expose(), "[azure] account_name / account_key")
        }
        (None, None) => {}
        _ => anyhow::bail!("[azure] account_name and account_key must be given together"),
    }
    if let Some(text) = env(CONNECTION_STRING_ENV) {
        return parse_connection_string(&text, CONNECTION_STRING_ENV);
    }
    match (env(ACCOUNT_ENV), env(KEY_ENV)) {
        (Some(name), Some(key)) => {
            public_account(&name, &key, "AZURE_STORAGE_ACCOUNT / AZURE_STORAGE_KEY")
        }
        (None, None) => anyhow::bail!(
            "backend azure:// needs a storage account key: set {CONNECTION_STRING_ENV} (as for \
             Meltano's azure state backend), or {ACCOUNT_ENV} and {KEY_ENV}, or [azure] \
             connection_string (or account_name and account_key) in the configuration file"
        ),
        (Some(_), None) => anyhow::bail!("{ACCOUNT_ENV} is set but {KEY_ENV} is not"),
        (None, Some(_)) => anyhow::bail!("{KEY_ENV} is set but {ACCOUNT_ENV} is not"),
    }
}

/// An account in Azure's public cloud.
fn public_account(name: &str, key: &str, source: &'static str) -> anyhow::Result<Account> {
    let name = name.trim();
    check_account_name(name, source)?;
    let account = Account {
        name: name.to_string(),
        key: key.trim().into(),
        endpoint: format!("https://{name}.blob.core.windows.net"),
        source,
    };
    check_key(&account)?;
    Ok(account)
}

fn check_account_name(name: &str, source: &str) -> anyhow::Result<()> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric()) {
        anyhow::bail!(
            "{source}: the account name {name:?} is not a storage account name \
             (letters and digits only)"
        );
    }
    Ok(())
}

/// Fails, naming where the key came from but not the key, unless it is base64
/// (Shared Key signing decodes it for every request).
fn check_key(account: &Account) -> anyhow::Result<()> {
    match azure_core::base64::decode(account.key.expose()) {
        Ok(bytes) if !bytes.is_empty() => Ok(()),
        _ => anyhow::bail!(
            "{}: the account key is not base64; copy key1 or key2 again from the storage \
             account's \"Access keys\" page",
            account.source
        ),
    }
}

/// Reads a storage connection string (`Key=Value` pairs separated by `;`).
/// Errors name the part at fault, never a value.
pub(super) fn parse_connection_string(text: &str, source: &'static str) -> anyhow::Result<Account> {
    let mut fields = std::collections::HashMap::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((name, value)) = part.split_once('=') else {
            anyhow::bail!("{source}: a part of the connection string is not Key=Value");
        };
        // Keys are case-insensitive in Azure's own SDKs; values (the base64 key) are not.
        fields.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    let field = |name: &str| fields.get(name).filter(|v| !v.is_empty()).cloned();
    if field("usedevelopmentstorage").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(Account {
            name: DEV_ACCOUNT.into(),
            key: azure_storage::EMULATOR_ACCOUNT_KEY.into(),
            endpoint: DEV_ENDPOINT.into(),
            source,
        });
    }
    if field("sharedaccesssignature").is_some() && field("accountkey").is_none() {
        anyhow::bail!(
            "{source}: a SharedAccessSignature connection string is not supported; use one \
             with AccountName and AccountKey"
        );
    }
    let (Some(name), Some(key)) = (field("accountname"), field("accountkey")) else {
        anyhow::bail!("{source}: the connection string needs AccountName and AccountKey");
    };
    check_account_name(&name, source)?;
    let endpoint = match field("blobendpoint") {
        Some(url) => {
            let parsed = azure_core::Url::parse(&url).map_err(|_| {
                anyhow::anyhow!("{source}: BlobEndpoint is not a URL (as in http://127.0.0.1:10000/{DEV_ACCOUNT})")
            })?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.query().is_some() {
                anyhow::bail!(
                    "{source}: BlobEndpoint must be an http:// or https:// URL without a query"
                );
            }
            url.trim_end_matches('/').to_string()
        }
        None => {
            let protocol = field("defaultendpointsprotocol").unwrap_or_else(|| "https".into());
            if protocol != "https" && protocol != "http" {
                anyhow::bail!("{source}: DefaultEndpointsProtocol must be https or http");
            }
            let suffix = field("endpointsuffix").unwrap_or_else(|| "core.windows.net".into());
            format!("{protocol}://{name}.blob.{suffix}")
        }
    };
    let account = Account {
        name,
        key: key.into(),
        endpoint,
        source,
    };
    check_key(&account)?;
    Ok(account)
}

/// `azure://container/prefix` → (container, prefix without surrounding slashes).
pub(super) fn parse_uri(uri: &str) -> anyhow::Result<(String, String)> {
    let (container, prefix) = crate::backend::cas::place_and_prefix(
        uri,
        "azure",
        "container",
        "the account and its key come from AZURE_STORAGE_CONNECTION_STRING (or \
         AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY)",
    )?;
    // Azure's rule for container names, checked here so that a typo is named at start.
    let valid = (3..=63).contains(&container.len())
        && container
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !container.starts_with('-')
        && !container.ends_with('-')
        && !container.contains("--");
    if !valid {
        anyhow::bail!(
            "backend azure://{container}: a container name is 3 to 63 lowercase letters, digits \
             and single hyphens, starting and ending with a letter or digit"
        );
    }
    Ok((container, prefix))
}
