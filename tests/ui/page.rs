//! `runlock ui`: the live page, read in headless Chromium as a person sees it
//! (issue 29), and its server's refusals, on `file://` (no emulator).

use super::{agent_in_the_past_minutes, axis_labels_apart, set_width};
use crate::support::agent::{Backend, FileBackendDir};
use crate::support::browser::Browser;
use crate::support::http;
use crate::support::run::HOLD;
use crate::support::{host_name, key, nobody_holds_connections, AgentOptions, Run, TestAgent};
use anyhow::{ensure, Context, Result};
use nix::sys::signal::Signal;
use serde_json::Value;

/// `runlock ui` on a free port through `agent`, and the address it printed.
async fn start_ui(agent: &TestAgent) -> Result<(Run, String)> {
    start_ui_on(agent, &[]).await
}

/// `runlock ui ARGS` through `agent`, and the address it printed.
async fn start_ui_on(agent: &TestAgent, args: &[&str]) -> Result<(Run, String)> {
    let mut command = agent.runlock()?;
    command.arg("ui").args(args);
    let mut ui = Run::spawn(command)?;
    let url = ui.line().await?;
    ensure!(
        url.starts_with("http://127.0.0.1:") && url.contains("/?token="),
        "runlock ui printed {url:?}"
    );
    Ok((ui, url))
}

/// Waits for the page to show a listing it got.
async fn wait_live(page: &mut Browser) -> Result<()> {
    page.wait_for(
        "document.body?.dataset.live === 'true'",
        "the page to be live",
    )
    .await?;
    Ok(())
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

    // With the token in the address; the page itself needs it too, while its
    // script and style are the same for everyone.
    let page = |path: &str| format!("{base}{path}");
    ensure!(
        status(http::get(&page("/")).await?) == 403,
        "the page without a token"
    );
    for path in ["/app.js", "/style.css"] {
        ensure!(status(http::get(&page(path)).await?) == 200, "{path}");
    }
    let answer = http::get(&state(&format!("?token={token}"))).await?;
    let body: Value = serde_json::from_str(&answer.success("the state")?)?;
    ensure!(
        body["complete"] == true
            && body["backend"]
                .as_str()
                .is_some_and(|b| b.starts_with("file://")),
        "{body}"
    );
    let localhost = http::request(
        "GET",
        &state(&format!("?token={token}")),
        &[("host", &format!("localhost:{port}"))],
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

/// A browser sends a cookie of 127.0.0.1 to every port of it, whoever
/// listens there: the page keeps its token in its address, in no cookie.
#[tokio::test]
async fn the_page_gives_the_browser_no_cookie_for_other_ports_to_receive() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let (_ui, url) = start_ui(&agent).await?;
    let mut page = Browser::open(&url).await?;
    wait_live(&mut page).await?;
    let cookies = page
        .call(
            "Network.getCookies",
            serde_json::json!({ "urls": [url, "http://127.0.0.1:1/", "http://localhost:1/"] }),
        )
        .await?;
    ensure!(
        cookies["cookies"].as_array().is_some_and(Vec::is_empty),
        "the browser keeps cookies that other ports would receive: {cookies}"
    );
    Ok(())
}

/// On port 80 a browser names the host without a port (`Host: 127.0.0.1`).
#[tokio::test]
async fn the_page_on_port_80_is_served_to_a_browser() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let (_ui, url) = start_ui_on(&agent, &["--listen", "127.0.0.1:80"])
        .await
        .context("runlock ui on port 80 (the tests run as root; is the port in use?)")?;
    // As a person would type it, and as the browser shows it.
    let url = url.replacen("127.0.0.1:80/", "127.0.0.1/", 1);
    let mut page = Browser::open(&url).await?;
    wait_live(&mut page).await?;
    Ok(())
}

/// Any user of the host can connect to the page's port, token or not: one
/// holding every connection it can, idle, leaves the page to its own user.
#[tokio::test]
async fn a_user_holding_every_connection_it_can_leaves_the_page_to_its_own_user() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let (_ui, url) = start_ui(&agent).await?;
    let (base, token) = url.split_once("/?token=").context("no token")?;
    let addr = base.trim_start_matches("http://").parse()?;
    let _hog = nobody_holds_connections(addr, 40).await?;
    // At once: the server closes an idle connection after 10 s.
    http::get(&format!("{base}/api/state?token={token}"))
        .await
        .context("the state while nobody holds connections")?
        .success("the state while nobody holds connections")?;
    Ok(())
}

/// Whoever can write to the store writes the slot numbers in it: the page
/// draws a lane for each slot up to a run's, so a number far past a key's
/// bounds would hang it. Each is read as the slot its record is.
#[tokio::test]
async fn slot_numbers_a_store_holds_past_every_bound_are_read_as_their_records() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let k = key("ui-slot-number");
    agent
        .run(&[&k], &[], "true")?
        .finish()
        .await?
        .expect_code(0)?;
    // The record's file: its name encodes the key.
    let locks = agent.dir().join("locks");
    let path = std::fs::read_dir(&locks)?
        .filter_map(|entry| Some(entry.ok()?.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains("ui-slot-number") && n.ends_with(".lock"))
        })
        .with_context(|| format!("no record of {k} in {}", locks.display()))?;
    let mut record: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let history = record["history"].as_array_mut().context("no history")?;
    ensure!(!history.is_empty(), "the run left no history: {record}");
    for event in history {
        event["slot"] = Value::from(u32::MAX - 1);
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&record)?)?;

    let (_ui, url) = start_ui(&agent).await?;
    let mut page = Browser::open(&url).await?;
    let lanes = format!(
        "[...document.querySelectorAll('#timeline .tl-row')].find(r => r.dataset.key === {k})
           ?.querySelectorAll('.lane').length ?? null",
        k = js(&k)
    );
    let lanes = page
        .wait_for(&lanes, "the key's row in the timeline")
        .await?;
    ensure!(lanes == 1, "the key has {lanes} lanes");
    let out = agent.runlock_output(&["history", &k, "--json"]).await?;
    out.expect_code(0)?;
    ensure!(
        !out.stdout.contains(&(u32::MAX - 1).to_string()),
        "history shows the stored number: {}",
        out.stdout
    );
    Ok(())
}

/// The keys of the timeline's rows in `group`'s container, in order.
fn timeline_keys(container: &str) -> String {
    format!("[...document.querySelectorAll('#{container} .tl-row')].map(r => r.dataset.key)")
}

/// Shows the timeline over `window` (`fit`, `1h`, `6h`, `24h`) as a person
/// does, with its button, and waits for it to be drawn over `shown`.
async fn choose_window(page: &mut Browser, window: &str, shown: &str) -> Result<()> {
    let click = format!(
        "document.querySelector('#windows button[data-window={w}]').click()",
        w = js(window)
    );
    page.evaluate(&click).await?;
    let drawn = format!(
        "document.body.dataset.window === {s} \
         && document.querySelector('#windows [aria-pressed=true]')?.dataset.window === {w}",
        s = js(shown),
        w = js(window)
    );
    page.wait_for(&drawn, &format!("the {window} button to show {shown}"))
        .await?;
    Ok(())
}

/// The window fits the runs: 6 h for a run 3 hours ago; keys run in numbered
/// series read src1, src2, src10; the Meltano add-on's state-write key is
/// shown in its own group; and at every window, 1280 or 800 px wide, no two
/// of the axis's labels touch.
#[tokio::test]
async fn the_timeline_fits_its_window_to_the_runs_and_reads_in_order() -> Result<()> {
    let dir = FileBackendDir::new()?;
    let (src1, src2, src10) = (key("src1"), key("src2"), key("src10"));
    let state_write = format!("meltano-state-write:{src2}");
    // src2 ran 3 hours ago, by the clock of the agent it ran through.
    let past = agent_in_the_past_minutes(&dir, 180, 1).await?;
    past.run(&[&src2], &[], "true")?
        .finish()
        .await?
        .expect_code(0)?;
    drop(past);

    let agent = TestAgent::start_with_env(AgentOptions::new(dir.uri()), &[]).await?;
    agent
        .run(&[&src10], &[], "true")?
        .finish()
        .await?
        .expect_code(0)?;
    let mut held = agent.run(&[&src1], &[], HOLD)?;
    held.ready().await?;
    let mut writing = agent.run(&[&state_write], &[], HOLD)?;
    writing.ready().await?;
    let (_ui, url) = start_ui(&agent).await?;
    let mut page = Browser::open(&url).await?;

    let rows = format!("(k => k.length === 3 && k)({})", timeline_keys("timeline"));
    let rows = page.wait_for(&rows, "three keys' rows").await?;
    ensure!(
        rows == serde_json::json!([src1, src2, src10]),
        "the timeline's pipelines read {rows}"
    );
    let chosen = page
        .evaluate(
            "[document.body.dataset.window, document.getElementById('timeline-title').textContent]",
        )
        .await?;
    ensure!(
        chosen == serde_json::json!(["6h", "Last 6 hours"]),
        "a run 3 hours ago and runs now are shown over {chosen}"
    );

    // The state write: apart from the pipelines, under its own heading, by its state ID.
    let writes = page
        .evaluate(&format!(
            "[{keys}, [...document.querySelectorAll('#timeline-state-writes .tl-label')].map(l => l.textContent), \
              document.getElementById('state-writes').hidden, \
              [...document.querySelectorAll('#held-state-writes tr')].map(r => r.dataset.key ?? r.innerText), \
              [...document.querySelectorAll('#held-pipelines tr')].map(r => r.dataset.key)]",
            keys = timeline_keys("timeline-state-writes")
        ))
        .await?;
    ensure!(
        writes[0] == serde_json::json!([state_write])
            && writes[1] == serde_json::json!([src2])
            && writes[2] == false
            && writes[3].as_array().map(Vec::len) == Some(2)
            && writes[3][0].as_str().is_some_and(|h| h.starts_with("Meltano state writes"))
            && writes[3][1] == state_write.as_str()
            && writes[4] == serde_json::json!([src1]),
        "the state write is not apart from the pipelines \
         ([its timeline row, its label, hidden, its held rows, the pipelines' held rows]): {writes}"
    );

    for width in [1280, 800] {
        set_width(&mut page, width).await?;
        for (window, shown) in [("1h", "1h"), ("24h", "24h"), ("fit", "6h")] {
            choose_window(&mut page, window, shown).await?;
            let labels = axis_labels_apart(&mut page)
                .await
                .with_context(|| format!("{width} px wide, over {shown}"))?;
            ensure!(
                labels.first().map(String::as_str) == Some(&format!("−{shown}")[..]),
                "the axis over {shown} begins {labels:?}"
            );
        }
    }

    // The last hour leaves out the run of 3 hours ago.
    choose_window(&mut page, "1h", "1h").await?;
    let rows = page.evaluate(&timeline_keys("timeline")).await?;
    ensure!(
        rows == serde_json::json!([src1, src10]),
        "the last hour shows {rows}"
    );

    // The address keeps the window picked, beside the token: opened again,
    // as after a reload, it shows the same.
    let address = page.evaluate("location.href").await?;
    let address = address.as_str().context("no address")?;
    ensure!(
        address.starts_with(&url) && address.ends_with("#window=1h"),
        "the address after picking 1 h: {address}"
    );
    let mut again = Browser::open(address).await?;
    wait_live(&mut again).await?;
    let shown = again
        .evaluate("[document.body.dataset.window, document.querySelector('#windows [aria-pressed=true]').dataset.window]")
        .await?;
    ensure!(
        shown == serde_json::json!(["1h", "1h"]),
        "the address with #window=1h shows [window, button pressed] {shown}"
    );
    drop((held, writing));
    Ok(())
}
