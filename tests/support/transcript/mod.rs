//! Runs the shell transcripts of a markdown page (a book page, the README's
//! tour) with the real programs, so that what the page shows is what they
//! print at that step. `tests/shipped/book.rs` runs the pages.
//!
//! What it reads in the page:
//! - A ```console block is a transcript. `PROMPT$ COMMAND` is a command: the
//!   prompt names the shell it runs in (`$ ` alone is one, `host-a$ ` and
//!   `host-b$ ` two others). A line ending in `\` goes on on the next, and a
//!   here-document (`<<'EOF'`) to its end. The lines after a command, up to
//!   the next command or the end of the block, are what it prints, stdout
//!   and stderr together as a terminal shows them. A command ending in `&`
//!   runs in the background, and its lines are awaited as they come. Its
//!   exit status is what it prints: a page shows it (`; echo "exit status
//!   $?"`) where it matters.
//! - A ```bash block is setup that every shell runs (each host does it),
//!   line by line; each line must exit 0, and its output is not compared.
//! - `<!-- transcript wait PROMPT$ COMMAND -->`, a line between blocks (it is
//!   not rendered), runs COMMAND in that shell until it exits 0, its output
//!   discarded: for what nothing prints, such as an agent started with `&`
//!   being ready, or a run queued behind another.
//! - Anything else is not run.
//!
//! What a shown line may hold beyond plain text (nothing else is loose):
//! - `[..]`: any text within the line, possibly none;
//! - `...` alone on a line: any lines, up to the first that matches the line
//!   after it (or all that are left, when it is the last);
//! - `[N]`: a number (pids, uids);
//! - `[TIME]`: an instant as runlock prints it, `2026-12-04T17:20:12.371Z`;
//! - `[HOST]`, `[USER]`: this machine's host name, this user's name;
//! - a run of spaces matches a run of spaces of any width (table columns
//!   widen with their values); trailing spaces and empty lines are ignored.
//!
//! Each shell is a `bash --noprofile --norc` of its own: its own directory
//! (its working directory and HOME), `RUNLOCK_SOCKET` in that directory (so
//! each has its own agent), a PATH of the programs under test (runlockd,
//! runlock, and those [`Transcript::program`] adds) before the system's, and
//! the variables [`Transcript::env`] sets; no other variable is inherited.
//! What cannot run here (installs, a cloud's own tools) is named by
//! [`Transcript::instead`], which the test calls with the reason. Every
//! command has a time limit; when the runner is done, or fails, every
//! process any shell started is killed.

mod expect;
mod page;
mod session;

use crate::bins::bins;
use anyhow::{bail, Context, Result};
use expect::{first_mismatch, Names};
use page::Step;
use session::Session;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// How long one command (or one `wait`, all its tries) may take.
const STEP_LIMIT: Duration = Duration::from_secs(60);

/// How often a `wait` directive tries its command again.
const WAIT_POLL: Duration = Duration::from_millis(100);

/// A page to run, and how.
pub struct Transcript {
    path: PathBuf,
    steps: Vec<Step>,
    env: Vec<(String, String)>,
    programs: Vec<(String, PathBuf)>,
    instead: Vec<StandIn>,
    limit: Duration,
}

/// A command the runner does not run as written.
struct StandIn {
    /// The start of the command's text.
    prefix: String,
    /// What runs instead (None: nothing).
    replacement: Option<String>,
    used: bool,
}

impl Transcript {
    /// The page at `path` (from the workspace root), all of it.
    pub fn page(path: &str) -> Result<Transcript> {
        Transcript::read(path, None)
    }

    /// The part of the page at `path` under the heading line `heading`.
    pub fn section(path: &str, heading: &str) -> Result<Transcript> {
        Transcript::read(path, Some(heading))
    }

    fn read(path: &str, heading: Option<&str>) -> Result<Transcript> {
        let path = workspace_root()?.join(path);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let text = match heading {
            Some(heading) => {
                page::section(&text, heading).with_context(|| format!("in {}", path.display()))?
            }
            None => text,
        };
        let steps = page::steps(&path, &text)?;
        if steps.is_empty() {
            bail!("{} has no transcript to run", path.display());
        }
        Ok(Transcript {
            path,
            steps,
            env: Vec::new(),
            programs: Vec::new(),
            instead: Vec::new(),
            limit: STEP_LIMIT,
        })
    }

    /// Sets `name` to `value` in every shell.
    pub fn env(&mut self, name: &str, value: &str) -> &mut Transcript {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    /// Puts `program` on every shell's PATH as `name`.
    pub fn program(&mut self, name: &str, program: impl Into<PathBuf>) -> &mut Transcript {
        self.programs.push((name.to_string(), program.into()));
        self
    }

    /// Runs `replacement` (or nothing) instead of each command that starts
    /// with `prefix`. A stand-in no command used fails the run: the page
    /// changed under it.
    pub fn instead(&mut self, prefix: &str, replacement: Option<&str>) -> &mut Transcript {
        self.instead.push(StandIn {
            prefix: prefix.to_string(),
            replacement: replacement.map(str::to_string),
            used: false,
        });
        self
    }

    /// Runs every step in page order; fails at the first that does not do
    /// what the page says, naming it, with what it printed.
    pub fn run(mut self) -> Result<()> {
        let bins = bins()?;
        let root = tempfile::Builder::new()
            .prefix("runlock-book-")
            .tempdir_in("/tmp")
            .context("creating the transcript's directory")?;
        let bin = root.path().join("bin");
        std::fs::create_dir(&bin)?;
        let mut programs = vec![
            ("runlockd".to_string(), bins.runlockd.clone()),
            ("runlock".to_string(), bins.runlock.clone()),
        ];
        programs.append(&mut self.programs);
        for (name, program) in &programs {
            std::os::unix::fs::symlink(program, bin.join(name))
                .with_context(|| format!("linking {}", program.display()))?;
        }
        let names = Names {
            host: crate::host_name()?,
            user: crate::user_name(),
        };
        let mut shells = self.start_shells(&root, &bin, &names)?;
        let total = self.steps.len();
        let started = Instant::now();
        for (done, step) in self.steps.clone().iter().enumerate() {
            let step_started = Instant::now();
            let printed = self.step(step, &mut shells, &names).with_context(|| {
                format!(
                    "{} steps of {} ran as the page shows ({:.1?}); then",
                    done,
                    total,
                    started.elapsed()
                )
            })?;
            // Shown with --nocapture: where a page's time goes, and what it printed.
            eprintln!(
                "{:>7.2?}  {}\n{printed}",
                step_started.elapsed(),
                step.shown()
            );
        }
        if let Some(unused) = self.instead.iter().find(|s| !s.used) {
            bail!(
                "{}: no command starts with {:?}, which the test stands in for",
                self.path.display(),
                unused.prefix
            );
        }
        Ok(())
    }

    /// One shell per prompt the page uses, each in a directory of its own.
    fn start_shells(
        &self,
        root: &TempDir,
        bin: &Path,
        names: &Names,
    ) -> Result<BTreeMap<String, Session>> {
        let mut shells = BTreeMap::new();
        for step in &self.steps {
            let session = match step {
                Step::Shown { command, .. } | Step::Wait(command) => &command.session,
                Step::Setup(_) => continue,
            };
            if shells.contains_key(session) {
                continue;
            }
            let dir = root.path().join(match session.as_str() {
                "" => "shell",
                name => name,
            });
            std::fs::create_dir(&dir)?;
            let path = format!(
                "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                bin.display()
            );
            let mut env = vec![
                ("PATH".to_string(), path),
                ("HOME".to_string(), dir.display().to_string()),
                ("USER".to_string(), names.user.clone()),
                ("LOGNAME".to_string(), names.user.clone()),
                ("LANG".to_string(), "C.UTF-8".to_string()),
                (
                    "RUNLOCK_SOCKET".to_string(),
                    dir.join("agent.sock").display().to_string(),
                ),
            ];
            env.extend(self.env.iter().cloned());
            shells.insert(session.clone(), Session::start(&dir, &env)?);
        }
        Ok(shells)
    }

    fn step(
        &mut self,
        step: &Step,
        shells: &mut BTreeMap<String, Session>,
        names: &Names,
    ) -> Result<String> {
        let path = self.path.clone();
        let place = |line: usize| format!("{}:{line}", path.display());
        match step {
            Step::Setup(command) => {
                let text = self.stand_in(&command.text);
                let Some(text) = text else {
                    return Ok(String::new());
                };
                for (name, shell) in shells.iter_mut() {
                    let ran = shell
                        .run(&text, self.limit)
                        .with_context(|| format!("{}: {}", place(command.line), command.text))?;
                    if ran.status != 0 {
                        bail!(
                            "{}: setup `{}` exited {} in the shell {name:?}:\n{}",
                            place(command.line),
                            command.text,
                            ran.status,
                            ran.output
                        );
                    }
                }
            }
            Step::Wait(command) => {
                let shell = shell_of(shells, &command.session)?;
                let deadline = Instant::now() + self.limit;
                let quiet = format!("{{ {}\n}} >/dev/null 2>&1", command.text);
                loop {
                    let ran = shell.run(&quiet, self.limit)?;
                    // Only what a background job printed meanwhile: the next command's.
                    shell.unread(&ran.output);
                    if ran.status == 0 {
                        break;
                    }
                    if Instant::now() >= deadline {
                        bail!(
                            "{}: waited {:?} for `{}` to succeed",
                            place(command.line),
                            self.limit,
                            command.shown()
                        );
                    }
                    std::thread::sleep(WAIT_POLL);
                }
            }
            Step::Shown { command, expected } => {
                let text = self
                    .stand_in(&command.text)
                    .unwrap_or_else(|| ":".to_string());
                let shell = shell_of(shells, &command.session)?;
                let deadline = Instant::now() + self.limit;
                let ran = shell
                    .run(&text, self.limit)
                    .with_context(|| format!("{}: {}", place(command.line), command.shown()))?;
                let mut output = ran.output;
                if command.background() {
                    let before = output.clone();
                    let done = |more: &str| {
                        first_mismatch(expected, &(before.clone() + more), names).is_none()
                    };
                    output += &shell.printed_until(deadline, done);
                }
                if let Some(mismatch) = first_mismatch(expected, &output, names) {
                    bail!(
                        "{}: {}\n{mismatch}\n--- the page shows ---\n{}\n--- it printed ---\n{}",
                        place(command.line),
                        command.shown(),
                        expected.join("\n"),
                        output
                    );
                }
                return Ok(output);
            }
        }
        Ok(String::new())
    }

    /// The text to run for `text`: its stand-in's, if it has one.
    fn stand_in(&mut self, text: &str) -> Option<String> {
        match self
            .instead
            .iter_mut()
            .find(|s| text.starts_with(&s.prefix))
        {
            Some(stand_in) => {
                stand_in.used = true;
                stand_in.replacement.clone()
            }
            None => Some(text.to_string()),
        }
    }
}

fn shell_of<'a>(shells: &'a mut BTreeMap<String, Session>, name: &str) -> Result<&'a mut Session> {
    shells
        .get_mut(name)
        .with_context(|| format!("no shell {name:?}"))
}

/// The workspace's root: the tests package's parent.
fn workspace_root() -> Result<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .context("the tests package has no parent directory")
}
