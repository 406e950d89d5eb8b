//! `runlock ui`: the live page, read in headless Chromium as a person sees it
//! (issue 29), and its server's refusals, on `file://` (no emulator).

use crate::support::agent::Backend;
use crate::support::browser::Browser;
use crate::support::http;
use crate::support::run::HOLD;
use crate::support::{host_name, key, Run, TestAgent};
use anyhow::{ensure, Context, Result};
use nix::sys::signal::Signal;
use serde_json::Value;

/// `runlock ui` on a free port through `agent`, and the address it printed.
async fn start_ui(agent: &TestAgent) -> Result<(Run, String)> {
    let mut command = agent.runlock()?;
    command.arg("ui");
    let mut ui = Run::spawn(command)?;
    let url = ui.line().await?;
    ensure!(
        url.starts_with("http://127.0.0.1:") && url.contains("/?token="),
        "runlock ui printed {url:?}"
    );
    Ok((ui, url))
}

/// A JavaScript string literal of `text`.
fn js(text: &str) -> String {
    // invariant: a string always serializes
    serde_json::to_string(text).unwrap_or_default()
}

/// The text of `key`'s rows in "held now", or null when it has none.
fn held_row_text(key: &str) -> String {
    format!(
        "(() => {{ const rows = [...document.querySelectorAll('#held tbody tr')]
             .filter(r => r.dataset.key === {k}); \
           return rows.length ? rows.map(r => r.innerText).join('\\n') : null; }})()",
        k = js(key)
    )
}

/// JavaScript for the timeline bar of `key`'s run with `token`, or null.
fn bar(key: &str, token: u64) -> String {
    format!(
        "([...document.querySelectorAll('#timeline .tl-row')].find(r => r.dataset.key === {k})
           ?.querySelector('.bar[data-token=\"{token}\"]') ?? null)",
        k = js(key)
    )
}

#[tokio::test]
async fn the_page_shows_a_run_held_growing_then_how_it_ended() -> Result<()> {
    let mut agent = TestAgent::start_on(Backend::File).await?;
    let nightly = key("ui-nightly");
    let mut job = agent.run(&[&nightly], &[], &format!("{HOLD} # load-warehouse"))?;
    let token = job.ready().await?.token();
    let (_ui, url) = start_ui(&agent).await?;
    let mut page = Browser::open(&url).await?;

    // Held now: the key, with its host and its command.
    let row = page
        .wait_for(&held_row_text(&nightly), "the job's key in 'held now'")
        .await?;
    let row = row.as_str().context("row text")?;
    let host = host_name()?;
    ensure!(
        row.contains(&host) && row.contains("# load-warehouse"),
        "the row names no host {host:?} or command: {row:?}"
    );

    // Its bar is open and grows while the page is live.
    let width = format!("parseFloat({}.style.width)", bar(&nightly, token));
    let ending = format!("{}?.dataset.ending", bar(&nightly, token));
    let first = page.wait_for(&width, "the job's bar").await?;
    let first = first.as_f64().context("a width")?;
    ensure!(
        page.evaluate(&ending).await? == "held",
        "an open bar is marked held"
    );
    let grown = format!("{width} > {first} && {width}");
    page.wait_for(&grown, "the job's bar to grow").await?;

    // A second copy is refused: a tick marks it on the key's timeline.
    agent
        .run(&[&nightly], &[], "true")?
        .finish()
        .await?
        .expect_code(75)?;
    let tick = format!(
        "([...document.querySelectorAll('#timeline .tl-row')].find(r => r.dataset.key === {k})
           ?.querySelector('.tick')?.title ?? null)",
        k = js(&nightly)
    );
    let tick = page
        .wait_for(&tick, "a refusal tick on the key's row")
        .await?;
    let tick = tick.as_str().unwrap_or("");
    ensure!(tick.starts_with("refused "), "the tick reads {tick:?}");

    // A copy that waits is counted in the key's "held now" row.
    let waiter = agent.run(&[&nightly], &["--wait", "5m"], "true")?;
    let waiting = format!(
        "[...document.querySelectorAll('#held tbody tr')]
           .find(r => r.dataset.key === {k})?.querySelector('td.waiting')?.innerText === '1'",
        k = js(&nightly)
    );
    page.wait_for(&waiting, "one waiter in the key's row")
        .await?;

    // The job ends: the waiter runs and ends, the key leaves "held now", and
    // the job's bar ends released.
    job.end_and_expect_success().await?;
    waiter.finish().await?.expect_code(0)?;
    let released = format!(
        "{held} === null && {ending} === 'released'",
        held = held_row_text(&nightly)
    );
    page.wait_for(&released, "the key to leave 'held now', its bar released")
        .await?;

    // A job killed with its shim ends crashed.
    let doomed = key("ui-doomed");
    let mut crash = agent.run(&[&doomed], &[], HOLD)?;
    let crash_token = crash.ready().await?.token();
    page.wait_for(&held_row_text(&doomed), "the second job in 'held now'")
        .await?;
    crash.signal(Signal::SIGKILL)?;
    crash.kill_group()?;
    crash.wait().await?;
    let crashed = format!(
        "{held} === null && {bar}?.dataset.ending === 'crashed'",
        held = held_row_text(&doomed),
        bar = bar(&doomed, crash_token)
    );
    page.wait_for(&crashed, "the killed job's bar to end crashed")
        .await?;

    // Without the agent the page says it is not live, and since when.
    agent.stop().await?;
    let banner = page
        .wait_for(
            "document.body.dataset.live === 'false' && !document.getElementById('stale').hidden \
             && document.getElementById('stale').innerText",
            "the page to say it is stale",
        )
        .await?;
    let banner = banner.as_str().unwrap_or("");
    ensure!(
        banner.starts_with("Not live: last update ") && banner.contains("agent"),
        "the stale banner reads {banner:?}"
    );
    Ok(())
}

#[tokio::test]
async fn markup_in_keys_and_commands_is_shown_as_text() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let hostile = key("<img src=x onerror=alert(1)>");
    let script = "<script>document.title=42</script>";
    let mut job = agent.run(&[&hostile], &[], &format!("{HOLD} # {script}"))?;
    job.ready().await?;
    let (_ui, url) = start_ui(&agent).await?;
    let mut page = Browser::open(&url).await?;

    let row = page
        .wait_for(&held_row_text(&hostile), "the key in 'held now'")
        .await?;
    let row = row.as_str().unwrap_or("");
    ensure!(
        row.contains(&hostile) && row.contains(script),
        "the key and command are not shown literally: {row:?}"
    );
    let label = page
        .evaluate("document.querySelector('#timeline .tl-label')?.textContent ?? null")
        .await?;
    ensure!(label == hostile.as_str(), "the timeline's label: {label}");
    let made = page
        .evaluate(
            "[document.querySelectorAll('img').length, \
              document.querySelectorAll('script').length, document.title]",
        )
        .await?;
    ensure!(
        made == serde_json::json!([0, 1, "runlock"]),
        "elements were made from the data ([img, script, title]): {made}"
    );
    Ok(())
}

#[tokio::test]
async fn the_server_answers_only_with_its_token_and_to_its_own_host() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let (_ui, url) = start_ui(&agent).await?;
    let (base, token) = url.split_once("/?token=").context("no token")?;
    let authority = base.trim_start_matches("http://");
    let port = authority.rsplit(':').next().unwrap_or("");

    let state = |query: &str| format!("{base}/api/state{query}");
    let status = |r: http::Response| r.status;
    ensure!(status(http::get(&state("")).await?) == 403, "no token");
    let wrong = format!("?token={}", "0".repeat(token.len()));
    ensure!(
        status(http::get(&state(&wrong)).await?) == 403,
        "a wrong token"
    );
    let foreign = http::request(
        "GET",
        &state(&format!("?token={token}")),
        &[("host", &format!("rebound.example:{port}"))],
        "",
    )
    .await?;
    ensure!(foreign.status == 403, "a foreign Host: {foreign:?}");

    // With the token, in the address or in the cookie the page sets.
    let answer = http::get(&state(&format!("?token={token}"))).await?;
    let body: Value = serde_json::from_str(&answer.success("the state")?)?;
    ensure!(
        body["complete"] == true
            && body["backend"]
                .as_str()
                .is_some_and(|b| b.starts_with("file://")),
        "{body}"
    );
    let cookie = format!("runlock_ui_{port}={token}");
    let by_cookie = http::request("GET", &state(""), &[("cookie", &cookie)], "").await?;
    ensure!(by_cookie.status == 200, "the cookie: {by_cookie:?}");
    let localhost = http::request(
        "GET",
        &state(""),
        &[("cookie", &cookie), ("host", &format!("localhost:{port}"))],
        "",
    )
    .await?;
    ensure!(localhost.status == 200, "localhost: {localhost:?}");

    // Only a loopback address is served.
    let out = agent
        .runlock_output(&["ui", "--listen", "0.0.0.0:0"])
        .await?;
    out.expect_code(64)?;
    ensure!(out.stderr.contains("loopback"), "{out:?}");
    Ok(())
}
