//! The agent's own Entra ID identity for Azure Storage, looked for in the
//! order of Azure's `DefaultAzureCredential`: a workload identity or a
//! service principal in the environment, a managed identity, the Azure
//! CLI's login. azure_identity 0.21 has the first and the last; its managed
//! identity asks only for a system-assigned one, so the managed identity
//! here is ours: system-assigned, or user-assigned when `AZURE_CLIENT_ID`
//! names one (and no secret or token file makes it a service principal's),
//! on App Service (`IDENTITY_ENDPOINT`) or a VM's instance metadata service.

use crate::backend::Secret;
use azure_core::auth::{AccessToken, TokenCredential};
use azure_core::error::{Error, ErrorKind};
use std::sync::Arc;
use std::time::Duration;

/// A token is fetched again when it has this little left, as Azure's SDKs do.
const REFRESH_BEFORE: Duration = Duration::from_secs(300);
/// The instance metadata service, unless `AZURE_POD_IDENTITY_AUTHORITY_HOST`
/// (the Azure SDKs' override) names another host.
const IMDS: &str = "http://169.254.169.254";
/// How long the instance metadata service may take: off Azure nothing
/// answers at its address, and the chain must go on to the next source.
const IMDS_TIMEOUT: Duration = Duration::from_secs(2);

/// The sources, in order; the first that gives a token is used.
pub(super) fn chain(env: &impl Fn(&str) -> Option<String>) -> Arc<dyn TokenCredential> {
    let options = azure_identity::TokenCredentialOptions::default();
    let mut sources: Vec<(&'static str, Arc<dyn TokenCredential>)> = Vec::new();
    let environment = azure_identity::EnvironmentCredential::create(options).ok();
    let service_principal = environment.is_some();
    if let Some(credential) = environment {
        sources.push(("environment", Arc::new(credential)));
    }
    let client_id = env("AZURE_CLIENT_ID").filter(|_| !service_principal);
    sources.push((
        "managed identity",
        Arc::new(ManagedIdentity::from_env(env, client_id)),
    ));
    sources.push((
        "Azure CLI",
        Arc::new(azure_identity::AzureCliCredential::new()),
    ));
    Arc::new(Chain { sources })
}

#[derive(Debug)]
struct Chain {
    sources: Vec<(&'static str, Arc<dyn TokenCredential>)>,
}

#[async_trait::async_trait]
impl TokenCredential for Chain {
    async fn get_token(&self, scopes: &[&str]) -> azure_core::Result<AccessToken> {
        let mut failures = Vec::new();
        for (name, source) in &self.sources {
            match source.get_token(scopes).await {
                Ok(token) => return Ok(token),
                Err(err) => failures.push(format!("{name}: {}", one_line(&err))),
            }
        }
        Err(Error::with_message(ErrorKind::Credential, || {
            format!("no Entra ID token ({})", failures.join("; "))
        }))
    }

    async fn clear_cache(&self) -> azure_core::Result<()> {
        for (_, source) in &self.sources {
            source.clear_cache().await?;
        }
        Ok(())
    }
}

/// An error and its causes, on one line.
fn one_line(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(next) = cause {
        text.push_str(": ");
        text.push_str(&next.to_string());
        cause = next.source();
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A managed identity's token endpoint and how to ask it.
#[derive(Debug)]
struct ManagedIdentity {
    endpoint: String,
    api_version: &'static str,
    /// App Service's secret header, sent back with each request; on a VM,
    /// `Metadata: true`.
    header: (&'static str, Secret),
    client_id: Option<String>,
    http: reqwest::Client,
    cached: tokio::sync::Mutex<Option<AccessToken>>,
}

impl ManagedIdentity {
    fn from_env(env: &impl Fn(&str) -> Option<String>, client_id: Option<String>) -> Self {
        let (endpoint, api_version, header) =
            match (env("IDENTITY_ENDPOINT"), env("IDENTITY_HEADER")) {
                (Some(endpoint), Some(secret)) => {
                    (endpoint, "2019-08-01", ("x-identity-header", secret.into()))
                }
                _ => {
                    let host = env("AZURE_POD_IDENTITY_AUTHORITY_HOST")
                        .unwrap_or_else(|| IMDS.to_string());
                    let host = host.trim_end_matches('/');
                    let endpoint = format!("{host}/metadata/identity/oauth2/token");
                    (endpoint, "2018-02-01", ("metadata", "true".into()))
                }
            };
        ManagedIdentity {
            endpoint,
            api_version,
            header,
            client_id,
            http: reqwest::Client::builder()
                .timeout(IMDS_TIMEOUT)
                .build()
                .unwrap_or_default(),
            cached: tokio::sync::Mutex::new(None),
        }
    }

    async fn fetch(&self, resource: &str) -> azure_core::Result<AccessToken> {
        let mut query = vec![("api-version", self.api_version), ("resource", resource)];
        if let Some(id) = &self.client_id {
            query.push(("client_id", id));
        }
        let failed = |what: String| Error::message(ErrorKind::Credential, what);
        let answer = self
            .http
            .get(&self.endpoint)
            .query(&query)
            .header(self.header.0, self.header.1.expose())
            .send()
            .await
            .map_err(|err| {
                failed(format!(
                    "{} did not answer: {}",
                    self.endpoint,
                    one_line(&err)
                ))
            })?;
        let status = answer.status();
        if !status.is_success() {
            return Err(failed(format!("{} answered {status}", self.endpoint)));
        }
        #[derive(serde::Deserialize)]
        struct Answer {
            access_token: String,
            /// Seconds since the epoch, as a string (App Service, the VM).
            expires_on: String,
        }
        let body = answer
            .bytes()
            .await
            .map_err(|err| failed(format!("{} broke off: {}", self.endpoint, one_line(&err))))?;
        let read: Answer = serde_json::from_slice(&body)
            .map_err(|_| failed(format!("{} sent no token", self.endpoint)))?;
        let expires = read
            .expires_on
            .parse::<i64>()
            .ok()
            .and_then(|secs| time::OffsetDateTime::from_unix_timestamp(secs).ok())
            .ok_or_else(|| failed(format!("{} sent a token without its expiry", self.endpoint)))?;
        Ok(AccessToken::new(read.access_token, expires))
    }
}

#[async_trait::async_trait]
impl TokenCredential for ManagedIdentity {
    async fn get_token(&self, scopes: &[&str]) -> azure_core::Result<AccessToken> {
        let mut cached = self.cached.lock().await;
        let fresh_until = time::OffsetDateTime::now_utc() + REFRESH_BEFORE;
        if let Some(token) = cached.as_ref().filter(|t| t.expires_on > fresh_until) {
            return Ok(token.clone());
        }
        let scope = scopes.first().copied().unwrap_or_default();
        let token = self.fetch(scope.trim_end_matches("/.default")).await?;
        *cached = Some(token.clone());
        Ok(token)
    }

    async fn clear_cache(&self) -> azure_core::Result<()> {
        *self.cached.lock().await = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_managed_identity_is_asked_where_its_host_says() {
        let app_service = |name: &str| match name {
            "IDENTITY_ENDPOINT" => Some("http://127.0.0.1:41000/msi/token".to_string()),
            "IDENTITY_HEADER" => Some("h".to_string()),
            _ => None,
        };
        let asked = ManagedIdentity::from_env(&app_service, None);
        assert_eq!(
            (asked.endpoint.as_str(), asked.api_version, asked.header.0),
            (
                "http://127.0.0.1:41000/msi/token",
                "2019-08-01",
                "x-identity-header"
            )
        );
        assert!(!format!("{asked:?}").contains("\"h\""), "{asked:?}");

        let vm = ManagedIdentity::from_env(&|_: &str| None, Some("id-1".into()));
        assert_eq!(
            vm.endpoint,
            "http://169.254.169.254/metadata/identity/oauth2/token"
        );
        assert_eq!(
            (vm.header.0, vm.client_id.as_deref()),
            ("metadata", Some("id-1"))
        );
        let moved = |name: &str| {
            (name == "AZURE_POD_IDENTITY_AUTHORITY_HOST").then(|| "http://10.0.0.9/".to_string())
        };
        let vm = ManagedIdentity::from_env(&moved, None);
        assert_eq!(
            vm.endpoint,
            "http://10.0.0.9/metadata/identity/oauth2/token"
        );
    }
}
