//! A `meltano … run|el|elt …` command line read as Meltano's CLI (Click)
//! reads it: long options matched with `_` read as `-`, `--opt=value`,
//! short flags in clusters (`-fs X`), options among `run`'s blocks, `--`,
//! and each option's variable (`MELTANO_RUN_FORCE`, …) where the option is
//! not given. An option runlock does not know is refused, since it might
//! change the state IDs.

use crate::Env;
use std::path::Path;

/// What a meltano command line says that bears on its state IDs.
#[derive(Debug, Default)]
pub struct Command {
    /// `NAME=VALUE` words of an `env` wrapper before `meltano`.
    pub assignments: Vec<(String, String)>,
    /// `--cwd`.
    pub cwd: Option<String>,
    /// `--environment`.
    pub environment: Option<String>,
    /// `--no-environment`.
    pub no_environment: bool,
    /// `--env-file`.
    pub env_file: Option<String>,
    pub subcommand: Subcommand,
}

#[derive(Debug)]
pub enum Subcommand {
    /// `meltano run`.
    Run {
        /// `--state-id-suffix` (or its variable).
        state_id_suffix: Option<String>,
        /// `--force`/`-f` (or its variable).
        force: bool,
        /// The blocks to run (plugin or job names), in order.
        blocks: Vec<String>,
    },
    /// `meltano el` or `meltano elt`.
    ExtractLoad {
        extractor: String,
        loader: String,
        /// `--state-id` (or `MELTANO_STATE_ID`).
        state_id: Option<String>,
        force: bool,
    },
}

impl Default for Subcommand {
    fn default() -> Self {
        Subcommand::Run {
            state_id_suffix: None,
            force: false,
            blocks: Vec::new(),
        }
    }
}

/// One option of a Click command: its names, whether it takes a value, and
/// the variable Click reads when it is not given.
struct Opt {
    names: &'static [&'static str],
    takes_value: bool,
    variable: Option<&'static str>,
}

const fn flag(names: &'static [&'static str], variable: Option<&'static str>) -> Opt {
    Opt {
        names,
        takes_value: false,
        variable,
    }
}

const fn valued(names: &'static [&'static str], variable: Option<&'static str>) -> Opt {
    Opt {
        names,
        takes_value: true,
        variable,
    }
}

/// `meltano`'s own options (Meltano 4.4's `cli`).
const GLOBAL: &[Opt] = &[
    valued(&["--log-level"], None),
    valued(&["--log-format"], None),
    valued(&["--log-config"], None),
    valued(&["--environment"], None),
    flag(&["--no-environment"], None),
    valued(&["--cwd"], None),
    valued(&["--env-file"], None),
    flag(&["--version"], None),
    flag(&["--help"], None),
];

const RUN: &[Opt] = &[
    flag(&["--dry-run"], None),
    flag(&["--full-refresh"], Some("MELTANO_RUN_FULL_REFRESH")),
    flag(&["--refresh-catalog"], Some("MELTANO_RUN_REFRESH_CATALOG")),
    flag(&["--no-state-update"], Some("MELTANO_RUN_NO_STATE_UPDATE")),
    flag(&["--force", "-f"], Some("MELTANO_RUN_FORCE")),
    valued(&["--state-id-suffix"], Some("MELTANO_RUN_STATE_ID_SUFFIX")),
    flag(&["--merge-state"], None),
    valued(&["--state-strategy"], Some("MELTANO_RUN_STATE_STRATEGY")),
    valued(&["--run-id"], Some("MELTANO_RUN_ID")),
    valued(&["--timeout"], Some("MELTANO_RUN_TIMEOUT")),
    flag(&["--install"], None),
    flag(&["--no-install"], None),
    flag(&["--only-install"], None),
    valued(&["--database-uri"], None),
    flag(&["--help"], None),
];

/// `meltano el` and `meltano elt` (which adds `--transform`).
const EXTRACT_LOAD: &[Opt] = &[
    valued(&["--transform"], None),
    flag(&["--dry"], None),
    flag(&["--full-refresh"], Some("MELTANO_RUN_FULL_REFRESH")),
    flag(&["--refresh-catalog"], None),
    valued(&["--select", "-s"], None),
    valued(&["--exclude", "-e"], None),
    valued(&["--catalog"], None),
    valued(&["--state"], None),
    valued(&["--dump"], None),
    valued(&["--state-id"], Some("MELTANO_STATE_ID")),
    flag(&["--force", "-f"], None),
    flag(&["--merge-state"], None),
    valued(&["--state-strategy"], None),
    flag(&["--install"], None),
    flag(&["--no-install"], None),
    flag(&["--only-install"], None),
    valued(&["--run-id"], None),
    valued(&["--database-uri"], None),
    flag(&["--help"], None),
];

/// Reads `command`, a meltano command line (the `meltano` executable may
/// have a directory, and come after a wrapper such as `env A=B` or `uv run`).
pub fn parse(command: &[String], env: &Env<'_>) -> Result<Command, String> {
    let start = command
        .iter()
        .position(|arg| Path::new(arg).file_name().is_some_and(|n| n == "meltano"))
        .ok_or("--meltano expects a meltano command: -- meltano run TAP TARGET ...")?;
    let assignments = wrapper_assignments(&command[..start])?;
    let with_wrapper = |name: &str| wrapped(&assignments, env, name);
    let global = Parsed::of(&command[start + 1..], GLOBAL, false, "meltano")?;
    for refused in ["--help", "--version"] {
        if global.given(refused) {
            return Err(format!("meltano {refused} runs no pipeline"));
        }
    }
    let (subcommand, args) = global
        .positional
        .split_first()
        .ok_or("--meltano expects `meltano run ...`, but no subcommand was given")?;
    let subcommand = match subcommand.as_str() {
        "run" => {
            let run = Parsed::of(args, RUN, true, "meltano run")?;
            run.refuse_help("run")?;
            run.check_flags(&with_wrapper)?;
            Subcommand::Run {
                state_id_suffix: run.value("--state-id-suffix", &with_wrapper),
                force: run.flag("--force", &with_wrapper)?,
                blocks: run.positional,
            }
        }
        name @ ("el" | "elt") => {
            let el = Parsed::of(args, EXTRACT_LOAD, true, &format!("meltano {name}"))?;
            el.refuse_help(name)?;
            el.check_flags(&with_wrapper)?;
            let [extractor, loader] = <[String; 2]>::try_from(el.positional.clone())
                .map_err(|_| format!("meltano {name} takes an extractor and a loader"))?;
            Subcommand::ExtractLoad {
                extractor,
                loader,
                state_id: el.value("--state-id", &with_wrapper),
                force: el.flag("--force", &with_wrapper)?,
            }
        }
        other => {
            return Err(format!(
            "--meltano expects `meltano run`, `meltano el` or `meltano elt`, not `meltano {other}`"
        ))
        }
    };
    Ok(Command {
        cwd: global.value("--cwd", &|_| None),
        environment: global.value("--environment", &|_| None),
        no_environment: global.given("--no-environment"),
        env_file: global.value("--env-file", &|_| None),
        assignments,
        subcommand,
    })
}

/// Variable `name` as Meltano sees it: the wrapper's last assignment of it, else `env`'s.
pub(crate) fn wrapped(
    assignments: &[(String, String)],
    env: &Env<'_>,
    name: &str,
) -> Option<String> {
    let assigned = assignments.iter().rev().find(|(k, _)| k == name);
    assigned.map(|(_, v)| v.clone()).or_else(|| env(name))
}

/// The `NAME=VALUE` words of an `env` wrapper; other wrappers change no variable.
fn wrapper_assignments(wrapper: &[String]) -> Result<Vec<(String, String)>, String> {
    let Some((first, rest)) = wrapper.split_first() else {
        return Ok(Vec::new());
    };
    if Path::new(first).file_name().is_none_or(|n| n != "env") {
        return Ok(Vec::new());
    }
    rest.iter()
        .map(|word| match word.split_once('=') {
            Some((name, value)) if !name.is_empty() && !word.starts_with('-') => {
                Ok((name.to_string(), value.to_string()))
            }
            _ => Err(format!(
                "`env {word}` before meltano changes its environment in a way runlock does not read; \
                 pass the state IDs with --key instead"
            )),
        })
        .collect()
}

/// One command's options as Click parsed them.
struct Parsed {
    spec: &'static [Opt],
    /// Each option given, by its first name, with its value; the last wins.
    given: Vec<(&'static str, Option<String>)>,
    positional: Vec<String>,
}

impl Parsed {
    /// Parses `args` against `spec`; with `interspersed`, options may follow
    /// plain arguments, else the first plain argument ends the options.
    fn of(
        args: &[String],
        spec: &'static [Opt],
        interspersed: bool,
        what: &str,
    ) -> Result<Parsed, String> {
        let mut parsed = Parsed {
            spec,
            given: Vec::new(),
            positional: Vec::new(),
        };
        let mut rest = args.iter().cloned();
        while let Some(arg) = rest.next() {
            if arg == "--" {
                parsed.positional.extend(rest.by_ref());
                break;
            }
            if !arg.starts_with('-') || arg.len() == 1 {
                parsed.positional.push(arg);
                if !interspersed {
                    parsed.positional.extend(rest.by_ref());
                    break;
                }
                continue;
            }
            let (name, explicit) = match arg.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (arg.as_str(), None),
            };
            if let Some(opt) = parsed.long(&normalize(name)) {
                let value = match (opt.takes_value, explicit) {
                    (true, Some(value)) => Some(value),
                    (true, None) => Some(rest.next().ok_or_else(|| {
                        format!("{what} option {name} needs a value, as Meltano would say")
                    })?),
                    (false, Some(_)) => {
                        return Err(format!(
                            "{what} option {name} takes no value, and Meltano would refuse it"
                        ))
                    }
                    (false, None) => None,
                };
                parsed.given.push((opt.names[0], value));
            } else if arg.starts_with("--") {
                return Err(unknown(what, name));
            } else {
                // A cluster of short options: flags, then at most one that
                // takes the rest of the word (or the next word) as its value.
                let letters: Vec<char> = arg.chars().skip(1).collect();
                for (i, letter) in letters.iter().enumerate() {
                    let short = format!("-{letter}");
                    let opt = parsed.short(&short).ok_or_else(|| unknown(what, &short))?;
                    if !opt.takes_value {
                        parsed.given.push((opt.names[0], None));
                        continue;
                    }
                    let attached: String = letters[i + 1..].iter().collect();
                    let value = if attached.is_empty() {
                        rest.next().ok_or_else(|| {
                            format!("{what} option {short} needs a value, as Meltano would say")
                        })?
                    } else {
                        attached
                    };
                    parsed.given.push((opt.names[0], Some(value)));
                    break;
                }
            }
        }
        Ok(parsed)
    }

    fn long(&self, name: &str) -> Option<&'static Opt> {
        self.spec
            .iter()
            .find(|o| o.names.iter().any(|n| n.starts_with("--") && *n == name))
    }

    fn short(&self, name: &str) -> Option<&'static Opt> {
        self.spec
            .iter()
            .find(|o| o.names.iter().any(|n| !n.starts_with("--") && *n == name))
    }

    fn given(&self, name: &str) -> bool {
        self.given.iter().any(|(n, _)| *n == name)
    }

    fn variable(&self, name: &str) -> Option<&'static str> {
        self.spec
            .iter()
            .find(|o| o.names[0] == name)
            .and_then(|o| o.variable)
    }

    /// The option's value, else its variable's (Click ignores an empty one).
    fn value(&self, name: &str, env: &Env<'_>) -> Option<String> {
        let given = self.given.iter().rev().find(|(n, _)| *n == name);
        match given {
            Some((_, value)) => value.clone(),
            None => self.variable(name).and_then(env).filter(|v| !v.is_empty()),
        }
    }

    /// A flag given, else its variable read as Click reads a boolean.
    fn flag(&self, name: &str, env: &Env<'_>) -> Result<bool, String> {
        if self.given(name) {
            return Ok(true);
        }
        match self.variable(name).and_then(|var| Some((var, env(var)?))) {
            Some((var, value)) => boolean(var, &value),
            None => Ok(false),
        }
    }

    /// Every flag's variable must read as a boolean, or Meltano refuses the command.
    fn check_flags(&self, env: &Env<'_>) -> Result<(), String> {
        for opt in self.spec.iter().filter(|o| !o.takes_value) {
            self.flag(opt.names[0], env)?;
        }
        Ok(())
    }

    fn refuse_help(&self, subcommand: &str) -> Result<(), String> {
        if self.given("--help") {
            return Err(format!("meltano {subcommand} --help runs no pipeline"));
        }
        Ok(())
    }
}

/// Click's reading of a boolean variable.
fn boolean(var: &str, value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" | "on" => Ok(true),
        "0" | "false" | "f" | "no" | "n" | "off" | "" => Ok(false),
        _ => Err(format!(
            "{var}={value:?} is not a boolean, so Meltano would refuse the command"
        )),
    }
}

/// Meltano's `token_normalize_func`: `--state_id_suffix` is `--state-id-suffix`.
fn normalize(name: &str) -> String {
    match name.strip_prefix("--") {
        Some(rest) => format!("--{}", rest.replace('_', "-")),
        None => name.to_string(),
    }
}

fn unknown(what: &str, name: &str) -> String {
    format!(
        "{what} option {name:?} is not one runlock knows; pass the state IDs with --key instead"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn options_read_as_click_reads_them() {
        let none = |_: &str| None;
        let command = parse(
            &words("env A=1 /opt/bin/meltano --log_level=debug --environment prod run tap --state_id_suffix=x -f target --dry-run"),
            &none,
        )
        .expect("parses");
        assert_eq!(command.assignments, [("A".to_string(), "1".to_string())]);
        assert_eq!(command.environment.as_deref(), Some("prod"));
        let Subcommand::Run {
            state_id_suffix,
            force,
            blocks,
        } = command.subcommand
        else {
            panic!("not run")
        };
        assert_eq!(state_id_suffix.as_deref(), Some("x"));
        assert!(force);
        assert_eq!(blocks, ["tap", "target"]);

        let command =
            parse(&words("meltano elt -fsa.b tap target --state-id=s"), &none).expect("parses");
        let Subcommand::ExtractLoad {
            state_id, force, ..
        } = command.subcommand
        else {
            panic!("not elt")
        };
        assert_eq!(state_id.as_deref(), Some("s"));
        assert!(force);
    }

    #[test]
    fn variables_stand_in_for_options_not_given() {
        let env = |name: &str| match name {
            "MELTANO_RUN_FORCE" => Some("Yes".to_string()),
            "MELTANO_RUN_STATE_ID_SUFFIX" => Some(String::new()),
            "MELTANO_STATE_ID" => Some("from-var".to_string()),
            _ => None,
        };
        let run = parse(&words("meltano run tap target"), &env).expect("parses");
        assert!(matches!(
            run.subcommand,
            Subcommand::Run {
                force: true,
                state_id_suffix: None,
                ..
            }
        ));
        let el = parse(&words("meltano el tap target"), &env).expect("parses");
        assert!(
            matches!(el.subcommand, Subcommand::ExtractLoad { state_id: Some(ref s), .. } if s == "from-var")
        );
        let bad = |name: &str| (name == "MELTANO_RUN_NO_STATE_UPDATE").then(|| "maybe".to_string());
        let err = parse(&words("meltano run tap target"), &bad).expect_err("refused");
        assert!(err.contains("MELTANO_RUN_NO_STATE_UPDATE"), "{err}");
    }

    #[test]
    fn what_runlock_cannot_read_is_refused() {
        let none = |_: &str| None;
        for (line, why) in [
            ("meltano run --bogus tap target", "not one runlock knows"),
            ("meltano --version", "runs no pipeline"),
            ("meltano run --help", "runs no pipeline"),
            ("meltano invoke tap", "not `meltano invoke`"),
            ("meltano el tap", "an extractor and a loader"),
            ("env -i meltano run tap target", "env -i"),
            ("meltano run --state-id-suffix", "needs a value"),
            ("sh -c true", "expects a meltano command"),
        ] {
            let err = parse(&words(line), &none).expect_err(line);
            assert!(err.contains(why), "{line}: {err}");
        }
    }
}
