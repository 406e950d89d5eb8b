//! A project's `.env`, read as Meltano reads it (`Project.dotenv_env`, which
//! is python-dotenv's `dotenv_values`): `KEY=value` lines, optionally
//! `export`ed, values bare, 'single' or "double" quoted (quotes may span
//! lines), `#` comments, and `${NAME}` / `${NAME:-default}` taken from the
//! lines above, else from the process environment. A line it cannot read is
//! skipped, as python-dotenv skips it (with a warning); a key without `=` is
//! no value.

use crate::Env;
use std::collections::BTreeMap;

/// The values of a `.env` text, interpolated, in the order written (a later
/// line wins).
pub fn parse(text: &str, env: &Env<'_>) -> BTreeMap<String, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut reader = Reader {
        chars: text.chars().collect(),
        at: 0,
    };
    // A key without a value stays in the map as `None` while the lines
    // below are interpolated (`${KEY}` is then empty, not its default).
    let mut values: Vec<(String, Option<String>)> = Vec::new();
    while reader.at < reader.chars.len() {
        reader.skip_while(is_space);
        if reader.at == reader.chars.len() {
            break;
        }
        match reader.binding() {
            Ok(Some((key, raw))) => {
                let value = raw.map(|raw| interpolate(&raw, &values, env));
                values.retain(|(k, _)| *k != key);
                values.push((key, value));
            }
            Ok(None) => {}
            Err(Unreadable) => reader.skip_rest_of_line(),
        }
    }
    values
        .into_iter()
        .filter_map(|(key, value)| Some((key, value?)))
        .collect()
}

/// A line python-dotenv would skip.
struct Unreadable;

struct Reader {
    chars: Vec<char>,
    at: usize,
}

impl Reader {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn skip_while(&mut self, keep: impl Fn(char) -> bool) -> usize {
        let start = self.at;
        while self.peek().is_some_and(&keep) {
            self.at += 1;
        }
        self.at - start
    }

    fn take_while(&mut self, keep: impl Fn(char) -> bool) -> String {
        let start = self.at;
        self.skip_while(keep);
        self.chars[start..self.at].iter().collect()
    }

    fn starts_with(&self, word: &str) -> bool {
        let mut at = self.at;
        word.chars().all(|c| {
            let same = self.chars.get(at) == Some(&c);
            at += 1;
            same
        })
    }

    /// One `KEY=value` binding; `None` for a comment line.
    #[allow(clippy::type_complexity)]
    fn binding(&mut self) -> Result<Option<(String, Option<String>)>, Unreadable> {
        let after_export = self.at + "export".len();
        if self.starts_with("export") && self.chars.get(after_export).is_some_and(|c| is_blank(*c))
        {
            self.at = after_export;
            self.skip_while(is_blank);
        }
        let key = match self.peek() {
            Some('#') => None,
            Some('\'') => {
                self.at += 1;
                let key = self.take_while(|c| c != '\'');
                if key.is_empty() || self.peek() != Some('\'') {
                    return Err(Unreadable);
                }
                self.at += 1;
                Some(key)
            }
            _ => {
                let key = self.take_while(|c| c != '=' && c != '#' && !is_space(c));
                if key.is_empty() {
                    return Err(Unreadable);
                }
                Some(key)
            }
        };
        self.skip_while(is_blank);
        let value = if self.peek() == Some('=') {
            self.at += 1;
            let blanks = self.skip_while(is_blank);
            // `KEY= # note` is empty with a comment; `KEY=#x` is "#x".
            if blanks > 0 && self.peek() == Some('#') {
                Some(String::new())
            } else {
                Some(self.value()?)
            }
        } else {
            None
        };
        self.end_of_binding()?;
        Ok(key.map(|key| (key, value)))
    }

    fn value(&mut self) -> Result<String, Unreadable> {
        match self.peek() {
            Some(quote @ ('\'' | '"')) => {
                let raw = self.quoted(quote)?;
                let escapes: &[char] = if quote == '\'' {
                    &['\\', '\'']
                } else {
                    &['\\', '\'', '"', 'a', 'b', 'f', 'n', 'r', 't', 'v']
                };
                Ok(unescape(&raw, escapes))
            }
            None | Some('\n' | '\r') => Ok(String::new()),
            Some(_) => {
                let line = self.take_while(|c| c != '\n' && c != '\r');
                Ok(strip_comment(&line).trim_end_matches(is_space).to_string())
            }
        }
    }

    /// The text between `quote` and the next unescaped one (lines included).
    fn quoted(&mut self, quote: char) -> Result<String, Unreadable> {
        let start = self.at;
        let mut at = start + 1;
        loop {
            match self.chars.get(at) {
                None => return Err(Unreadable),
                Some('\\') if at + 1 < self.chars.len() => at += 2,
                Some(c) if *c == quote => break,
                Some(_) => at += 1,
            }
        }
        self.at = at + 1;
        Ok(self.chars[start + 1..at].iter().collect())
    }

    /// An optional `# comment`, blanks, then the end of the line or text.
    fn end_of_binding(&mut self) -> Result<(), Unreadable> {
        let before = self.at;
        self.skip_while(is_blank);
        if self.peek() == Some('#') {
            self.skip_while(|c| c != '\n' && c != '\r');
        } else {
            self.at = before;
        }
        self.skip_while(is_blank);
        match self.peek() {
            None => Ok(()),
            Some('\r') => {
                self.at += 1;
                if self.peek() == Some('\n') {
                    self.at += 1;
                }
                Ok(())
            }
            Some('\n') => {
                self.at += 1;
                Ok(())
            }
            Some(_) => Err(Unreadable),
        }
    }

    fn skip_rest_of_line(&mut self) {
        self.skip_while(|c| c != '\n' && c != '\r');
        // One line end, `\r` before `\r\n`, as python-dotenv's pattern tries them.
        if matches!(self.peek(), Some('\n' | '\r')) {
            self.at += 1;
        }
    }
}

/// An unquoted value up to its first ` #` (blanks before a `#`).
fn strip_comment(line: &str) -> &str {
    let chars: Vec<(usize, char)> = line.char_indices().collect();
    let mut i = 0;
    while i < chars.len() {
        if is_space(chars[i].1) {
            let mut j = i;
            while j < chars.len() && is_space(chars[j].1) {
                j += 1;
            }
            if j < chars.len() && chars[j].1 == '#' {
                return &line[..chars[i].0];
            }
            i = j;
        } else {
            i += 1;
        }
    }
    line
}

/// `\x` replaced by what it stands for, for each `x` in `escapes`.
fn unescape(raw: &str, escapes: &[char]) -> String {
    let mut out = String::new();
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match chars.peek() {
            Some(&next) if c == '\\' && escapes.contains(&next) => {
                chars.next();
                out.push(match next {
                    'a' => '\x07',
                    'b' => '\x08',
                    'f' => '\x0c',
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    'v' => '\x0b',
                    other => other,
                });
            }
            _ => out.push(c),
        }
    }
    out
}

/// `${NAME}` and `${NAME:-default}` in `raw`: from the lines above, else the
/// process environment, else the default (or nothing).
fn interpolate(raw: &str, above: &[(String, Option<String>)], env: &Env<'_>) -> String {
    let mut out = String::new();
    let mut rest = raw;
    while let Some(start) = rest.find("${") {
        let inside = &rest[start + 2..];
        let Some(end) = inside.find('}') else { break };
        let spec = &inside[..end];
        let (name, default) = match spec.find(':') {
            Some(colon) => match spec[colon..].strip_prefix(":-") {
                Some(default) => (&spec[..colon], Some(default)),
                // `${A:B}` is no variable: python-dotenv's pattern wants `:-`.
                None => {
                    out.push_str(&rest[..start + 2]);
                    rest = inside;
                    continue;
                }
            },
            None => (spec, None),
        };
        out.push_str(&rest[..start]);
        let value = match above.iter().rev().find(|(key, _)| key == name) {
            Some((_, value)) => value.clone().unwrap_or_default(),
            None => env(name).unwrap_or_else(|| default.unwrap_or("").to_string()),
        };
        out.push_str(&value);
        rest = &inside[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Python's `str.isspace`, which its `\s` follows.
pub(crate) fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// A space that does not end a line (`[^\S\r\n]`).
fn is_blank(c: char) -> bool {
    is_space(c) && c != '\n' && c != '\r'
}

#[cfg(test)]
mod tests {
    use super::parse;

    fn read(text: &str) -> Vec<(String, String)> {
        let env = |name: &str| (name == "HOME_VAR").then(|| "from-process".to_string());
        parse(text, &env).into_iter().collect()
    }

    fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut v: Vec<_> = expected
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn quotes_exports_and_comments_read_as_python_dotenv_reads_them() {
        let text = "# a comment\n\
                    export MELTANO_ENVIRONMENT='prod'\n\
                    A = \"x\\ty\" # note\n\
                    B=plain value  # note\n\
                    C=#kept\n\
                    D= # empty\n\
                    'E'=quoted key\n\
                    F\n\
                    G=\"two\nlines\"\n";
        assert_eq!(
            read(text),
            pairs(&[
                ("MELTANO_ENVIRONMENT", "prod"),
                ("A", "x\ty"),
                ("B", "plain value"),
                ("C", "#kept"),
                ("D", ""),
                ("E", "quoted key"),
                ("G", "two\nlines"),
            ])
        );
    }

    #[test]
    fn unreadable_lines_are_skipped_and_later_lines_win() {
        let text = "=novalue\nA=\"open\nB='x' junk\nA=2\nA=3\n";
        assert_eq!(read(text), pairs(&[("A", "3")]));
    }

    #[test]
    fn variables_come_from_lines_above_then_the_process() {
        let text = "X=one\nY=${X}-${HOME_VAR}-${NOPE:-dflt}-${NOPE}-$X\nZ='${X}'\nK\nL=${K:-d}\n";
        assert_eq!(
            read(text),
            pairs(&[
                ("X", "one"),
                ("Y", "one-from-process-dflt--$X"),
                ("Z", "one"),
                ("L", ""),
            ])
        );
    }
}
