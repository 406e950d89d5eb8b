//! One agent under load: many leases renewed at once (CPU, memory,
//! lateness), and a hostile peer beside well-behaved ones.

use super::*;

/// Leases one agent holds in the `leases` group, unless `RUNLOCK_BENCH_LEASES`
/// says how many (issue 28 asks for 100,000), on the store
/// `RUNLOCK_BENCH_LEASES_ON` names (`memory-cas://` unless set).
pub(crate) const MANY_LEASES: usize = 10_000;

/// One agent holding [`MANY_LEASES`] leases (TTL 30 s) on the in-memory CAS
/// store: how late renewals go out (the agent's own once-a-minute report),
/// its resident memory, and its share of one core over that minute; then
/// how long its keys took to take, and to let go.
pub(crate) async fn many_leases(_scratch: &Path) -> Result<Rows> {
    let count = match std::env::var("RUNLOCK_BENCH_LEASES") {
        Ok(text) => text.parse::<usize>().context("RUNLOCK_BENCH_LEASES")?,
        Err(_) => MANY_LEASES,
    };
    let store = std::env::var("RUNLOCK_BENCH_LEASES_ON").unwrap_or_else(|_| "memory-cas://".into());
    let mut agent = start_agent(&store, &["--ttl", "30s"], &[]).await?;
    let pid = agent.pid().context("agent pid")?;
    let (mut conns, mut acquiring) = (Vec::new(), Duration::ZERO);
    for c in 0..count.div_ceil(1000) {
        let mut conn = agent.client().await?;
        let keys: Vec<String> = (c * 1000..((c + 1) * 1000).min(count))
            .map(|i| format!("lease-{i}"))
            .collect();
        let asked = keys.len();
        let request = ClientMessage::Acquire(AcquireRequest {
            slots: 1,
            keys,
            ttl_ms: None,
            wait_ms: 0,
            force: false,
            command: "bench".into(),
            on_lost: OnLost::Term,
        });
        let started = Instant::now();
        let lease_ids = match conn.call(request).await? {
            AgentMessage::Acquired { leases, .. } if leases.len() == asked => {
                leases.into_iter().map(|l| l.lease_id).collect::<Vec<_>>()
            }
            other => bail!("acquire of {asked} keys: {other:?}"),
        };
        acquiring += started.elapsed();
        conns.push((conn, lease_ids));
    }
    let held_rss_kib = rss_kib(pid)?;
    if store == "memory://" {
        // Its leases never lapse, so nothing renews them: only the memory.
        agent.stop().await?;
        return Ok(vec![(
            format!("{count} leases on {store}: agent resident memory"),
            format!("{:.1} MiB", held_rss_kib as f64 / 1024.0),
        )]);
    }
    // The first report made after every lease is held: on a store where
    // taking them takes most of a minute (etcd), the one before counts only
    // a part of a minute of renewals.
    let reports = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains("renewal lateness"))
            .map(str::to_string)
            .collect()
    };
    let earlier = reports(&agent.log()).len();
    let (cpu_before, started) = (cpu_seconds(pid)?, Instant::now());
    let report = loop {
        if let Some(line) = reports(&agent.log()).get(earlier) {
            break serde_json::from_str::<serde_json::Value>(line)?;
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!("no renewal report from the agent in 120 s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let cpu_share = (cpu_seconds(pid)? - cpu_before) / started.elapsed().as_secs_f64();
    let rss_kib = rss_kib(pid)?;
    let fields = &report["fields"];
    let figure = |name: &str| fields[name].as_f64().unwrap_or(f64::NAN);
    // Each request's keys are taken one after another (in sorted order, so
    // that no two runs deadlock) and let go several at once.
    let releasing = Instant::now();
    for (conn, lease_ids) in &mut conns {
        let asked = lease_ids.len();
        let lease_ids = std::mem::take(lease_ids);
        match conn.call(runlock_tests::client::release(lease_ids)).await? {
            AgentMessage::Released { count } if count as usize == asked => {}
            other => bail!("release of {asked} leases: {other:?}"),
        }
    }
    let releasing = releasing.elapsed();
    agent.stop().await?;
    drop(conns);
    let per_key = |took: Duration| took.as_secs_f64() * 1e3 / count as f64;
    Ok(vec![
        (
            format!("{count} keys on {store}, 1,000 a request: acquire, release (ms a key)"),
            format!(
                "{:.1} s, {:.1} s ({:.2}, {:.2})",
                acquiring.as_secs_f64(),
                releasing.as_secs_f64(),
                per_key(acquiring),
                per_key(releasing)
            ),
        ),
        (
            format!("{count} leases on {store}, TTL 30 s: renewals in a minute once all are held"),
            format!("{}", figure("renewals")),
        ),
        (
            "renewal lateness (bucket bounds) p50 / p99 / max".into(),
            format!(
                "≤ {} ms / ≤ {} ms / {:.1} ms",
                figure("late_p50_ms"),
                figure("late_p99_ms"),
                figure("late_max_ms")
            ),
        ),
        (
            "agent resident memory with those leases".into(),
            format!("{:.1} MiB", rss_kib as f64 / 1024.0),
        ),
        (
            "agent CPU share of one core while renewing".into(),
            format!("{:.2} %", cpu_share * 100.0),
        ),
    ])
}

/// Hostile connections a member of the socket group opens at once.
pub(crate) const HOSTILE: usize = 2_000;

/// Pings of a good client, quiet and beside the hostile connections.
pub(crate) const PINGS: usize = 2_000;

/// Opens N connections as whoever runs it and holds them until stdin closes:
/// `silent` ones say nothing; `partial` ones say hello, then send 1 MiB − 1 of
/// a 1 MiB frame. Prints `held N refused M` once all are open.
pub(crate) const HOSTILE_PEER: &str = r#"
import socket, sys, struct, time
path, count, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
hello = bytes.fromhex(sys.argv[4])
refused, socks = 0, []
for _ in range(count):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    try:
        if mode == "partial":
            s.sendall(struct.pack(">I", len(hello)) + hello)
            head = s.recv(4)
            body = s.recv(struct.unpack(">I", head)[0]) if len(head) == 4 else b""
            if b"welcome" not in body:
                raise OSError("refused")
            s.sendall(struct.pack(">I", 1 << 20) + b"\x90" * ((1 << 20) - 1))
        socks.append(s)
    except OSError:
        refused += 1
        s.close()
if mode == "silent":
    # A refused connection has its answer (or its end) waiting by now.
    time.sleep(1)
    for s in list(socks):
        s.setblocking(False)
        try:
            s.recv(1)
            socks.remove(s)
            refused += 1
        except BlockingIOError:
            pass
held = len(socks)
print(f"held {held} refused {refused}", flush=True)
sys.stdin.read()
"#;

/// A member of the socket group (`nobody`) opens [`HOSTILE`] silent, then
/// partial-frame, connections: the agent's memory and a good client's ping
/// beside them, under the default limits and with the limits raised to
/// admit them all (what the limits spare the agent).
pub(crate) async fn hostile(scratch: &Path) -> Result<Rows> {
    use std::os::unix::fs::PermissionsExt;
    // nobody must reach the socket: the scratch directory is root's 0700.
    let dir = scratch.join("hostile");
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(scratch, std::fs::Permissions::from_mode(0o755))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    let hello = runlock_protocol::codec::encode_body(&Envelope::event(ClientMessage::Hello {
        version: PROTOCOL_VERSION,
        client: "hostile".into(),
        pid: 1,
        takes_locks: false,
    }))?;
    let hex: String = hello.iter().map(|b| format!("{b:02x}")).collect();
    let mut rows = Vec::new();
    for (setting, config) in [
        ("default limits", "[limits]\nhandshake_timeout = \"10m\"\n"),
        (
            "limits raised to admit all",
            "[limits]\nconnections = 4096\nconnections_per_user = 4096\nhandshake_timeout = \"10m\"\n",
        ),
    ] {
        let file = dir.join("runlockd.toml");
        std::fs::write(&file, config)?;
        let extra = ["--config", file.to_str().context("utf-8")?, "--socket-group", "65534"];
        let mut options = agent_options("memory://", &extra);
        options.socket = Some(dir.join("hostile.sock"));
        let mut agent = TestAgent::start_with_env(options, &agent_env(&[])).await?;
        let pid = agent.pid().context("agent pid")?;
        let mut good = agent.client().await?;
        let quiet = pings(&mut good).await?;
        let quiet_p50 = quantile(&mut quiet.clone(), 0.5);
        rows.push((
            format!("{setting}: agent memory, quiet"),
            format!("{:.1} MiB", rss_kib(pid)? as f64 / 1024.0),
        ));
        rows.push((format!("{setting}: good client ping, quiet"), percentiles(quiet)));
        for mode in ["silent", "partial"] {
            let mut peer = runlock_tests::setpriv(65534, 65534, &[])
                // Debian's python3: root's pyenv shims are not reachable by nobody.
                .args(["/usr/bin/python3", "-c", HOSTILE_PEER])
                .arg(agent.socket())
                .args([&HOSTILE.to_string(), mode, &hex])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()?;
            let stdout = peer.stdout.take().context("peer stdout")?;
            let mut lines = BufReader::new(stdout).lines();
            let opened = tokio::time::timeout(Duration::from_secs(300), lines.next_line())
                .await
                .context("the hostile peer did not finish opening")??
                .context("the hostile peer exited")?;
            let under = pings(&mut good).await?;
            let ratio = quantile(&mut under.clone(), 0.5).as_secs_f64() / quiet_p50.as_secs_f64();
            rows.push((
                format!("{setting}: {HOSTILE} {mode} connections from nobody"),
                opened.replace("held", "admitted"),
            ));
            rows.push((
                format!("{setting}: agent memory with them open"),
                format!("{:.1} MiB", rss_kib(pid)? as f64 / 1024.0),
            ));
            rows.push((
                format!("{setting}: good client ping beside them"),
                format!("{}  ({ratio:.2}× quiet p50)", percentiles(under)),
            ));
            drop(peer.stdin.take());
            tokio::time::timeout(Duration::from_secs(60), peer.wait()).await??;
            // The agent sees them close a moment later; give it that moment.
            tokio::time::sleep(Duration::from_secs(1)).await;
            rows.push((
                format!("{setting}: agent memory after they closed"),
                format!("{:.1} MiB", rss_kib(pid)? as f64 / 1024.0),
            ));
        }
        agent.stop().await?;
    }
    Ok(rows)
}

pub(crate) async fn pings(conn: &mut RawClient) -> Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(PINGS);
    for _ in 0..PINGS {
        let started = Instant::now();
        match conn.call(ClientMessage::Ping).await? {
            AgentMessage::Pong => samples.push(started.elapsed()),
            other => bail!("ping: {other:?}"),
        }
    }
    Ok(samples)
}

pub(crate) fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after_name = stat.rsplit_once(')').context("stat format")?.1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // After the name: state is field 3 of the whole line, utime 14 and stime 15.
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / per_second)
}
