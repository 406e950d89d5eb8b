//! A Meltano project read as Meltano reads it, for runlock: the state IDs a
//! `meltano run|el|elt` command line will use (`runlock run --meltano`) and
//! the project's settings with where each came from (`runlockd
//! check-config --from-meltano`). Meltano 4.4's own code is the reference:
//! each module names the function it follows, and tests/meltano/differential
//! compares the two on generated projects. What runlock cannot know for
//! certain is refused with the input named, never guessed.

mod argv;
mod dotenv;
mod expand;
mod project;
mod settings;
mod state_id;
#[cfg(test)]
mod test_project;

pub use project::Project;
pub use settings::{variable, Setting, Source};

use std::path::Path;

/// The process environment, looked up by name.
pub type Env<'a> = dyn Fn(&str) -> Option<String> + 'a;

/// What a meltano command line asks runlock for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The state ID of every extract-load block, in command-line order.
    pub state_ids: Vec<String>,
    /// `--force`/`-f` (or `MELTANO_RUN_FORCE`): Meltano's own bypass, taken as runlock's.
    pub force: bool,
}

/// The state IDs and force flag of `command`, a meltano command line run
/// from `cwd` with the variables `env` looks up.
pub fn invocation(command: &[String], env: &Env<'_>, cwd: &Path) -> Result<Invocation, String> {
    let parsed = argv::parse(command, env)?;
    // An `env A=B meltano …` wrapper's variables are Meltano's too.
    let env = |name: &str| argv::wrapped(&parsed.assignments, env, name);
    let cwd = match &parsed.cwd {
        Some(dir) => {
            let dir = cwd.join(dir);
            if !dir.is_dir() {
                return Err(format!(
                    "meltano --cwd {} is not a directory, so Meltano would refuse it",
                    dir.display()
                ));
            }
            dir
        }
        None => cwd.to_path_buf(),
    };
    let root = Project::find_root(&cwd, &env)?;
    let project = Project::open(&root, parsed.env_file.as_deref(), &env)?;
    let state_ids = state_id::state_ids(&parsed, &project, &env)?;
    let force = match parsed.subcommand {
        argv::Subcommand::Run { force, .. } | argv::Subcommand::ExtractLoad { force, .. } => force,
    };
    Ok(Invocation { state_ids, force })
}

#[cfg(test)]
mod tests {
    use super::invocation;
    use super::test_project::{ids, project, state_ids};

    #[test]
    fn a_plain_run_uses_the_default_environment() {
        assert_eq!(
            state_ids("meltano run tap-smoke-test target-jsonl", &[]),
            ["dev:tap-smoke-test-to-target-jsonl"]
        );
    }

    #[test]
    fn the_environment_comes_from_the_flag_then_the_process_then_dotenv() {
        let line = "/opt/meltano/bin/meltano --environment=prod run tap-gitlab target-jsonl";
        assert_eq!(
            state_ids(line, &[]),
            ["prod:tap-gitlab-to-target-jsonl:blue"]
        );
        let env = [("MELTANO_ENVIRONMENT", "staging"), ("RUN_SUFFIX", "green")];
        assert_eq!(
            state_ids("meltano run tap-gitlab target-jsonl", &env),
            ["staging:tap-gitlab-to-target-jsonl:green"]
        );
        // .env's MELTANO_ENVIRONMENT, as `meltano environment`/`config set` users write it.
        let env = [("DOTENV", "MELTANO_ENVIRONMENT='prod'\n")];
        assert_eq!(
            state_ids("meltano run tap-gitlab target-jsonl", &env),
            ["prod:tap-gitlab-to-target-jsonl:blue"]
        );
        // The process wins over .env, even set to nothing (then the default).
        let env = [
            ("DOTENV", "MELTANO_ENVIRONMENT=prod\n"),
            ("MELTANO_ENVIRONMENT", ""),
        ];
        assert_eq!(
            state_ids("meltano run tap-gitlab target-jsonl", &env),
            ["dev:tap-gitlab-to-target-jsonl"]
        );
        for line in [
            "meltano --no-environment run tap-gitlab target-jsonl",
            "meltano --environment NULL run tap-gitlab target-jsonl",
        ] {
            let err = ids(line, &[]).expect_err(line);
            assert!(err.contains("no environment"), "{err}");
        }
    }

    #[test]
    fn the_suffix_comes_from_the_flag_then_the_variable_then_the_environment() {
        let line = "meltano --environment prod run --state-id-suffix=a tap-gitlab target-jsonl";
        assert_eq!(state_ids(line, &[]), ["prod:tap-gitlab-to-target-jsonl:a"]);
        let env = [("MELTANO_RUN_STATE_ID_SUFFIX", "b")];
        let line = "meltano --environment prod run tap-gitlab target-jsonl";
        assert_eq!(state_ids(line, &env), ["prod:tap-gitlab-to-target-jsonl:b"]);
        // Click reads the variable from the process only, not from .env.
        let env = [("DOTENV", "MELTANO_RUN_STATE_ID_SUFFIX=c\n")];
        assert_eq!(
            state_ids(line, &env),
            ["prod:tap-gitlab-to-target-jsonl:blue"]
        );
        // An unset variable in the environment's suffix leaves no suffix; .env sets it.
        let line = "meltano --environment staging run tap-gitlab target-jsonl";
        assert_eq!(state_ids(line, &[]), ["staging:tap-gitlab-to-target-jsonl"]);
        let env = [("DOTENV", "RUN_SUFFIX=\"d\"\n")];
        assert_eq!(
            state_ids(line, &env),
            ["staging:tap-gitlab-to-target-jsonl:d"]
        );
    }

    #[test]
    fn a_suffix_whose_value_depends_on_the_plugins_meltano_reads_is_refused() {
        let line = "meltano --environment canary run tap-gitlab target-jsonl";
        let err = ids(line, &[("TAP_VAR", "x")]).expect_err("refused");
        assert!(err.contains("$TAP_VAR"), "{err}");
        // Meltano expands the suffix again for each plugin it reads.
        let line = "meltano --environment staging run tap-gitlab target-jsonl";
        let err = ids(line, &[("RUN_SUFFIX", "$OTHER")]).expect_err("refused");
        assert!(err.contains("expands again"), "{err}");
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
        assert_eq!(
            state_ids("meltano run nightly smoke", &[]),
            [
                "dev:tap-gitlab-to-target-postgres",
                "dev:tap-smoke-test-to-target-jsonl"
            ]
        );
    }

    #[test]
    fn el_and_elt_lock_their_state_id() {
        let line = "meltano elt tap-gitlab target-jsonl --state-id nightly-gitlab";
        assert_eq!(state_ids(line, &[]), ["nightly-gitlab"]);
        let env = [("MELTANO_STATE_ID", "from-var")];
        assert_eq!(
            state_ids("meltano el tap-gitlab target-jsonl", &env),
            ["from-var"]
        );
        let err = ids("meltano el tap-gitlab target-jsonl", &[]).expect_err("ephemeral");
        assert!(err.contains("--state-id"), "{err}");
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
            (
                "meltano run tap-gitlab target-jsonl target-postgres",
                "cannot start",
            ),
            ("meltano run meltano-map-transformer", "cannot start"),
            (
                "meltano run tap-gitlab meltano-map-transformer target-jsonl",
                "mapping",
            ),
            ("meltano run dbt-postgres:run", "no extractor-to-loader"),
            ("meltano run stringy", "block \"t\""),
            (
                "meltano --environment nope run tap-gitlab target-jsonl",
                "not in the project",
            ),
            (
                "meltano run --state-id-suffix a:b tap-gitlab target-jsonl",
                "':'",
            ),
            ("meltano elt tap-gitlab tap-gitlab --state-id x", "loaders"),
        ] {
            let err = ids(line, &[]).expect_err(line);
            assert!(err.contains(why), "{line}: {err}");
        }
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
        let mut with_cwd = vec![
            "meltano".to_string(),
            "--cwd".into(),
            dir.path().display().to_string(),
        ];
        with_cwd.extend(command[1..].iter().cloned());
        let found = invocation(&with_cwd, &none, elsewhere.path()).expect("found by --cwd");
        assert_eq!(found.state_ids, ["dev:tap-smoke-test-to-target-jsonl"]);
    }
}
