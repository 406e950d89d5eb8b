//! A key's runs over the page's window, paired from its history's events by
//! token, so the page draws bars and never reads the protocol's events itself.

use runlock_protocol::{EventKind, Holder, KeyEvent, REASON_CLIENT_GONE};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};

/// How a run ended, as the page colours it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// Still held: the bar grows to now.
    Held,
    /// Its holder let it go.
    Released,
    /// Its client went away holding it (killed, crashed) and its agent let go.
    Crashed,
    /// It ran out without a release, as the next acquirer found it.
    Expired,
    /// Another client took it over with `force`, or someone broke it.
    Forced,
    /// Its agent gave it up, unable to renew it in time.
    Lost,
    /// The history has no end for it and nobody holds it now (an agent that
    /// keeps no history wrote the end): it ended before the key's next event.
    Unknown,
}

/// One run of a key (of one slot of it): from its grant to its end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Run {
    /// The grant; `None` when it was before the window (only its end is in it).
    pub start_ms: Option<u64>,
    /// The end; `None` while it is held.
    pub end_ms: Option<u64>,
    pub ending: Ending,
    pub token: u64,
    pub host: String,
    pub user: String,
    pub slot: Option<u32>,
}

/// Tokens count per slot (SPEC 8.9), so a run is named by both.
type RunId = (Option<u32>, u64);

/// The runs paired so far, and which are open or ended.
#[derive(Default)]
struct Pairing {
    runs: Vec<Run>,
    open: HashMap<RunId, usize>,
    /// A run ended by a force is not ended again by a late release of its token.
    ended: BTreeSet<RunId>,
}

impl Pairing {
    fn start(&mut self, id: RunId, event: &KeyEvent) {
        // An adoption continues the run its token already names.
        if self.open.contains_key(&id) || self.ended.contains(&id) {
            return;
        }
        self.open.insert(id, self.runs.len());
        self.runs.push(Run {
            start_ms: Some(event.at_ms),
            end_ms: None,
            ending: Ending::Held,
            token: id.1,
            host: event.host.clone(),
            user: event.user.clone(),
            slot: id.0,
        });
    }

    fn end(&mut self, id: RunId, ending: Ending, event: &KeyEvent) {
        if !self.ended.insert(id) {
            return;
        }
        match self.open.remove(&id) {
            Some(index) => {
                self.runs[index].end_ms = Some(event.at_ms);
                self.runs[index].ending = ending;
            }
            // Its grant is older than the window.
            None => self.runs.push(Run {
                start_ms: None,
                end_ms: Some(event.at_ms),
                ending,
                token: id.1,
                host: event.host.clone(),
                user: event.user.clone(),
                slot: id.0,
            }),
        }
    }
}

/// The runs that `events` (oldest first) tell of, and the ones `holders`
/// hold now that began before them; ordered by start, the unknown first.
pub fn pair(events: &[KeyEvent], holders: &[&Holder]) -> Vec<Run> {
    let mut pairing = Pairing::default();
    for event in events {
        let id = (event.slot, event.token);
        match event.kind {
            EventKind::Granted | EventKind::Adopted => pairing.start(id, event),
            EventKind::Forced | EventKind::Broken => {
                if let Some(from) = event.from_token {
                    pairing.end((event.slot, from), Ending::Forced, event);
                }
                pairing.start(id, event);
            }
            EventKind::Released => {
                let ending = match event.reason.as_str() {
                    REASON_CLIENT_GONE => Ending::Crashed,
                    _ => Ending::Released,
                };
                pairing.end(id, ending, event);
            }
            EventKind::Expired => pairing.end(id, Ending::Expired, event),
            EventKind::Lost => pairing.end(id, Ending::Lost, event),
            EventKind::Unknown => {}
        }
    }
    let Pairing { mut runs, open, .. } = pairing;
    let held: BTreeSet<RunId> = holders.iter().map(|h| (h.slot, h.token)).collect();
    for (id, index) in open {
        if held.contains(&id) {
            continue;
        }
        let run = &runs[index];
        let start = run.start_ms.unwrap_or(0);
        let next = events
            .iter()
            .filter(|e| e.slot == id.0 && e.at_ms > start)
            .map(|e| e.at_ms)
            .min();
        runs[index].end_ms = Some(next.unwrap_or(start));
        runs[index].ending = Ending::Unknown;
    }
    for holder in holders {
        let id = (holder.slot, holder.token);
        if runs.iter().any(|r| (r.slot, r.token) == id) {
            continue;
        }
        runs.push(Run {
            start_ms: Some(holder.acquired_at_ms),
            end_ms: None,
            ending: Ending::Held,
            token: holder.token,
            host: holder.host.clone(),
            user: holder.user.clone(),
            slot: holder.slot,
        });
    }
    runs.sort_by_key(|r| (r.start_ms, r.slot, r.token));
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use runlock_protocol::Clock;

    fn event(kind: EventKind, at_ms: u64, token: u64) -> KeyEvent {
        KeyEvent {
            kind,
            at_ms,
            clock: Clock::Agent,
            token,
            from_token: None,
            host: "runner-01".into(),
            agent_id: "a1".into(),
            pid: 42,
            uid: 1000,
            user: "etl".into(),
            reason: String::new(),
            slot: None,
        }
    }

    fn forced(at_ms: u64, token: u64, from: u64) -> KeyEvent {
        KeyEvent {
            from_token: Some(from),
            ..event(EventKind::Forced, at_ms, token)
        }
    }

    fn holder(token: u64, acquired_at_ms: u64, slot: Option<u32>) -> Holder {
        Holder {
            host: "runner-02".into(),
            agent_id: "a2".into(),
            pid: 7,
            uid: 1000,
            gid: 1000,
            user: "etl".into(),
            command: "meltano run".into(),
            acquired_at_ms,
            token,
            slot,
            slots: slot.map(|_| 3),
        }
    }

    /// (start, end, ending, token) of each run, for short assertions.
    fn spans(runs: &[Run]) -> Vec<(Option<u64>, Option<u64>, Ending, u64)> {
        runs.iter()
            .map(|r| (r.start_ms, r.end_ms, r.ending, r.token))
            .collect()
    }

    #[test]
    fn each_ending_is_told_apart_by_its_event() {
        let mut crash = event(EventKind::Released, 40, 3);
        crash.reason = REASON_CLIENT_GONE.into();
        let events = [
            event(EventKind::Granted, 10, 1),
            event(EventKind::Released, 20, 1),
            event(EventKind::Granted, 30, 3),
            crash,
            event(EventKind::Granted, 50, 4),
            event(EventKind::Expired, 60, 4),
            event(EventKind::Granted, 70, 5),
            event(EventKind::Lost, 80, 5),
        ];
        assert_eq!(
            spans(&pair(&events, &[])),
            [
                (Some(10), Some(20), Ending::Released, 1),
                (Some(30), Some(40), Ending::Crashed, 3),
                (Some(50), Some(60), Ending::Expired, 4),
                (Some(70), Some(80), Ending::Lost, 5),
            ]
        );
    }

    #[test]
    fn a_force_ends_the_run_it_took_over_and_starts_its_own() {
        let events = [
            event(EventKind::Granted, 10, 1),
            forced(20, 2, 1),
            // The displaced run's shim may still report its end: the force stands.
            event(EventKind::Released, 25, 1),
            event(EventKind::Released, 30, 2),
        ];
        assert_eq!(
            spans(&pair(&events, &[])),
            [
                (Some(10), Some(20), Ending::Forced, 1),
                (Some(20), Some(30), Ending::Released, 2),
            ]
        );
    }

    #[test]
    fn a_break_ends_the_broken_run_as_forced() {
        let broken = KeyEvent {
            from_token: Some(1),
            ..event(EventKind::Broken, 20, 2)
        };
        let events = [
            event(EventKind::Granted, 10, 1),
            broken,
            event(EventKind::Released, 21, 2),
        ];
        let runs = pair(&events, &[]);
        assert_eq!(runs[0].ending, Ending::Forced);
        assert_eq!(runs[0].end_ms, Some(20));
    }

    #[test]
    fn a_held_run_is_open_and_one_granted_before_the_window_is_kept() {
        let old = holder(9, 5, None);
        let runs = pair(&[], &[&old]);
        assert_eq!(spans(&runs), [(Some(5), None, Ending::Held, 9)]);
        assert_eq!(runs[0].host, "runner-02");

        let events = [event(EventKind::Granted, 10, 1)];
        let now = holder(1, 10, None);
        assert_eq!(
            spans(&pair(&events, &[&now])),
            [(Some(10), None, Ending::Held, 1)]
        );
    }

    #[test]
    fn an_end_whose_grant_is_older_than_the_window_has_no_start() {
        let events = [
            event(EventKind::Released, 15, 1),
            event(EventKind::Granted, 16, 2),
        ];
        let now = holder(2, 16, None);
        assert_eq!(
            spans(&pair(&events, &[&now])),
            [
                (None, Some(15), Ending::Released, 1),
                (Some(16), None, Ending::Held, 2),
            ]
        );
    }

    #[test]
    fn an_adoption_continues_its_run() {
        let events = [
            event(EventKind::Granted, 10, 1),
            event(EventKind::Adopted, 20, 1),
            event(EventKind::Released, 30, 1),
        ];
        assert_eq!(
            spans(&pair(&events, &[])),
            [(Some(10), Some(30), Ending::Released, 1)]
        );
    }

    #[test]
    fn slots_count_their_tokens_apart() {
        let on = |slot, e: KeyEvent| KeyEvent {
            slot: Some(slot),
            ..e
        };
        let events = [
            on(0, event(EventKind::Granted, 10, 1)),
            on(1, event(EventKind::Granted, 11, 1)),
            on(0, event(EventKind::Released, 20, 1)),
        ];
        let still = holder(1, 11, Some(1));
        let runs = pair(&events, &[&still]);
        let by_slot: Vec<_> = runs.iter().map(|r| (r.slot, r.ending)).collect();
        assert_eq!(
            by_slot,
            [(Some(0), Ending::Released), (Some(1), Ending::Held)]
        );
    }

    #[test]
    fn a_run_with_no_end_that_nobody_holds_ends_before_the_next_event() {
        let events = [
            event(EventKind::Granted, 10, 1),
            event(EventKind::Granted, 30, 2),
            event(EventKind::Released, 40, 2),
        ];
        assert_eq!(
            spans(&pair(&events, &[])),
            [
                (Some(10), Some(30), Ending::Unknown, 1),
                (Some(30), Some(40), Ending::Released, 2),
            ]
        );
    }
}
