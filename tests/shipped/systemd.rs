//! runlockd under systemd: the units in `systemd/` pass `systemd-analyze
//! verify` and rate an exposure of 2.0 or better, the sysusers and tmpfiles
//! snippets make the user and directories the units expect, the agent serves on
//! a socket systemd passes it, and it sends READY, STATUS, WATCHDOG and STOPPING.

use crate::support::agent::temp_dir;
use crate::support::bins::bins;
use crate::support::client::RawClient;
use crate::support::{key, within, Deadline, Run, WAIT};
use anyhow::{bail, ensure, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixDatagram;
use tokio::process::{Child, Command};
use tokio::sync::mpsc::UnboundedReceiver;

/// The worst `systemd-analyze security` exposure the service may have.
const MAX_EXPOSURE: f64 = 2.0;

fn units_dir() -> Result<PathBuf> {
    Ok(Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the tests package has no parent directory")?
        .join("systemd"))
}

/// Runs a systemd tool to its end (bounded), without colours or a pager.
pub(crate) async fn tool(program: &str, args: &[&str]) -> Result<Output> {
    let mut command = Command::new(program);
    command
        .args(args)
        .env("SYSTEMD_COLORS", "0")
        .env("SYSTEMD_PAGER", "")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    within(WAIT, program, command.output())
        .await?
        .with_context(|| format!("running {program} (package systemd; scripts/test installs it)"))
}

pub(crate) fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Copies both units into `dir`, the service's ExecStart pointed at the built
/// runlockd (verify checks that the binary exists), with `edit` applied to the service.
fn copy_units(dir: &Path, edit: impl Fn(String) -> String) -> Result<(PathBuf, PathBuf)> {
    let units = units_dir()?;
    let service = std::fs::read_to_string(units.join("runlockd.service"))?;
    let exec = "\nExecStart=/usr/bin/runlockd\n";
    ensure!(service.contains(exec), "the service does not run {exec:?}");
    let service = service.replace(
        exec,
        &format!("\nExecStart={}\n", bins()?.runlockd.display()),
    );
    let (service_path, socket_path) = (dir.join("runlockd.service"), dir.join("runlockd.socket"));
    std::fs::write(&service_path, edit(service))?;
    std::fs::copy(units.join("runlockd.socket"), &socket_path)?;
    Ok((service_path, socket_path))
}

pub(crate) async fn verify(service: &Path, socket: &Path) -> Result<Output> {
    let (service, socket) = (service.display().to_string(), socket.display().to_string());
    // --man=no: the Documentation= pages are not installed here.
    tool(
        "systemd-analyze",
        &["verify", "--man=no", &service, &socket],
    )
    .await
}

/// Fails unless `systemd-analyze verify` found nothing in `what`: it exits 0
/// on most mistakes (unknown keys, bad values) and only says so, so any
/// output at all is a failure.
pub(crate) fn expect_verified(out: &Output, what: &str) -> Result<()> {
    ensure!(
        out.status.success() && text(out).trim().is_empty(),
        "systemd-analyze verify complained about {what} ({}):\n{}",
        out.status,
        text(out)
    );
    Ok(())
}

/// The fields of the `runlock` user's line in ROOT/etc/passwd, as
/// `systemd-sysusers --root=ROOT` wrote it.
pub(crate) fn runlock_user(root: &Path) -> Result<Vec<String>> {
    let passwd = std::fs::read_to_string(root.join("etc/passwd"))?;
    let line = passwd
        .lines()
        .find(|l| l.starts_with("runlock:"))
        .with_context(|| format!("no user runlock in:\n{passwd}"))?;
    Ok(line.split(':').map(String::from).collect())
}

#[tokio::test]
async fn units_pass_systemd_analyze_verify() -> Result<()> {
    let dir = temp_dir()?;
    let (service, socket) = copy_units(dir.path(), |s| s)?;
    expect_verified(&verify(&service, &socket).await?, "the units")?;

    // The check above means something only if verify does read these files.
    let broken = temp_dir()?;
    let (service, socket) = copy_units(broken.path(), |s| {
        s.replace("\nType=notify\n", "\nType=notify\nNoSuchSetting=yes\n")
    })?;
    let out = verify(&service, &socket).await?;
    ensure!(
        text(&out).contains("NoSuchSetting"),
        "verify did not notice a bad key: {}",
        text(&out)
    );
    Ok(())
}

#[tokio::test]
async fn service_exposure_is_at_most_2_0() -> Result<()> {
    let service = units_dir()?.join("runlockd.service");
    let out = tool(
        "systemd-analyze",
        &["security", "--offline=yes", &service.display().to_string()],
    )
    .await?;
    let report = text(&out);
    // "→ Overall exposure level for runlockd.service: 1.2 OK 🙂"
    let exposure: f64 = report
        .lines()
        .find_map(|line| line.split_once("Overall exposure level for runlockd.service:"))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|score| score.parse().ok())
        .with_context(|| format!("no overall exposure level in:\n{report}"))?;
    ensure!(
        exposure <= MAX_EXPOSURE,
        "exposure {exposure} is above {MAX_EXPOSURE}:\n{report}"
    );
    Ok(())
}

#[tokio::test]
async fn sysusers_and_tmpfiles_make_the_user_and_its_directories() -> Result<()> {
    let root = temp_dir()?;
    std::fs::create_dir(root.path().join("etc"))?;
    let root_arg = format!("--root={}", root.path().display());
    let units = units_dir()?;
    let sysusers = units.join("sysusers.d/runlock.conf").display().to_string();
    let out = tool("systemd-sysusers", &[&root_arg, &sysusers]).await?;
    ensure!(out.status.success(), "systemd-sysusers: {}", text(&out));

    let user = runlock_user(root.path())?;
    let (uid, gid): (u32, u32) = (user[2].parse()?, user[3].parse()?);
    ensure!(uid != 0 && uid < 1000, "not a system user: {user:?}");
    ensure!(user[5] == "/var/lib/runlock", "home: {user:?}");
    let group = std::fs::read_to_string(root.path().join("etc/group"))?;
    ensure!(
        group
            .lines()
            .any(|l| l.starts_with(&format!("runlock:x:{gid}:"))),
        "no group runlock with gid {gid} in:\n{group}"
    );

    // tmpfiles resolves runlock through the --root's /etc/passwd just written.
    let tmpfiles = units.join("tmpfiles.d/runlock.conf").display().to_string();
    let out = tool("systemd-tmpfiles", &["--create", &root_arg, &tmpfiles]).await?;
    ensure!(out.status.success(), "systemd-tmpfiles: {}", text(&out));
    // The socket's directory lets the group reach the socket; the lock
    // directory is the agent's alone (tests/trust/file_layout.rs attacks it).
    for (dir, want) in [("run/runlock", 0o750), ("var/lib/runlock", 0o700)] {
        let meta = std::fs::metadata(root.path().join(dir)).with_context(|| dir.to_string())?;
        ensure!(
            meta.is_dir()
                && meta.uid() == uid
                && meta.gid() == gid
                && meta.permissions().mode() & 0o7777 == want,
            "/{dir}: uid {} gid {} mode {:o}",
            meta.uid(),
            meta.gid(),
            meta.permissions().mode() & 0o7777
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_serves_on_a_socket_passed_by_socket_activation() -> Result<()> {
    let bins = bins()?;
    let dir = temp_dir()?;
    let socket = dir.path().join("agent.sock");
    // --socket names the same path: an agent binding it itself would refuse
    // it, since systemd-socket-activate is listening there.
    let mut activator = Command::new("systemd-socket-activate");
    activator
        .arg("-l")
        .arg(&socket)
        .arg(&bins.runlockd)
        .arg("--socket")
        .arg(&socket)
        .args(["--backend", "memory://"])
        .env_remove("NOTIFY_SOCKET")
        .env_remove("RUNLOCK_SOCKET")
        .env_remove("RUNLOCK_BACKEND")
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = activator
        .spawn()
        .context("starting systemd-socket-activate (package systemd)")?;
    let pid = child.id().context("no pid")?;
    // Its stderr, then (after the exec) runlockd's, line by line.
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let mut stderr = BufReader::new(child.stderr.take().context("no stderr")?).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = stderr.next_line().await {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut log = Vec::new();
    wait_for_line(&mut lines, &mut log, "Listening on").await?;

    // The first connection starts the agent; the second run finds it serving.
    // memory:// starts its tokens at 1, so 1 then 2 means one agent served both.
    let k = key("socket-activation");
    for token in 1..=2 {
        let mut shim = Command::new(&bins.runlock);
        shim.arg("--socket")
            .arg(&socket)
            .args(["run", "--key", &k, "--", "sh", "-c"])
            .arg("echo token $RUNLOCK_TOKEN")
            .env_remove("RUNLOCK_SOCKET")
            .kill_on_drop(true);
        let out = Run::spawn(shim)?.finish().await?;
        out.expect_code(0)?;
        ensure!(out.stdout.trim() == format!("token {token}"), "{out:?}");
    }
    wait_for_line(
        &mut lines,
        &mut log,
        "listening on the socket systemd passed",
    )
    .await?;
    ensure!(
        child.try_wait()?.is_none(),
        "the agent has exited after two runs"
    );

    kill(Pid::from_raw(pid as i32), Signal::SIGTERM)?;
    let status = within(WAIT, "runlockd to exit", child.wait()).await??;
    ensure!(status.success(), "runlockd exited with {status:?}");
    // The file belongs to the socket unit (here, to systemd-socket-activate).
    ensure!(socket.exists(), "the agent removed systemd's socket file");
    Ok(())
}

#[tokio::test]
async fn agent_refuses_a_passed_descriptor_that_is_not_a_listening_socket() -> Result<()> {
    let dir = temp_dir()?;
    let socket = dir.path().join("agent.sock");
    // LISTEN_PID must be the agent's own pid, known only inside the shell that execs it.
    let mut agent = Command::new("sh");
    agent
        .arg("-c")
        .arg(r#"export LISTEN_PID=$$ LISTEN_FDS=1; exec "$0" "$@" 3</dev/null"#)
        .arg(&bins()?.runlockd)
        .arg("--socket")
        .arg(&socket)
        .args(["--backend", "memory://"])
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDNAMES")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = within(WAIT, "runlockd to give up", agent.output()).await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.code() == Some(1) && stderr.contains("the socket systemd passed"),
        "runlockd took /dev/null for a socket ({}): {stderr}",
        out.status
    );
    ensure!(!socket.exists(), "it bound its own socket instead");
    Ok(())
}

/// Waits (bounded) for a line of `lines` that contains `want`, keeping all in `log`.
async fn wait_for_line(
    lines: &mut UnboundedReceiver<String>,
    log: &mut Vec<String>,
    want: &str,
) -> Result<()> {
    within(WAIT, want, async {
        while let Some(line) = lines.recv().await {
            let found = line.contains(want);
            log.push(line);
            if found {
                return Ok(());
            }
        }
        bail!("stderr closed without {want:?}:\n{}", log.join("\n"))
    })
    .await?
}

/// Every line of every datagram the agent sends to its NOTIFY_SOCKET.
struct Notifications {
    socket: UnixDatagram,
    seen: Vec<String>,
}

impl Notifications {
    /// Waits (bounded) for a line that `want` accepts, keeping all lines seen.
    async fn until(&mut self, what: &str, want: impl Fn(&str) -> bool) -> Result<()> {
        let mut buf = vec![0u8; 4096];
        let result = within(WAIT, what, async {
            loop {
                let n = self.socket.recv(&mut buf).await?;
                let mut found = false;
                for line in String::from_utf8_lossy(&buf[..n]).lines() {
                    found |= want(line);
                    self.seen.push(line.to_string());
                }
                if found {
                    return anyhow::Ok(());
                }
            }
        })
        .await;
        result?.with_context(|| format!("notifications so far: {:?}", self.seen))
    }

    fn count(&self, line: &str) -> usize {
        self.seen.iter().filter(|l| *l == line).count()
    }
}

/// runlockd on memory:// with its NOTIFY_SOCKET bound by the test, and a
/// watchdog of `watchdog_usec` with no WATCHDOG_PID: like libsystemd, the
/// agent takes a watchdog without one as its own.
fn notifying_agent(dir: &Path, watchdog_usec: &str) -> Result<(Child, Notifications, PathBuf)> {
    let socket = dir.join("agent.sock");
    let notify_path = dir.join("notify.sock");
    let notes = Notifications {
        socket: UnixDatagram::bind(&notify_path)?,
        seen: Vec::new(),
    };
    let mut agent = Command::new(&bins()?.runlockd);
    agent
        .arg("--socket")
        .arg(&socket)
        .args(["--backend", "memory://"])
        .env("NOTIFY_SOCKET", &notify_path)
        .env("WATCHDOG_USEC", watchdog_usec)
        .env_remove("WATCHDOG_PID")
        .env_remove("RUNLOCK_SOCKET")
        .env_remove("RUNLOCK_BACKEND")
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("runlockd.log"))?)
        .kill_on_drop(true);
    let child = agent.spawn().context("starting runlockd")?;
    Ok((child, notes, socket))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_notifies_ready_status_watchdog_and_stopping() -> Result<()> {
    let dir = temp_dir()?;
    // 0.2 s: pings every 0.1 s.
    let (mut child, mut notes, socket) = notifying_agent(dir.path(), "200000")?;
    let log = || std::fs::read_to_string(dir.path().join("runlockd.log")).unwrap_or_default();

    notes.until("READY=1", |l| l == "READY=1").await?;
    let status = notes
        .seen
        .iter()
        .find_map(|l| l.strip_prefix("STATUS="))
        .with_context(|| format!("no STATUS= with READY=1: {:?}", notes.seen))?;
    ensure!(
        status.contains(&socket.display().to_string())
            && status.contains("memory://")
            && status.contains("0 leases held"),
        "first status: {status:?}"
    );

    let mut pings = 0;
    while pings < 2 {
        notes.until("two WATCHDOG=1", |l| l == "WATCHDOG=1").await?;
        pings = notes.count("WATCHDOG=1");
    }

    // The status follows the number of leases held.
    let mut client = RawClient::connect(&socket).await?;
    client.hello().await?;
    let k = key("notify-status");
    let reply = client.call(crate::support::client::acquire(&[&k])).await?;
    ensure!(
        matches!(reply, runlock_protocol::AgentMessage::Acquired { .. }),
        "{reply:?}"
    );
    notes
        .until("STATUS= with 1 lease held", |l| {
            l.starts_with("STATUS=") && l.contains("1 lease held")
        })
        .await?;

    kill(
        Pid::from_raw(child.id().context("no pid")? as i32),
        Signal::SIGTERM,
    )?;
    notes.until("STOPPING=1", |l| l == "STOPPING=1").await?;
    let exit = within(WAIT, "runlockd to exit", child.wait()).await??;
    ensure!(exit.success(), "runlockd exited with {exit:?}:\n{}", log());

    // Everything it sent is queued by now: no ping may follow STOPPING=1.
    let mut buf = vec![0u8; 4096];
    while let Ok(n) = notes.socket.try_recv(&mut buf) {
        notes
            .seen
            .extend(String::from_utf8_lossy(&buf[..n]).lines().map(String::from));
    }
    let stopping = notes
        .seen
        .iter()
        .position(|l| l == "STOPPING=1")
        .context("STOPPING=1 vanished")?;
    ensure!(
        !notes.seen[stopping..].iter().any(|l| l == "WATCHDOG=1"),
        "a watchdog ping after STOPPING=1: {:?}",
        notes.seen
    );
    Ok(())
}

/// A service manager that stops reading (here: after READY=1) fills the
/// notify socket's queue; the agent must go on serving and stop on SIGTERM,
/// dropping the notifications it cannot send, and say so once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_manager_that_stops_reading_costs_notifications_not_service() -> Result<()> {
    let dir = temp_dir()?;
    // 2 ms: a ping every millisecond fills the queue (10 datagrams here) at once.
    let (mut child, mut notes, socket) = notifying_agent(dir.path(), "2000")?;
    let log = || std::fs::read_to_string(dir.path().join("runlockd.log")).unwrap_or_default();
    notes.until("READY=1", |l| l == "READY=1").await?;

    // Nothing is read from here on. The agent says when a send finds the queue
    // full; a blocking send would instead hold a runtime thread forever.
    let deadline = Deadline::new(WAIT, "the agent to find the notify queue full");
    while !log().contains("not reading its notify socket") {
        deadline.tick().await.with_context(log)?;
    }
    let mut client = RawClient::connect(&socket).await?;
    client.hello().await?;
    for round in 0..3 {
        let k = key(&format!("notify-full-{round}"));
        let reply = client.call(crate::support::client::acquire(&[&k])).await?;
        ensure!(
            matches!(reply, runlock_protocol::AgentMessage::Acquired { .. }),
            "acquire with the notify queue full: {reply:?}\n{}",
            log()
        );
    }
    kill(
        Pid::from_raw(child.id().context("no pid")? as i32),
        Signal::SIGTERM,
    )?;
    let exit = within(
        WAIT,
        "runlockd to stop with the notify queue full",
        child.wait(),
    )
    .await
    .with_context(log)??;
    ensure!(exit.success(), "runlockd exited with {exit:?}:\n{}", log());
    ensure!(
        log().matches("not reading its notify socket").count() == 1,
        "the full queue should be reported once:\n{}",
        log()
    );
    Ok(())
}

/// `systemd/examples/`, the pipeline's service and timer, copied into `dir`
/// with `runlock` pointed at the built shim (verify checks that ExecStart's
/// program exists) and `edit` applied to the service.
fn copy_examples(dir: &Path, edit: impl Fn(String) -> String) -> Result<(PathBuf, PathBuf)> {
    let examples = units_dir()?.join("examples");
    let service = std::fs::read_to_string(examples.join("meltano-pipeline.service"))?;
    let exec = "\nExecStart=/usr/bin/runlock ";
    ensure!(service.contains(exec), "the example does not run {exec:?}");
    let service = service.replace(exec, &format!("\nExecStart={} ", bins()?.runlock.display()));
    let (service_path, timer_path) = (
        dir.join("meltano-pipeline.service"),
        dir.join("meltano-pipeline.timer"),
    );
    std::fs::write(&service_path, edit(service))?;
    std::fs::copy(examples.join("meltano-pipeline.timer"), &timer_path)?;
    Ok((service_path, timer_path))
}

/// `systemd-analyze verify` on the example with the agent's units beside it
/// (the example requires runlockd.socket).
async fn verify_example(edit: impl Fn(String) -> String) -> Result<Output> {
    let dir = temp_dir()?;
    let (agent_service, agent_socket) = copy_units(dir.path(), |s| s)?;
    let (service, timer) = copy_examples(dir.path(), edit)?;
    let paths = [agent_service, agent_socket, service, timer].map(|p| p.display().to_string());
    let mut args = vec!["verify", "--man=no"];
    args.extend(paths.iter().map(String::as_str));
    tool("systemd-analyze", &args).await
}

#[tokio::test]
async fn pipeline_example_passes_systemd_analyze_verify() -> Result<()> {
    expect_verified(&verify_example(|s| s).await?, "systemd/examples")?;
    // As above: verify must be reading the example.
    let out =
        verify_example(|s| s.replace("\nType=oneshot\n", "\nType=oneshot\nNoSuchSetting=yes\n"))
            .await?;
    ensure!(
        text(&out).contains("NoSuchSetting"),
        "verify did not notice a bad key in the example: {}",
        text(&out)
    );
    Ok(())
}

/// The settings of `[Service]` in the example: `(name, value)` in order.
fn example_settings() -> Result<Vec<(String, String)>> {
    let service = std::fs::read_to_string(units_dir()?.join("examples/meltano-pipeline.service"))?;
    Ok(service
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_example_runs_locked_on_the_socket_the_agents_unit_listens_on() -> Result<()> {
    let settings = example_settings()?;
    let env: Vec<(String, String)> = settings
        .iter()
        .filter(|(k, _)| k == "Environment")
        .filter_map(|(_, v)| v.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let socket_unit = std::fs::read_to_string(units_dir()?.join("runlockd.socket"))?;
    let listens = socket_unit
        .lines()
        .find_map(|l| l.strip_prefix("ListenStream="))
        .context("runlockd.socket listens nowhere")?;
    ensure!(
        env.iter()
            .any(|(k, v)| k == "RUNLOCK_SOCKET" && v == listens),
        "the example's RUNLOCK_SOCKET is not {listens}: {env:?}"
    );
    // 75 (held elsewhere: skipped, from the shim or the Meltano add-on)
    // counts as success and is never restarted; 76 (lost) must fail.
    let statuses = |name: &str| {
        settings
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.split_whitespace().map(String::from).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let success = statuses("SuccessExitStatus");
    ensure!(
        success.iter().any(|c| c == "75") && !success.iter().any(|c| c == "76"),
        "SuccessExitStatus={success:?}"
    );
    let no_restart = statuses("RestartPreventExitStatus");
    ensure!(
        no_restart.iter().any(|c| c == "75"),
        "RestartPreventExitStatus={no_restart:?}"
    );

    let exec = settings
        .iter()
        .find(|(k, _)| k == "ExecStart")
        .context("no ExecStart")?;
    let line: Vec<String> = exec.1.split_whitespace().map(String::from).collect();
    let agent = crate::support::TestAgent::start("memory://").await?;
    let out = crate::shipped::deploy::run_example_line(&agent, &line, &env).await?;
    out.expect_code(0)?;
    ensure!(
        out.stdout.trim() == format!("keys {}", crate::shipped::deploy::EXAMPLE_KEY),
        "{out:?}"
    );
    Ok(())
}
