//! What `/api/state` answers: the store's listing through the agent, with
//! each key's runs of the last 24 hours, read at most once per
//! [`FRESH_FOR`] however many tabs poll, and never twice at once.

use super::runs::{self, Run};
use crate::commands::list;
use crate::order::{self, Group};
use runlock_client::Client;
use runlock_protocol::{Holder, KeyListing, KeyState};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// How far back the timeline reaches.
pub const WINDOW_MS: u64 = 24 * 60 * 60 * 1000;
/// A listing answers every request that comes this soon after it: tabs
/// polling every 2 s then cost the store one listing, not one each.
const FRESH_FOR: Duration = Duration::from_millis(1500);

/// One answer of `/api/state`: its HTTP status and JSON body.
#[derive(Clone)]
pub struct Answer {
    pub status: u16,
    pub body: bytes::Bytes,
}

/// The latest listing and the connection it came through.
pub struct StateSource {
    socket: PathBuf,
    /// Held while a listing runs, so a request that comes meanwhile waits
    /// for it and is answered with it instead of starting another.
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Kept between listings; dropped after a failure, to reconnect.
    client: Option<Client>,
    last: Option<(Instant, Answer)>,
}

impl StateSource {
    pub fn new(socket: PathBuf) -> StateSource {
        StateSource {
            socket,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The latest listing, read again when it is older than [`FRESH_FOR`].
    pub async fn answer(&self) -> Answer {
        let mut inner = self.inner.lock().await;
        if let Some((at, answer)) = &inner.last {
            if at.elapsed() < FRESH_FOR {
                return answer.clone();
            }
        }
        let answer = self.read(&mut inner).await;
        inner.last = Some((Instant::now(), answer.clone()));
        answer
    }

    async fn read(&self, inner: &mut Inner) -> Answer {
        let started = Instant::now();
        let now_ms = list::now_ms();
        let since_ms = now_ms.saturating_sub(WINDOW_MS);
        let failed = |message: String| Answer {
            status: 503,
            body: to_json(&Failed {
                now_ms,
                error: message,
            }),
        };
        let mut client = match inner.client.take() {
            Some(client) => client,
            None => match crate::agent::connect(&self.socket).await {
                Ok(client) => client,
                Err(err) => return failed(err.message),
            },
        };
        let listing = match list::read_all(&mut client, "", true, Some(since_ms)).await {
            Ok(listing) => listing,
            Err(failure) => return failed(failure.message),
        };
        let state = State::new(&client, listing, now_ms, started.elapsed());
        if state.complete {
            inner.client = Some(client);
        }
        Answer {
            status: 200,
            body: to_json(&state),
        }
    }
}

fn to_json(value: &impl Serialize) -> bytes::Bytes {
    // invariant: these types hold only strings, numbers and lists, which always serialize
    serde_json::to_vec(value).unwrap_or_default().into()
}

/// The agent could not be asked, or failed the first page: nothing to show.
#[derive(Serialize)]
struct Failed {
    now_ms: u64,
    error: String,
}

/// The page's picture of the fleet.
#[derive(Serialize)]
struct State {
    /// The time of the listing, by this host's clock (the timeline's right end).
    now_ms: u64,
    since_ms: u64,
    /// How long the listing took, so the page can poll less often when long.
    listing_ms: u64,
    agent_id: String,
    backend: String,
    pages: u32,
    /// `false` when a page failed; `error` then says which and why.
    complete: bool,
    error: Option<String>,
    /// Keys held now, or with events or refusals in the window, or
    /// unreadable; by group, then in [`order::natural`] order.
    keys: Vec<KeyView>,
}

/// One key as the page shows it.
#[derive(Serialize)]
struct KeyView {
    key: String,
    group: Group,
    /// The key as its group's rows name it ([`order::label`]).
    label: String,
    /// `held`, `free` or `unreadable`.
    state: &'static str,
    unreadable: Option<String>,
    /// How many holders the key admits, for a key with slots.
    slots: Option<u32>,
    holders: Vec<HolderView>,
    expires_in_ms: Option<u64>,
    /// The runs waiting for it through any agent, longest waiting first.
    waiters: Vec<WaiterView>,
    runs: Vec<Run>,
    refusals: Vec<RefusalView>,
}

#[derive(Serialize)]
struct HolderView {
    host: String,
    user: String,
    pid: u32,
    acquired_at_ms: u64,
    /// As the agent showed it to this user (another user's arguments hidden).
    command: String,
    token: u64,
    slot: Option<u32>,
}

#[derive(Serialize)]
struct RefusalView {
    at_ms: u64,
    host: String,
    user: String,
    pid: u32,
    waited_ms: u64,
}

impl State {
    fn new(client: &Client, mut listing: list::Listing, now_ms: u64, took: Duration) -> State {
        listing.keys.sort_by(|a, b| {
            let (a, b) = (&a.key, &b.key);
            (order::group(a).cmp(&order::group(b))).then_with(|| order::natural(a, b))
        });
        let keys = listing.keys.iter().filter_map(key_state).collect();
        State {
            now_ms,
            since_ms: now_ms.saturating_sub(WINDOW_MS),
            listing_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            agent_id: client.agent_id.clone(),
            backend: client.backend.clone(),
            pages: listing.pages,
            complete: listing.failed.is_none(),
            error: listing.failed.map(|(_, failure)| failure.message),
            keys,
        }
    }
}

/// The key as the page shows it; `None` for a free key with nothing in the window.
fn key_state(key: &KeyListing) -> Option<KeyView> {
    let refusals = key
        .refused
        .iter()
        .map(|r| RefusalView {
            at_ms: r.at_ms,
            host: r.host.clone(),
            user: r.user.clone(),
            pid: r.pid,
            waited_ms: r.waited_ms,
        })
        .collect::<Vec<_>>();
    let Some(record) = &key.record else {
        return Some(KeyView {
            key: key.key.clone(),
            group: order::group(&key.key),
            label: order::label(&key.key).to_string(),
            state: "unreadable",
            unreadable: key.unreadable.clone(),
            slots: None,
            holders: Vec::new(),
            expires_in_ms: None,
            waiters: waiter_views(key),
            runs: Vec::new(),
            refusals,
        });
    };
    let holders: Vec<&Holder> = list::holders(key);
    let held = record.state == KeyState::Held || !holders.is_empty();
    if !held && key.events.is_empty() && refusals.is_empty() && key.waiters.is_empty() {
        return None;
    }
    Some(KeyView {
        key: key.key.clone(),
        group: order::group(&key.key),
        label: order::label(&key.key).to_string(),
        state: if held { "held" } else { "free" },
        unreadable: None,
        slots: record.slots,
        holders: holders.iter().map(|h| holder_view(h)).collect(),
        expires_in_ms: record.expires_in_ms,
        waiters: waiter_views(key),
        runs: runs::pair(&key.events, &holders),
        refusals,
    })
}

#[derive(Serialize)]
struct WaiterView {
    host: String,
    user: String,
    pid: u32,
    since_ms: u64,
}

fn waiter_views(key: &KeyListing) -> Vec<WaiterView> {
    (key.waiters.iter())
        .map(|w| WaiterView {
            host: w.host.clone(),
            user: w.user.clone(),
            pid: w.pid,
            since_ms: w.since_ms,
        })
        .collect()
}

fn holder_view(holder: &Holder) -> HolderView {
    HolderView {
        host: holder.host.clone(),
        user: holder.user.clone(),
        pid: holder.pid,
        acquired_at_ms: holder.acquired_at_ms,
        command: holder.command.clone(),
        token: holder.token,
        slot: holder.slot,
    }
}
