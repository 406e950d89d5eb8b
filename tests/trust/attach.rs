//! A member of the socket's group acts only on its own processes (DESIGN
//! invariant 7). `attach` refuses another user's process, init, the agent and
//! nonsense; and when a lease whose client is gone is broken or forced, the
//! agent signals only the member's own processes in the attached group. The
//! member is `nobody`, connected through a process that then exits
//! (`RawClient::connect_as`), as a shim killed after `attach` would be.

use crate::support::client::RawClient;
use crate::support::{key, setpriv, Run, TestAgent};
use crate::trust::access::{agent, member_holds, NOBODY, RUNLOCK_GROUP};
use anyhow::{bail, ensure, Context, Result};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use runlock_protocol::{AcquireRequest, AgentMessage, ClientMessage, ErrorCode, OnLost};
use std::os::unix::process::ExitStatusExt;
use tokio::process::{Child, Command};

/// How a root user takes a member's lease away.
#[derive(Debug, Clone, Copy)]
enum Breaker {
    /// `runlock release KEY`.
    Release,
    /// `runlock run --force --key KEY -- true`.
    Force,
}

const BREAKERS: [Breaker; 2] = [Breaker::Release, Breaker::Force];

impl Breaker {
    async fn take(self, agent: &TestAgent, key: &str) -> Result<()> {
        let out = match self {
            Breaker::Release => agent.runlock_output(&["release", key]).await?,
            Breaker::Force => {
                let force = ["run", "--force", "--key", key, "--", "true"];
                agent.runlock_output(&force).await?
            }
        };
        out.expect_code(0).with_context(|| format!("{self:?}"))
    }
}

/// Whether `pid` is a process that has not exited: these tests do not reap
/// what they started before checking, so a killed one shows as a zombie.
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("Z" | "X") | None)
}

/// Root's `sleep` in a process group of its own, or in `group`.
fn roots_sleeper(group: Option<u32>) -> Result<Child> {
    let mut command = Command::new("sleep");
    command
        .arg("600")
        .process_group(group.unwrap_or(0) as i32)
        .kill_on_drop(true);
    command.spawn().context("starting sleep")
}

fn pid_of(child: &Child) -> Result<u32> {
    child.id().context("already waited for")
}

/// Nobody's `sleep` in a process group of its own, once it runs as nobody;
/// its pid is also its group.
async fn nobodys_sleeper() -> Result<(Run, u32)> {
    let mut command = setpriv(NOBODY, NOBODY, &[]);
    command
        .args(["sh", "-c", "echo ready $$; exec sleep 600"])
        .process_group(0);
    let mut run = Run::spawn(command)?;
    let pid = run.ready().await?.pid;
    Ok((run, pid))
}

/// `nobody`, a member of the socket's group, with `key` (whose loss the
/// agent answers with SIGKILL at once, so nothing is left to happen later).
async fn member_holding(agent: &TestAgent, key: &str) -> Result<RawClient> {
    let mut member =
        RawClient::connect_as(agent.socket(), NOBODY, NOBODY, &[RUNLOCK_GROUP]).await?;
    member.hello().await?;
    let acquire = ClientMessage::Acquire(AcquireRequest {
        slots: 1,
        keys: vec![key.to_string()],
        ttl_ms: None,
        wait_ms: 0,
        force: false,
        command: "attacker".to_string(),
        on_lost: OnLost::Kill,
    });
    match member.call(acquire).await? {
        AgentMessage::Acquired { .. } => Ok(member),
        other => bail!("expected acquired, got {other:?}"),
    }
}

async fn attach(member: &mut RawClient, pid: u32, pgid: u32) -> Result<AgentMessage> {
    member.call(ClientMessage::Attach { pid, pgid }).await
}

/// [`member_holding`], its own process group `group` attached.
async fn member_attached(agent: &TestAgent, key: &str, group: u32) -> Result<RawClient> {
    let mut member = member_holding(agent, key).await?;
    let attached = attach(&mut member, group, group).await?;
    ensure!(matches!(attached, AgentMessage::Attached), "{attached:?}");
    Ok(member)
}

/// `breaker` takes the member's lease, and the member is told. The member's
/// connection then closes, as its run's would once stopped: a forced run
/// waits for that (invariant 10).
async fn break_and_tell(
    agent: &TestAgent,
    mut member: RawClient,
    key: &str,
    breaker: Breaker,
) -> Result<()> {
    let told = async move {
        let event = member.next_event().await;
        drop(member);
        event
    };
    let (taken, told) = tokio::join!(breaker.take(agent, key), told);
    taken?;
    match told? {
        AgentMessage::Lost { .. } => Ok(()),
        other => bail!("{breaker:?}: expected lost, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_of_what_is_not_the_members_own_is_refused_and_nothing_is_signalled() -> Result<()> {
    let agent = agent("").await?;
    let agent_pid = agent.pid().context("the agent is not running")?;
    let agent_group = nix::unistd::getpgid(Some(Pid::from_raw(agent_pid as i32)))?.as_raw() as u32;
    let roots = roots_sleeper(None)?;
    let root = pid_of(&roots)?;
    let (_own, own) = nobodys_sleeper().await?;
    let mismatch = format!("process {own} is in process group {own}, not {root}");
    let cases = [
        (root, root, ErrorCode::Forbidden, "it belongs to uid 0"),
        (own, 0, ErrorCode::BadRequest, "pgid 0"),
        (1, 1, ErrorCode::Forbidden, "pid 1"),
        (
            agent_pid,
            agent_group,
            ErrorCode::Forbidden,
            "the agent itself",
        ),
        (own, agent_group, ErrorCode::Forbidden, "the agent's own"),
        (own, root, ErrorCode::BadRequest, mismatch.as_str()),
    ];
    for (n, (pid, pgid, code, says)) in cases.into_iter().enumerate() {
        let k = key(&format!("attach-refused-{n}"));
        for breaker in BREAKERS {
            let case = format!("attach {{pid: {pid}, pgid: {pgid}}}, then {breaker:?}");
            let mut member = member_holding(&agent, &k).await?;
            match attach(&mut member, pid, pgid).await? {
                AgentMessage::Error(err) => {
                    ensure!(err.code == code, "{case}: {err:?}");
                    ensure!(err.message.contains(says), "{case}: {err:?}");
                }
                other => bail!("{case}: expected an error, got {other:?}"),
            }
            break_and_tell(&agent, member, &k, breaker).await?;
            for (whose, pid) in [("root's", root), ("nobody's", own), ("init", 1)] {
                ensure!(alive(pid), "{case}: {whose} process {pid} was killed");
            }
            ensure!(alive(agent_pid), "{case}: the agent was killed");
            agent.still_serves().await.context(case)?;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_run_is_stopped_but_roots_process_in_its_group_is_left_alone() -> Result<()> {
    let agent = agent("").await?;
    let k = key("attach-own-group");
    for breaker in BREAKERS {
        let (mut own, group) = nobodys_sleeper().await?;
        // Root's process joins nobody's group (same session), as a member cannot make it.
        let roots = roots_sleeper(Some(group))?;
        let root = pid_of(&roots)?;
        let member = member_attached(&agent, &k, group).await?;
        break_and_tell(&agent, member, &k, breaker).await?;
        let status = own.wait().await?;
        ensure!(
            status.signal() == Some(Signal::SIGKILL as i32),
            "{breaker:?}: nobody's run was not stopped: {status:?}"
        );
        ensure!(
            alive(root),
            "{breaker:?}: root's process in the group was killed"
        );
        agent.still_serves().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_orphaned_run_is_stopped_when_its_lease_is_broken_or_forced() -> Result<()> {
    let agent = agent("").await?;
    let k = key("attach-orphan");
    for breaker in BREAKERS {
        let (mut run, ready) = member_holds(&agent, &k).await?;
        agent.wait_attached(ready.pid).await?;
        run.signal(Signal::SIGKILL)?;
        run.wait().await?;

        breaker.take(&agent, &k).await?;
        // The shim is gone, so the agent applies --on-lost term to nobody's group itself.
        run.until_stdout_closes().await?;
        ensure!(
            !run.lines_seen().iter().any(|l| l == "bye"),
            "{breaker:?}: the command ended on its own, it was not stopped"
        );
    }
    Ok(())
}

/// Starts root's `sleep`, in a group of its own, with the pid `want` (free
/// now): the kernel hands out the pid after `ns_last_pid`, unless another
/// process on the machine forks in between and takes it. Then it stays taken
/// (by a thread of a test, say) and this returns `None`: the caller starts
/// over with a new pid (CI at 1209d98 lost one pid 1000 times in a row).
fn roots_sleeper_with_pid(want: u32) -> Result<Option<Child>> {
    const LAST_PID: &str = "/proc/sys/kernel/ns_last_pid";
    let taken = || std::path::Path::new(&format!("/proc/{want}")).exists();
    for _ in 0..100 {
        if taken() {
            return Ok(None);
        }
        let last = std::fs::read_to_string(LAST_PID).context("reading ns_last_pid")?;
        std::fs::write(LAST_PID, (want - 1).to_string()).context("writing ns_last_pid")?;
        let child = roots_sleeper(None);
        // Put the counter back at once, or every process on the machine would
        // get recently freed pids for a while (other tests' included).
        std::fs::write(LAST_PID, last.trim()).context("restoring ns_last_pid")?;
        let child = child?;
        if pid_of(&child)? == want {
            return Ok(Some(child));
        }
    }
    bail!("pid {want} stayed free, yet 100 processes in a row got another")
}

/// A member holding a key, attached to its own group of nobody's, which has
/// ended: root's new process now has the pid, and the group, nobody attached.
/// Each attempt takes a key of its own, so one the race lost leaves nothing
/// in the way of the next.
async fn nobodys_run_whose_pid_root_reuses(
    agent: &TestAgent,
    breaker: Breaker,
) -> Result<(RawClient, u32, Child, String)> {
    for attempt in 0..5 {
        let k = key(&format!("attach-reused-{breaker:?}-{attempt}"));
        let (mut own, group) = nobodys_sleeper().await?;
        let member = member_attached(agent, &k, group).await?;
        own.signal(Signal::SIGKILL)?;
        own.wait().await?;
        drop(own);
        if let Some(roots) = roots_sleeper_with_pid(group)? {
            return Ok((member, group, roots, k));
        }
    }
    bail!("another process took the freed pid first, 5 times in a row")
}

/// Root's new process has nobody's old pid, group and session: only its
/// owner, checked through a pidfd just before the signal, tells it apart. (A
/// root peer's run reused by another root process is told apart by its
/// session; the pidfd keeps a pid from changing hands between check and signal.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_pid_reused_by_root_after_its_run_ended_is_not_signalled() -> Result<()> {
    let agent = agent("").await?;
    for breaker in BREAKERS {
        let (member, group, roots, k) = nobodys_run_whose_pid_root_reuses(&agent, breaker).await?;
        break_and_tell(&agent, member, &k, breaker).await?;
        ensure!(
            alive(pid_of(&roots)?),
            "{breaker:?}: root's process that reused pid {group} was killed"
        );
        agent.still_serves().await?;
    }
    Ok(())
}
