//! `runlock run`: take the keys, run the command in its own process group with
//! an inherited duplicate of the agent socket (so the lock lasts exactly as
//! long as the run's processes), forward signals, act on a lost lease, keep
//! the run through an agent restart by reattaching before the leases'
//! deadline, release when the command exits, and exit with its status.
//!
//! In phases, each a function: `connect` (asking for the keys),
//! `wait_for_lock`, `start` (the command), `supervise` (its exit, signals,
//! the agent's events), `finish` (the lost run's group, the release, the
//! exit code).

use crate::agent::{self, describe_wire_error, unexpected};
use crate::cli::{self, OnLostArg, RunArgs};
use crate::exit::{self, Failure};
use crate::host_config::HostConfig;
use crate::signals::Signals;
use futures::StreamExt;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use runlock_client::{
    escape, CallError, Client, ConnectError, Incoming, ANSWER_TIMEOUT, BACKEND_ANSWER_TIMEOUT,
};
use runlock_protocol::{
    procfs, timing::kill_grace, AcquireRequest, AgentMessage, ClientMessage, ErrorCode, Lease,
    OnUnavailable, ReleaseRequest, WireError,
};
use std::collections::HashMap;
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Duration;
use tokio::process::Child;
use tokio::time::Instant;

/// A reattach in progress: the next agent's connection and how long the
/// leases stay guaranteed, or why there is none.
type Reattaching = Pin<Box<dyn Future<Output = Result<(Client, Option<Duration>), String>>>>;

/// How long the shim waits for the agent to confirm the release at the end.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

pub async fn run(socket: &Path, host: &HostConfig, mut args: RunArgs) -> Result<ExitCode, Failure> {
    if args.meltano {
        add_meltano_keys(&mut args)?;
    }
    for key in &args.keys {
        super::valid_key(key)?;
    }
    // What would be locked, for people and tests: nothing runs.
    if args.print_keys {
        for key in &args.keys {
            println!("{key}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut signals = Signals::install().map_err(|e| {
        Failure::new(
            exit::EXIT_SOFTWARE,
            format!("cannot install signal handlers: {e}"),
        )
    })?;
    let (mut client, asked) = match connect(socket, &args).await {
        Ok(connected) => connected,
        Err(err @ ConnectError::Unreachable(_)) => {
            let failure = agent::connect_failure(err);
            return unlocked(host.on_unavailable, failure, &args, &mut signals).await;
        }
        Err(refused) => return Err(agent::connect_failure(refused)),
    };
    let held = match wait_for_lock(&mut client, asked, socket, &args, &mut signals).await {
        Ok(Ok(held)) => held,
        Ok(Err(signal)) => return Ok(ExitCode::from(exit::for_signal(signal as i32))),
        Err(failure) if failure.code == exit::EXIT_UNAVAILABLE => {
            let policy = client.on_unavailable;
            return unlocked(policy, failure, &args, &mut signals).await;
        }
        Err(failure) => return Err(failure),
    };
    let mut run = start(client, held, &args).await?;
    let status = supervise(&mut run, socket, &mut signals).await;
    finish(run, status).await
}

/// `--meltano`: the state IDs of the Meltano command as keys too, and its
/// `--force` as ours.
fn add_meltano_keys(args: &mut RunArgs) -> Result<(), Failure> {
    let cwd = std::env::current_dir().map_err(|e| {
        Failure::new(
            exit::EXIT_USAGE,
            format!("--meltano: no working directory: {e}"),
        )
    })?;
    let env = |name: &str| std::env::var(name).ok();
    let meltano = runlock_meltano_project::invocation(&args.command, &env, &cwd)
        .map_err(|why| Failure::new(exit::EXIT_USAGE, format!("--meltano: {why}")))?;
    args.keys.extend(meltano.state_ids);
    args.force |= meltano.force;
    Ok(())
}

/// Connects to the agent with the `acquire` right behind hello, one round
/// trip less before the run starts; returns the acquire's id.
async fn connect(socket: &Path, args: &RunArgs) -> Result<(Client, u64), ConnectError> {
    let request = AcquireRequest {
        slots: args.slots,
        keys: args.keys.clone(),
        ttl_ms: args.ttl.map(cli::millis),
        wait_ms: cli::millis(args.wait),
        force: args.force,
        command: command_line(&args.command),
        on_lost: args.on_lost.into(),
    };
    agent::connect_asking(socket, ClientMessage::Acquire(request)).await
}

/// What `acquired` granted.
struct Held {
    leases: Vec<Lease>,
    ttl: Duration,
    /// How long the leases stay guaranteed without the agent (`None`: for
    /// as long as the run holds its locks).
    valid_for: Option<Duration>,
    /// The kernel locks, for the run to hold.
    locks: Vec<OwnedFd>,
}

/// Waits for the answer to the acquire sent as `id`, showing the wait
/// meanwhile: what `acquired` said, or `Ok(Err(signal))` when a signal came
/// first. The agent answers by the end of the wait, or sooner; past that plus
/// its own bound on the backend operations of each key, it is wedged.
async fn wait_for_lock(
    client: &mut Client,
    id: u64,
    socket: &Path,
    args: &RunArgs,
    signals: &mut Signals,
) -> Result<Result<Held, Signal>, Failure> {
    let per_key = BACKEND_ANSWER_TIMEOUT.saturating_mul(args.keys.len().max(1) as u32);
    let limit = args.wait.saturating_add(per_key);
    // A forced acquire says what it waits for in its own notice.
    let shown_wait = if args.force {
        Duration::ZERO
    } else {
        args.wait
    };
    let waiting = crate::wait_line::show(socket, &args.keys, shown_wait);
    let reply = tokio::select! {
        reply = client.reply_within(id, limit) => reply,
        // Closing the connection (by returning) abandons the wait in the agent.
        signal = signals.next() => return Ok(Err(signal)),
        never = waiting => match never {},
    };
    match reply {
        Ok(AgentMessage::Acquired {
            leases,
            ttl_ms,
            valid_for_ms,
            locks,
        }) => Ok(Ok(Held {
            leases,
            ttl: Duration::from_millis(ttl_ms),
            valid_for: valid_for_ms.map(Duration::from_millis),
            locks: client
                .take_locks(locks)
                .map_err(|missing| Failure::new(exit::EXIT_SOFTWARE, missing.to_string()))?,
        })),
        Ok(other) => Err(unexpected("acquire", &other)),
        Err(CallError::Agent(err)) => Err(Failure::new(
            exit::for_error(err.code),
            describe_wire_error(&err),
        )),
        Err(gone) => Err(agent::call_failure(gone, "asking for the lock")),
    }
}

/// A command running under its leases.
struct Run {
    client: Client,
    child: Child,
    pid: u32,
    leases: Vec<Lease>,
    locks: Vec<OwnedFd>,
    /// The id of the `attach` whose answer is still to come.
    attaching: Option<u64>,
    watch: Watch,
}

/// Starts the command holding the agent connection and its locks, then
/// names it to the agent (`attach`), not waiting for the answer: the
/// command already runs, and `supervise` reads it.
async fn start(mut client: Client, held: Held, args: &RunArgs) -> Result<Run, Failure> {
    let fd = client.as_raw_fd();
    let spawned = spawn(
        Some(fd),
        &held.locks,
        &args.command,
        &args.keys,
        &held.leases,
    );
    let child = match spawned {
        Ok(child) => child,
        Err(failure) => {
            // A command that could not start leaves the key free as an exit does: at once.
            unlock(&held.locks);
            release(&mut client, &held.leases).await;
            return Err(failure);
        }
    };
    // invariant: a spawned child has a pid until it is waited for
    let pid = child.id().unwrap_or_default();
    let attaching = client
        .send(ClientMessage::Attach { pid, pgid: pid })
        .await
        .ok();
    if attaching.is_none() {
        eprintln!("runlock: warning: attach failed: the agent closed the connection");
    }
    let mut watch = Watch {
        lost: false,
        kill_at: None,
        kill_grace: kill_grace(held.ttl),
        agent_open: true,
        on_lost: args.on_lost,
        group: Pid::from_raw(pid as i32),
        survives_agent: client.leases_survive_agent,
        expires: held.valid_for.is_some(),
        valid_until: HashMap::new(),
    };
    watch.valid_for(&held.leases, held.valid_for);
    // What came while the lock was awaited counts before the command's exit.
    for event in std::mem::take(&mut client.events) {
        watch.event(event);
    }
    Ok(Run {
        client,
        child,
        pid,
        leases: held.leases,
        locks: held.locks,
        attaching,
        watch,
    })
}

/// Until the command exits: forwards signals to its group, reads what the
/// agent says (a lost lease stops the run), finds the next agent where
/// leases outlive this one, and kills a run that outstays its kill grace.
async fn supervise(
    run: &mut Run,
    socket: &Path,
    signals: &mut Signals,
) -> std::io::Result<std::process::ExitStatus> {
    let mut reattaching: Option<Reattaching> = None;
    loop {
        if run.watch.wants_agent() && reattaching.is_none() {
            let on_lost = run.watch.on_lost.into();
            let attempt = reattach(socket.to_path_buf(), run.leases.clone(), on_lost, run.pid);
            reattaching = Some(Box::pin(attempt));
        }
        tokio::select! {
            status = run.child.wait() => return status,
            signal = signals.next() => {
                let _ = killpg(run.watch.group, signal);
            }
            incoming = run.client.next(), if run.watch.agent_open => run.incoming(incoming),
            reattached = poll_some(&mut reattaching) => {
                reattaching = None;
                match reattached {
                    Ok((new, valid_for)) => {
                        eprintln!("runlock: reattached to the agent; the lock was kept");
                        run.client = new;
                        run.watch.agent_open = true;
                        run.watch.valid_for(&run.leases, valid_for);
                    }
                    Err(why) => {
                        eprintln!("runlock: cannot reattach: {why}");
                        run.watch.stop_run();
                    }
                }
            }
            _ = sleep_until(run.watch.orphan_deadline()), if reattaching.is_some() => {
                reattaching = None;
                eprintln!("runlock: no agent took the lease over before its deadline");
                run.watch.stop_run();
            }
            _ = sleep_until(run.watch.kill_at), if run.watch.kill_at.is_some() => {
                run.watch.kill_at = None;
                let _ = killpg(run.watch.group, Signal::SIGKILL);
            }
        }
    }
}

impl Run {
    /// What the agent sent while the command runs.
    fn incoming(&mut self, incoming: Option<Result<Incoming, CallError>>) {
        match incoming {
            Some(Ok(Incoming::Event(event))) => self.watch.event(event),
            Some(Ok(Incoming::Reply(id, reply))) if Some(id) == self.attaching => {
                self.attaching = None;
                attached(reply, self.pid);
            }
            Some(Ok(Incoming::Reply(..))) => {} // a late reply; nothing waits for it
            Some(Ok(Incoming::Undecodable(why))) => {
                eprintln!("runlock: warning: undecodable message from the agent: {why}")
            }
            None | Some(Err(_)) => self.watch.agent_gone(),
        }
    }
}

/// After the command: a lost run's whole group stopped, the locks dropped,
/// the leases released; the command's status, or 76 for a lost lease.
async fn finish(
    mut run: Run,
    status: std::io::Result<std::process::ExitStatus>,
) -> Result<ExitCode, Failure> {
    let watch = &run.watch;
    if watch.lost && !matches!(watch.on_lost, OnLostArg::Ignore) {
        stop_group(watch.group, watch.kill_at, watch.kill_grace).await;
    }
    unlock(&run.locks);
    if run.watch.agent_open {
        release(&mut run.client, &run.leases).await;
    } else if !run.watch.lost && run.locks.is_empty() {
        eprintln!("runlock: no agent to release the lock to; it expires by itself within its TTL");
    }
    let status = status
        .map_err(|e| Failure::new(exit::EXIT_SOFTWARE, format!("waiting for the command: {e}")))?;
    if run.watch.lost {
        eprintln!(
            "runlock: the lease was lost while the command ran; exiting {}",
            exit::EXIT_LEASE_LOST
        );
        return Ok(ExitCode::from(exit::EXIT_LEASE_LOST));
    }
    Ok(exit_code(status))
}

/// Drops the run's kernel locks for every holder (a daemon the run left
/// behind too), before the agent is told: it marks the record free only
/// once it can take the lock itself, so this leaves no moment with two holders.
fn unlock(locks: &[OwnedFd]) {
    for lock in locks {
        // SAFETY: the descriptor is open; LOCK_UN only drops our lock.
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Releases the run's leases, waiting (bounded) for the agent to confirm,
/// so that the key is free when the shim exits.
async fn release(client: &mut Client, leases: &[Lease]) {
    let lease_ids = leases.iter().map(|l| l.lease_id.clone());
    let release = ClientMessage::Release(ReleaseRequest::leases(lease_ids));
    // A lease already lost answers not_owner, which is fine: the run is over either way.
    let _ = tokio::time::timeout(RELEASE_WAIT, client.call(release)).await;
}

/// A lost run is its whole process group: what the command left behind is
/// killed at the end of the kill grace too (`kill_at`), before the lock is
/// dropped and before the agent may say the run has stopped.
async fn stop_group(group: Pid, kill_at: Option<Instant>, kill_grace: Duration) {
    if killpg(group, None).is_err() {
        return;
    }
    if let Some(at) = kill_at {
        tokio::time::sleep_until(at).await;
    }
    let _ = killpg(group, Signal::SIGKILL);
    // SIGKILL lands at once, but a process lets go of what it holds (a
    // file lock, a connection) only as it exits: the key is let go after.
    let bound = after(kill_grace);
    while group_has_live_members(group) && Instant::now() < bound {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The command's own status, as a shell reports it.
fn exit_code(status: std::process::ExitStatus) -> ExitCode {
    ExitCode::from(match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => exit::for_signal(signal),
        (None, None) => exit::EXIT_SOFTWARE,
    })
}

/// The agent or its backend cannot be reached: `on_unavailable` decides
/// whether the command runs anyway, without a lock.
async fn unlocked(
    policy: OnUnavailable,
    failure: Failure,
    args: &RunArgs,
    signals: &mut Signals,
) -> Result<ExitCode, Failure> {
    match policy {
        OnUnavailable::Warn => eprintln!(
            "runlock: WARNING: running {} WITHOUT A LOCK on {} (on_unavailable = warn): {}",
            command_line(&args.command),
            args.keys.join(", "),
            failure.message
        ),
        OnUnavailable::Skip => {}
        OnUnavailable::Fail | OnUnavailable::Unknown => return Err(failure),
    }
    let mut child = spawn(None, &[], &args.command, &args.keys, &[])?;
    // invariant: a spawned child has a pid until it is waited for
    let group = Pid::from_raw(child.id().unwrap_or_default() as i32);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            signal = signals.next() => {
                let _ = killpg(group, signal);
            }
        }
    };
    status
        .map(exit_code)
        .map_err(|e| Failure::new(exit::EXIT_SOFTWARE, format!("waiting for the command: {e}")))
}

/// Starts the command in its own process group. With an agent `socket`, the
/// command holds a duplicate of it, so that the agent sees the connection
/// close only when every process of the run has exited, and of each of its
/// `locks`, so that a kernel lock lasts as long as the run, agent or no
/// agent; without one (no lock), it gets only `RUNLOCK_KEY`. A key with
/// slots adds `RUNLOCK_SLOT`.
fn spawn(
    socket: Option<RawFd>,
    locks: &[OwnedFd],
    command: &[String],
    keys: &[String],
    leases: &[Lease],
) -> Result<tokio::process::Child, Failure> {
    let descriptors = socket
        .into_iter()
        .chain(locks.iter().map(|lock| lock.as_raw_fd()));
    let inherited = descriptors
        .map(|fd| {
            // dup() leaves close-on-exec clear on the copy, so the command inherits it.
            let copy = nix::unistd::dup(fd).map_err(|e| {
                Failure::new(
                    exit::EXIT_SOFTWARE,
                    format!("cannot duplicate a descriptor for the command: {e}"),
                )
            })?;
            // SAFETY: `dup` just returned this descriptor and nothing else owns it.
            Ok(unsafe { OwnedFd::from_raw_fd(copy) })
        })
        .collect::<Result<Vec<_>, Failure>>()?;
    let join = |f: fn(&Lease) -> String| leases.iter().map(f).collect::<Vec<_>>().join("\n");
    let (program, args) = command
        .split_first()
        .ok_or_else(|| Failure::new(exit::EXIT_USAGE, "no command given"))?;
    let mut sorted_keys = keys.to_vec();
    sorted_keys.sort();
    sorted_keys.dedup();
    let mut builder = tokio::process::Command::new(program);
    builder
        .args(args)
        .process_group(0)
        .env("RUNLOCK_KEY", sorted_keys.join("\n"));
    if !leases.is_empty() {
        builder
            .env("RUNLOCK_TOKEN", join(|l| l.token.to_string()))
            .env("RUNLOCK_LEASE_ID", join(|l| l.lease_id.clone()));
    } else {
        builder
            .env_remove("RUNLOCK_TOKEN")
            .env_remove("RUNLOCK_LEASE_ID");
    }
    // One line per key, in RUNLOCK_TOKEN's order: a token is only
    // comparable with its own slot's, so the two are read together.
    if leases.iter().any(|l| l.slot.is_some()) {
        builder.env(
            "RUNLOCK_SLOT",
            join(|l| l.slot.map(|s| s.to_string()).unwrap_or_default()),
        );
    } else {
        // Not an enclosing run's: a plain key has no slot.
        builder.env_remove("RUNLOCK_SLOT");
    }
    let spawned = builder.spawn();
    drop(inherited); // the child has its copies; these would keep the run's lock alive after it
    spawned.map_err(|e| {
        let code = match e.kind() {
            std::io::ErrorKind::NotFound => exit::EXIT_NOT_FOUND,
            _ => exit::EXIT_CANNOT_EXECUTE,
        };
        Failure::new(code, format!("cannot run {program:?}: {e}"))
    })
}

/// Tells the agent the run's pid and process group; a failure only weakens
/// what the agent can do for the run if the shim dies, so it is a warning.
/// Bounded, since the command already runs and needs the shim back.
async fn attach(client: &mut Client, pid: u32) {
    let request = ClientMessage::Attach { pid, pgid: pid };
    match client.call_within(ANSWER_TIMEOUT, request).await {
        Ok(reply) => attached(Ok(reply), pid),
        Err(CallError::Agent(err)) => attached(Err(err), pid),
        Err(CallError::Gone(why)) => eprintln!("runlock: warning: attach failed: {why}"),
    }
}

/// Says what went wrong with the agent's answer to `attach`, if anything.
fn attached(reply: Result<AgentMessage, WireError>, pid: u32) {
    match reply {
        Ok(AgentMessage::Attached) => {}
        // A command that is over already needs no one to stop it.
        Err(_) if has_exited(pid) => {}
        Err(err) => {
            eprintln!("runlock: warning: attach failed: {}", escape(&err.message))
        }
        Ok(other) => eprintln!("runlock: warning: {}", unexpected("attach", &other).message),
    }
}

/// Whether our child `pid` has exited (it stays unreaped for `wait`).
fn has_exited(pid: u32) -> bool {
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    !matches!(
        waitid(Id::Pid(Pid::from_raw(pid as i32)), flags),
        Ok(WaitStatus::StillAlive)
    )
}

/// Connects to the agent again (the next one, after a restart) and has it
/// adopt the leases, retrying while no agent answers or its backend cannot be
/// reached; the caller bounds it by the leases' deadline. The connection, and
/// how long the leases stay guaranteed where they lapse unless renewed;
/// `Err` when an agent answered that the leases cannot be kept.
async fn reattach(
    socket: PathBuf,
    leases: Vec<Lease>,
    on_lost: runlock_protocol::OnLost,
    pid: u32,
) -> Result<(Client, Option<Duration>), String> {
    let mut pause = Duration::from_millis(50);
    loop {
        if let Ok(mut client) = agent::connect(&socket).await {
            let request = ClientMessage::Reattach {
                leases: leases.clone(),
                on_lost,
            };
            match client.call(request).await {
                Ok(AgentMessage::Acquired { valid_for_ms, .. }) => {
                    attach(&mut client, pid).await;
                    return Ok((client, valid_for_ms.map(Duration::from_millis)));
                }
                Ok(other) => return Err(unexpected("reattach", &other).message),
                Err(CallError::Agent(err)) if err.code != ErrorCode::Unavailable => {
                    return Err(escape(&err.message).into_owned())
                }
                Err(_) => {} // its backend cannot be reached, or it went away: try again
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// The future in `future`, or never when there is none.
pub(crate) async fn poll_some<T>(future: &mut Option<Pin<Box<dyn Future<Output = T>>>>) -> T {
    match future {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

/// What the shim knows while the command runs.
struct Watch {
    lost: bool,
    kill_at: Option<Instant>,
    /// SIGTERM to SIGKILL: short enough to end before anyone may take the key.
    kill_grace: Duration,
    agent_open: bool,
    on_lost: OnLostArg,
    group: Pid,
    /// Whether the leases outlive the agent, so the run may wait for the next one.
    survives_agent: bool,
    /// Whether they lapse unless renewed; a lock the run holds itself does not.
    expires: bool,
    /// Until when each lease stays guaranteed without a renewal.
    valid_until: HashMap<String, Instant>,
}

impl Watch {
    fn event(&mut self, event: AgentMessage) {
        match event {
            AgentMessage::Lost { key, message, .. } => {
                eprintln!("runlock: lost the lock on {key:?}: {}", escape(&message));
                self.stop_run();
            }
            AgentMessage::Renewed {
                lease_id,
                valid_for_ms,
            } => {
                let until = after(Duration::from_millis(valid_for_ms));
                self.valid_until.insert(lease_id, until);
            }
            AgentMessage::Restarting if self.survives_agent => {
                match self.expires {
                    true => eprintln!(
                        "runlock: the agent is restarting; keeping the run while the lease lasts"
                    ),
                    false => eprintln!(
                        "runlock: the agent is restarting; the run holds its lock and goes on"
                    ),
                }
                // Stop reading the old agent: it is handing the leases over.
                self.agent_open = false;
            }
            AgentMessage::Restarting => eprintln!("runlock: the agent is stopping"),
            _ => {}
        }
    }

    /// Every lease stays guaranteed for `valid_for` from now, where leases
    /// lapse unless renewed (a grant or a reattach said so).
    fn valid_for(&mut self, leases: &[Lease], valid_for: Option<Duration>) {
        if let Some(valid_for) = valid_for {
            let until = after(valid_for);
            for lease in leases {
                self.valid_until.insert(lease.lease_id.clone(), until);
            }
        }
    }

    /// The agent closed the connection. Where leases outlive it, the run goes
    /// on while the next agent is sought; elsewhere its locks died with it.
    fn agent_gone(&mut self) {
        self.agent_open = false;
        if self.survives_agent && !self.expires {
            eprintln!("runlock: lost the agent; the run holds its lock and goes on");
        } else if self.survives_agent {
            eprintln!("runlock: lost the agent; keeping the run while the lease lasts");
        } else {
            eprintln!("runlock: the agent went away, and its locks with it");
            self.stop_run();
        }
    }

    /// Whether the run needs an agent to take its leases over.
    fn wants_agent(&self) -> bool {
        !self.agent_open && self.survives_agent && !self.lost
    }

    /// The earliest deadline of the leases: past it the run must stop.
    fn orphan_deadline(&self) -> Option<Instant> {
        if !self.expires {
            return None;
        }
        Some(
            self.valid_until
                .values()
                .min()
                .copied()
                .unwrap_or_else(Instant::now),
        )
    }

    fn stop_run(&mut self) {
        if self.lost {
            return;
        }
        self.lost = true;
        match self.on_lost {
            OnLostArg::Ignore => {
                eprintln!("runlock: --on-lost ignore: the command goes on unprotected")
            }
            OnLostArg::Kill => {
                let _ = killpg(self.group, Signal::SIGKILL);
            }
            OnLostArg::Term => {
                let _ = killpg(self.group, Signal::SIGTERM);
                self.kill_at = Some(after(self.kill_grace));
            }
        }
    }
}

/// `duration` from now; one beyond what the clock can count is as good as never.
fn after(duration: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(duration)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The command line as a shell would need it typed, for the holder record.
fn command_line(command: &[String]) -> String {
    command
        .iter()
        .map(|arg| {
            let plain = !arg.is_empty()
                && arg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=@,+%".contains(c));
            if plain {
                arg.clone()
            } else {
                format!("'{}'", arg.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether a process of `group` has yet to exit. A zombie has let go of all
/// it held and does not count; `killpg(group, None)` would count it.
fn group_has_live_members(group: Pid) -> bool {
    let group = u32::try_from(group.as_raw()).unwrap_or(0);
    procfs::pids()
        .filter_map(procfs::Stat::read)
        .any(|stat| stat.pgrp == group && !stat.exited)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn a_group_has_live_members_until_its_last_has_exited_and_zombies_do_not_count() {
        let mut sleeper = std::process::Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .expect("sleep");
        let group = Pid::from_raw(sleeper.id() as i32);
        assert!(group_has_live_members(group));
        killpg(group, Signal::SIGKILL).expect("kill");
        // Not reaped: a zombie, still in the group for killpg, gone here.
        let gone = after(Duration::from_secs(10));
        while group_has_live_members(group) {
            assert!(Instant::now() < gone, "the killed sleep still counts");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            killpg(group, None).is_ok(),
            "reaped before its zombie was seen"
        );
        sleeper.wait().expect("reaped");
    }
}
