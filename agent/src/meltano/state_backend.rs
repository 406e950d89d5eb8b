//! `runlockd check-config --from-meltano PROJECT_DIR`: a Meltano project's
//! `state_backend` settings as the agent's TOML, so that an operator moves a
//! project onto runlock without retyping. Settings are read as Meltano reads
//! them (runlock-meltano-project: the process environment, then the project's
//! `.env`, then meltano.yml), and the output says where each came from.
//! Secrets are never copied: the output names the variable that carries
//! each one into the agent's environment instead.

use crate::backend::{redact_uri, split_userinfo};
use runlock_meltano_project::{Project, Setting};
use std::path::{Path, PathBuf};

/// Meltano's `state_backend` settings the agent has a counterpart for, by
/// their dotted names under `state_backend`.
const SETTINGS: &[&str] = &[
    "uri",
    "s3.aws_access_key_id",
    "s3.aws_secret_access_key",
    "s3.endpoint_url",
    "azure.connection_string",
    "azure.storage_account_url",
    "gcs.application_credentials",
    "gcs.application_credentials_path",
    "gcs.application_credentials_json",
];

/// A project's `state_backend` settings, each with where it was found.
#[derive(Debug, Default)]
pub struct StateBackend {
    found: Vec<(&'static str, Setting)>,
    /// The project directory: relative key-file paths are Meltano's, from there.
    project: PathBuf,
}

impl StateBackend {
    /// Reads `project`'s settings as Meltano does, with the variables `env` looks up.
    pub fn read(project: &Path, env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<Self> {
        let meltano = Project::open(project, None, env).map_err(anyhow::Error::msg)?;
        let mut found = Vec::new();
        for &name in SETTINGS {
            let setting = meltano
                .setting(&format!("state_backend.{name}"), env)
                .map_err(anyhow::Error::msg)?;
            if let Some(setting) = setting {
                found.push((name, setting));
            }
        }
        Ok(StateBackend {
            found,
            project: project.to_path_buf(),
        })
    }

    /// The value of `name`; a setting set to nothing counts as unset here.
    fn get(&self, name: &str) -> Option<&str> {
        self.found
            .iter()
            .find(|(found, _)| *found == name)
            .map(|(_, setting)| setting.value.as_str())
            .filter(|value| !value.is_empty())
    }

    /// `state_backend.NAME (SOURCE)`, for a comment about the setting.
    fn from(&self, name: &str) -> String {
        let source = self
            .found
            .iter()
            .find(|(found, _)| *found == name)
            .map_or_else(String::new, |(_, setting)| setting.source.to_string());
        format!("state_backend.{name} ({source})")
    }

    /// One comment line per setting read, with where it came from.
    fn sources(&self) -> String {
        self.found
            .iter()
            .map(|(name, setting)| format!("#   state_backend.{name}: {}\n", setting.source))
            .collect()
    }

    /// The agent's TOML for these settings: non-secret settings as values,
    /// each secret as a comment naming the variable to set.
    pub fn to_agent_toml(&self) -> anyhow::Result<String> {
        let Some(uri) = self.get("uri") else {
            anyhow::bail!(
                "the project sets no state_backend.uri (meltano.yml, .env or MELTANO_STATE_BACKEND_URI): \
                 Meltano keeps its state in the system database, which runlock cannot lock on; \
                 choose a backend URI for the agent"
            );
        };
        // The Meltano add-on's `runlock+SCHEME://…` keeps state in SCHEME's
        // store, with SCHEME's settings: that store is the agent's too.
        let uri = uri.strip_prefix("runlock+").unwrap_or(uri);
        let scheme = uri.split_once("://").map_or(uri, |(scheme, _)| scheme);
        let mut out = format!(
            "# runlockd configuration for the Meltano project {}, from the\n\
             # settings Meltano reads there:\n{}\
             # Secrets are not copied: set the variables named below in the\n\
             # agent's environment.\n",
            self.project.display(),
            self.sources()
        );
        match scheme {
            "s3" => self.s3(uri, &mut out),
            "azure" => self.azure(uri, &mut out),
            "gs" => self.gcs(uri, &mut out),
            "postgresql" | "postgres" => postgres(uri, &mut out),
            "file" => out.push_str(&format!("backend = {}\n", quoted(uri))),
            "systemdb" => anyhow::bail!(
                "state_backend.uri is systemdb: Meltano keeps its state in the system database, \
                 which runlock cannot lock on; choose a backend URI for the agent"
            ),
            _ => anyhow::bail!(
                "state_backend.uri {} has a scheme runlockd does not know",
                redact_uri(uri)
            ),
        }
        Ok(out)
    }

    fn s3(&self, uri: &str, out: &mut String) {
        // The agent refuses keys in the URI: they go to the environment.
        let (userinfo, rest) = split_userinfo(&uri["s3://".len()..]);
        out.push_str(&format!("backend = {}\n", quoted(&format!("s3://{rest}"))));
        if let Some(url) = self.get("s3.endpoint_url") {
            out.push_str(&format!(
                "\n[s3]\nendpoint_url = {}\n",
                quoted(&redact_uri(url))
            ));
        }
        let keys = [
            ("s3.aws_access_key_id", "AWS_ACCESS_KEY_ID"),
            ("s3.aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
        ];
        if userinfo.is_some() {
            out.push_str(
                "# The URI's access key: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.\n",
            );
        }
        for (name, variable) in keys {
            if self.get(name).is_some() {
                out.push_str(&format!("# {}: set {variable}.\n", self.from(name)));
            }
        }
    }

    fn azure(&self, uri: &str, out: &mut String) {
        out.push_str(&format!("backend = {}\n", quoted(uri)));
        let url = self.get("azure.storage_account_url");
        if let Some(url) = url {
            out.push_str(&format!(
                "\n[azure]\naccount_url = {}\n",
                quoted(&redact_uri(url))
            ));
        }
        if self.get("azure.connection_string").is_some() {
            let note = if url.is_some() {
                " (unused while account_url is set: Meltano and runlockd both try the \
                 account URL first)"
            } else {
                ""
            };
            out.push_str(&format!(
                "# {}: set AZURE_STORAGE_CONNECTION_STRING{note}.\n",
                self.from("azure.connection_string")
            ));
        }
    }

    fn gcs(&self, uri: &str, out: &mut String) {
        out.push_str(&format!("backend = {}\n", quoted(uri)));
        let path = self
            .get("gcs.application_credentials_path")
            .or_else(|| self.get("gcs.application_credentials"));
        if self.get("gcs.application_credentials_json").is_some() {
            out.push_str(&format!(
                "# {}: set RUNLOCK_GCS_CREDENTIALS_JSON (or keep \
                 MELTANO_STATE_BACKEND_GCS_APPLICATION_CREDENTIALS_JSON, which runlockd reads too).\n",
                self.from("gcs.application_credentials_json")
            ));
        } else if let Some(path) = path {
            let path = self.project.join(path);
            out.push_str(&format!(
                "\n[gcs]\ncredentials_file = {}\n",
                quoted(&path.display().to_string())
            ));
        }
    }
}

/// A PostgreSQL URI without its password, which goes to `PGPASSWORD`.
fn postgres(uri: &str, out: &mut String) {
    let (scheme, rest) = uri.split_once("://").unwrap_or(("postgresql", uri));
    let (userinfo, place) = split_userinfo(rest);
    match userinfo {
        Some(userinfo) => {
            let (user, password) = userinfo
                .split_once(':')
                .map_or((userinfo, None), |(user, password)| (user, Some(password)));
            out.push_str(&format!(
                "backend = {}\n",
                quoted(&format!("{scheme}://{user}@{place}"))
            ));
            if password.is_some() {
                out.push_str("# The URI's password: set PGPASSWORD.\n");
            }
        }
        None => out.push_str(&format!("backend = {}\n", quoted(uri))),
    }
}

/// `text` as a TOML basic string.
fn quoted(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The TOML for a project whose meltano.yml is `yaml`, with `vars` set.
    fn imported(yaml: &str, vars: &[(&str, &str)]) -> anyhow::Result<String> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("meltano.yml"), yaml)?;
        let env = |name: &str| {
            vars.iter()
                .find(|(var, _)| *var == name)
                .map(|(_, value)| value.to_string())
        };
        let toml = StateBackend::read(dir.path(), &env)?.to_agent_toml()?;
        Ok(toml.replace(&dir.path().display().to_string(), "PROJECT"))
    }

    #[test]
    fn variables_win_over_the_file_and_dotted_keys_are_read() {
        let yaml = "state_backend:\n  uri: s3://from-file/p\n  s3.endpoint_url: http://file:9000\n";
        let toml = imported(yaml, &[]).expect("imported");
        assert!(toml.contains("backend = \"s3://from-file/p\""), "{toml}");
        assert!(
            toml.contains("endpoint_url = \"http://file:9000\""),
            "{toml}"
        );
        let vars = [
            ("MELTANO_STATE_BACKEND_URI", "s3://from-env/p"),
            ("MELTANO_STATE_BACKEND_S3_ENDPOINT_URL", "http://env:9000"),
        ];
        let toml = imported(yaml, &vars).expect("imported");
        assert!(toml.contains("backend = \"s3://from-env/p\""), "{toml}");
        assert!(
            toml.contains("endpoint_url = \"http://env:9000\""),
            "{toml}"
        );
    }

    #[test]
    fn dotenv_is_read_as_meltano_config_set_writes_it_and_each_source_is_named() {
        // `meltano config set meltano state_backend.uri …` writes to .env.
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("meltano.yml"),
            "state_backend:\n  s3:\n    endpoint_url: http://yml:9000\n",
        )
        .expect("write");
        std::fs::write(
            dir.path().join(".env"),
            "MELTANO_STATE_BACKEND_URI='s3://from-dotenv/p'\n\
             MELTANO_STATE_BACKEND_S3_AWS_SECRET_ACCESS_KEY=\"s3cr3t\"\n",
        )
        .expect("write");
        let none = |_: &str| None;
        let toml = StateBackend::read(dir.path(), &none)
            .and_then(|found| found.to_agent_toml())
            .expect("imported");
        for want in [
            "backend = \"s3://from-dotenv/p\"",
            "#   state_backend.uri: .env (MELTANO_STATE_BACKEND_URI)\n",
            "#   state_backend.s3.endpoint_url: meltano.yml\n",
            "#   state_backend.s3.aws_secret_access_key: .env (MELTANO_STATE_BACKEND_S3_AWS_SECRET_ACCESS_KEY)\n",
            "set AWS_SECRET_ACCESS_KEY",
        ] {
            assert!(toml.contains(want), "{want:?} missing: {toml}");
        }
        assert!(!toml.contains("s3cr3t"), "{toml}");
    }

    #[test]
    fn secrets_become_the_variables_to_set() {
        let toml =
            imported("state_backend:\n  uri: s3://AKID:s3cr3t@b/p\n", &[]).expect("imported");
        assert!(toml.contains("backend = \"s3://b/p\""), "{toml}");
        assert!(toml.contains("AWS_SECRET_ACCESS_KEY") && !toml.contains("s3cr3t"));
        let yaml = "state_backend:\n  uri: azure://c/p\n  azure:\n    \
                    storage_account_url: https://acct.blob.core.windows.net\n    \
                    connection_string: AccountName=a;AccountKey=c2VjcmV0\n";
        let toml = imported(yaml, &[]).expect("imported");
        assert!(
            toml.contains("account_url = \"https://acct.blob.core.windows.net\""),
            "{toml}"
        );
        assert!(toml.contains("AZURE_STORAGE_CONNECTION_STRING") && !toml.contains("c2VjcmV0"));
        let toml =
            imported("state_backend:\n  uri: postgresql://u:pw@h/db\n", &[]).expect("imported");
        assert!(toml.contains("backend = \"postgresql://u@h/db\""), "{toml}");
        assert!(
            toml.contains("PGPASSWORD") && !toml.contains(":pw@"),
            "{toml}"
        );
    }

    #[test]
    fn the_add_ons_uri_names_the_store_it_wraps() {
        let toml = imported(
            "state_backend:\n  uri: runlock+s3://b/p\n  s3:\n    endpoint_url: http://e:9000\n",
            &[],
        )
        .expect("imported");
        assert!(toml.contains("backend = \"s3://b/p\""), "{toml}");
        assert!(toml.contains("endpoint_url = \"http://e:9000\""), "{toml}");
        let err =
            imported("state_backend:\n  uri: runlock+systemdb://\n", &[]).expect_err("refused");
        assert!(err.to_string().contains("system database"), "{err}");
    }

    #[test]
    fn a_relative_key_file_is_the_projects() {
        let yaml =
            "state_backend:\n  uri: gs://b/p\n  gcs:\n    application_credentials: keys/sa.json\n";
        let toml = imported(yaml, &[]).expect("imported");
        assert!(
            toml.contains("credentials_file = \"PROJECT/keys/sa.json\""),
            "{toml}"
        );
    }

    #[test]
    fn the_system_database_has_no_counterpart() {
        let err = imported("project_id: p\n", &[]).expect_err("refused");
        assert!(err.to_string().contains("system database"), "{err}");
        let err = imported("state_backend:\n  uri: systemdb\n", &[]).expect_err("refused");
        assert!(err.to_string().contains("system database"), "{err}");
    }
}
