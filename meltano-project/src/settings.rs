//! A project setting (`default_environment`, `state_backend.uri`, …) read
//! as Meltano's `ProjectSettingsService` reads it: its variable
//! (`MELTANO_` and the name, dots as `_`, upper case) from the process
//! environment or meltano.yml's `env:`, else from `.env`, else meltano.yml's
//! value, nested or dotted, with `$VAR`s expanded. A variable that is set,
//! even to nothing, wins.

use crate::expand::expand;
use crate::project::{scalar, Project};
use crate::Env;
use std::fmt;
use yaml_serde::Value;

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The process environment, with the variable's name.
    Environment(String),
    /// meltano.yml's top-level `env:`, which Meltano counts as the environment.
    ProjectEnv(String),
    /// The project's `.env`, with the variable's name.
    DotEnv(String),
    MeltanoYml,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Environment(var) => write!(f, "the environment ({var})"),
            Source::ProjectEnv(var) => write!(f, "meltano.yml's env: ({var})"),
            Source::DotEnv(var) => write!(f, ".env ({var})"),
            Source::MeltanoYml => f.write_str("meltano.yml"),
        }
    }
}

/// A setting's value and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    pub value: String,
    pub source: Source,
}

/// The variable Meltano reads a project setting from.
pub fn variable(name: &str) -> String {
    format!(
        "MELTANO_{}",
        name.replace(['.', '-'], "_").to_ascii_uppercase()
    )
}

impl Project {
    /// The setting `name`, or `None` where nothing sets it (or meltano.yml's
    /// value expands to nothing, which Meltano takes as unset).
    pub fn setting(&self, name: &str, env: &Env<'_>) -> Result<Option<Setting>, String> {
        let Some(found) = self.raw_setting(name, env) else {
            return Ok(None);
        };
        if found.source != Source::MeltanoYml || !found.value.contains('$') {
            return Ok(Some(found));
        }
        let strict = self.strict_env_var_mode(env);
        let value = expand(&found.value, &mut |var| {
            if var.starts_with("MELTANO_") {
                return Err(format!(
                    "meltano.yml's {name} takes ${var}, one of Meltano's own variables; \
                     write its value instead"
                ));
            }
            let value = self
                .project_env(var)
                .or_else(|| env(var))
                .or_else(|| self.dotenv.get(var).cloned());
            if value.is_none() && strict {
                return Err(format!(
                    "meltano.yml's {name} takes ${var}, which is not set, and \
                     strict_env_var_mode makes Meltano refuse that"
                ));
            }
            Ok(value)
        })?;
        Ok((!value.is_empty()).then_some(Setting {
            value,
            source: Source::MeltanoYml,
        }))
    }

    fn raw_setting(&self, name: &str, env: &Env<'_>) -> Option<Setting> {
        let var = variable(name);
        if let Some(value) = self.project_env(&var) {
            return Some(Setting {
                value,
                source: Source::ProjectEnv(var),
            });
        }
        if let Some(value) = env(&var) {
            return Some(Setting {
                value,
                source: Source::Environment(var),
            });
        }
        if let Some(value) = self.dotenv.get(&var) {
            return Some(Setting {
                value: value.clone(),
                source: Source::DotEnv(var),
            });
        }
        let value = lookup(&self.yml, name)?;
        (!value.is_null()).then(|| Setting {
            value: scalar(value),
            source: Source::MeltanoYml,
        })
    }

    /// Meltano's `ff.strict_env_var_mode`: a variable a value takes that is
    /// not set is an error, not nothing.
    pub(crate) fn strict_env_var_mode(&self, env: &Env<'_>) -> bool {
        self.raw_setting("ff.strict_env_var_mode", env)
            .is_some_and(|s| truthy(&s.value))
    }
}

/// `name` in meltano.yml: nested (`state_backend: {s3: {endpoint_url: …}}`),
/// dotted (`state_backend.s3.endpoint_url: …`), or a mix of the two.
fn lookup<'a>(value: &'a Value, name: &str) -> Option<&'a Value> {
    if let Some(found) = value.get(name) {
        return Some(found);
    }
    let (head, rest) = name.split_once('.')?;
    lookup(value.get(head)?, rest)
}

/// Click's and Meltano's reading of a boolean.
pub fn truthy(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "t" | "yes" | "y" | "on"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project(yml: &str, dotenv: &str) -> (tempfile::TempDir, Project) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("meltano.yml"), yml).expect("write");
        std::fs::write(dir.path().join(".env"), dotenv).expect("write");
        let none = |_: &str| None;
        let project = Project::open(dir.path(), None, &none).expect("opens");
        (dir, project)
    }

    #[test]
    fn the_environment_wins_then_dotenv_then_meltano_yml() {
        let (_dir, p) = project(
            "state_backend:\n  uri: s3://yml/p\n  s3.endpoint_url: http://yml\n",
            "MELTANO_STATE_BACKEND_URI=s3://dotenv/p\n",
        );
        let none = |_: &str| None;
        let uri = p.setting("state_backend.uri", &none).expect("ok");
        assert_eq!(
            uri,
            Some(Setting {
                value: "s3://dotenv/p".into(),
                source: Source::DotEnv("MELTANO_STATE_BACKEND_URI".into())
            })
        );
        let empty = |name: &str| (name == "MELTANO_STATE_BACKEND_URI").then(String::new);
        let uri = p.setting("state_backend.uri", &empty).expect("ok");
        assert_eq!(
            uri.expect("set").value,
            "",
            "a variable set to nothing wins"
        );
        let url = p
            .setting("state_backend.s3.endpoint_url", &none)
            .expect("ok");
        assert_eq!(url.expect("set").source, Source::MeltanoYml);
    }

    #[test]
    fn meltano_yml_values_expand_from_the_environment_and_dotenv() {
        let (_dir, p) = project(
            "default_environment: ${WHERE}\nstate_backend:\n  uri: ${GONE}\n",
            "WHERE=prod\n",
        );
        let none = |_: &str| None;
        let env = p.setting("default_environment", &none).expect("ok");
        assert_eq!(env.expect("set").value, "prod");
        assert_eq!(p.setting("state_backend.uri", &none).expect("ok"), None);
    }
}
