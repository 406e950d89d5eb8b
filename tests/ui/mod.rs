//! `runlock ui`: its page read in headless Chromium as a person sees it
//! (page.rs), and the picture of it the book shows (screenshot.rs); here what
//! both need: the page laid out at a width, its axis read, and agents whose
//! clock starts in the past.

mod page;
mod screenshot;

use crate::support::agent::FileBackendDir;
use crate::support::browser::Browser;
use crate::support::{AgentOptions, TestAgent};
use anyhow::{ensure, Context, Result};
use serde_json::Value;

/// Lays the page out `width` px wide, as a window that wide shows it, and
/// waits for the timeline to be drawn again at that width.
async fn set_width(page: &mut Browser, width: u32) -> Result<()> {
    let metrics = serde_json::json!({
        "width": width, "height": 800, "deviceScaleFactor": 1, "mobile": false,
    });
    page.call("Emulation.setDeviceMetricsOverride", metrics)
        .await?;
    let drawn = format!(
        "innerWidth === {width} && (a => a.dataset.width === String(a.clientWidth))(document.getElementById('axis'))"
    );
    page.wait_for(&drawn, &format!("the timeline drawn {width} px wide"))
        .await?;
    Ok(())
}

/// Checks that the axis's labels, as laid out, stand inside its track and
/// no two of them touch; returns their texts.
async fn axis_labels_apart(page: &mut Browser) -> Result<Vec<String>> {
    let marks = page
        .evaluate(
            "(() => { const axis = document.getElementById('axis').getBoundingClientRect(); \
               return { axis: [axis.left, axis.right], marks: [...document.querySelectorAll('#axis .axis-mark')] \
                 .map(m => { const b = m.getBoundingClientRect(); \
                   return { text: m.textContent, left: b.left, right: b.right, top: b.top, bottom: b.bottom }; }) }; })()",
        )
        .await?;
    let (left, right) = (marks["axis"][0].as_f64(), marks["axis"][1].as_f64());
    let (left, right) = (left.context("axis box")?, right.context("axis box")?);
    let marks = marks["marks"].as_array().context("no marks")?;
    let edge = |m: &Value, side: &str| m[side].as_f64().unwrap_or(f64::NAN);
    for (i, a) in marks.iter().enumerate() {
        ensure!(
            edge(a, "left") >= left - 0.5 && edge(a, "right") <= right + 0.5,
            "axis label {a} is outside the axis [{left}, {right}]"
        );
        for b in &marks[i + 1..] {
            let apart = edge(a, "right") <= edge(b, "left")
                || edge(b, "right") <= edge(a, "left")
                || edge(a, "bottom") <= edge(b, "top")
                || edge(b, "bottom") <= edge(a, "top");
            ensure!(apart, "axis labels overlap: {a} and {b}");
        }
    }
    let texts: Vec<String> = marks
        .iter()
        .filter_map(|m| m["text"].as_str().map(str::to_string))
        .collect();
    ensure!(
        texts.len() >= 3,
        "the axis has fewer than two ends and a time: {texts:?}"
    );
    Ok(texts)
}

/// libfaketime's library for a program of many threads, as the agent is
/// (Debian's libfaketime, which `scripts/test` installs with `faketime`).
fn libfaketime() -> String {
    let arch = std::env::consts::ARCH;
    format!("/usr/lib/{arch}-linux-gnu/faketime/libfaketimeMT.so.1")
}
/// An agent on `dir` whose clock starts `minutes_ago` and runs `speed` times as fast.
async fn agent_in_the_past_minutes(
    dir: &FileBackendDir,
    minutes_ago: u32,
    speed: u32,
) -> Result<TestAgent> {
    let env = [
        ("LD_PRELOAD", libfaketime()),
        ("FAKETIME", format!("-{minutes_ago}m x{speed}")),
        // Its timers keep real time: only the clock it records events by moves.
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
    ]
    .map(|(name, value)| (name.to_string(), value));
    TestAgent::start_with_env(AgentOptions::new(dir.uri()), &env).await
}
