//! What `azure://container/prefix`, the `[azure]` settings and the
//! environment name: the container, the records' prefix, and the storage
//! account to sign for. Errors name the setting at fault, never a key.

use crate::backend::{AzureOptions, Secret};

/// The Azure CLI's variables, also read by the Azure SDKs' samples.
pub(super) const CONNECTION_STRING_ENV: &str = "AZURE_STORAGE_CONNECTION_STRING";
pub(super) const ACCOUNT_ENV: &str = "AZURE_STORAGE_ACCOUNT";
pub(super) const KEY_ENV: &str = "AZURE_STORAGE_KEY";
pub(super) const SAS_ENV: &str = "AZURE_STORAGE_SAS_TOKEN";
/// Azurite's well-known development account (`UseDevelopmentStorage=true`); not a secret.
pub(super) const DEV_ACCOUNT: &str = "devstoreaccount1";
pub(super) const DEV_ENDPOINT: &str = "http://127.0.0.1:10000/devstoreaccount1";

/// How requests to the account are authorized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Credential {
    /// Shared Key: one of the account's access keys (base64), signing each request.
    Key(Secret),
    /// A shared access signature: the query (`sv=…&sig=…`) sent with each request.
    Sas(Secret),
    /// An Entra ID token for the agent's own identity, found as Azure's
    /// `DefaultAzureCredential` finds it (a service principal or workload
    /// identity in the environment, a managed identity, the Azure CLI's
    /// login) and fetched again before it expires.
    EntraId,
}

impl Credential {
    /// What it is, for messages.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Credential::Key(_) => "account key",
            Credential::Sas(_) => "shared access signature",
            Credential::EntraId => "Entra ID identity",
        }
    }
}

/// A storage account and how to authorize requests to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Account {
    pub(super) name: String,
    pub(super) credential: Credential,
    /// The blob service's URL, without a trailing slash.
    pub(super) endpoint: String,
    /// The setting the credential came from, for "check …" advice.
    pub(super) source: &'static str,
}

/// The account from `options`, else from the environment (`env` looks a
/// variable up), in this order: a connection string, an account name and
/// key, a SAS; the configuration file's before the environment's.
pub(super) fn account(
    options: &AzureOptions,
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Account> {
    let env = |name: &str| env(name).filter(|value| !value.trim().is_empty());
    if let Some(text) = &options.connection_string {
        return parse_connection_string(text.expose(), "[azure] connection_string");
    }
    let url = options.account_url.as_deref();
    match (&options.account_name, &options.account_key) {
        (Some(name), Some(key)) => {
            return with_key(
                name,
                key.expose(),
                url,
                "[azure] account_name / account_key",
            )
        }
        (Some(_), None) | (None, Some(_)) if options.sas_token.is_none() => {
            anyhow::bail!("[azure] account_name and account_key must be given together")
        }
        _ => {}
    }
    if let Some(token) = &options.sas_token {
        let name = options.account_name.as_deref();
        return with_sas(name, url, token.expose(), "[azure] sas_token");
    }
    if let Some(url) = url {
        // No key and no SAS: the account lets identities in (shared-key
        // access may be disabled), as Meltano's storage_account_url does.
        let endpoint = blob_endpoint(url, "[azure] account_url")?;
        return Ok(Account {
            name: account_of_endpoint(&endpoint),
            credential: Credential::EntraId,
            endpoint,
            source: "[azure] account_url",
        });
    }
    if let Some(text) = env(CONNECTION_STRING_ENV) {
        return parse_connection_string(&text, CONNECTION_STRING_ENV);
    }
    match (env(ACCOUNT_ENV), env(KEY_ENV), env(SAS_ENV)) {
        (Some(name), Some(key), _) => with_key(
            &name,
            &key,
            url,
            "AZURE_STORAGE_ACCOUNT / AZURE_STORAGE_KEY",
        ),
        (name, None, Some(token)) => with_sas(name.as_deref(), url, &token, SAS_ENV),
        (None, None, None) => anyhow::bail!(
            "backend azure:// needs a credential: set {CONNECTION_STRING_ENV} (as for \
             Meltano's azure state backend), or {ACCOUNT_ENV} and {KEY_ENV} (or {SAS_ENV}), \
             or in the configuration file [azure] connection_string, account_name and \
             account_key, account_url and sas_token, or account_url alone for an Entra ID \
             identity"
        ),
        (Some(_), None, None) => anyhow::bail!("{ACCOUNT_ENV} is set but {KEY_ENV} is not"),
        (None, Some(_), _) => anyhow::bail!("{KEY_ENV} is set but {ACCOUNT_ENV} is not"),
    }
}

/// The account `name` signing with `key`, at `url` or in Azure's public cloud.
fn with_key(
    name: &str,
    key: &str,
    url: Option<&str>,
    source: &'static str,
) -> anyhow::Result<Account> {
    let name = name.trim();
    check_account_name(name, source)?;
    let endpoint = match url {
        Some(url) => blob_endpoint(url, "[azure] account_url")?,
        None => format!("https://{name}.blob.core.windows.net"),
    };
    let account = Account {
        name: name.to_string(),
        credential: Credential::Key(key.trim().into()),
        endpoint,
        source,
    };
    check_key(&account)?;
    Ok(account)
}

/// The account at `url` (or named `name`, in Azure's public cloud) with the
/// SAS `token`.
fn with_sas(
    name: Option<&str>,
    url: Option<&str>,
    token: &str,
    source: &'static str,
) -> anyhow::Result<Account> {
    let (name, endpoint) = match (name.map(str::trim), url) {
        (_, Some(url)) => {
            let endpoint = blob_endpoint(url, "[azure] account_url")?;
            (account_of_endpoint(&endpoint), endpoint)
        }
        (Some(name), None) => {
            check_account_name(name, source)?;
            (
                name.to_string(),
                format!("https://{name}.blob.core.windows.net"),
            )
        }
        (None, None) => anyhow::bail!(
            "{source}: a shared access signature needs the account: set [azure] account_url \
             (or account_name, or {ACCOUNT_ENV})"
        ),
    };
    Ok(Account {
        name,
        credential: Credential::Sas(sas_token(token, source)?),
        endpoint,
        source,
    })
}

/// A SAS as Azure's portal and CLI print it (with or without a leading `?`),
/// checked for the parts every SAS has; errors never show it.
fn sas_token(token: &str, source: &str) -> anyhow::Result<Secret> {
    let token = token.trim().trim_start_matches('?');
    let has = |part: &str| {
        token.split('&').any(|pair| {
            pair.split_once('=')
                .is_some_and(|(name, v)| name == part && !v.is_empty())
        })
    };
    if !has("sv") || !has("sig") {
        anyhow::bail!(
            "{source}: the shared access signature lacks sv= or sig=; copy the whole token \
             (the query after '?' of a SAS URL)"
        );
    }
    Ok(token.into())
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
    let Credential::Key(key) = &account.credential else {
        return Ok(());
    };
    match azure_core::base64::decode(key.expose()) {
        Ok(bytes) if !bytes.is_empty() => Ok(()),
        _ => anyhow::bail!(
            "{}: the account key is not base64; copy key1 or key2 again from the storage \
             account's \"Access keys\" page",
            account.source
        ),
    }
}

/// A blob service URL, checked, without its trailing slash.
fn blob_endpoint(url: &str, source: &str) -> anyhow::Result<String> {
    let parsed = azure_core::Url::parse(url.trim()).map_err(|_| {
        anyhow::anyhow!(
            "{source}: the blob endpoint is not a URL (as in https://ACCOUNT.blob.core.windows.net \
             or http://127.0.0.1:10000/{DEV_ACCOUNT})"
        )
    })?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.query().is_some() {
        anyhow::bail!(
            "{source}: the blob endpoint must be an http:// or https:// URL without a query \
             (a SAS goes in sas_token)"
        );
    }
    Ok(url.trim().trim_end_matches('/').to_string())
}

/// The account a blob endpoint names: the first label of Azure's host
/// name, or the first path segment of an emulator's URL
/// (`http://127.0.0.1:10000/devstoreaccount1`).
fn account_of_endpoint(endpoint: &str) -> String {
    let Ok(url) = azure_core::Url::parse(endpoint) else {
        return String::new();
    };
    let in_path = url
        .path_segments()
        .and_then(|mut s| s.next())
        .filter(|s| !s.is_empty());
    match (in_path, url.host_str()) {
        (Some(segment), _) => segment.to_string(),
        (None, Some(host)) => host.split('.').next().unwrap_or_default().to_string(),
        (None, None) => String::new(),
    }
}

/// Reads a storage connection string (`Key=Value` pairs separated by `;`):
/// an account key's (`AccountName`, `AccountKey`) or a SAS's
/// (`SharedAccessSignature`, with `BlobEndpoint` or `AccountName`). Errors
/// name the part at fault, never a value.
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
            credential: Credential::Key(azure_storage::EMULATOR_ACCOUNT_KEY.into()),
            endpoint: DEV_ENDPOINT.into(),
            source,
        });
    }
    let endpoint = match field("blobendpoint") {
        Some(url) => Some(blob_endpoint(&url, &format!("{source}: BlobEndpoint"))?),
        None => None,
    };
    let name = field("accountname");
    let sas = field("sharedaccesssignature");
    let Some(key) = field("accountkey") else {
        let Some(token) = sas else {
            anyhow::bail!(
                "{source}: the connection string needs AccountName and AccountKey, or \
                 SharedAccessSignature"
            );
        };
        return with_sas(name.as_deref(), endpoint.as_deref(), &token, source);
    };
    let Some(name) = name else {
        anyhow::bail!("{source}: the connection string needs AccountName with AccountKey");
    };
    check_account_name(&name, source)?;
    let endpoint = match endpoint {
        Some(endpoint) => endpoint,
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
        credential: Credential::Key(key.into()),
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
