//! A meltano.yml for the unit tests of every part of `--meltano`, and the
//! state IDs a command line gets in it.

use super::{invocation, Invocation};
use std::collections::BTreeMap;

/// A project with three environments, extractors, loaders, a mapper with a
/// mapping, a utility and two jobs.
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

pub fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("meltano.yml"), PROJECT).expect("write");
    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    dir
}

pub fn ids(line: &str, vars: &[(&str, &str)]) -> Result<Invocation, String> {
    let dir = project();
    let command: Vec<String> = line.split_whitespace().map(str::to_string).collect();
    let vars: BTreeMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let env = move |name: &str| vars.get(name).cloned();
    invocation(&command, &env, &dir.path().join("sub"))
}

pub fn state_ids(line: &str, vars: &[(&str, &str)]) -> Vec<String> {
    ids(line, vars).expect("derives").state_ids
}
