//! Meltano's state IDs for a command line in a project.
//!
//! `meltano run` names each extract-load block set (`generate_state_id` in
//! `core/block/extract_load.py`) `{environment}:{extractor}-to-{loader}`,
//! plus `:{suffix}`; `meltano el`/`elt` use `--state-id` as it is. The
//! environment is chosen as `detect_selected_environment` in `cli/cli.py`
//! chooses it, and the blocks are read as `BlockParser` reads them.

use crate::argv::{Command, Subcommand};
use crate::expand::{expand, has_variable};
use crate::project::{Found, Project};
use crate::Env;

/// The state IDs `command` will use in `project`, in command-line order, each once.
pub fn state_ids(
    command: &Command,
    project: &Project,
    env: &Env<'_>,
) -> Result<Vec<String>, String> {
    let environment = selected_environment(command, project, env)?;
    if let Some(name) = &environment {
        if project.environment(name).is_none() {
            return Err(format!(
                "environment {name:?} is not in the project, so Meltano would refuse the run"
            ));
        }
    }
    match &command.subcommand {
        Subcommand::ExtractLoad {
            extractor,
            loader,
            state_id,
            ..
        } => {
            for (kind, name) in [("extractors", extractor), ("loaders", loader)] {
                if !project.has_plugin(kind, name) {
                    return Err(format!(
                        "{name:?} is not one of the project's {kind}, so Meltano would refuse the run"
                    ));
                }
            }
            match state_id.as_deref().filter(|id| !id.is_empty()) {
                Some(id) => Ok(vec![id.to_string()]),
                None => Err(
                    "meltano el/elt without --state-id (or MELTANO_STATE_ID) keeps its state under a \
                     new, timestamped ID each run, so no two runs share a key; give --state-id"
                        .into(),
                ),
            }
        }
        Subcommand::Run {
            state_id_suffix,
            blocks,
            ..
        } => {
            let environment = environment.ok_or(
                "meltano run has no environment here (no --environment, MELTANO_ENVIRONMENT or \
                 default_environment), so Meltano would refuse it; name the keys with --key instead",
            )?;
            let suffix = match state_id_suffix.as_deref().filter(|s| !s.is_empty()) {
                Some(suffix) => Some(suffix.to_string()),
                None => environment_suffix(project, &environment, env)?,
            };
            let pairs = extract_load_pairs(&project.expand_jobs(blocks), project)?;
            if pairs.is_empty() {
                return Err(
                    "this meltano run has no extractor-to-loader block, so no state ID".into(),
                );
            }
            let mut ids = Vec::new();
            for (extractor, loader) in pairs {
                let pipeline = format!("{extractor}-to-{loader}");
                let parts = [
                    Some(environment.as_str()),
                    Some(&*pipeline),
                    suffix.as_deref(),
                ];
                if parts.iter().flatten().any(|p| p.contains(':')) {
                    return Err(format!(
                        "a state ID part contains ':' (environment {environment:?}, \
                         {pipeline}, suffix {suffix:?}); Meltano refuses it too"
                    ));
                }
                let id = parts
                    .iter()
                    .flatten()
                    .filter(|p| !p.is_empty())
                    .copied()
                    .collect::<Vec<_>>()
                    .join(":");
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
            Ok(ids)
        }
    }
}

/// The environment Meltano selects: `--environment`, else `MELTANO_ENVIRONMENT`
/// from the process (even empty), else from `.env`; none with
/// `--no-environment` or "null"; else `default_environment`.
fn selected_environment(
    command: &Command,
    project: &Project,
    env: &Env<'_>,
) -> Result<Option<String>, String> {
    let chosen = command
        .environment
        .clone()
        .filter(|e| !e.is_empty())
        .or_else(|| env("MELTANO_ENVIRONMENT"))
        .or_else(|| project.dotenv.get("MELTANO_ENVIRONMENT").cloned());
    if command.no_environment
        || chosen
            .as_deref()
            .is_some_and(|e| e.eq_ignore_ascii_case("null"))
    {
        return Ok(None);
    }
    if let Some(chosen) = chosen.filter(|e| !e.is_empty()) {
        return Ok(Some(chosen));
    }
    let default = project.setting("default_environment", env)?;
    Ok(default.map(|s| s.value).filter(|e| !e.is_empty()))
}

/// The environment's `state_id_suffix`, expanded as Meltano's plugin
/// settings expand it: from meltano.yml's `env:`, the process environment,
/// then `.env` (an environment's own `env:` comes in only after). Refused,
/// not guessed, where Meltano's answer depends on the plugins it reads: a
/// variable a plugin's `env:` sets or one of Meltano's own (its value is
/// the first plugin's), and a suffix that holds a variable still after one
/// expansion (`\$A`, or a value with a `$` in it), since Meltano expands
/// it again for each plugin it reads.
fn environment_suffix(
    project: &Project,
    environment: &str,
    env: &Env<'_>,
) -> Result<Option<String>, String> {
    let Some(written) = project
        .environment(environment)
        .and_then(|e| e.state_id_suffix.clone())
    else {
        return Ok(None);
    };
    let strict = project.strict_env_var_mode(env);
    let refused = |why: String| {
        format!(
            "environment {environment:?}'s state_id_suffix {written:?} {why}; \
             pass --state-id-suffix or --key instead"
        )
    };
    let suffix = expand(&written, &mut |var| {
        if var == "MELTANO_ENVIRONMENT" {
            return Ok(Some(environment.to_string()));
        }
        if var.starts_with("MELTANO_") || project.set_by_a_plugin(var) {
            return Err(refused(format!(
                "takes ${var}, whose value Meltano takes from the plugin it reads first"
            )));
        }
        let value = project
            .project_env(var)
            .or_else(|| env(var))
            .or_else(|| project.dotenv.get(var).cloned());
        if value.is_none() && strict {
            return Err(refused(format!(
                "takes ${var}, which is not set, and strict_env_var_mode makes Meltano refuse that"
            )));
        }
        Ok(value)
    })?;
    if has_variable(&suffix) {
        return Err(refused(format!(
            "is {suffix:?} once expanded, which Meltano expands again for each plugin it reads"
        )));
    }
    Ok(Some(suffix).filter(|s| !s.is_empty()))
}

/// The (extractor, loader) of every extract-load block set, as Meltano's
/// `BlockParser.find_blocks` finds them: an extractor, any mappings, then a
/// loader; command blocks between sets; anything else refused.
fn extract_load_pairs(
    blocks: &[String],
    project: &Project,
) -> Result<Vec<(String, String)>, String> {
    let mut found = Vec::new();
    for block in blocks {
        // `plugin:command` (one ':'); any other name is a plugin's whole name.
        let name = match block.split(':').collect::<Vec<_>>()[..] {
            [plugin, _command] => plugin,
            _ => block.as_str(),
        };
        let plugin = project
            .find_plugin(name)?
            .ok_or_else(|| format!("block {block:?} is not a plugin or job in the project"))?;
        if project.is_job(block) {
            return Err(format!(
                "block {block:?} names both a job and a plugin, which Meltano refuses"
            ));
        }
        found.push((name.to_string(), plugin));
    }
    let mut pairs = Vec::new();
    let mut at = 0;
    while at < found.len() {
        let (name, plugin) = &found[at];
        match plugin {
            Found::Extractor => {}
            Found::Command => {
                at += 1;
                continue;
            }
            _ => return Err(format!("block {name:?} cannot start a block set")),
        }
        let mut next = at + 1;
        loop {
            match found.get(next) {
                Some((_, Found::Loader)) => break,
                Some((_, Found::Mapper(mapper))) => {
                    // Meltano compares the mapper with the block name at the
                    // set's *relative* index (block_parser.py): so it refuses a
                    // mapper named by its own name only in the first set.
                    let relative = next - at;
                    if found.get(relative).is_some_and(|(n, p)| {
                        matches!(p, Found::Mapper(_)) && n == mapper
                    }) {
                        return Err(format!(
                            "mapper {mapper:?} is named by its plugin name, not a mapping's: \
                             Meltano refuses it"
                        ));
                    }
                    next += 1;
                }
                _ => {
                    return Err(format!(
                        "extractor {name:?} is not followed by a loader (Meltano would refuse this run)"
                    ))
                }
            }
        }
        pairs.push((name.clone(), found[next].0.clone()));
        at = next + 1;
    }
    Ok(pairs)
}
