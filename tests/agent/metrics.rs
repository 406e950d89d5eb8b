//! `runlockd --metrics ADDR`: the Prometheus endpoint, scraped over HTTP while
//! runs take a key, wait for it, are refused it, lose it to `--force` or a
//! break, or are killed holding it; and the exposition checked by promtool.

use crate::agent::process::runlockd_refusing;
use crate::support::agent::{temp_dir, FileBackendDir};
use crate::support::{
    http, key, nobody_holds_connections, AgentOptions, Deadline, TestAgent, WAIT,
};
use anyhow::{bail, ensure, Context, Result};
use nix::sys::signal::Signal;
use runlock_agent::metrics::exposition::differences;
pub(crate) use runlock_agent::metrics::exposition::value;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// An agent on a fresh `file://` backend (which renews its leases) serving
/// metrics on a port of the kernel's choosing, that port, and the lock
/// directory (to keep while the agent runs).
pub(crate) async fn agent_with_metrics(
    ttl: &str,
) -> Result<(TestAgent, SocketAddr, FileBackendDir)> {
    let locks = FileBackendDir::new()?;
    let mut options = AgentOptions::new(locks.uri());
    options.args = ["--metrics", "127.0.0.1:0", "--ttl", ttl]
        .map(String::from)
        .to_vec();
    let agent = TestAgent::start_with(options).await?;
    let addr = metrics_address(&agent)?;
    Ok((agent, addr, locks))
}

/// Where an agent started with `--metrics 127.0.0.1:0` serves them: it logs
/// the address before it reports READY=1.
pub(crate) fn metrics_address(agent: &TestAgent) -> Result<SocketAddr> {
    let log = agent.log();
    log.lines()
        .find_map(|line| line.split("metrics listening on ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .with_context(|| format!("the agent did not log its metrics address:\n{log}"))?
        .parse()
        .with_context(|| format!("a bad metrics address in the log:\n{log}"))
}

/// `GET http://ADDR/PATH`: the status code and the body.
async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let answer = http::get(&format!("http://{addr}{path}")).await?;
    Ok((answer.status, answer.body))
}

/// The exposition from `GET /metrics`.
pub(crate) async fn scrape(addr: SocketAddr) -> Result<String> {
    let (code, body) = get(addr, "/metrics").await?;
    ensure!(code == 200, "GET /metrics answered {code}: {body}");
    Ok(body)
}

/// [`value`], or an error that shows the exposition.
fn value_in(text: &str, series: &str) -> Result<f64> {
    value(text, series).with_context(|| format!("no {series} in:\n{text}"))
}

/// Debian's promtool (package `prometheus`), which scripts/test installs: its
/// absence fails the test that needs it rather than skipping it.
pub(crate) fn promtool() -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("promtool"))
        .find(|candidate| candidate.is_file())
        .context(
            "promtool is not installed: `apt-get install prometheus` (Debian) provides it; \
             scripts/test installs it",
        )
}

/// Scrapes until `series` has `want`, within [`WAIT`]; the last exposition
/// is in the error.
async fn wait_for(addr: SocketAddr, series: &str, want: impl Fn(f64) -> bool) -> Result<String> {
    let deadline = Deadline::new(WAIT, format!("{series} to reach its value"));
    loop {
        let text = scrape(addr).await?;
        if value(&text, series).is_some_and(&want) {
            return Ok(text);
        }
        if let Err(err) = deadline.tick().await {
            return Err(err.context(format!("last scrape:\n{text}")));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_follow_runs_conflicts_and_forced_losses() -> Result<()> {
    let (agent, addr, _locks) = agent_with_metrics("3s").await?;
    let text = scrape(addr).await?;
    ensure!(value(&text, "runlock_leases_held") == Some(0.0), "{text}");

    let k = key("metrics");
    agent.run_to_success(&k).await?;
    let (holder, _) = agent.hold(&k).await?;
    let text = scrape(addr).await?;
    ensure!(value(&text, "runlock_leases_held") == Some(1.0), "{text}");
    // TTL 3 s: the file backend renews every second or so.
    wait_for(addr, r#"runlock_renewals_total{result="ok"}"#, |v| v >= 1.0).await?;

    agent
        .run(&[&k], &[], "exit 0")?
        .finish()
        .await?
        .expect_code(75)?;
    agent
        .run(&[&k], &["--force"], "exit 0")?
        .finish()
        .await?
        .expect_code(0)?;
    holder.finish().await?.expect_code(76)?;

    // A force on a free key is a forced acquire, not a takeover.
    agent
        .run(&[&k], &["--force"], "exit 0")?
        .finish()
        .await?
        .expect_code(0)?;

    let text = wait_for(addr, "runlock_leases_held", |v| v == 0.0).await?;
    let wrong = differences(
        &text,
        r#"
        runlock_acquisitions_total{result="granted"} 2
        runlock_acquisitions_total{result="held"} 1
        runlock_acquisitions_total{result="forced"} 2
        runlock_takeovers_total{how="force"} 1
        runlock_takeovers_total{how="break"} 0
        runlock_losses_total{reason="forced"} 1
        runlock_losses_total{reason="expired"} 0
        # Every grant is timed; the refusal is not.
        runlock_wait_duration_seconds_count 4
        runlock_hold_duration_seconds_count{ended="released"} 3
        runlock_hold_duration_seconds_count{ended="forced"} 1
        runlock_hold_duration_seconds_count{ended="closed"} 0
        # It was held across a renewal, TTL/3 = 1 s give or take 10%.
        runlock_hold_duration_seconds_bucket{ended="forced",le="0.1"} 0
        runlock_waiters 0
        "#,
    );
    ensure!(wrong.is_empty(), "{wrong:?} in:\n{text}");
    // The refusal asked no store: the holder was this agent's own (the
    // tests below have the store say "held").
    for series in [
        r#"runlock_backend_request_duration_seconds_count{operation="acquire",result="ok"}"#,
        r#"runlock_backend_request_duration_seconds_count{operation="release",result="ok"}"#,
    ] {
        ensure!(
            value(&text, series).is_some_and(|v| v > 0.0),
            "{series} is not above 0:\n{text}"
        );
    }
    ensure!(
        text.contains(r#"runlock_backend_request_duration_seconds_bucket{operation="acquire",result="ok",le="0.0001"}"#),
        "the histogram's buckets do not start at 0.1 ms:\n{text}"
    );
    // Every renewal's lateness is recorded, retries included.
    let renewed = value_in(&text, r#"runlock_renewals_total{result="ok"}"#)?;
    let timed = value_in(&text, "runlock_renewal_lateness_seconds_count")?;
    ensure!(
        timed >= renewed,
        "{timed} lateness samples for {renewed} renewals:\n{text}"
    );
    let build = format!(
        r#"runlock_build_info{{version="{}"}}"#,
        env!("CARGO_PKG_VERSION")
    );
    ensure!(value(&text, &build) == Some(1.0), "no {build} 1:\n{text}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_a_held_key_shows_in_the_waiters_gauge_and_the_wait_before_its_grant(
) -> Result<()> {
    let (agent, addr, locks) = agent_with_metrics("30s").await?;
    // Held through another agent, so that the waiter's tries ask the store.
    let neighbour = TestAgent::start(locks.uri()).await?;
    let k = key("metrics-wait");
    let (holder, _) = neighbour.hold(&k).await?;
    let waiter = agent.run(&[&k], &["--wait", "60s"], "exit 0")?;
    wait_for(addr, "runlock_waiters", |v| v == 1.0).await?;
    // Its tries 2 to 4 follow pauses of at least 10, 20 and 40 ms (half of
    // the first polls, 20 ms doubling): by then it has waited 70 ms or more.
    let polled =
        r#"runlock_backend_request_duration_seconds_count{operation="acquire",result="held"}"#;
    let before = wait_for(addr, polled, |v| v >= 4.0).await?;
    let quick = r#"runlock_wait_duration_seconds_bucket{le="0.05"}"#;
    let (quick_before, count_before) = (
        value_in(&before, quick)?,
        value_in(&before, "runlock_wait_duration_seconds_count")?,
    );
    ensure!(
        count_before == 0.0,
        "nothing was granted here yet:\n{before}"
    );

    holder.end_and_expect_success().await?;
    waiter.finish().await?.expect_code(0)?;
    let text = wait_for(addr, "runlock_waiters", |v| v == 0.0).await?;
    ensure!(
        value_in(&text, "runlock_wait_duration_seconds_count")? == count_before + 1.0,
        "the waiter's grant was not timed:\n{text}"
    );
    ensure!(
        value_in(&text, quick)? == quick_before,
        "the waiter's grant was timed as under 50 ms:\n{text}"
    );
    ensure!(
        value_in(&text, r#"runlock_acquisitions_total{result="granted"}"#)? == 1.0,
        "{text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_and_a_killed_run_end_their_holds_as_broken_and_closed() -> Result<()> {
    let (agent, addr, _locks) = agent_with_metrics("30s").await?;
    let broken = key("metrics-broken");
    let (holder, _) = agent.hold(&broken).await?;
    agent
        .runlock_output(&["release", &broken])
        .await?
        .expect_code(0)?;
    holder.finish().await?.expect_code(76)?;
    let text = wait_for(
        addr,
        r#"runlock_hold_duration_seconds_count{ended="broken"}"#,
        |v| v == 1.0,
    )
    .await?;
    let wrong = differences(
        &text,
        r#"
        runlock_losses_total{reason="broken"} 1
        runlock_takeovers_total{how="break"} 1
        runlock_takeovers_total{how="force"} 0
        "#,
    );
    ensure!(wrong.is_empty(), "{wrong:?} in:\n{text}");

    // The shim and then its command killed: the connection closes holding the key.
    let killed = key("metrics-killed");
    let (run, _) = agent.hold(&killed).await?;
    run.signal(Signal::SIGKILL)?;
    run.kill_group()?;
    wait_for(
        addr,
        r#"runlock_hold_duration_seconds_count{ended="closed"}"#,
        |v| v == 1.0,
    )
    .await?;
    // The broken run's lease is forgotten once its connection closes, which
    // the agent may handle after the killed one's: the gauge gets there.
    let text = wait_for(addr, "runlock_leases_held", |v| v == 0.0).await?;
    let wrong = differences(
        &text,
        r#"
        runlock_hold_duration_seconds_count{ended="closed"} 1
        runlock_hold_duration_seconds_count{ended="released"} 0
        "#,
    );
    ensure!(wrong.is_empty(), "{wrong:?} in:\n{text}");
    Ok(())
}

/// `promtool check metrics` on `exposition`: its findings, if any, as the error.
pub(crate) fn promtool_check_metrics(exposition: &str) -> Result<()> {
    let mut check = Command::new(promtool()?)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting promtool check metrics")?;
    check
        .stdin
        .take()
        .context("promtool's stdin")?
        .write_all(exposition.as_bytes())?;
    let out = check.wait_with_output()?;
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() || !findings.trim().is_empty() {
        bail!("promtool check metrics ({}):\n{findings}", out.status);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exposition_passes_promtool_check_metrics() -> Result<()> {
    let (agent, addr, locks) = agent_with_metrics("30s").await?;
    // Series made the first time something happens are in it too: the
    // store's "held", for a key held through another agent.
    let neighbour = TestAgent::start(locks.uri()).await?;
    let k = key("metrics-promtool");
    let (holder, _) = neighbour.hold(&k).await?;
    agent
        .run(&[&k], &[], "exit 0")?
        .finish()
        .await?
        .expect_code(75)?;
    holder.end_and_expect_success().await?;
    let text = scrape(addr).await?;
    ensure!(
        text.contains(r#"operation="acquire",result="held""#),
        "the refusal made no series:\n{text}"
    );
    promtool_check_metrics(&text)
}

#[test]
fn promtool_check_metrics_finds_a_badly_named_counter() -> Result<()> {
    // So that the check above is known to look: a counter without `_total`.
    let bad = "# HELP runlock_oops Oops.\n# TYPE runlock_oops counter\nrunlock_oops 1\n";
    let Err(err) = promtool_check_metrics(bad) else {
        bail!("promtool accepted a counter named without _total");
    };
    ensure!(format!("{err:#}").contains("_total"), "{err:#}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_get_metrics_is_served() -> Result<()> {
    let (_agent, addr, _locks) = agent_with_metrics("30s").await?;
    let (code, body) = get(addr, "/").await?;
    ensure!(code == 404 && body.contains("/metrics"), "{code}: {body}");
    let (code, _) = get(addr, "/metrics?x=1").await?;
    ensure!(code == 200, "a query string is refused: {code}");
    let answer = http::request("DELETE", &format!("http://{addr}/metrics"), &[], "").await?;
    ensure!(
        answer.status == 405,
        "DELETE /metrics answered {}",
        answer.status
    );
    Ok(())
}

/// Any user of the host can connect to the metrics port: one holding every
/// connection it can, idle, leaves Prometheus its scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_holding_every_metrics_connection_it_can_leaves_prometheus_its_scrape() -> Result<()>
{
    let (_agent, addr, _locks) = agent_with_metrics("30s").await?;
    let _hog = nobody_holds_connections(addr, 40).await?;
    // At once: the agent closes an idle connection after 10 s.
    scrape(addr)
        .await
        .context("a scrape while nobody holds connections")?;
    Ok(())
}

/// Metrics carry no authentication: an address beyond loopback is warned of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_on_an_address_beyond_loopback_are_warned_of() -> Result<()> {
    const WARNING: &str = "without authentication";
    let (agent, _, _locks) = agent_with_metrics("30s").await?;
    ensure!(
        !agent.log().contains(WARNING),
        "a loopback address warned:\n{}",
        agent.log()
    );
    let locks = FileBackendDir::new()?;
    let mut options = AgentOptions::new(locks.uri());
    options.args = ["--metrics", "0.0.0.0:0"].map(String::from).to_vec();
    let agent = TestAgent::start_with(options).await?;
    let log = agent.log();
    ensure!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains(WARNING) && l.contains("0.0.0.0:")),
        "no warning for metrics on 0.0.0.0:\n{log}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_address_in_use_stops_the_start_naming_it() -> Result<()> {
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = taken.local_addr()?.to_string();
    let dir = temp_dir()?;
    let socket = dir.path().join("agent.sock").display().to_string();
    let out = runlockd_refusing(&[
        "--socket",
        &socket,
        "--backend",
        "memory://",
        "--metrics",
        &addr,
    ])
    .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        stderr.contains(&addr) && stderr.contains("metrics"),
        "no clear message: {stderr}"
    );
    let out = runlockd_refusing(&["--socket", &socket, "--metrics", "localhost"]).await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(stderr.contains("localhost"), "no clear message: {stderr}");
    Ok(())
}
