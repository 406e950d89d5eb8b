//! `runlock list [PREFIX] [--all] [--json]`: every key held in the store,
//! from every host that shares it, read page by page through this host's
//! agent, as this user may see them.

use crate::agent::{self, unexpected};
use crate::exit::Failure;
#[cfg(test)]
use crate::exit::EXIT_UNAVAILABLE;
use runlock_client::escape;
use runlock_client::{CallError, Client};
use runlock_protocol::{
    AgentMessage, ClientMessage, Holder, KeyListing, KeyState, ListKeysRequest,
};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the agent has to answer one page: it reads up to a thousand
/// records for it (each bounded at 5 s, many at once).
const PAGE_ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// The listing, and how it ended: whole, or cut short by a failed page.
pub struct Listing {
    pub keys: Vec<KeyListing>,
    pub pages: u32,
    /// The page that failed (counted from 1) and why.
    pub failed: Option<(u32, Failure)>,
}

pub async fn run(socket: &Path, prefix: &str, all: bool, json: bool) -> Result<ExitCode, Failure> {
    if !prefix.is_empty() {
        super::valid_key(prefix)?;
    }
    let mut client = agent::connect(socket).await?;
    let mut listing = read_all(&mut client, prefix, all, None).await?;
    in_reading_order(&mut listing.keys);
    let text = match json {
        true => json_text(&listing),
        false => table_text(&listing, all),
    };
    // A reader that has gone (`| head`) has all it wanted.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    match listing.failed {
        Some((_, failure)) => Err(failure),
        None => Ok(ExitCode::SUCCESS),
    }
}

/// The store's order puts keys named by their hash first; people read by
/// key, numbers by their value, as `runlock ui` shows them.
fn in_reading_order(keys: &mut [KeyListing]) {
    keys.sort_by(|a, b| crate::order::natural(&a.key, &b.key));
}

/// Every page, until the last or the first that fails; a failure on the
/// first page (nothing to show) is the command's failure. `free` lists free
/// keys too; `events_since_ms` asks for each key's events and refusals since then.
pub async fn read_all(
    client: &mut Client,
    prefix: &str,
    free: bool,
    events_since_ms: Option<u64>,
) -> Result<Listing, Failure> {
    let mut listing = Listing {
        keys: Vec::new(),
        pages: 0,
        failed: None,
    };
    let mut cursor = None;
    loop {
        let request = ClientMessage::ListKeys(ListKeysRequest {
            prefix: prefix.to_string(),
            cursor: cursor.clone(),
            free,
            events_since_ms,
        });
        let page = listing.pages + 1;
        match client.call_within(PAGE_ANSWER_TIMEOUT, request).await {
            // An agent that cannot move on would be asked forever.
            Ok(AgentMessage::Keys { keys, cursor: next })
                if keys.is_empty() && next.is_some() && next == cursor =>
            {
                let failure = Failure::new(
                    crate::exit::EXIT_SOFTWARE,
                    format!("page {page} of the listing made no progress: the agent gave back the same cursor"),
                );
                listing.failed = Some((page, failure));
                return Ok(listing);
            }
            Ok(AgentMessage::Keys { keys, cursor: next }) => {
                listing.keys.extend(keys);
                listing.pages = page;
                match next {
                    Some(next) => cursor = Some(next),
                    None => return Ok(listing),
                }
            }
            Ok(other) => return Err(unexpected("list_keys", &other)),
            Err(err) if page == 1 => return Err(agent::call_failure(err, "listing keys")),
            Err(err) => {
                let after = listing
                    .keys
                    .last()
                    .map(|k| k.key.clone())
                    .unwrap_or_default();
                let failure = page_failure(err, page, &after);
                listing.failed = Some((page, failure));
                return Ok(listing);
            }
        }
    }
}

fn page_failure(err: CallError, page: u32, after: &str) -> Failure {
    let failure = agent::call_failure(err, "listing keys");
    Failure::new(
        failure.code,
        format!(
            "page {page} of the listing (after key {:?}) failed: {}; the keys above are those of the pages before it",
            escape(after),
            failure.message
        ),
    )
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The held slots of a key (its one holder for a plain key).
pub fn holders(key: &KeyListing) -> Vec<&Holder> {
    let Some(record) = &key.record else {
        return Vec::new();
    };
    match record.slots {
        Some(_) => record.holders.iter().collect(),
        None => record.holder.iter().collect(),
    }
}

fn json_text(listing: &Listing) -> String {
    let keys: Vec<serde_json::Value> = listing.keys.iter().map(key_json).collect();
    let value = serde_json::json!({
        "keys": keys,
        "pages": listing.pages,
        "complete": listing.failed.is_none(),
        "error": listing.failed.as_ref().map(|(_, failure)| failure.message.clone()),
    });
    format!("{value}\n")
}

/// One key as `list --json` prints it (README, "runlock list").
fn key_json(key: &KeyListing) -> serde_json::Value {
    let Some(record) = &key.record else {
        return serde_json::json!({
            "key": key.key,
            "state": "unreadable",
            "unreadable": key.unreadable,
        });
    };
    let held = holders(key);
    serde_json::json!({
        "key": key.key,
        "state": match record.state {
            KeyState::Held => "held",
            KeyState::Free => "free",
            KeyState::Unknown => "unknown",
        },
        "token": record.token,
        "slots": record.slots.unwrap_or(1),
        "slots_held": held.len(),
        "holders": held.iter().map(|h| super::inspect::holder_json(h)).collect::<Vec<_>>(),
        "expires_in_ms": record.expires_in_ms,
        "incident": record.incident.as_deref().map(super::history::event_json),
        "waiting_here": key.waiting_here,
        "waiters": key.waiters.iter().map(|w| serde_json::json!({
            "host": w.host,
            "user": w.user,
            "uid": w.uid,
            "pid": w.pid,
            "since_ms": w.since_ms,
        })).collect::<Vec<_>>(),
    })
}

/// The widths of the columns that never grow, and the least the key and
/// the command are given.
const STATE_WIDTH: usize = 10;
const HOST_WIDTH: usize = 16;
const PID_WIDTH: usize = 7;
const USER_WIDTH: usize = 10;
const SINCE_WIDTH: usize = 9;
const EXPIRES_WIDTH: usize = 8;
const LEAST_KEY_WIDTH: usize = 12;
const LEAST_COMMAND_WIDTH: usize = 12;

fn table_text(listing: &Listing, all: bool) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if listing.keys.is_empty() && listing.failed.is_none() {
        let none = if all {
            "no keys in the store"
        } else {
            "no keys held"
        };
        return format!("{none}\n");
    }
    let width = terminal_width();
    let fixed = STATE_WIDTH + HOST_WIDTH + PID_WIDTH + USER_WIDTH + SINCE_WIDTH + EXPIRES_WIDTH + 7;
    let longest_key = listing
        .keys
        .iter()
        .map(|k| escape(&k.key).chars().count())
        .max()
        .unwrap_or(0);
    let key_width = longest_key
        .min(width.saturating_sub(fixed + LEAST_COMMAND_WIDTH))
        .max(LEAST_KEY_WIDTH);
    let command_width = width
        .saturating_sub(fixed + key_width)
        .max(LEAST_COMMAND_WIDTH);
    let mut row = |cells: [&str; 8]| {
        let [key, state, host, pid, user, since, expires, command] = cells;
        let line = format!(
            "{:<key_width$} {:<STATE_WIDTH$} {:<HOST_WIDTH$} {:>PID_WIDTH$} {:<USER_WIDTH$} {:<SINCE_WIDTH$} {:<EXPIRES_WIDTH$} {}",
            fit(key, key_width),
            fit(state, STATE_WIDTH),
            fit(host, HOST_WIDTH),
            fit(pid, PID_WIDTH),
            fit(user, USER_WIDTH),
            fit(since, SINCE_WIDTH),
            fit(expires, EXPIRES_WIDTH),
            fit(command, command_width),
        );
        let _ = writeln!(out, "{}", line.trim_end());
    };
    row([
        "KEY", "STATE", "HOST", "PID", "USER", "SINCE", "EXPIRES", "COMMAND",
    ]);
    let now = now_ms();
    let (mut held, mut free, mut unreadable) = (0, 0, 0);
    for key in &listing.keys {
        let name = escape(&key.key);
        let Some(record) = &key.record else {
            unreadable += 1;
            let why = key.unreadable.as_deref().unwrap_or("");
            row([&name, "unreadable", "", "", "", "", "", &escape(why)]);
            continue;
        };
        let holders = holders(key);
        let state = state_cell(record.state, record.slots, holders.len(), waiting(key));
        let expires = record
            .expires_in_ms
            .map_or_else(|| "-".to_string(), |ms| format!("in {}", short(ms)));
        match record.state {
            KeyState::Held => held += 1,
            _ => free += 1,
        }
        if holders.is_empty() {
            let last = record
                .incident
                .as_deref()
                .map(|e| format!("last: {}", super::history::event_line(e)))
                .unwrap_or_default();
            row([&name, &state, "", "", "", "", "-", &last]);
            continue;
        }
        for (i, h) in holders.iter().enumerate() {
            let label = match (i, h.slot) {
                (0, _) => name.to_string(),
                (_, Some(slot)) => format!("  slot {slot}"),
                (_, None) => String::new(),
            };
            let since = format!("{} ago", short(now.saturating_sub(h.acquired_at_ms)));
            row([
                &label,
                if i == 0 { &state } else { "" },
                &escape(&h.host),
                &h.pid.to_string(),
                &escape(&h.user),
                &since,
                if i == 0 { &expires } else { "" },
                &escape(&h.command),
            ]);
        }
    }
    let mut summary = format!("{held} held");
    if all {
        summary.push_str(&format!(", {free} free"));
    }
    if unreadable > 0 {
        summary.push_str(&format!(", {unreadable} unreadable"));
    }
    let pages = listing.pages;
    summary.push_str(&format!(
        " ({pages} page{})",
        if pages == 1 { "" } else { "s" }
    ));
    if let Some((page, _)) = &listing.failed {
        summary.push_str(&format!("; page {page} failed, the listing is incomplete"));
    }
    let _ = writeln!(out, "{summary}");
    out
}

/// "held", "free", or for a key with slots "2/4 held"; "+N waiting" when
/// runs wait for it through this host's agent.
/// How many runs wait for the key through any agent, as far as known: the
/// agents' reports, or this agent's own count where its list was cut short.
fn waiting(key: &KeyListing) -> u32 {
    u32::try_from(key.waiters.len())
        .unwrap_or(u32::MAX)
        .max(key.waiting_here)
}

fn state_cell(state: KeyState, slots: Option<u32>, held: usize, waiting: u32) -> String {
    let mut cell = match (state, slots) {
        (_, Some(n)) => format!("{held}/{n} held"),
        (KeyState::Held, None) => "held".to_string(),
        (KeyState::Free, None) => "free".to_string(),
        (KeyState::Unknown, None) => "unknown".to_string(),
    };
    if waiting > 0 {
        cell.push_str(&format!(" +{waiting}"));
    }
    cell
}

/// A duration in its largest unit or two: "3m", "2h 5m", "12s".
fn short(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// `text`, cut to `width` characters with "…" where cut.
fn fit(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The terminal's width, or `COLUMNS`, or 120 when output is not a terminal.
fn terminal_width() -> usize {
    let mut size = nix::libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes a winsize into the struct given, nothing else.
    let asked = unsafe { nix::libc::ioctl(1, nix::libc::TIOCGWINSZ, &mut size) };
    if asked == 0 && size.ws_col > 0 {
        return usize::from(size.ws_col);
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(120)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_cut_to_their_width_and_durations_read_short() {
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("abc", 4), "abc");
        assert_eq!(short(59_000), "59s");
        assert_eq!(short(3_600_000 + 5 * 60_000), "1h 5m");
        assert_eq!(short(2 * 86_400_000), "2d 0h");
        assert_eq!(state_cell(KeyState::Held, Some(4), 2, 3), "2/4 held +3");
        assert_eq!(state_cell(KeyState::Free, None, 0, 0), "free");
    }

    /// `key` as a page lists it, with `record`, and nothing else known of it.
    fn listed(key: &str, record: Option<runlock_protocol::KeyRecord>) -> KeyListing {
        KeyListing {
            key: key.into(),
            record,
            unreadable: None,
            events: Vec::new(),
            events_omitted: 0,
            waiting_here: 0,
            waiters: Vec::new(),
            refused: Vec::new(),
        }
    }

    /// An agent that answers every `list_keys` after the first with no key
    /// and the cursor it was sent, as one that cannot fit its next key did.
    async fn stuck_agent(stream: tokio::net::UnixStream) {
        use runlock_protocol::codec::{decode_body, encode_body};
        use runlock_protocol::{Envelope, KeyRecord, Scope};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = stream;
        for page in 0.. {
            let Ok(len) = stream.read_u32().await else {
                return;
            };
            let mut body = vec![0; len as usize];
            if stream.read_exact(&mut body).await.is_err() {
                return;
            }
            let request: Envelope<ClientMessage> = decode_body(&body).expect("a request");
            let key = || {
                let free =
                    KeyRecord::free(&runlock_protocol::Key::new("a").expect("key"), Scope::Host);
                listed("a", Some(free))
            };
            let reply = AgentMessage::Keys {
                keys: if page == 0 { vec![key()] } else { Vec::new() },
                cursor: Some("stuck".into()),
            };
            let bytes = encode_body(&Envelope {
                id: request.id,
                body: reply,
            })
            .expect("encodes");
            let mut frame = (bytes.len() as u32).to_be_bytes().to_vec();
            frame.extend(bytes);
            if stream.write_all(&frame).await.is_err() {
                return;
            }
        }
    }

    #[tokio::test]
    async fn a_listing_that_stops_moving_ends_with_that_page_failed() {
        let (ours, theirs) = tokio::net::UnixStream::pair().expect("a socket pair");
        let agent = tokio::spawn(stuck_agent(theirs));
        let mut client = Client::new(ours);
        let listing = read_all(&mut client, "", false, None)
            .await
            .expect("the first page");
        assert_eq!(listing.keys.len(), 1);
        let (page, failure) = listing.failed.expect("the second page failed");
        assert_eq!(page, 2);
        assert!(
            failure.message.contains("no progress"),
            "{}",
            failure.message
        );
        drop(client);
        agent
            .await
            .expect("the fake agent ends with the connection");
    }

    #[test]
    fn keys_are_listed_numbers_by_their_value_as_the_page_shows_them() {
        let mut keys: Vec<KeyListing> = ["src10", "src2", "b", "src1"]
            .map(|key| listed(key, None))
            .into();
        in_reading_order(&mut keys);
        let names: Vec<&str> = keys.iter().map(|k| k.key.as_str()).collect();
        assert_eq!(names, ["b", "src1", "src2", "src10"]);
    }

    #[test]
    fn a_failed_page_names_itself_and_the_last_key_shown() {
        let err = CallError::Gone("the agent closed the connection".into());
        let failure = page_failure(err, 3, "etl\u{1b}[31m");
        assert!(failure.message.contains("page 3"), "{}", failure.message);
        assert!(failure.message.contains("\\x1b"), "{}", failure.message);
        assert_eq!(failure.code, EXIT_UNAVAILABLE);
    }
}
