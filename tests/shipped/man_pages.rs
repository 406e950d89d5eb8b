//! The pages and help a person reads as they read flock(1)'s or
//! systemctl(1)'s (issue 46): every man page `runlock-docs` makes has EXIT
//! STATUS, ENVIRONMENT, FILES and EXAMPLES, and `--help` names the exit
//! statuses, the same ones as the pages.

use crate::support::bins::bins;
use crate::support::run::Run;
use anyhow::{ensure, Context, Result};
use runlock_shim::exit;
use tokio::process::Command;

/// A page's section `name`: from its `.SH` to the next.
fn section<'a>(page: &'a str, name: &str) -> Option<&'a str> {
    let start = page
        .find(&format!(".SH \"{name}\"\n"))
        .or_else(|| page.find(&format!(".SH {name}\n")))?;
    let body = &page[start..];
    let body = &body[body.find('\n')? + 1..];
    Some(body.find("\n.SH").map_or(body, |end| &body[..end]))
}

#[tokio::test]
async fn every_man_page_has_exit_status_environment_files_and_examples() -> Result<()> {
    let bins = bins()?;
    let docs = bins.runlock.with_file_name("runlock-docs");
    let out = tempfile::tempdir()?;
    let mut command = Command::new(&docs);
    command.arg(out.path());
    Run::spawn(command)?.finish().await?.expect_code(0)?;

    let mut pages = Vec::new();
    for entry in std::fs::read_dir(out.path().join("man"))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .context("a page without a name")?
            .to_string_lossy()
            .into_owned();
        pages.push((name, std::fs::read_to_string(&path)?));
    }
    pages.sort();
    ensure!(pages.len() >= 10, "too few pages: {pages:?}");
    for (name, page) in &pages {
        for wanted in ["EXIT STATUS", "ENVIRONMENT", "FILES", "EXAMPLES"] {
            let text = section(page, wanted)
                .with_context(|| format!("{name} has no {wanted}:\n{page}"))?;
            ensure!(
                text.contains(".TP") || text.contains(".PP") || !text.trim().is_empty(),
                "{name}: {wanted} is empty"
            );
        }
        ensure!(
            section(page, "FILES").is_some_and(|t| t.contains("/etc/runlock/runlockd.toml")),
            "{name}: FILES does not name the configuration file"
        );
        ensure!(
            section(page, "EXAMPLES").is_some_and(|t| t.contains(".nf")),
            "{name}: EXAMPLES shows no command"
        );
    }

    // The shim's pages list what its --help does; run's all of them.
    let page_of = |name: &str| {
        pages
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, page)| page.as_str())
            .with_context(|| format!("no {name}"))
    };
    for (page, args, run) in [
        ("runlock.1", &["--help"][..], true),
        ("runlock-run.1", &["run", "--help"][..], true),
        ("runlock-status.1", &["status", "--help"][..], false),
        ("runlock-release.1", &["release", "--help"][..], false),
    ] {
        let statuses = section(page_of(page)?, "EXIT STATUS").context("no EXIT STATUS")?;
        let help = Command::new(&bins.runlock).args(args).output().await?;
        ensure!(help.status.success(), "runlock {args:?}: {help:?}");
        let help = String::from_utf8(help.stdout)?;
        let listed = help
            .split_once("Exit status:")
            .with_context(|| format!("runlock {args:?} names no exit status:\n{help}"))?
            .1;
        for documented in exit::statuses(run) {
            ensure!(
                listed.contains(&format!(
                    "  {:<6} {}",
                    documented.status, documented.meaning
                )),
                "runlock {args:?} lacks {}:\n{help}",
                documented.status
            );
            ensure!(
                statuses.contains(&format!(".TP\n\\fB{}\\fR", documented.status))
                    && statuses.contains(documented.meaning.split('-').next().unwrap_or("")),
                "{page} lacks {}:\n{statuses}",
                documented.status
            );
        }
        for run_only in ["75", "76", "127"] {
            ensure!(
                run == listed.contains(&format!("  {run_only} ")),
                "runlock {args:?}: {run_only} listed wrongly:\n{help}"
            );
        }
    }
    let agent = page_of("runlockd.8")?;
    for wanted in [
        "78",
        "69",
        "RUNLOCK_BACKEND",
        "RUNLOCK_TTL",
        "AWS_ACCESS_KEY_ID",
    ] {
        ensure!(agent.contains(wanted), "runlockd.8 lacks {wanted}");
    }
    // The agent's --help names what its page does, from the same table.
    for (args, check) in [
        (&["--help"][..], false),
        (&["check-config", "--help"][..], true),
    ] {
        let help = Command::new(&bins.runlockd).args(args).output().await?;
        ensure!(help.status.success(), "runlockd {args:?}: {help:?}");
        let help = String::from_utf8(help.stdout)?;
        let listed = help
            .split_once("Exit status:")
            .with_context(|| format!("runlockd {args:?} names no exit status:\n{help}"))?
            .1;
        for (status, meaning) in runlock_agent::exit_status::statuses(check) {
            ensure!(
                listed.contains(&format!("  {status:<6} {meaning}")),
                "runlockd {args:?} lacks {status}:\n{help}"
            );
        }
    }
    Ok(())
}
