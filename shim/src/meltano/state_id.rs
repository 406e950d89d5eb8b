//! Meltano's state-ID rule (`generate_state_id` in
//! `core/block/extract_load.py`): each extract-load block set is named
//! `{environment}:{extractor}-to-{loader}`, plus `:{suffix}` when there is one.

use super::argv::MeltanoRun;
use super::project::{Kind, Project};

/// The state ID of every extract-load block set of `run` in `project`, in
/// command-line order, each once.
pub fn state_ids(
    run: &MeltanoRun,
    project: &Project,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>, String> {
    // The environment: `--environment`, `MELTANO_ENVIRONMENT`, then `default_environment`.
    let environment = if run.no_environment {
        None
    } else {
        run.environment
            .clone()
            .or_else(|| env("MELTANO_ENVIRONMENT").filter(|e| !e.is_empty()))
            .or(project.default_environment.clone())
    };
    let environment = environment.ok_or(
        "meltano run has no environment here, so it keeps no state and has no state ID; \
         name the keys with --key instead",
    )?;
    // The suffix: `--state-id-suffix`, `MELTANO_RUN_STATE_ID_SUFFIX`, then the environment's.
    let suffix = match &run.state_id_suffix {
        Some(suffix) => Some(suffix.clone()),
        None => env("MELTANO_RUN_STATE_ID_SUFFIX"),
    }
    .filter(|s| !s.is_empty())
    .or_else(|| {
        project
            .state_id_suffix(&environment)
            .map(|s| expand(s, env))
    })
    .filter(|s| !s.is_empty());

    let blocks = project.expand_jobs(&run.blocks);
    let pairs = extract_load_pairs(&blocks, project)?;
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
    Ok(state_ids)
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

/// The (extractor, loader) name of every extract-load block set, as Meltano's
/// block parser finds them: an extractor, then mappers, then a loader.
fn extract_load_pairs(
    blocks: &[String],
    project: &Project,
) -> Result<Vec<(String, String)>, String> {
    let kinds = blocks
        .iter()
        .map(|block| {
            let name = block.split(':').next().unwrap_or(block);
            project
                .kind_of(name)
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
    use super::super::test_project::state_ids;
    use super::expand;

    #[test]
    fn a_plain_run_uses_the_default_environment() {
        assert_eq!(
            state_ids("meltano run tap-smoke-test target-jsonl", &[]),
            ["dev:tap-smoke-test-to-target-jsonl"]
        );
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
    fn variables_expand_like_meltano() {
        let env = |name: &str| (name == "A").then(|| "x".to_string());
        assert_eq!(expand("${A}-$A-$B-${B}-$", &env), "x-x---$");
    }
}
