//! The run's processes: who owns them, whether they live, and signalling them
//! safely (DESIGN invariant 7). A pid or group a peer names must be its own
//! (its uid; anyone's for root) and never init's or the agent's; that is
//! checked when it is named and again, through a pidfd, before every signal,
//! so a pid reused by another process is never signalled.

use nix::sys::signal::Signal;
use runlock_protocol::{procfs, ErrorCode, OnLost};
use std::collections::HashSet;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;
use tokio_util::task::TaskTracker;

/// How often a group is scanned again for members forked while it was being
/// signalled (killpg is one step in the kernel; a scan of /proc is not).
const SIGNAL_PASSES: usize = 4;
/// How often a run's group is looked at where its members' exits cannot be
/// awaited (no pidfd: before Linux 5.3).
const EXIT_POLL: Duration = Duration::from_millis(100);
/// How often a run's group is scanned again while one member's exit is
/// awaited: a member can leave the group (`setsid`) without exiting, and the
/// run ends when the group is empty, not when that process ends.
const REGROUP_SCAN: Duration = Duration::from_secs(1);

/// A process held by a pidfd: whatever later reuses its pid is not it.
#[derive(Debug)]
pub struct Pidfd(OwnedFd);

impl Pidfd {
    /// The process `pid` is now.
    pub fn open(pid: u32) -> io::Result<Pidfd> {
        let pid =
            libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just created this descriptor (close-on-exec) and nothing else owns it.
        Ok(Pidfd(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
    }

    /// The process that connected `socket`, as it was when it connected (SO_PEERPIDFD).
    pub fn of_peer(socket: &impl AsFd) -> io::Result<Pidfd> {
        let mut fd: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `fd` is valid for `len` bytes and the kernel writes at most that many.
        let rc = unsafe {
            libc::getsockopt(
                socket.as_fd().as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERPIDFD,
                (&mut fd as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if rc != 0 || fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: on success the kernel handed us a new descriptor that nothing else owns.
        Ok(Pidfd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Whether the process has exited, a zombie not yet reaped included.
    pub fn exited(&self) -> bool {
        self.wait_exit(Duration::ZERO)
    }

    /// Waits at most `limit` for the process to exit; whether it has.
    fn wait_exit(&self, limit: Duration) -> bool {
        let mut poll = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let timeout = limit.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd, for the duration of the call.
        let rc = unsafe { libc::poll(&mut poll, 1, timeout) };
        // A pidfd turns readable when its process exits. An error cannot show it
        // alive, and "exited" is the side that never signals it.
        rc != 0
    }

    fn signal(&self, signal: Signal) -> io::Result<()> {
        // SAFETY: a valid pidfd, a signal number, no siginfo and no flags.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                signal as libc::c_int,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// A connection's peer (its shim), watched from the moment it connected, so
/// that a reused pid cannot pass for it. Unknown counts as gone: the agent
/// then acts for the run, which it may only do on the run's own processes.
#[derive(Debug, Default)]
pub struct Peer(Option<Pidfd>);

impl Peer {
    /// The peer of `socket`, whose pid SO_PEERCRED says is `pid`.
    pub fn of(socket: &impl AsFd, pid: u32) -> Peer {
        match Pidfd::of_peer(socket) {
            Ok(fd) => Peer(Some(fd)),
            // Before Linux 6.5: the pid, opened at once, can only be someone
            // else's if the peer has already gone.
            Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => Peer::of_pid(pid),
            Err(_) => Peer(None),
        }
    }

    /// The process `pid` is now.
    pub fn of_pid(pid: u32) -> Peer {
        Peer(Pidfd::open(pid).ok())
    }

    /// Whether the peer has exited (or was never known).
    pub fn gone(&self) -> bool {
        self.0.as_ref().is_none_or(Pidfd::exited)
    }
}

/// What /proc says of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Process {
    pid: u32,
    stat: procfs::Stat,
    /// The real uid, the one kill(2) checks.
    uid: u32,
}

impl Process {
    /// The process `pid`, if its group and session pass `wanted` (asked
    /// before its owner is read: a scan of /proc reads a file less per process).
    fn read(pid: u32, wanted: impl Fn(u32, u32) -> bool) -> Option<Process> {
        let stat = procfs::Stat::read(pid)?;
        if !wanted(stat.pgrp, stat.session) {
            return None;
        }
        Some(Process {
            pid,
            stat,
            uid: procfs::real_uid(pid)?,
        })
    }
}

/// Processes no peer may have signalled, whatever its uid.
fn protected(pid: u32) -> bool {
    pid == 1 || pid == std::process::id()
}

/// A live process's place with respect to a run.
#[derive(Debug, PartialEq, Eq)]
enum Place {
    Outside,
    /// In the run's group, but another user's (or init, or the agent).
    Foreign,
    Member,
}

/// The run a peer attached: its process group, checked to be the peer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pid: u32,
    pgid: u32,
    /// A group lives in one session: the same number in another session is a
    /// reused one, not this run's.
    session: u32,
    /// Whose processes it may signal: the peer's uid, or anyone's for root.
    owner: Option<u32>,
}

/// Why a peer may not name a process as its run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachRefused {
    /// Pid 0 names no process.
    #[error("pid 0 is not a process")]
    NoPid,
    /// Group 0 names no group.
    #[error("pgid 0 is not a process group")]
    NoGroup,
    /// Init or its group.
    #[error("init (pid 1) and its group are never signalled")]
    Init,
    /// The agent's own process.
    #[error("pid {0} is the agent itself")]
    Agent(u32),
    /// The agent's own process group.
    #[error("process group {0} is the agent's own")]
    AgentGroup(u32),
    /// No such live process.
    #[error("there is no process {0}")]
    NoProcess(u32),
    /// Another user's process.
    #[error("uid {uid} may not attach process {pid}: it belongs to uid {owner}")]
    NotOwned {
        /// The peer's uid.
        uid: u32,
        /// The process named.
        pid: u32,
        /// Its real uid.
        owner: u32,
    },
    /// The process is in another group than the one named.
    #[error("process {pid} is in process group {actual}, not {named}")]
    OtherGroup {
        /// The process named.
        pid: u32,
        /// Its group.
        actual: u32,
        /// The group named.
        named: u32,
    },
}

impl AttachRefused {
    /// Its code: `forbidden` where the process is not the peer's to name,
    /// `bad_request` where it names nothing that could be.
    pub fn code(&self) -> ErrorCode {
        use AttachRefused::*;
        match self {
            Init | Agent(_) | AgentGroup(_) | NotOwned { .. } => ErrorCode::Forbidden,
            NoPid | NoGroup | NoProcess(_) | OtherGroup { .. } => ErrorCode::BadRequest,
        }
    }
}

impl Run {
    /// The run of a peer of `uid` whose pid is `pid` in group `pgid`, if
    /// `pid` is a live process of that uid (anyone's for root) in that group,
    /// and neither init nor the agent; the refusal names what is wrong.
    pub fn attach(uid: u32, pid: u32, pgid: u32) -> Result<Run, AttachRefused> {
        let agent_group = nix::unistd::getpgrp().as_raw() as u32;
        if pid == 0 {
            return Err(AttachRefused::NoPid);
        }
        if pgid == 0 {
            return Err(AttachRefused::NoGroup);
        }
        if pid == 1 || pgid == 1 {
            return Err(AttachRefused::Init);
        }
        if pid == std::process::id() {
            return Err(AttachRefused::Agent(pid));
        }
        if pgid == agent_group {
            return Err(AttachRefused::AgentGroup(pgid));
        }
        let gone = || AttachRefused::NoProcess(pid);
        let fd = Pidfd::open(pid).map_err(|_| gone())?;
        // Read after the pidfd pins the process: if it has not exited since, what
        // /proc said was about it and not about a process that reused its pid.
        let process = Process::read(pid, |_, _| true)
            .filter(|p| !p.stat.exited && !fd.exited())
            .ok_or_else(gone)?;
        let owner = (uid != 0).then_some(uid);
        if owner.is_some_and(|uid| uid != process.uid) {
            return Err(AttachRefused::NotOwned {
                uid,
                pid,
                owner: process.uid,
            });
        }
        if process.stat.pgrp != pgid {
            return Err(AttachRefused::OtherGroup {
                pid,
                actual: process.stat.pgrp,
                named: pgid,
            });
        }
        Ok(Run {
            pid,
            pgid,
            session: process.stat.session,
            owner,
        })
    }

    /// The attached pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The attached process group.
    pub fn pgid(&self) -> u32 {
        self.pgid
    }

    fn in_group(&self, pgrp: u32, session: u32) -> bool {
        pgrp == self.pgid && session == self.session
    }

    fn place(&self, p: &Process) -> Place {
        if p.stat.exited || !self.in_group(p.stat.pgrp, p.stat.session) {
            Place::Outside
        } else if protected(p.pid) || self.owner.is_some_and(|uid| uid != p.uid) {
            Place::Foreign
        } else {
            Place::Member
        }
    }

    /// Every live process in the run's group, with its place.
    fn scan(&self) -> impl Iterator<Item = (Process, Place)> + '_ {
        procfs::pids()
            .filter_map(|pid| Process::read(pid, |pgrp, sid| self.in_group(pgrp, sid)))
            .map(|p| (p, self.place(&p)))
            .filter(|(_, place)| *place != Place::Outside)
    }

    /// Whether the run's group still has a live process of the run's owner:
    /// another user's process in it does not keep the run going.
    pub fn has_members(&self) -> bool {
        self.scan().any(|(_, place)| place == Place::Member)
    }

    /// Returns once the run's group has no member left. It awaits one
    /// member's exit at a time, through its pidfd, and scans the group again
    /// after each (members may have forked or left meanwhile), and at least
    /// every [`REGROUP_SCAN`]; it polls only where a pidfd cannot be had.
    pub async fn ended(&self) {
        use tokio::io::unix::AsyncFd;
        use tokio::io::Interest;
        loop {
            let member = self
                .scan()
                .find_map(|(p, place)| (place == Place::Member).then_some(p.pid));
            let Some(member) = member else {
                return;
            };
            // A pidfd turns readable when its process exits.
            let exit = Pidfd::open(member).ok().and_then(|fd| {
                // SAFETY: the AsyncFd owns the descriptor until it is dropped,
                // and an OwnedFd's raw descriptor never changes.
                unsafe { AsyncFd::register_with_interest(fd.0, Interest::READABLE) }.ok()
            });
            let awaited = match exit {
                Some(exit) => tokio::select! {
                    readable = exit.readable() => readable.is_ok(),
                    () = tokio::time::sleep(REGROUP_SCAN) => true,
                },
                None => false,
            };
            if !awaited {
                tokio::time::sleep(EXIT_POLL).await;
            }
        }
    }

    /// Sends `signal` to each member of the group, through a pidfd and after
    /// checking it again; returns how many were signalled.
    fn signal(&self, signal: Signal) -> usize {
        let mut signalled = HashSet::new();
        let mut foreign = 0;
        for _ in 0..SIGNAL_PASSES {
            let mut fresh = 0;
            foreign = 0;
            for (p, place) in self.scan() {
                if place == Place::Foreign {
                    foreign += 1;
                } else if !signalled.contains(&(p.pid, p.stat.start)) {
                    fresh += 1;
                    if self.signal_one(p.pid, signal) {
                        signalled.insert((p.pid, p.stat.start));
                    }
                }
            }
            if fresh == 0 {
                break;
            }
        }
        if foreign > 0 {
            tracing::warn!(
                pgid = self.pgid,
                processes = foreign,
                "left processes of other users in the run's group alone"
            );
        }
        tracing::info!(pgid = self.pgid, %signal, processes = signalled.len(), "signalled the run");
        signalled.len()
    }

    fn signal_one(&self, pid: u32, signal: Signal) -> bool {
        let Ok(fd) = Pidfd::open(pid) else {
            return false;
        };
        // As in `attach`: checked after the pidfd pins the process, and trusted
        // only if it has not exited since, so the signal reaches what was checked.
        let checked = Process::read(pid, |pgrp, sid| self.in_group(pgrp, sid))
            .is_some_and(|p| self.place(&p) == Place::Member);
        checked && !fd.exited() && fd.signal(signal).is_ok()
    }

    /// Applies `on_lost` to the run, whose client is gone: SIGTERM now and
    /// SIGKILL after `grace` (a task of `tasks`), SIGKILL now, or nothing.
    pub fn stop(self, on_lost: OnLost, grace: Duration, tasks: &TaskTracker) {
        match on_lost {
            OnLost::Ignore => {}
            OnLost::Kill => {
                self.signal(Signal::SIGKILL);
            }
            OnLost::Term => {
                self.signal(Signal::SIGTERM);
                tasks.spawn(async move {
                    tokio::time::sleep(grace).await;
                    self.signal(Signal::SIGKILL);
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command};

    const NOBODY: u32 = 65534;
    /// Bounds every wait for a child to exit.
    const WAIT: Duration = Duration::from_secs(10);

    /// `sleep 60` in a process group of its own, or in `group`, as `uid`.
    fn sleeper(group: Option<u32>, uid: Option<u32>) -> anyhow::Result<Child> {
        let mut command = Command::new("sleep");
        command.arg("60").process_group(group.unwrap_or(0) as i32);
        if let Some(uid) = uid {
            command.uid(uid).gid(uid);
        }
        Ok(command.spawn()?)
    }

    /// Waits (bounded) until `child` has been killed; reaps it.
    fn killed(child: &mut Child) -> anyhow::Result<bool> {
        let fd = Pidfd::open(child.id())?;
        anyhow::ensure!(fd.wait_exit(WAIT), "{} did not exit", child.id());
        Ok(child.wait()?.code().is_none())
    }

    fn alive(child: &mut Child) -> anyhow::Result<bool> {
        Ok(child.try_wait()?.is_none())
    }

    fn root() -> u32 {
        nix::unistd::getuid().as_raw()
    }

    #[test]
    fn a_child_of_ours_is_ours_to_attach_and_signal() -> anyhow::Result<()> {
        let mut child = sleeper(None, None)?;
        let pid = child.id();
        let run = Run::attach(root(), pid, pid)?;
        assert!(run.has_members());
        let stranger = Run::attach(4242, pid, pid).expect_err("not uid 4242's");
        assert_eq!(stranger.code(), ErrorCode::Forbidden);
        assert!(
            stranger.to_string().contains("belongs to uid"),
            "{stranger:?}"
        );
        assert_eq!(run.signal(Signal::SIGKILL), 1);
        assert!(killed(&mut child)?);
        assert!(!run.has_members());
        Ok(())
    }

    #[test]
    fn a_zombie_counts_as_gone() -> anyhow::Result<()> {
        let mut child = sleeper(None, None)?;
        let pid = child.id();
        let run = Run::attach(root(), pid, pid)?;
        let peer = Peer::of_pid(pid);
        assert!(!peer.gone());
        child.kill()?;
        // Exited, not yet reaped: a zombie still has its pid and its group.
        let fd = Pidfd::open(pid)?;
        assert!(fd.wait_exit(WAIT), "{pid} did not exit");
        assert!(peer.gone());
        assert!(!run.has_members());
        let err = Run::attach(root(), pid, pid).expect_err("a zombie");
        assert_eq!(err.code(), ErrorCode::BadRequest);
        child.wait()?;
        Ok(())
    }

    #[tokio::test]
    async fn a_runs_end_is_awaited_until_its_last_member_has_exited() -> anyhow::Result<()> {
        let mut leader = sleeper(None, None)?;
        let group = leader.id();
        let mut member = sleeper(Some(group), None)?;
        let run = Run::attach(root(), group, group)?;
        let ended = tokio::spawn(async move { run.ended().await });
        leader.kill()?;
        leader.wait()?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!ended.is_finished(), "ended while a member was left");
        member.kill()?;
        member.wait()?;
        tokio::time::timeout(WAIT, ended).await??;
        Ok(())
    }

    #[tokio::test]
    async fn a_member_that_leaves_the_group_no_longer_keeps_the_run() -> anyhow::Result<()> {
        let mut leader = sleeper(None, None)?;
        let group = leader.id();
        // Leaves the group (setsid) once its stdin closes, and lives on.
        let mut leaver = Command::new("python3")
            .args([
                "-c",
                "import os,sys,time; sys.stdin.read(); os.setsid(); time.sleep(60)",
            ])
            .process_group(group as i32)
            .stdin(std::process::Stdio::piped())
            .spawn()?;
        let run = Run::attach(root(), group, group)?;
        leader.kill()?;
        leader.wait()?;
        let ended = tokio::spawn(async move { run.ended().await });
        drop(leaver.stdin.take());
        tokio::time::timeout(WAIT, ended).await??;
        assert!(
            alive(&mut leaver)?,
            "the run ended because its last member exited"
        );
        leaver.kill()?;
        leaver.wait()?;
        Ok(())
    }

    #[test]
    fn a_pid_outside_the_group_named_is_refused() -> anyhow::Result<()> {
        let (mut a, mut b) = (sleeper(None, None)?, sleeper(None, None)?);
        let err = Run::attach(root(), a.id(), b.id()).expect_err("another group");
        assert_eq!(err.code(), ErrorCode::BadRequest);
        let want = format!("is in process group {}, not {}", a.id(), b.id());
        assert!(err.to_string().contains(&want), "{err:?}");
        a.kill()?;
        b.kill()?;
        a.wait()?;
        b.wait()?;
        Ok(())
    }

    #[test]
    fn init_the_agent_and_nonsense_are_refused_even_for_root() -> anyhow::Result<()> {
        let me = std::process::id();
        let my_group = nix::unistd::getpgrp().as_raw() as u32;
        let mut child = sleeper(None, None)?;
        let pid = child.id();
        for (pid, pgid, code) in [
            (1, 1, ErrorCode::Forbidden),
            (pid, 1, ErrorCode::Forbidden),
            (me, my_group, ErrorCode::Forbidden),
            (me, pid, ErrorCode::Forbidden),
            (pid, my_group, ErrorCode::Forbidden),
            (pid, 0, ErrorCode::BadRequest),
            (0, pid, ErrorCode::BadRequest),
            (u32::MAX, pid, ErrorCode::BadRequest),
        ] {
            let err = Run::attach(root(), pid, pgid).expect_err("refused");
            assert_eq!(err.code(), code, "attach {pid} {pgid}: {err:?}");
        }
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    #[test]
    fn another_users_process_in_the_group_is_neither_signalled_nor_counted() -> anyhow::Result<()> {
        let mut leader = sleeper(None, None)?;
        let group = leader.id();
        let mut theirs = sleeper(Some(group), Some(NOBODY))?;
        // spawn returns after exec, so nobody's uid is already in place.
        let run = Run::attach(NOBODY, theirs.id(), group)?;
        assert_eq!(run.signal(Signal::SIGKILL), 1);
        assert!(killed(&mut theirs)?);
        assert!(alive(&mut leader)?, "root's leader was signalled");
        assert!(!run.has_members(), "root's process kept nobody's run going");
        leader.kill()?;
        leader.wait()?;
        Ok(())
    }
}
