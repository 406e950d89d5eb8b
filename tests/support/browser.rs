//! `Browser`: headless Chromium (Debian's `chromium`) on one page, driven
//! over its DevTools protocol, so a test reads what a person would see:
//! the page's DOM after its script ran, at any moment, as often as needed.
//! A missing Chromium fails the test, naming the package: never a skip.

use super::agent::temp_dir;
use super::{within, Deadline, WAIT};
use anyhow::{bail, Context, Result};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Stdio;
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// The window a page is laid out in (and a screenshot's size).
pub const WINDOW: (u32, u32) = (1280, 800);

/// Headless Chromium showing one page.
pub struct Browser {
    devtools: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    _chromium: Child,
    _profile: TempDir,
}

/// The Chromium program: `chromium` on PATH.
fn chromium() -> Result<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("chromium"))
        .find(|candidate| candidate.is_file())
        .context(
            "headless Chromium is needed to test runlock ui's page and is not installed: \
             apt-get install chromium (scripts/test installs it)",
        )
}

impl Browser {
    /// Starts Chromium on `url` and connects to that page's DevTools.
    pub async fn open(url: &str) -> Result<Browser> {
        let profile = temp_dir()?;
        let mut chromium = Command::new(chromium()?)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--window-size={},{}", WINDOW.0, WINDOW.1))
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting chromium")?;
        // Chromium announces its DevTools endpoint on stderr once it listens.
        let stderr = chromium.stderr.take().context("no stderr pipe")?;
        let mut lines = BufReader::new(stderr).lines();
        let announced = async {
            let mut seen = Vec::new();
            while let Some(line) = lines.next_line().await? {
                if let Some(ws) = line.strip_prefix("DevTools listening on ") {
                    return Ok(ws.trim().to_string());
                }
                seen.push(line);
            }
            bail!(
                "chromium exited without DevTools; it said:\n{}",
                seen.join("\n")
            )
        };
        let browser_ws = within(WAIT, "chromium's DevTools", announced).await??;
        // Later lines are Chromium's own chatter; reading them keeps its pipe from filling.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let page_ws = page_target(&browser_ws, url).await?;
        let (devtools, _) = within(
            WAIT,
            "the page's DevTools connection",
            tokio_tungstenite::connect_async(page_ws.as_str()),
        )
        .await?
        .context("connecting to the page's DevTools")?;
        Ok(Browser {
            devtools,
            next_id: 1,
            _chromium: chromium,
            _profile: profile,
        })
    }

    /// Calls DevTools `method` and returns its result, within [`WAIT`].
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let request = json!({ "id": id, "method": method, "params": params });
        self.devtools
            .send(Message::text(request.to_string()))
            .await
            .with_context(|| format!("sending {method}"))?;
        let reply = async {
            while let Some(message) = self.devtools.next().await {
                let Message::Text(text) = message? else {
                    continue;
                };
                let value: Value = serde_json::from_str(&text)?;
                // Events have no id; replies to other calls cannot be pending.
                if value["id"] == id {
                    return Ok(value);
                }
            }
            bail!("chromium closed DevTools")
        };
        let value = within(WAIT, method, reply).await??;
        if !value["error"].is_null() {
            bail!("{method}: {}", value["error"]);
        }
        Ok(value["result"].clone())
    }

    /// The value of JavaScript `expression` in the page (a promise is awaited).
    pub async fn evaluate(&mut self, expression: &str) -> Result<Value> {
        let params =
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true });
        let result = self.call("Runtime.evaluate", params).await?;
        if !result["exceptionDetails"].is_null() {
            bail!("{expression} threw: {}", result["exceptionDetails"]);
        }
        Ok(result["result"]["value"].clone())
    }

    /// Evaluates `expression` until it is neither null, false nor undefined,
    /// and returns that value; fails past [`WAIT`], saying `what` was awaited
    /// and what the expression last gave.
    pub async fn wait_for(&mut self, expression: &str, what: &str) -> Result<Value> {
        let deadline = Deadline::new(WAIT, what);
        loop {
            let value = self.evaluate(expression).await?;
            if !matches!(value, Value::Null | Value::Bool(false)) {
                return Ok(value);
            }
            if let Err(err) = deadline.tick().await {
                let page = match self.evaluate("document.body.innerText").await {
                    Ok(Value::String(text)) => text,
                    Ok(other) => format!("(no text: {other})"),
                    Err(why) => format!("(cannot read it: {why:#})"),
                };
                bail!("{err:#}; the page reads:\n{page}");
            }
        }
    }

    /// Saves a PNG of the page, the window's width by the content's height
    /// (at most the window's).
    pub async fn screenshot(&mut self, path: &Path) -> Result<()> {
        use base64::Engine as _;
        let height = self
            .evaluate("Math.ceil(document.documentElement.getBoundingClientRect().height)")
            .await?
            .as_u64()
            .map_or(WINDOW.1, |h| (h as u32).min(WINDOW.1));
        let clip = json!({ "x": 0, "y": 0, "width": WINDOW.0, "height": height, "scale": 1 });
        let shot = self
            .call(
                "Page.captureScreenshot",
                json!({ "format": "png", "clip": clip }),
            )
            .await?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().context("no screenshot data")?)
            .context("decoding the screenshot")?;
        std::fs::write(path, png).with_context(|| format!("writing {}", path.display()))
    }
}

/// The DevTools WebSocket of the page showing `url`, found through the
/// browser's HTTP endpoint (the page may take a moment to be listed).
async fn page_target(browser_ws: &str, url: &str) -> Result<String> {
    let authority = browser_ws
        .strip_prefix("ws://")
        .and_then(|rest| rest.split('/').next())
        .with_context(|| format!("unexpected DevTools address {browser_ws:?}"))?;
    let list = format!("http://{authority}/json/list");
    let deadline = Deadline::new(WAIT, format!("chromium to list a page for {url}"));
    loop {
        let body = super::http::get(&list).await?.success("listing pages")?;
        let targets: Value = serde_json::from_str(&body).context("parsing /json/list")?;
        let page =
            targets.as_array().into_iter().flatten().find(|t| {
                t["type"] == "page" && t["url"].as_str().is_some_and(|u| u.starts_with(url))
            });
        if let Some(ws) = page.and_then(|t| t["webSocketDebuggerUrl"].as_str()) {
            return Ok(ws.to_string());
        }
        deadline.tick().await?;
    }
}
