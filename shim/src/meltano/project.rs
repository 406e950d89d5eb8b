//! Finding a Meltano project's meltano.yml and reading the parts of it that
//! decide state IDs: environments, plugins by kind, and jobs.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The parts of meltano.yml that decide state IDs.
#[derive(Debug, Default, Deserialize)]
pub struct Project {
    #[serde(default)]
    pub default_environment: Option<String>,
    #[serde(default)]
    environments: Vec<Environment>,
    #[serde(default)]
    plugins: Plugins,
    #[serde(default)]
    jobs: Vec<Job>,
}

#[derive(Debug, Deserialize)]
struct Environment {
    name: String,
    #[serde(default)]
    state_id_suffix: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Plugins {
    #[serde(default)]
    extractors: Vec<Plugin>,
    #[serde(default)]
    loaders: Vec<Plugin>,
    #[serde(default)]
    mappers: Vec<Plugin>,
    /// Utilities, transformers, orchestrators, files…: blocks that are not extract-load.
    #[serde(flatten)]
    others: BTreeMap<String, yaml_serde::Value>,
}

#[derive(Debug, Deserialize)]
struct Plugin {
    name: String,
    #[serde(default)]
    mappings: Vec<Mapping>,
}

#[derive(Debug, Deserialize)]
struct Mapping {
    name: String,
}

#[derive(Debug, Deserialize)]
struct Job {
    name: String,
    tasks: Tasks,
}

/// A job's tasks: `"tap target"`, `["tap target", "dbt:run"]` or `[["tap", "target"]]`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Tasks {
    One(String),
    Many(Vec<Tasks>),
}

impl Tasks {
    /// Meltano's `flat_args`: every task split at whitespace, in order.
    fn flat_args(&self, into: &mut Vec<String>) {
        match self {
            Tasks::One(text) => into.extend(text.split_whitespace().map(str::to_string)),
            Tasks::Many(tasks) => tasks.iter().for_each(|t| t.flat_args(into)),
        }
    }
}

/// What a block's plugin is, as far as state IDs go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Extractor,
    Mapper,
    Loader,
    Other,
}

impl Project {
    /// The project's meltano.yml, found from `--cwd` (`cwd_flag`), else
    /// `MELTANO_PROJECT_ROOT`, else the nearest directory upward from `cwd`
    /// that holds one.
    pub fn find(
        cwd_flag: Option<&str>,
        env: &dyn Fn(&str) -> Option<String>,
        cwd: &Path,
    ) -> Result<Project, String> {
        let root = project_root(cwd_flag, env, cwd)?;
        let file = root.join("meltano.yml");
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        yaml_serde::from_str(&text).map_err(|e| format!("cannot read {}: {e}", file.display()))
    }

    /// The `state_id_suffix` of the environment named `environment`, as written.
    pub fn state_id_suffix(&self, environment: &str) -> Option<&str> {
        self.environments
            .iter()
            .find(|e| e.name == environment)
            .and_then(|e| e.state_id_suffix.as_deref())
    }

    /// Block names with job names replaced by their tasks.
    pub fn expand_jobs(&self, blocks: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        for block in blocks {
            match self.jobs.iter().find(|j| j.name == *block) {
                Some(job) => job.tasks.flat_args(&mut out),
                None => out.push(block.to_string()),
            }
        }
        out
    }

    /// The kind of the plugin (or mapping) named `name`; `None` if the project has none.
    pub fn kind_of(&self, name: &str) -> Option<Kind> {
        let plugins = &self.plugins;
        let named = |list: &[Plugin]| list.iter().any(|p| p.name == name);
        if named(&plugins.extractors) {
            Some(Kind::Extractor)
        } else if named(&plugins.loaders) {
            Some(Kind::Loader)
        } else if plugins
            .mappers
            .iter()
            .any(|p| p.name == name || p.mappings.iter().any(|m| m.name == name))
        {
            Some(Kind::Mapper)
        } else {
            let in_others = plugins.others.values().any(|list| {
                list.as_sequence().is_some_and(|items| {
                    items
                        .iter()
                        .any(|p| p.get("name").and_then(|n| n.as_str()) == Some(name))
                })
            });
            in_others.then_some(Kind::Other)
        }
    }
}

/// Where meltano.yml is: `--cwd`, else `MELTANO_PROJECT_ROOT`, else the
/// nearest directory upward from `cwd` that holds one.
fn project_root(
    cwd_flag: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
    cwd: &Path,
) -> Result<PathBuf, String> {
    if let Some(dir) = cwd_flag {
        return Ok(cwd.join(dir));
    }
    if let Some(dir) = env("MELTANO_PROJECT_ROOT").filter(|d| !d.is_empty()) {
        return Ok(cwd.join(dir));
    }
    cwd.ancestors()
        .find(|dir| dir.join("meltano.yml").is_file())
        .map(Path::to_path_buf)
        .ok_or_else(|| {
            format!(
                "no meltano.yml in {} or above (set MELTANO_PROJECT_ROOT or run from the project)",
                cwd.display()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::super::invocation;
    use super::super::test_project::{project, state_ids};

    #[test]
    fn jobs_expand_to_their_tasks() {
        assert_eq!(
            state_ids("meltano run nightly smoke", &[]),
            [
                "dev:tap-gitlab-to-target-postgres",
                "dev:tap-smoke-test-to-target-jsonl"
            ]
        );
    }

    #[test]
    fn the_project_is_found_from_the_variable_or_by_walking_up() {
        let dir = project();
        let command: Vec<String> = "meltano run tap-smoke-test target-jsonl"
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let root = dir.path().display().to_string();
        let env = move |name: &str| (name == "MELTANO_PROJECT_ROOT").then(|| root.clone());
        let elsewhere = tempfile::tempdir().expect("tempdir");
        let found = invocation(&command, &env, elsewhere.path()).expect("found by variable");
        assert_eq!(found.state_ids, ["dev:tap-smoke-test-to-target-jsonl"]);
        let none = |_: &str| None;
        let err = invocation(&command, &none, elsewhere.path()).expect_err("no project");
        assert!(err.contains("no meltano.yml"), "{err}");
    }
}
