//! The line a `--wait` on a terminal shows: what the run waits for (the key
//! and its holder, in the words of the `--force` notice) and for how long so
//! far, redrawn in place once a second and cleared when the wait ends.
//! Nothing when stderr is not a terminal: logs get the outcome, not a clock.

use crate::agent::{self, run_of};
use crate::commands::run::poll_some;
use runlock_client::{escape, BACKEND_ANSWER_TIMEOUT};
use runlock_protocol::{AgentMessage, ClientMessage, Holder, KeyState};
use std::convert::Infallible;
use std::future::Future;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;
use tokio::time::{Instant, MissedTickBehavior};

/// How often the line is redrawn.
const REDRAW: Duration = Duration::from_secs(1);
/// How often the holder is looked up again: it changes when another waiter
/// goes first, and each look reads the store.
const REREAD: Duration = Duration::from_secs(10);

/// Shows the line while it is polled (never ends; drop it when the wait
/// does, which clears the line). Pending and silent when stderr is not a
/// terminal or there is no wait.
pub async fn show(socket: &Path, keys: &[String], wait: Duration) -> Infallible {
    let Some(first_key) = keys.first() else {
        return std::future::pending().await;
    };
    if wait.is_zero() || !std::io::stderr().is_terminal() {
        return std::future::pending().await;
    }
    let started = Instant::now();
    let mut redraw = tokio::time::interval_at(started + REDRAW, REDRAW);
    redraw.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut line = Line { drawn: false };
    let mut waited_for = None;
    let mut asking: Option<Pin<Box<dyn Future<Output = Option<WaitedFor>>>>> = None;
    let mut ask_at = started;
    loop {
        if asking.is_none() && Instant::now() >= ask_at {
            asking = Some(Box::pin(waited_for_now(
                socket.to_path_buf(),
                keys.to_vec(),
            )));
            ask_at = Instant::now() + REREAD;
        }
        tokio::select! {
            _ = redraw.tick() => {}
            found = poll_some(&mut asking), if asking.is_some() => {
                asking = None;
                waited_for = found;
                if !line.drawn {
                    continue; // the first line waits for its first second
                }
            }
        }
        line.draw(&text(
            first_key,
            waited_for.as_ref(),
            started.elapsed(),
            wait,
        ));
    }
}

/// The first key held by another run, and by whom.
struct WaitedFor {
    key: String,
    holders: Vec<Holder>,
    slots: Option<u32>,
}

/// Asks the agent, on a connection of its own, who holds the keys; keys are
/// taken in order, so this run may hold the first ones already. `None` when
/// nobody else is seen holding one or the agent cannot say.
async fn waited_for_now(socket: PathBuf, keys: Vec<String>) -> Option<WaitedFor> {
    let mut client = agent::connect(&socket).await.ok()?;
    let ours = std::process::id();
    for key in keys {
        let request = ClientMessage::Inspect { key: key.clone() };
        let Ok(AgentMessage::Record(record)) =
            client.call_within(BACKEND_ANSWER_TIMEOUT, request).await
        else {
            return None;
        };
        if record.state != KeyState::Held {
            continue;
        }
        let holders: Vec<Holder> = match (record.holders, record.holder) {
            (holders, _) if !holders.is_empty() => holders,
            (_, holder) => holder.into_iter().collect(),
        };
        let holders: Vec<Holder> = holders.into_iter().filter(|h| h.pid != ours).collect();
        if !holders.is_empty() {
            return Some(WaitedFor {
                key,
                holders,
                slots: record.slots,
            });
        }
    }
    None
}

/// `"nightly" is held; waiting for the run of etl@runner-01 (pid 4242,
/// token 7) to release it: 12s so far, at most 30s`.
fn text(
    first_key: &str,
    waited_for: Option<&WaitedFor>,
    so_far: Duration,
    wait: Duration,
) -> String {
    let how_long = format!(
        "{} so far, {}",
        humantime::format_duration(Duration::from_secs(so_far.as_secs())),
        if wait >= crate::cli::WAIT_FOREVER {
            "no time limit".to_string()
        } else {
            format!("at most {}", humantime::format_duration(wait))
        }
    );
    let Some(WaitedFor {
        key,
        holders,
        slots,
    }) = waited_for
    else {
        return format!("waiting for {:?}: {how_long}", escape(first_key));
    };
    let key = escape(key);
    match (slots, &holders[..]) {
        (Some(slots), [first, rest @ ..]) => format!(
            "{key:?} is held (all {slots} slots); waiting for {}{} to release one: {how_long}",
            run_of(first),
            match rest.len() {
                0 => String::new(),
                n => format!(" or {n} other"),
            }
        ),
        (_, [holder, ..]) => format!(
            "{key:?} is held; waiting for {} to release it: {how_long}",
            run_of(holder)
        ),
        (_, []) => format!("waiting for {key:?}: {how_long}"),
    }
}

/// The line on the terminal; cleared when dropped, so that what follows
/// (the command's output, or why the wait failed) starts on a clean line.
struct Line {
    drawn: bool,
}

impl Line {
    fn draw(&mut self, text: &str) {
        let text = fit(&format!("runlock: {text}"), columns());
        // Back to the line's start, the line, then erase what a longer one left.
        let _ = write!(std::io::stderr().lock(), "\r{text}\x1b[K");
        self.drawn = true;
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if self.drawn {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[K");
        }
    }
}

/// The terminal's width; a line that wrapped could not be redrawn in place.
fn columns() -> usize {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes a winsize into the pointer it is given.
    let asked = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut size) };
    match (asked, size.ws_col) {
        (0, cols) if cols > 0 => usize::from(cols),
        _ => 80,
    }
}

/// `text` cut to fit in `columns` - 1 (the last column would wrap on some
/// terminals), ending with "…" when cut.
fn fit(text: &str, columns: usize) -> String {
    let room = columns.saturating_sub(1).max(1);
    if text.chars().count() <= room {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(room - 1).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(pid: u32, slot: Option<u32>) -> Holder {
        crate::agent::tests::holder(slot, pid, 7)
    }

    #[test]
    fn the_line_names_the_key_its_holder_and_both_durations() {
        let waited_for = WaitedFor {
            key: "nightly".into(),
            holders: vec![holder(4242, None)],
            slots: None,
        };
        assert_eq!(
            text(
                "a",
                Some(&waited_for),
                Duration::from_millis(12_400),
                Duration::from_secs(30)
            ),
            "\"nightly\" is held; waiting for the run of etl@runner-01 (pid 4242, token 7) \
             to release it: 12s so far, at most 30s"
        );
        assert_eq!(
            text("a", None, Duration::from_secs(61), crate::cli::WAIT_FOREVER),
            "waiting for \"a\": 1m 1s so far, no time limit"
        );
        let slots = WaitedFor {
            key: "pool".into(),
            holders: vec![holder(1, Some(0)), holder(2, Some(1)), holder(3, Some(2))],
            slots: Some(3),
        };
        assert!(text("pool", Some(&slots), Duration::ZERO, Duration::from_secs(5))
            .starts_with("\"pool\" is held (all 3 slots); waiting for the run of etl@runner-01 (pid 1, token 7) or 2 other to release one: 0s so far"));
    }

    #[test]
    fn a_long_line_is_cut_to_the_terminal_s_width() {
        assert_eq!(fit("runlock: short", 80), "runlock: short");
        let cut = fit(&"x".repeat(200), 40);
        assert_eq!(cut.chars().count(), 39);
        assert!(cut.ends_with('…'));
    }
}
