//! A meltano.yml for the unit tests, and the state IDs a command line gets
//! in it (run from a subdirectory, as Meltano walks up to the project).

use super::{invocation, Invocation};
use std::collections::BTreeMap;

/// A project with four environments, extractors, loaders (one inheriting),
/// a mapper with a mapping, a utility, two jobs and an included file.
const PROJECT: &str = r#"
version: 1
default_environment: dev
project_id: 5a1b2c3d-0000-4000-8000-000000000000
include_paths:
- ./extra/*.meltano.yml
environments:
- name: dev
- name: staging
  state_id_suffix: ${RUN_SUFFIX}
- name: prod
  state_id_suffix: blue
- name: canary
  state_id_suffix: $TAP_VAR
plugins:
  extractors:
  - name: tap-smoke-test
    namespace: tap_smoke_test
    pip_url: git+https://github.com/meltano/tap-smoke-test.git
    executable: tap-smoke-test
  - name: tap-gitlab
    variant: meltanolabs
    pip_url: meltanolabs-tap-gitlab
    env:
      TAP_VAR: from-the-tap
  loaders:
  - name: target-jsonl
    variant: andyh1203
    pip_url: target-jsonl
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
"#;

/// Included by PROJECT's include_paths.
const EXTRA: &str = r#"
plugins:
  loaders:
  - name: target-postgres
    inherit_from: target-jsonl
jobs:
- name: smoke
  tasks:
  - tap-smoke-test target-jsonl
# One string, not a list: Meltano reads it a character at a time.
- name: stringy
  tasks: tap-smoke-test target-jsonl
"#;

pub fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("meltano.yml"), PROJECT).expect("write");
    std::fs::create_dir(dir.path().join("extra")).expect("mkdir");
    std::fs::write(dir.path().join("extra/loaders.meltano.yml"), EXTRA).expect("write");
    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    dir
}

/// The invocation of `line` in the project, with `vars` as the process
/// environment; a `DOTENV` var is written as the project's `.env` instead.
pub fn ids(line: &str, vars: &[(&str, &str)]) -> Result<Invocation, String> {
    let dir = project();
    let command: Vec<String> = line.split_whitespace().map(str::to_string).collect();
    let mut vars: BTreeMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Some(dotenv) = vars.remove("DOTENV") {
        std::fs::write(dir.path().join(".env"), dotenv).expect("write");
    }
    let env = move |name: &str| vars.get(name).cloned();
    invocation(&command, &env, &dir.path().join("sub"))
}

pub fn state_ids(line: &str, vars: &[(&str, &str)]) -> Vec<String> {
    ids(line, vars).expect("derives").state_ids
}
