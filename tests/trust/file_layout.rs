//! `file://` in the layout the package ships (issue 27): the agent as the
//! user `runlock` that sysusers makes, in the directories tmpfiles makes, with
//! the unit's umask, and a member of the socket's group trying what an
//! earlier layout let it do: read a holder's command line from `KEY.lock`,
//! and take kernel locks on `KEY.run`, `.force.lock` and `.probe.run` so that
//! root's runs are refused, `--force` hangs or a restarting agent never
//! starts. Then the same locks held by a process the layout cannot keep out
//! (root): the agent names it and never waits on it forever.

use crate::shipped::systemd::{runlock_user, text, tool};
use crate::support::agent::{temp_dir, FileBackendDir};
use crate::support::run::{Finished, HOLD};
use crate::support::{setpriv, within, AgentOptions, Run, TestAgent, WAIT};
use crate::trust::access::{as_nobody, NOBODY};
use anyhow::{ensure, Context, Result};
use runlock_shim::exit::EXIT_HELD;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tempfile::TempDir;

/// The shipped snippets and units.
fn shipped(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../systemd")
        .join(relative)
}

/// A scratch root with the user, group and directories the package makes
/// (`systemd-sysusers` and `systemd-tmpfiles` on the shipped snippets, as
/// postinst runs them), and the unit's umask.
struct Packaged {
    root: TempDir,
    /// The user `runlock`'s uid and its group's gid (the socket's group).
    uid: u32,
    gid: u32,
    umask: u32,
}

impl Packaged {
    async fn install() -> Result<Packaged> {
        let root = temp_dir()?;
        // As / is: the agent's user and the member pass through it.
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755))?;
        std::fs::create_dir(root.path().join("etc"))?;
        let root_arg = format!("--root={}", root.path().display());
        let sysusers = shipped("sysusers.d/runlock.conf").display().to_string();
        let out = tool("systemd-sysusers", &[&root_arg, &sysusers]).await?;
        ensure!(out.status.success(), "systemd-sysusers: {}", text(&out));
        let tmpfiles = shipped("tmpfiles.d/runlock.conf").display().to_string();
        let out = tool("systemd-tmpfiles", &["--create", &root_arg, &tmpfiles]).await?;
        ensure!(out.status.success(), "systemd-tmpfiles: {}", text(&out));
        let fields = runlock_user(root.path())?;
        let (uid, gid) = (fields[2].parse()?, fields[3].parse()?);
        let unit = std::fs::read_to_string(shipped("runlockd.service"))?;
        let setting = |name: &str| -> Result<u32> {
            let value = unit
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .with_context(|| format!("the unit sets no {name}"))?;
            Ok(u32::from_str_radix(value.trim(), 8)?)
        };
        let umask = setting("UMask")?;
        // systemd makes StateDirectory= itself if tmpfiles has not: the same mode either way.
        let state_mode = setting("StateDirectoryMode")?;
        let packaged = Packaged {
            root,
            uid,
            gid,
            umask,
        };
        let made = std::fs::metadata(packaged.locks())?.mode() & 0o7777;
        ensure!(
            made == state_mode,
            "tmpfiles made /var/lib/runlock {made:o}, the unit says {state_mode:o}"
        );
        Ok(packaged)
    }

    /// `/var/lib/runlock`, the default `file://` directory.
    fn locks(&self) -> PathBuf {
        self.root.path().join("var/lib/runlock")
    }

    /// The agent as `runlock:runlock` with the unit's umask, its socket in
    /// `/run/runlock` for the group runlock (as runlockd.socket makes it).
    async fn agent(&self) -> Result<TestAgent> {
        let mut options = AgentOptions::new(format!("file://{}", self.locks().display()));
        options.socket = Some(self.root.path().join("run/runlock/agent.sock"));
        options.args = vec!["--socket-group".into(), self.gid.to_string()];
        options.umask = Some(self.umask);
        options.user = Some((self.uid, self.gid));
        TestAgent::start_with(options).await
    }
}

/// `program args...` as `nobody` with the socket's group: a member.
async fn member(gid: u32, program: &str, args: &[&str]) -> Result<Finished> {
    let mut command = setpriv(NOBODY, NOBODY, &[gid]);
    command.arg(program).args(args);
    Run::spawn(command)?.finish().await
}

/// The member was refused by the kernel at `open`, before any lock or read.
fn refused_access(out: &Finished, what: &str) -> Result<()> {
    ensure!(
        !out.status.success() && out.stderr.contains("Permission denied"),
        "a member could {what}: {out:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_can_neither_read_nor_lock_what_the_packaged_agent_keeps() -> Result<()> {
    let packaged = Packaged::install().await?;
    let mut agent = packaged.agent().await?;
    let locks = packaged.locks();
    let k = "members-attack";
    let mut held = agent.run(&[k], &[], &format!("{HOLD} # --password=hunter2"))?;
    held.ready().await?;
    let record = locks.join(format!("{k}.lock"));
    ensure!(
        std::fs::read_to_string(&record)?.contains("hunter2"),
        "the record does not name the command; nothing to hide"
    );
    // Whatever the agent keeps gives its group and others nothing.
    for entry in std::fs::read_dir(&locks)? {
        let path = entry?.path();
        let meta = std::fs::symlink_metadata(&path)?;
        ensure!(
            meta.mode() & 0o077 == 0 && meta.uid() == packaged.uid,
            "{} is {}:{} {:o}",
            path.display(),
            meta.uid(),
            meta.gid(),
            meta.mode() & 0o7777
        );
    }

    // Attack 2: the holder's command line, lease id, uid and pid.
    let cat = member(packaged.gid, "cat", &[&record.display().to_string()]).await?;
    refused_access(&cat, "read a lock record")?;
    ensure!(!cat.stdout.contains("hunter2"), "{cat:?}");
    let ls = member(packaged.gid, "ls", &[&locks.display().to_string()]).await?;
    refused_access(&ls, "list the lock directory")?;

    // Attack 3: a lock of any kind needs a descriptor, and open is refused.
    let key_lock = locks.join(format!("{k}.run"));
    for file in [
        key_lock,
        locks.join(".force.lock"),
        locks.join(".probe.run"),
    ] {
        let path = file.display().to_string();
        for mode in ["-x", "-s"] {
            let out = member(packaged.gid, "flock", &["-n", mode, &path, "true"]).await?;
            refused_access(&out, &format!("flock {mode} {path}"))?;
        }
    }

    // What a member may do it still can: its own run holds its key through
    // the descriptor it is handed (no name to open), and root's run waits on it.
    let mut mine = as_nobody(
        &agent,
        &[packaged.gid],
        &["run", "--key", "mine", "--", "sh", "-c", HOLD],
    )?;
    mine.ready().await?;
    agent
        .runlock_output(&["run", "--key", "mine", "--", "true"])
        .await?
        .expect_code(EXIT_HELD.into())?;
    mine.end_and_expect_success().await?;
    // Nor can a run open its own lock file again through the descriptor's
    // /proc link (no directory is looked through there, only the file's
    // mode): a second description of it would hold the key past the release.
    let reopen = r#"for f in /proc/$$/fd/*; do
        case "$(readlink "$f")" in *.run)
            echo found-lock
            if (exec 8<"$f") 2>/dev/null; then echo reopened; fi
        esac
    done"#;
    let out = as_nobody(
        &agent,
        &[packaged.gid],
        &["run", "--key", "mine", "--", "sh", "-c", reopen],
    )?
    .finish()
    .await?;
    out.expect_code(0)?;
    ensure!(
        out.stdout.contains("found-lock") && !out.stdout.contains("reopened"),
        "{out:?}"
    );

    // Root's runs are what they would be with no member at all.
    held.end_and_expect_success().await?;
    let forced = agent
        .runlock_output(&["run", "--force", "--key", "other", "--", "true"])
        .await?;
    forced.expect_code(0)?;
    agent.stop().await?;
    drop(agent);
    let again = packaged.agent().await?;
    let token = again.token_of_a_run(k).await?;
    ensure!(token >= 2, "token {token} after a first run");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_directory_left_open_by_an_earlier_layout_is_closed_at_start() -> Result<()> {
    let packaged = Packaged::install().await?;
    let locks = packaged.locks();
    // What the 0750/0640 layout left behind: a record a member could read.
    std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o750))?;
    let record = locks.join("old.lock");
    std::fs::write(&record, "{\"command\": \"sh --password=hunter2\"}\n")?;
    std::fs::set_permissions(&record, std::fs::Permissions::from_mode(0o640))?;
    std::os::unix::fs::chown(&record, Some(packaged.uid), Some(packaged.gid))?;
    let path = record.display().to_string();
    let before = member(packaged.gid, "cat", &[&path]).await?;
    ensure!(
        before.stdout.contains("hunter2"),
        "no open layout to close: {before:?}"
    );

    let agent = packaged.agent().await?;
    let mode = std::fs::metadata(&locks)?.mode() & 0o7777;
    ensure!(mode == 0o700, "the lock directory is {mode:o}");
    let after = member(packaged.gid, "cat", &[&path]).await?;
    refused_access(&after, "read a record the old layout left")?;
    ensure!(
        agent.log().contains("0750") && agent.log().contains("0700"),
        "the agent did not say it closed the directory:\n{}",
        agent.log()
    );
    agent.still_serves().await
}

/// Takes a lock the way `flock(1)` does, or a classic POSIX one, in this test process.
fn lock_here(path: &Path, posix: bool) -> Result<File> {
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    if posix {
        // SAFETY: plain old data, all-zero is valid; the descriptor is open.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_WRLCK as libc::c_short;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        let done = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) };
        ensure!(done == 0, "fcntl: {}", std::io::Error::last_os_error());
    } else {
        // SAFETY: the descriptor is open.
        let done = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        ensure!(done == 0, "flock: {}", std::io::Error::last_os_error());
    }
    Ok(file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_on_the_probe_file_does_not_keep_an_agent_from_starting() -> Result<()> {
    let locks = FileBackendDir::new()?;
    std::fs::create_dir(locks.path())?;
    std::fs::set_permissions(locks.path(), std::fs::Permissions::from_mode(0o700))?;
    let _held = lock_here(&locks.path().join(".probe.run"), false)?;
    let agent = TestAgent::start_with(AgentOptions::new(locks.uri())).await?;
    agent
        .runlock_output(&["run", "--key", "k", "--", "true"])
        .await?
        .expect_code(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_gate_held_by_another_process_is_named_not_waited_on_forever() -> Result<()> {
    let locks = FileBackendDir::new()?;
    let agent = TestAgent::start_with(AgentOptions::new(locks.uri())).await?;
    let gate = lock_here(&locks.path().join(".force.lock"), true)?;
    let pid = std::process::id();
    for force in [false, true] {
        let mut args = vec!["run", "--key", "gated"];
        if force {
            args.push("--force");
        }
        args.extend(["--", "echo", "ran"]);
        let out = within(
            WAIT,
            "a run behind a held gate",
            agent.runlock_output(&args),
        )
        .await??;
        out.expect_code(69)?;
        ensure!(!out.stdout.contains("ran"), "{out:?}");
        for says in [".force.lock", &format!("pid {pid}")] {
            ensure!(out.stderr.contains(says), "{says:?} not named: {out:?}");
        }
    }
    drop(gate);
    agent
        .runlock_output(&["run", "--force", "--key", "gated", "--", "true"])
        .await?
        .expect_code(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_locked_by_a_process_no_record_names_is_refused_naming_it() -> Result<()> {
    let locks = FileBackendDir::new()?;
    let agent = TestAgent::start_with(AgentOptions::new(locks.uri())).await?;
    let run_file = locks.path().join("stranger.run");
    let held = lock_here(&run_file, false)?;
    let out = agent
        .runlock_output(&["run", "--key", "stranger", "--", "echo", "ran"])
        .await?;
    out.expect_code(75)?;
    ensure!(!out.stdout.contains("ran"), "{out:?}");
    let pid = std::process::id();
    for says in [
        run_file.display().to_string(),
        format!("pid {pid}"),
        "no record".to_string(),
    ] {
        ensure!(out.stderr.contains(&says), "{says:?} not named: {out:?}");
    }
    // With slots, the stranger holds slot 0 only: the next is taken.
    agent
        .runlock_output(&["run", "--slots", "2", "--key", "stranger", "--", "true"])
        .await?
        .expect_code(0)?;
    drop(held);
    agent
        .runlock_output(&["run", "--key", "stranger", "--", "true"])
        .await?
        .expect_code(0)
}
