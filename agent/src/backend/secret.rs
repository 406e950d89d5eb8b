//! A credential that never shows: [`Secret`] prints, debugs and serializes
//! as `<redacted>`, so a settings struct that holds one may derive all three.

use serde::{Deserialize, Serialize, Serializer};

/// What a secret shows as, wherever it is shown.
pub const REDACTED: &str = "<redacted>";

/// A password, key or connection string, read from the configuration or the
/// environment. Only [`Secret::expose`] gives the value, to the client that
/// signs or logs in with it.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// The value itself: for a client library, never for a message.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Secret {
        Secret(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Secret {
        Secret(value.to_string())
    }
}

/// For flags and environment variables (`--backend`).
impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Secret, Self::Err> {
        Ok(Secret::from(text))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REDACTED)
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REDACTED)
    }
}

/// `check-config` prints the settings as TOML: the secret stays hidden there too.
impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(REDACTED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{AzureOptions, BackendOptions, EtcdOptions, GcsOptions, S3Options};

    const PASSWORD: &str = "hunter2-s3cr3t";

    /// Every settings struct that holds a credential, with each one set.
    fn with_every_secret() -> BackendOptions {
        BackendOptions {
            s3: S3Options {
                access_key_id: Some("AKIA".into()),
                secret_access_key: Some(PASSWORD.into()),
                ..S3Options::default()
            },
            azure: AzureOptions {
                connection_string: Some(format!("AccountName=a;AccountKey={PASSWORD}").into()),
                account_name: Some("a".into()),
                account_key: Some(PASSWORD.into()),
                account_url: Some("https://a.blob.core.windows.net".into()),
                sas_token: Some(format!("sv=2022-11-02&sig={PASSWORD}").into()),
                ..AzureOptions::default()
            },
            gcs: GcsOptions {
                credentials_json: Some(format!("{{\"private_key\": \"{PASSWORD}\"}}").into()),
                ..GcsOptions::default()
            },
            etcd: EtcdOptions {
                user: Some("ops".into()),
                password: Some(PASSWORD.into()),
                ..EtcdOptions::default()
            },
            ..BackendOptions::default()
        }
    }

    #[test]
    fn no_settings_struct_shows_a_secret_it_holds() {
        let options = with_every_secret();
        let shown = [
            format!("{options:?}"),
            format!("{:?}", options.s3),
            format!("{:?}", options.azure),
            format!("{:?}", options.gcs),
            format!("{:?}", options.etcd),
            toml::to_string(&options.s3).expect("toml"),
            toml::to_string(&options.azure).expect("toml"),
            toml::to_string(&options.gcs).expect("toml"),
            toml::to_string(&options.etcd).expect("toml"),
        ];
        for text in shown {
            assert!(!text.contains(PASSWORD), "{text}");
            assert!(text.contains(REDACTED), "{text}");
        }
        let secret = Secret::from(PASSWORD);
        assert_eq!(format!("{secret} {secret:?}"), "<redacted> <redacted>");
        assert_eq!(secret.expose(), PASSWORD);
    }
}
