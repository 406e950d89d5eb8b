//! What a peer is shown of a holder: every string bounded, so that every
//! reply fits a frame whatever a holder sent, and another user's command line
//! reduced to its program name (it may hold passwords), unless the viewer may
//! force and break.

use runlock_protocol::{Holder, KeyEvent, MAX_COMMAND_LEN};

/// Host names, user names and agent ids are far shorter; a record from a
/// store is still cut to this.
pub const MAX_NAME_LEN: usize = 256;
/// Ends a string that was cut.
const CUT: &str = "…[cut]";
/// Follows a program name whose arguments are not shown.
const HIDDEN: &str = " [arguments hidden]";

/// Who is looking.
#[derive(Debug, Clone, Copy)]
pub struct Viewer {
    /// The viewer's uid.
    pub uid: u32,
    /// Whether the viewer may force and break, and so sees everything.
    pub may_override: bool,
}

/// `text`, cut to at most `max` bytes at a character boundary, marked if cut.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub(CUT.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{CUT}", &text[..end])
}

/// The holder as `viewer` may see it; `host` is this agent's host name, since
/// a uid names the same user only on the host that recorded it.
pub fn holder(holder: &Holder, viewer: Viewer, host: &str) -> Holder {
    let own = holder.uid == viewer.uid && holder.host == host;
    let command = if own || viewer.may_override {
        cut(&holder.command, MAX_COMMAND_LEN)
    } else {
        program(&holder.command)
    };
    Holder {
        host: cut(&holder.host, MAX_NAME_LEN),
        agent_id: cut(&holder.agent_id, MAX_NAME_LEN),
        user: cut(&holder.user, MAX_NAME_LEN),
        command,
        ..holder.clone()
    }
}

/// A history event as any peer may see it: it names no command line, so
/// only its strings (from a store any agent writes) are cut.
pub fn event(event: &KeyEvent) -> KeyEvent {
    KeyEvent {
        host: cut(&event.host, MAX_NAME_LEN),
        agent_id: cut(&event.agent_id, MAX_NAME_LEN),
        user: cut(&event.user, MAX_NAME_LEN),
        reason: cut(&event.reason, MAX_NAME_LEN),
        ..event.clone()
    }
}

/// A command line's first word, and a note when there was more.
fn program(command: &str) -> String {
    let command = command.trim_start();
    match command.split_once(char::is_whitespace) {
        Some((program, rest)) if !rest.trim().is_empty() => {
            format!("{}{HIDDEN}", cut(program, MAX_NAME_LEN))
        }
        _ => cut(command.trim_end(), MAX_NAME_LEN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn viewer(uid: u32, may_override: bool) -> Viewer {
        Viewer { uid, may_override }
    }

    fn holder_of(uid: u32, command: &str) -> Holder {
        Holder {
            slot: None,
            slots: None,
            host: "h".into(),
            agent_id: "a".into(),
            pid: 1,
            uid,
            gid: uid,
            user: "u".into(),
            command: command.into(),
            acquired_at_ms: 0,
            token: 1,
        }
    }

    #[test]
    fn others_see_the_program_only() {
        let h = holder_of(1000, "meltano run tap --password=hunter2");
        let stranger = viewer(1001, false);
        assert_eq!(
            holder(&h, stranger, "h").command,
            "meltano [arguments hidden]"
        );
        let owner = viewer(1000, false);
        assert_eq!(holder(&h, owner, "h").command, h.command);
        // The same uid on another host is not known to be the same person.
        assert_eq!(
            holder(&h, owner, "other").command,
            "meltano [arguments hidden]"
        );
        let admin = viewer(0, true);
        assert_eq!(holder(&h, admin, "other").command, h.command);
        assert_eq!(holder(&holder_of(7, "make"), stranger, "h").command, "make");
    }

    #[test]
    fn long_strings_are_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_COMMAND_LEN);
        let shown = holder(&holder_of(0, &long), viewer(0, true), "h");
        assert!(shown.command.len() <= MAX_COMMAND_LEN);
        assert!(shown.command.ends_with(CUT));
        assert_eq!(cut("short", 10), "short");
    }
}
