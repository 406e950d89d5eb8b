//! `runlock-docs OUTDIR`: writes runlock's man pages and shell completions
//! for scripts/package, from the clap definitions the binaries parse with and
//! the commented example configuration, so that none is written twice.

mod config_page;
mod sections;

use anyhow::Context;
use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::roff::{roman, Roff};
use clap_mangen::Man;
use std::path::{Path, PathBuf};

/// The commented example configuration: the conffile and runlockd.toml(5).
const EXAMPLE_CONFIG: &str = include_str!("../../systemd/runlockd.toml");
use sections::{Sections, CONFIG_PATH};

fn main() -> anyhow::Result<()> {
    let out = PathBuf::from(
        std::env::args_os()
            .nth(1)
            .context("usage: runlock-docs OUTDIR")?,
    );
    let man = out.join("man");
    let completions = out.join("completions");
    for dir in [&man, &completions] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }

    let date = page_date()?;
    let shim = shim_command();
    let agent = agent_command();
    write_pages(
        &man,
        shim.clone(),
        "1",
        &date,
        &shim_see_also(),
        &|name, _| sections::shim(name),
    )?;
    // The agent's flags are global: its subcommands read the same variables.
    let variables = sections::variables_of(&agent);
    write_pages(
        &man,
        agent.clone(),
        "8",
        &date,
        &agent_see_also(),
        &|name, _| sections::agent(name, variables.clone()),
    )?;
    write(
        &man.join("runlockd.toml.5"),
        config_page::render(
            EXAMPLE_CONFIG,
            CONFIG_PATH,
            version(),
            &date,
            &sections::config_file(),
        )?
        .as_bytes(),
    )?;

    for mut command in [shim, agent] {
        let name = command.get_name().to_owned();
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, &name, &mut script);
            write(&completions.join(completion_file(shell, &name)), &script)?;
        }
    }
    Ok(())
}

/// The pages' date, YYYY-MM-DD: SOURCE_DATE_EPOCH's (scripts/package sets it
/// to the commit's, so one commit makes the same pages), else today.
fn page_date() -> anyhow::Result<String> {
    let time = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(epoch) => {
            let seconds: u64 = epoch
                .trim()
                .parse()
                .with_context(|| format!("SOURCE_DATE_EPOCH={epoch:?} is not seconds"))?;
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(seconds)
        }
        Err(_) => std::time::SystemTime::now(),
    };
    let mut date = humantime::format_rfc3339_seconds(time).to_string();
    date.truncate("YYYY-MM-DD".len());
    Ok(date)
}

fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// The names are the ones the binaries are installed as, and the
/// descriptions those their `--help` prints.
fn shim_command() -> clap::Command {
    named(runlock_shim::cli::Cli::command(), "runlock")
}

fn agent_command() -> clap::Command {
    named(runlock_agent::config::Args::command(), "runlockd")
}

/// A page's NAME line reads "runlockd - the per-host lock agent": the
/// description without the "runlockd: " it starts with in `--help`.
fn named(command: clap::Command, name: &'static str) -> clap::Command {
    let description = command
        .get_about()
        .map(|about| about.to_string())
        .unwrap_or_default();
    let about = description
        .strip_prefix(name)
        .and_then(|rest| rest.strip_prefix(": "))
        .unwrap_or(&description)
        .to_owned();
    command
        .name(name)
        .bin_name(name)
        .about(about)
        .disable_help_subcommand(true)
}

fn shim_see_also() -> Vec<&'static str> {
    vec!["runlockd(8)", "runlockd.toml(5)"]
}

fn agent_see_also() -> Vec<&'static str> {
    vec![
        "runlock(1)",
        "runlockd.toml(5)",
        "systemd.socket(5)",
        "sysusers.d(5)",
        "tmpfiles.d(5)",
    ]
}

/// Where each shell's completion loader looks, by file name.
fn completion_file(shell: Shell, name: &str) -> String {
    match shell {
        Shell::Zsh => format!("_{name}"),
        Shell::Fish => format!("{name}.fish"),
        _ => name.to_owned(),
    }
}

/// One page for the command and one for each subcommand (NAME-SUB), as
/// clap_mangen's own generate_to does, in `section`, each ending with the
/// `sections` of its name, and SEE ALSO.
fn write_pages(
    dir: &Path,
    command: clap::Command,
    section: &str,
    date: &str,
    see: &[&str],
    sections: &dyn Fn(&str, &clap::Command) -> Sections,
) -> anyhow::Result<()> {
    let mut command = command;
    command.build();
    let name = command.get_name().to_owned();
    let subcommands: Vec<clap::Command> = command.get_subcommands().cloned().collect();
    let mut see_also: Vec<String> = see.iter().map(|s| (*s).to_owned()).collect();
    let own = sections(&name, &command);
    let page = render_page(command, section, date, &see_also, &own)?;
    write(&dir.join(format!("{name}.{section}")), &page)?;

    see_also.insert(0, format!("{name}({section})"));
    for sub in subcommands {
        let page_name = sub
            .get_display_name()
            .unwrap_or_else(|| sub.get_name())
            .to_owned();
        let own = sections(&page_name, &sub);
        let page = render_page(sub, section, date, &see_also, &own)?;
        write(&dir.join(format!("{page_name}.{section}")), &page)?;
    }
    Ok(())
}

fn render_page(
    command: clap::Command,
    section: &str,
    date: &str,
    see_also: &[String],
    sections: &Sections,
) -> anyhow::Result<Vec<u8>> {
    let has_options = command.get_arguments().any(|a| !a.is_hide_set());
    let has_subcommands = command.has_subcommands();
    let has_version = command.get_version().is_some();
    let man = Man::new(command)
        .section(section)
        .date(date)
        .source(format!("runlock {}", version()))
        .manual("runlock");
    let mut ending = Roff::new();
    sections.render(&mut ending);
    ending
        .control("SH", ["SEE ALSO"])
        .text([roman(see_also.join(", "))]);

    let mut parts: Vec<Vec<u8>> = Vec::new();
    let mut part = |render: &dyn Fn(&mut Vec<u8>) -> std::io::Result<()>| -> std::io::Result<()> {
        let mut buf = Vec::new();
        render(&mut buf)?;
        parts.push(buf);
        Ok(())
    };
    part(&|w| man.render_title(w))?;
    part(&|w| man.render_name_section(w))?;
    part(&|w| man.render_synopsis_section(w))?;
    part(&|w| man.render_description_section(w))?;
    if has_options {
        part(&|w| man.render_options_section(w))?;
    }
    if has_subcommands {
        part(&|w| man.render_subcommands_section(w))?;
    }
    part(&|w| ending.to_writer(w))?;
    if has_version {
        part(&|w| man.render_version_section(w))?;
    }
    Ok(join_parts(parts))
}

/// Each rendered part starts with roff's apostrophe preamble; the page needs it once.
fn join_parts(parts: Vec<Vec<u8>>) -> Vec<u8> {
    let preamble = Roff::new().render().into_bytes();
    let mut page = preamble.clone();
    for part in parts {
        page.extend(part.strip_prefix(preamble.as_slice()).unwrap_or(&part));
    }
    page
}

fn write(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}
