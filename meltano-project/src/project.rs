//! A Meltano project as Meltano loads it: its root (`MELTANO_PROJECT_ROOT`,
//! else the nearest directory upward holding meltano.yml), meltano.yml with
//! the files its `include_paths` globs name, and its `.env`.

use crate::{dotenv, Env};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use yaml_serde::Value;

/// Meltano's plugin types, in the order it searches them for a name
/// (`PluginType`; mappings are found through their mapper).
const PLUGIN_TYPES: &[&str] = &[
    "extractors",
    "loaders",
    "transforms",
    "orchestrators",
    "transformers",
    "files",
    "utilities",
    "mappers",
];

/// A loaded project.
#[derive(Debug)]
pub struct Project {
    pub root: PathBuf,
    /// The `.env` Meltano reads (`--env-file`, else the root's `.env`).
    pub dotenv_path: PathBuf,
    /// Its values (none when it does not exist).
    pub dotenv: BTreeMap<String, String>,
    /// meltano.yml as written, for its settings.
    pub(crate) yml: Value,
    file: ProjectFile,
}

/// The parts of meltano.yml (and its included files) that decide state IDs.
#[derive(Debug, Default, Deserialize)]
struct ProjectFile {
    #[serde(default)]
    environments: Vec<Environment>,
    #[serde(default)]
    plugins: BTreeMap<String, Vec<Plugin>>,
    #[serde(default)]
    jobs: Vec<Job>,
    #[serde(default)]
    env: BTreeMap<String, Value>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Environment {
    pub name: String,
    #[serde(default)]
    pub state_id_suffix: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Plugin {
    name: String,
    #[serde(default)]
    mappings: Vec<Mapping>,
    #[serde(default)]
    env: BTreeMap<String, Value>,
}

impl Plugin {
    fn maps(&self, name: &str) -> bool {
        self.mappings.iter().any(|m| m.name == name)
    }
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
    /// Meltano's `flat_args`: every task of a list split at each single
    /// space, in order. A job whose `tasks` is one string is iterated as
    /// Python iterates a string, a character at a time (so Meltano finds no
    /// block `t` for `tasks: tap target`).
    fn flat_args(&self, into: &mut Vec<String>) {
        match self {
            Tasks::One(text) => {
                for c in text.chars() {
                    match c {
                        ' ' => into.extend([String::new(), String::new()]),
                        c => into.push(c.to_string()),
                    }
                }
            }
            Tasks::Many(tasks) => tasks.iter().for_each(|t| t.split_into(into)),
        }
    }

    fn split_into(&self, into: &mut Vec<String>) {
        match self {
            Tasks::One(text) => into.extend(text.split(' ').map(str::to_string)),
            Tasks::Many(tasks) => tasks.iter().for_each(|t| t.split_into(into)),
        }
    }
}

/// What a block names, found as Meltano's `find_plugin` finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Extractor,
    Loader,
    /// A mapper, by its own name or one of its mappings': the mapper's name.
    Mapper(String),
    /// A plugin whose blocks are commands (utilities, transformers, …).
    Command,
}

impl Project {
    /// The project root Meltano finds from `cwd`: `MELTANO_PROJECT_ROOT`
    /// (relative to `cwd`), else the nearest directory upward with a meltano.yml.
    pub fn find_root(cwd: &Path, env: &Env<'_>) -> Result<PathBuf, String> {
        if let Some(dir) = env("MELTANO_PROJECT_ROOT").filter(|d| !d.is_empty()) {
            let root = cwd.join(dir);
            if !root.join("meltano.yml").is_file() {
                return Err(format!(
                    "MELTANO_PROJECT_ROOT names {}, which holds no meltano.yml",
                    root.display()
                ));
            }
            return Ok(root);
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

    /// Loads the project at `root`, its `.env` from `env_file` (relative to
    /// the root) or the root's `.env`.
    pub fn open(root: &Path, env_file: Option<&str>, env: &Env<'_>) -> Result<Project, String> {
        let meltano_yml = root.join("meltano.yml");
        let mut yml = read_yaml(&meltano_yml)?;
        // Meltano merges every included file into meltano.yml at depth:
        // mappings merged, lists extended, anything else replaced.
        let patterns: Vec<String> = yml
            .get("include_paths")
            .and_then(|p| yaml_serde::from_value(p.clone()).ok())
            .unwrap_or_default();
        for pattern in patterns {
            for path in included(root, &pattern)? {
                if path != meltano_yml {
                    deep_merge(&mut yml, read_yaml(&path)?)
                        .map_err(|why| format!("cannot include {}: {why}", path.display()))?;
                }
            }
        }
        let file: ProjectFile = yaml_serde::from_value(yml.clone())
            .map_err(|e| format!("cannot read {}: {e}", meltano_yml.display()))?;
        if let Some(bad) = file.environments.iter().find(|e| e.name.contains(':')) {
            return Err(format!(
                "environment {:?} contains ':', which Meltano refuses",
                bad.name
            ));
        }
        let dotenv_path = match env_file {
            Some(path) => root.join(path),
            None => root.join(".env"),
        };
        let dotenv = match std::fs::read(&dotenv_path) {
            Ok(bytes) => {
                let text = String::from_utf8(bytes).map_err(|_| {
                    format!(
                        "{} is not UTF-8, which Meltano needs",
                        dotenv_path.display()
                    )
                })?;
                dotenv::parse(&text, env)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(format!("cannot read {}: {e}", dotenv_path.display())),
        };
        Ok(Project {
            root: root.to_path_buf(),
            dotenv_path,
            dotenv,
            yml,
            file,
        })
    }

    /// The environment named `name`.
    pub(crate) fn environment(&self, name: &str) -> Option<&Environment> {
        self.file.environments.iter().find(|e| e.name == name)
    }

    /// meltano.yml's top-level `env:` value of `name`.
    pub(crate) fn project_env(&self, name: &str) -> Option<String> {
        self.file.env.get(name).map(scalar)
    }

    /// Whether a plugin's `env:` sets `name`: a value that reaches Meltano's
    /// expansions or not depending on the plugin it reads first.
    pub(crate) fn set_by_a_plugin(&self, name: &str) -> bool {
        self.file
            .plugins
            .values()
            .flatten()
            .any(|p| p.env.contains_key(name))
    }

    /// Block names with job names replaced by their tasks.
    pub(crate) fn expand_jobs(&self, blocks: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        for block in blocks {
            match self.job(block) {
                Some(job) => job.tasks.flat_args(&mut out),
                None => out.push(block.clone()),
            }
        }
        out
    }

    pub(crate) fn is_job(&self, name: &str) -> bool {
        self.job(name).is_some()
    }

    fn job(&self, name: &str) -> Option<&Job> {
        self.file.jobs.iter().find(|j| j.name == name)
    }

    /// The plugin `name` names, searched by type in Meltano's order; a
    /// mapping is found through its mapper, and must be one mapper's only.
    pub(crate) fn find_plugin(&self, name: &str) -> Result<Option<Found>, String> {
        for kind in PLUGIN_TYPES {
            for plugin in self.file.plugins.get(*kind).into_iter().flatten() {
                if plugin.name != name && !(*kind == "mappers" && plugin.maps(name)) {
                    continue;
                }
                return Ok(Some(match *kind {
                    "extractors" => Found::Extractor,
                    "loaders" => Found::Loader,
                    "mappers" => {
                        let mappers = self.file.plugins.get("mappers").into_iter().flatten();
                        if plugin.name != name && mappers.filter(|m| m.maps(name)).count() > 1 {
                            return Err(format!(
                                "mapping {name:?} is in several mappers, which Meltano refuses"
                            ));
                        }
                        Found::Mapper(plugin.name.clone())
                    }
                    _ => Found::Command,
                }));
            }
        }
        Ok(None)
    }

    /// Whether `name` is a plugin of `kind` ("extractors", "loaders").
    pub(crate) fn has_plugin(&self, kind: &str, name: &str) -> bool {
        self.file
            .plugins
            .get(kind)
            .is_some_and(|plugins| plugins.iter().any(|p| p.name == name))
    }
}

fn read_yaml(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let value: Value =
        yaml_serde::from_str(&text).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    // An empty file is an empty project part.
    Ok(if value.is_null() {
        Value::Mapping(Default::default())
    } else {
        value
    })
}

/// Meltano's `deep_merge` of `part` into `base`.
fn deep_merge(base: &mut Value, part: Value) -> Result<(), String> {
    let (Value::Mapping(base), Value::Mapping(part)) = (base, part) else {
        return Err("not a mapping".into());
    };
    for (key, value) in part {
        match value {
            Value::Mapping(_) => {
                let entry = base
                    .entry(key)
                    .or_insert_with(|| Value::Mapping(Default::default()));
                deep_merge(entry, value)?;
            }
            Value::Sequence(items) => {
                let entry = base
                    .entry(key)
                    .or_insert_with(|| Value::Sequence(Vec::new()));
                match entry {
                    Value::Sequence(list) => list.extend(items),
                    _ => return Err("a list where meltano.yml has no list".into()),
                }
            }
            other => {
                base.insert(key, other);
            }
        }
    }
    Ok(())
}

/// The files an `include_paths` pattern names, relative to the root.
fn included(root: &Path, pattern: &str) -> Result<Vec<PathBuf>, String> {
    let full = root.join(pattern);
    let full = full
        .to_str()
        .ok_or_else(|| format!("include_paths pattern {pattern:?} is not UTF-8"))?;
    let paths = glob::glob(full).map_err(|e| format!("include_paths pattern {pattern:?}: {e}"))?;
    let mut found = Vec::new();
    for path in paths {
        let path = path.map_err(|e| format!("include_paths pattern {pattern:?}: {e}"))?;
        if path.is_file() {
            found.push(path);
        }
    }
    found.sort();
    Ok(found)
}

/// A YAML scalar as Meltano's environment sees it: text as written.
pub(crate) fn scalar(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => yaml_serde::to_string(other)
            .map(|text| text.trim().to_string())
            .unwrap_or_default(),
    }
}
