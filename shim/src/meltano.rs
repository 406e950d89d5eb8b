//! `runlock run --meltano`: the state IDs a `meltano run` command line will
//! write, derived the way Meltano derives them, so that runlock locks exactly
//! the keys Meltano's own duplicate-run check would look at.
//!
//! Meltano (`generate_state_id` in `core/block/extract_load.py`) names each
//! extract-load block `{environment}:{extractor}-to-{loader}`, plus
//! `:{suffix}` from `--state-id-suffix`, `MELTANO_RUN_STATE_ID_SUFFIX` or the
//! environment's `state_id_suffix`. Blocks are plugin names (or job names,
//! expanded to their tasks); a block set is an extractor, any mappers, then a
//! loader. The environment comes from `--environment`, `MELTANO_ENVIRONMENT`
//! or `default_environment`.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What a `meltano run` command line asks runlock for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The state ID of every extract-load block, in command-line order.
    pub state_ids: Vec<String>,
    /// `--force`/`-f` or `MELTANO_RUN_FORCE`: Meltano's own bypass, taken as runlock's.
    pub force: bool,
}

/// The parts of meltano.yml that decide state IDs.
#[derive(Debug, Default, Deserialize)]
struct Project {
    #[serde(default)]
    default_environment: Option<String>,
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

/// Meltano's global options that take a value (before the subcommand).
const GLOBAL_WITH_VALUE: &[&str] = &[
    "--environment",
    "--cwd",
    "--log-level",
    "--log-config",
    "--log-format",
];
const GLOBAL_FLAGS: &[&str] = &["--no-environment", "-v", "--verbose"];
/// `meltano run`'s options that take a value.
const RUN_WITH_VALUE: &[&str] = &[
    "--state-id-suffix",
    "--state-strategy",
    "--run-id",
    "--timeout",
];
const RUN_FLAGS: &[&str] = &[
    "--dry-run",
    "--full-refresh",
    "--refresh-catalog",
    "--no-state-update",
    "--force",
    "-f",
    "--merge-state",
    "--install",
    "--no-install",
    "--only-install",
];

/// One parsed option list: values by option name, flags seen, plain arguments.
#[derive(Debug, Default)]
struct Parsed<'a> {
    values: BTreeMap<&'a str, &'a str>,
    flags: Vec<&'a str>,
    rest: Vec<&'a str>,
}

/// Parses `args` up to the first plain argument (`stop_at_plain`) or to the end.
fn parse<'a>(
    args: &'a [String],
    with_value: &[&'static str],
    flags: &[&'static str],
    stop_at_plain: bool,
    what: &str,
) -> Result<Parsed<'a>, String> {
    let mut parsed = Parsed::default();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        i += 1;
        if arg == "--" {
            parsed.rest.extend(args[i..].iter().map(String::as_str));
            break;
        }
        if !arg.starts_with('-') || arg == "-" {
            parsed.rest.push(arg);
            if stop_at_plain {
                parsed.rest.extend(args[i..].iter().map(String::as_str));
                break;
            }
            continue;
        }
        if let Some((name, value)) = arg.split_once('=') {
            if let Some(known) = with_value.iter().find(|o| **o == name) {
                parsed.values.insert(known, value);
                continue;
            }
        }
        if let Some(known) = with_value.iter().find(|o| **o == arg) {
            let value = args
                .get(i)
                .ok_or_else(|| format!("{what} option {arg} needs a value"))?;
            parsed.values.insert(known, value);
            i += 1;
        } else if let Some(known) = flags.iter().find(|o| **o == arg) {
            parsed.flags.push(known);
        } else {
            return Err(format!(
                "{what} option {arg:?} is not one runlock knows; pass the state IDs with --key instead"
            ));
        }
    }
    Ok(parsed)
}

/// Click's reading of a boolean variable.
fn truthy(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "t" | "yes" | "y" | "on"
    )
}

/// `$VAR` and `${VAR}` replaced from `env` (unset ones become empty), as
/// Meltano expands `state_id_suffix`.
fn expand(text: &str, env: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, used) = if let Some(braced) = after.strip_prefix('{') {
            match braced.find('}') {
                Some(end) => (&braced[..end], end + 2),
                None => ("", 0),
            }
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        if name.is_empty() {
            out.push('$');
            rest = after;
        } else {
            out.push_str(&env(name).unwrap_or_default());
            rest = &after[used..];
        }
    }
    out.push_str(rest);
    out
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

/// The state IDs and force flag of `command`, a `meltano ... run ...` command line.
pub fn invocation(
    command: &[String],
    env: &dyn Fn(&str) -> Option<String>,
    cwd: &Path,
) -> Result<Invocation, String> {
    let start = command
        .iter()
        .position(|arg| Path::new(arg).file_name().is_some_and(|n| n == "meltano"))
        .ok_or("--meltano expects a meltano command: -- meltano run TAP TARGET ...")?;
    let global = parse(
        &command[start + 1..],
        GLOBAL_WITH_VALUE,
        GLOBAL_FLAGS,
        true,
        "meltano",
    )?;
    let (subcommand, run_args) = global
        .rest
        .split_first()
        .ok_or("--meltano expects `meltano run ...`, but no subcommand was given")?;
    if *subcommand != "run" {
        return Err(format!(
            "--meltano expects `meltano run ...`, not `meltano {subcommand}`"
        ));
    }
    let run_args: Vec<String> = run_args.iter().map(|a| a.to_string()).collect();
    let run = parse(&run_args, RUN_WITH_VALUE, RUN_FLAGS, false, "meltano run")?;

    let root = project_root(global.values.get("--cwd").copied(), env, cwd)?;
    let file = root.join("meltano.yml");
    let text = std::fs::read_to_string(&file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let project: Project =
        yaml_serde::from_str(&text).map_err(|e| format!("cannot read {}: {e}", file.display()))?;

    let environment = if global.flags.contains(&"--no-environment") {
        None
    } else {
        global
            .values
            .get("--environment")
            .map(|e| e.to_string())
            .or_else(|| env("MELTANO_ENVIRONMENT").filter(|e| !e.is_empty()))
            .or(project.default_environment.clone())
    };
    let environment = environment.ok_or(
        "meltano run has no environment here, so it keeps no state and has no state ID; \
         name the keys with --key instead",
    )?;
    let suffix = match run.values.get("--state-id-suffix") {
        Some(suffix) => Some(suffix.to_string()),
        None => env("MELTANO_RUN_STATE_ID_SUFFIX"),
    }
    .filter(|s| !s.is_empty())
    .or_else(|| {
        project
            .environments
            .iter()
            .find(|e| e.name == environment)
            .and_then(|e| e.state_id_suffix.as_deref())
            .map(|s| expand(s, env))
    })
    .filter(|s| !s.is_empty());

    let blocks = expand_jobs(&run.rest, &project.jobs);
    let pairs = extract_load_pairs(&blocks, &project.plugins)?;
    if pairs.is_empty() {
        return Err("this meltano run has no extractor-to-loader block, so no state ID".into());
    }
    let mut state_ids = Vec::new();
    for (extractor, loader) in pairs {
        let parts = [
            Some(environment.as_str()),
            Some(&*format!("{extractor}-to-{loader}")),
            suffix.as_deref(),
        ];
        if parts.iter().flatten().any(|p| p.contains(':')) {
            return Err(format!(
                "a state ID part contains ':' (environment {environment:?}, \
                 {extractor}-to-{loader}, suffix {suffix:?}); Meltano refuses it too"
            ));
        }
        let id = parts
            .iter()
            .flatten()
            .copied()
            .collect::<Vec<_>>()
            .join(":");
        if !state_ids.contains(&id) {
            state_ids.push(id);
        }
    }
    let force = run.flags.iter().any(|f| *f == "--force" || *f == "-f")
        || env("MELTANO_RUN_FORCE").is_some_and(|v| truthy(&v));
    Ok(Invocation { state_ids, force })
}

/// Block names with job names replaced by their tasks.
fn expand_jobs(blocks: &[&str], jobs: &[Job]) -> Vec<String> {
    let mut out = Vec::new();
    for block in blocks {
        match jobs.iter().find(|j| j.name == *block) {
            Some(job) => job.tasks.flat_args(&mut out),
            None => out.push(block.to_string()),
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Extractor,
    Mapper,
    Loader,
    Other,
}

fn kind_of(name: &str, plugins: &Plugins) -> Option<Kind> {
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

/// The (extractor, loader) name of every extract-load block set, as Meltano's
/// block parser finds them: an extractor, then mappers, then a loader.
fn extract_load_pairs(
    blocks: &[String],
    plugins: &Plugins,
) -> Result<Vec<(String, String)>, String> {
    let kinds = blocks
        .iter()
        .map(|block| {
            let name = block.split(':').next().unwrap_or(block);
            kind_of(name, plugins)
                .map(|kind| (name.to_string(), kind))
                .ok_or_else(|| format!("block {block:?} is not a plugin or job in meltano.yml"))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut pairs = Vec::new();
    let mut i = 0;
    while i < kinds.len() {
        let (name, kind) = &kinds[i];
        i += 1;
        if *kind != Kind::Extractor {
            continue;
        }
        loop {
            match kinds.get(i) {
                Some((_, Kind::Mapper)) => i += 1,
                Some((loader, Kind::Loader)) => {
                    pairs.push((name.clone(), loader.clone()));
                    i += 1;
                    break;
                }
                _ => {
                    return Err(format!(
                        "extractor {name:?} is not followed by a loader (Meltano would refuse this run)"
                    ))
                }
            }
        }
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROJECT: &str = r#"
version: 1
default_environment: dev
project_id: 5a1b2c3d-0000-4000-8000-000000000000
environments:
- name: dev
- name: staging
  state_id_suffix: ${RUN_SUFFIX}
- name: prod
  state_id_suffix: blue
plugins:
  extractors:
  - name: tap-smoke-test
    namespace: tap_smoke_test
    pip_url: git+https://github.com/meltano/tap-smoke-test.git
    executable: tap-smoke-test
  - name: tap-gitlab
    variant: meltanolabs
    pip_url: meltanolabs-tap-gitlab
  loaders:
  - name: target-jsonl
    variant: andyh1203
    pip_url: target-jsonl
  - name: target-postgres
    inherit_from: target-jsonl
  mappers:
  - name: meltano-map-transformer
    pip_url: meltano-map-transform
    mappings:
    - name: hash-emails
      config: {}
  utilities:
  - name: dbt-postgres
    pip_url: dbt-postgres
jobs:
- name: nightly
  tasks:
  - tap-gitlab hash-emails target-postgres
  - dbt-postgres:run
- name: smoke
  tasks: tap-smoke-test target-jsonl
"#;

    fn project() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("meltano.yml"), PROJECT).expect("write");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        dir
    }

    fn ids(line: &str, vars: &[(&str, &str)]) -> Result<Invocation, String> {
        let dir = project();
        let command: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        let vars: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env = move |name: &str| vars.get(name).cloned();
        invocation(&command, &env, &dir.path().join("sub"))
    }

    fn state_ids(line: &str, vars: &[(&str, &str)]) -> Vec<String> {
        ids(line, vars).expect("derives").state_ids
    }

    #[test]
    fn a_plain_run_uses_the_default_environment() {
        assert_eq!(
            state_ids("meltano run tap-smoke-test target-jsonl", &[]),
            ["dev:tap-smoke-test-to-target-jsonl"]
        );
    }

    #[test]
    fn the_environment_comes_from_the_flag_then_the_variable() {
        let line = "/opt/meltano/bin/meltano --environment=prod run tap-gitlab target-jsonl";
        assert_eq!(
            state_ids(line, &[]),
            ["prod:tap-gitlab-to-target-jsonl:blue"]
        );
        let line = "meltano --log-level debug --environment prod run tap-gitlab target-jsonl";
        assert_eq!(
            state_ids(line, &[]),
            ["prod:tap-gitlab-to-target-jsonl:blue"]
        );
        let env = [("MELTANO_ENVIRONMENT", "staging"), ("RUN_SUFFIX", "green")];
        assert_eq!(
            state_ids("meltano run tap-gitlab target-jsonl", &env),
            ["staging:tap-gitlab-to-target-jsonl:green"]
        );
        assert!(ids("meltano --no-environment run tap-gitlab target-jsonl", &[]).is_err());
    }

    #[test]
    fn the_suffix_comes_from_the_flag_then_the_variable_then_the_environment() {
        let line = "meltano --environment prod run --state-id-suffix=a tap-gitlab target-jsonl";
        assert_eq!(state_ids(line, &[]), ["prod:tap-gitlab-to-target-jsonl:a"]);
        let env = [("MELTANO_RUN_STATE_ID_SUFFIX", "b")];
        let line = "meltano --environment prod run tap-gitlab target-jsonl";
        assert_eq!(state_ids(line, &env), ["prod:tap-gitlab-to-target-jsonl:b"]);
        // An unset variable in the environment's suffix leaves no suffix.
        let line = "meltano --environment staging run tap-gitlab target-jsonl";
        assert_eq!(state_ids(line, &[]), ["staging:tap-gitlab-to-target-jsonl"]);
    }

    #[test]
    fn every_block_set_gets_an_id_and_other_blocks_none() {
        let line = "meltano run --full-refresh tap-gitlab hash-emails target-postgres \
                    dbt-postgres:run tap-smoke-test target-jsonl";
        assert_eq!(
            state_ids(line, &[]),
            [
                "dev:tap-gitlab-to-target-postgres",
                "dev:tap-smoke-test-to-target-jsonl"
            ]
        );
    }

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
    fn force_comes_from_the_flag_or_the_variable() {
        let line = "meltano run tap-smoke-test target-jsonl";
        assert!(!ids(line, &[]).expect("ok").force);
        assert!(
            ids("meltano run -f tap-smoke-test target-jsonl", &[])
                .expect("ok")
                .force
        );
        assert!(
            ids(line, &[("MELTANO_RUN_FORCE", "true")])
                .expect("ok")
                .force
        );
        assert!(!ids(line, &[("MELTANO_RUN_FORCE", "0")]).expect("ok").force);
    }

    #[test]
    fn what_meltano_would_refuse_is_refused() {
        for (line, why) in [
            ("meltano run tap-nope target-jsonl", "not a plugin"),
            (
                "meltano run tap-gitlab dbt-postgres",
                "not followed by a loader",
            ),
            ("meltano run dbt-postgres:run", "no extractor-to-loader"),
            ("meltano elt tap-gitlab target-jsonl", "not `meltano elt`"),
            (
                "meltano run --bogus tap-gitlab target-jsonl",
                "not one runlock knows",
            ),
            ("sh -c true", "expects a meltano command"),
        ] {
            let err = ids(line, &[]).expect_err(line);
            assert!(err.contains(why), "{line}: {err}");
        }
        let err = ids(
            "meltano run --state-id-suffix a:b tap-gitlab target-jsonl",
            &[],
        )
        .expect_err("colon");
        assert!(err.contains("':'"), "{err}");
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

    #[test]
    fn variables_expand_like_meltano() {
        let env = |name: &str| (name == "A").then(|| "x".to_string());
        assert_eq!(expand("${A}-$A-$B-${B}-$", &env), "x-x---$");
    }
}
