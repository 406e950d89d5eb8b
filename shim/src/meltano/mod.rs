//! `runlock run --meltano`: the state IDs a `meltano run` command line will
//! write, derived the way Meltano derives them, so that runlock locks exactly
//! the keys Meltano's own duplicate-run check would look at: the command line
//! read as Meltano reads it (`argv`), its project's meltano.yml (`project`),
//! and Meltano's naming rule over the two (`state_id`).
//!
//! Meltano (`generate_state_id` in `core/block/extract_load.py`) names each
//! extract-load block `{environment}:{extractor}-to-{loader}`, plus
//! `:{suffix}` from `--state-id-suffix`, `MELTANO_RUN_STATE_ID_SUFFIX` or the
//! environment's `state_id_suffix`. Blocks are plugin names (or job names,
//! expanded to their tasks); a block set is an extractor, any mappers, then a
//! loader. The environment comes from `--environment`, `MELTANO_ENVIRONMENT`
//! or `default_environment`.

mod argv;
mod project;
mod state_id;
#[cfg(test)]
mod test_project;

use std::path::Path;

/// What a `meltano run` command line asks runlock for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The state ID of every extract-load block, in command-line order.
    pub state_ids: Vec<String>,
    /// `--force`/`-f` or `MELTANO_RUN_FORCE`: Meltano's own bypass, taken as runlock's.
    pub force: bool,
}

/// The state IDs and force flag of `command`, a `meltano ... run ...` command line.
pub fn invocation(
    command: &[String],
    env: &dyn Fn(&str) -> Option<String>,
    cwd: &Path,
) -> Result<Invocation, String> {
    let run = argv::parse_meltano_run(command)?;
    let project = project::Project::find(run.cwd.as_deref(), env, cwd)?;
    let state_ids = state_id::state_ids(&run, &project, env)?;
    let force = run.force || env("MELTANO_RUN_FORCE").is_some_and(|v| truthy(&v));
    Ok(Invocation { state_ids, force })
}

/// Click's reading of a boolean variable.
fn truthy(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "t" | "yes" | "y" | "on"
    )
}

#[cfg(test)]
mod tests {
    use super::test_project::ids;

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
}
