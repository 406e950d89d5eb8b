//! Text that a peer of the agent supplied (a holder's command, user, host,
//! key, agent id, and the agent's messages that quote them), made safe to
//! print: a client may run as root or other users, whose terminals must not
//! take orders from whoever holds a lock.

use std::borrow::Cow;
use std::fmt::Write;

/// Whether a terminal could act on `c` or show it as something else:
/// C0 controls, DEL, C1 controls, and the characters no key may hold for not
/// being seen (zero-width ones, the bidi marks, overrides and isolates that
/// reorder the rest of the line, line and paragraph separators).
fn is_unsafe(c: char) -> bool {
    c.is_control() || runlock_protocol::is_invisible(c)
}

/// `text` with every unsafe character as a visible escape: `\n`, `\r`,
/// `\t`, `\x1b` for the other ASCII ones, `\u{202e}` beyond ASCII. Other
/// text, backslashes included, is left as typed, so an ordinary command reads
/// as it was written.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_ascii() && is_unsafe(c) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if is_unsafe(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn plain_text_is_unchanged() {
        let command = r"meltano run tap-x target-y --pattern 'a\d+' — ünïcode";
        assert_eq!(escape(command), command);
    }

    #[test]
    fn controls_become_visible_escapes() {
        let hostile = "x\ny\tz\r\x1b[2J\x1b]0;pwned\x07\x7f\u{9b}\0";
        assert_eq!(
            escape(hostile),
            r"x\ny\tz\r\x1b[2J\x1b]0;pwned\x07\x7f\u{9b}\x00"
        );
    }

    #[test]
    fn bidi_overrides_and_isolates_become_visible_escapes() {
        let hostile = "a\u{202a}\u{202e}b\u{2066}\u{2069}c";
        assert_eq!(escape(hostile), r"a\u{202a}\u{202e}b\u{2066}\u{2069}c");
        // The neighbours of those ranges are ordinary text.
        assert_eq!(
            escape("\u{2027}\u{202f}\u{2065}\u{2070}").chars().count(),
            4
        );
    }

    #[test]
    fn zero_width_and_separator_characters_become_visible_escapes() {
        let hidden = "night\u{200b}ly\u{feff}\u{2028}\u{ad}";
        assert_eq!(escape(hidden), r"night\u{200b}ly\u{feff}\u{2028}\u{ad}");
    }

    #[test]
    fn the_result_holds_no_unsafe_character() {
        let every: String = (0u32..0x11_0000).filter_map(char::from_u32).collect();
        let escaped = escape(&every);
        assert!(!escaped.chars().any(super::is_unsafe), "{escaped:?}");
    }
}
