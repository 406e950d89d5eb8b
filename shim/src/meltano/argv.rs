//! A `meltano ... run ...` command line read as Meltano's own CLI reads it:
//! the global options, the `run` subcommand's options and its blocks. An
//! option runlock does not know is refused, since it might change the state IDs.

use std::collections::BTreeMap;
use std::path::Path;

/// What a `meltano run` command line says that bears on its state IDs.
#[derive(Debug, Default)]
pub struct MeltanoRun {
    /// `--cwd`: the project directory.
    pub cwd: Option<String>,
    /// `--environment`.
    pub environment: Option<String>,
    /// `--no-environment`.
    pub no_environment: bool,
    /// `run --state-id-suffix`.
    pub state_id_suffix: Option<String>,
    /// `run --force` or `run -f`.
    pub force: bool,
    /// The blocks to run (plugin or job names), in order.
    pub blocks: Vec<String>,
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

/// Reads `command`, a `meltano ... run ...` command line (the `meltano`
/// executable may come after a wrapper such as `env` and may have a directory).
pub fn parse_meltano_run(command: &[String]) -> Result<MeltanoRun, String> {
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
    let owned = |value: Option<&&str>| value.map(|v| v.to_string());
    Ok(MeltanoRun {
        cwd: owned(global.values.get("--cwd")),
        environment: owned(global.values.get("--environment")),
        no_environment: global.flags.contains(&"--no-environment"),
        state_id_suffix: owned(run.values.get("--state-id-suffix")),
        force: run.flags.iter().any(|f| *f == "--force" || *f == "-f"),
        blocks: run.rest.iter().map(|b| b.to_string()).collect(),
    })
}

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

#[cfg(test)]
mod tests {
    use super::super::test_project::{ids, state_ids};

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
}
