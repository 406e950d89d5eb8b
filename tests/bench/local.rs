//! The local paths: round trips on memory:// and file:// beside a raw
//! MessagePack echo, throughput, crash release, the shim beside flock(1),
//! and keys with slots.

use super::*;

pub(crate) const ECHO_ENV: &str = "RUNLOCK_BENCH_ECHO_SOCKET";

pub(crate) const ROUND_TRIPS: usize = 20_000;

pub(crate) const THROUGHPUT_CONNECTIONS: usize = 16;

pub(crate) const THROUGHPUT_TIME: Duration = Duration::from_secs(3);

pub(crate) const CRASHES: usize = 40;

pub(crate) async fn round_trips(
    agent: &TestAgent,
) -> Result<(Vec<Duration>, Vec<Duration>, Vec<Duration>)> {
    let mut conn = agent.client().await?;
    let key = "dev:tap-x-to-target-y";
    for _ in 0..1_000 {
        pair(&mut conn, key).await?;
    }
    let (mut acquires, mut releases, mut pairs) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUND_TRIPS {
        let (a, r) = pair(&mut conn, key).await?;
        acquires.push(a);
        releases.push(r);
        pairs.push(a + r);
    }
    Ok((acquires, releases, pairs))
}

pub(crate) async fn throughput(agent: &TestAgent) -> Result<f64> {
    let deadline = Instant::now() + THROUGHPUT_TIME;
    let mut tasks = Vec::new();
    for n in 0..THROUGHPUT_CONNECTIONS {
        let mut conn = agent.client().await?;
        tasks.push(tokio::spawn(async move {
            let key = format!("bench-{n}");
            let mut count = 0u64;
            while Instant::now() < deadline {
                pair(&mut conn, &key).await?;
                count += 1;
            }
            anyhow::Ok(count)
        }));
    }
    let started = Instant::now();
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// A run holds the key; a waiter queues for it; SIGKILL takes the shim and
/// its child's group at once; the figure is kill → the waiter's `acquired`.
pub(crate) async fn crash_release(agent: &TestAgent) -> Result<Vec<Duration>> {
    let mut samples = Vec::new();
    for i in 0..CRASHES {
        let key = format!("crash-{i}");
        let mut run = agent
            .runlock()?
            .args(["run", "--key", &key, "--"])
            .args(["sh", "-c", "echo ready; exec sleep 60"])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = BufReader::new(run.stdout.take().context("stdout")?).lines();
        tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await??
            .context("no ready line")?;
        let mut waiter = agent.client().await?;
        let waiting = waiter.send(acquire(&key, 10_000)).await?;
        // A ping answered after the acquire was sent means the acquire is queued.
        match waiter.call(ClientMessage::Ping).await? {
            AgentMessage::Pong => {}
            other => bail!("ping: {other:?}"),
        }
        let shim_pid = run.id().context("shim pid")? as i32;
        let child_group = child_group_of(shim_pid)?;
        let killed = Instant::now();
        use nix::sys::signal::{kill, killpg, Signal};
        use nix::unistd::Pid;
        kill(Pid::from_raw(shim_pid), Signal::SIGKILL)?;
        killpg(Pid::from_raw(child_group), Signal::SIGKILL)?;
        match waiter.reply(waiting).await? {
            AgentMessage::Acquired { .. } => {}
            other => bail!("waiter: {other:?}"),
        }
        samples.push(killed.elapsed());
        let _ = run.wait().await;
    }
    Ok(samples)
}

/// Whole commands, each waited for: `runlock run --key k -- true` through
/// the agent on `socket` with each of `shims`, and `flock(1)` on a file,
/// taken in turn so that all see the same machine.
pub(crate) async fn beside_flock(
    shims: &[PathBuf],
    socket: &Path,
    scratch: &Path,
) -> Result<(Vec<Vec<Duration>>, Vec<Duration>)> {
    const RUNS: usize = 300;
    let file = scratch.join("flock-beside");
    let timed = |mut command: tokio::process::Command| async move {
        let started = Instant::now();
        let status = command.status().await?;
        anyhow::ensure!(status.success(), "{command:?} exited with {status}");
        Ok::<_, anyhow::Error>(started.elapsed())
    };
    let (mut runs, mut flocks) = (vec![Vec::new(); shims.len()], Vec::new());
    for i in 0..RUNS + 20 {
        for (shim, times) in shims.iter().zip(&mut runs) {
            let mut run = tokio::process::Command::new(shim);
            run.arg("--socket")
                .arg(socket)
                .args(["run", "--key", "beside-flock", "--", "true"]);
            let took = timed(run).await?;
            if i >= 20 {
                times.push(took);
            }
        }
        let mut flock = tokio::process::Command::new("flock");
        flock.arg(&file).arg("true");
        let took = timed(flock).await?;
        if i >= 20 {
            flocks.push(took);
        }
    }
    Ok((runs, flocks))
}

/// The shim linked statically (docs/src/install.md, "Building and installing"), built beside
/// `shim` in a target directory of its own so that neither build undoes the
/// other: most of a dynamically linked shim's extra start-up is the loader's.
pub(crate) fn static_shim(shim: &Path) -> Result<PathBuf> {
    let target = shim
        .parent()
        .and_then(Path::parent)
        .context("the shim is not in a target directory")?
        .join("static-shim");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("no workspace")?;
    let status = std::process::Command::new(env!("CARGO"))
        .current_dir(workspace)
        .args([
            "rustc",
            "--release",
            "-p",
            "runlock-shim",
            "--bin",
            "runlock",
        ])
        .arg("--target-dir")
        .arg(&target)
        .args(["--", "-C", "target-feature=+crt-static"])
        .env_remove("CARGO_PRIMARY_PACKAGE")
        .status()
        .context("running cargo rustc")?;
    anyhow::ensure!(status.success(), "building the static shim: {status}");
    Ok(target.join("release").join("runlock"))
}

/// The process group of the shim's only child (the run).
pub(crate) fn child_group_of(shim_pid: i32) -> Result<i32> {
    let children = std::fs::read_to_string(format!("/proc/{shim_pid}/task/{shim_pid}/children"))?;
    let child: i32 = children
        .split_whitespace()
        .next()
        .context("shim has no child")?
        .parse()?;
    Ok(nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(child)))?.as_raw())
}

/// Raw echo: frames of the acquire request's size, decoded and re-encoded.
pub(crate) async fn echo_round_trips(scratch: &Path) -> Result<Vec<Duration>> {
    let socket = scratch.join("echo.sock");
    let exe = std::env::current_exe()?;
    let mut server = Command::new(exe)
        .env(ECHO_ENV, &socket)
        .kill_on_drop(true)
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(server.stdout.take().context("stdout")?).lines();
    tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await??
        .context("echo server not ready")?;
    let mut conn: Framed<UnixStream, MessageCodec<ClientMessage, ClientMessage>> =
        Framed::new(UnixStream::connect(&socket).await?, MessageCodec::new());
    let mut samples = Vec::new();
    for i in 0..(1_000 + ROUND_TRIPS as u64) {
        let started = Instant::now();
        conn.send(Envelope::request(i, acquire("dev:tap-x-to-target-y", 0)))
            .await?;
        conn.next()
            .await
            .context("echo closed")??
            .map_err(|e| anyhow::anyhow!(e.reason))?;
        if i >= 1_000 {
            samples.push(started.elapsed());
        }
    }
    server.kill().await?;
    Ok(samples)
}

pub(crate) async fn echo_server(socket: PathBuf) -> Result<()> {
    let listener = UnixListener::bind(&socket)?;
    println!("ready");
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            let mut conn: Framed<UnixStream, MessageCodec<ClientMessage, ClientMessage>> =
                Framed::new(stream, MessageCodec::new());
            while let Some(frame) = conn.next().await {
                let message = match frame {
                    Ok(Ok(message)) => message,
                    Ok(Err(bad)) => return eprintln!("echo: undecodable frame: {}", bad.reason),
                    Err(err) => return eprintln!("echo: {err}"),
                };
                if let Err(err) = conn.send(message).await {
                    return eprintln!("echo: {err}");
                }
            }
        });
    }
}
