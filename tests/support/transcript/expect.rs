//! Expected output against actual output, with the runner's few wildcards
//! (listed in [`super`]'s documentation).

/// One part of an expected line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    /// `[..]`: any text, possibly none.
    Any,
    /// `[N]`: one or more digits.
    Number,
    /// `[TIME]`: `2026-12-04T17:20:12.371Z`.
    Time,
    /// A run of spaces: one or more spaces.
    Spaces,
}

/// What `[HOST]` and `[USER]` stand for here.
#[derive(Debug, Clone)]
pub struct Names {
    pub host: String,
    pub user: String,
}

/// Where expected and actual output part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The actual line (counted from 1) where they part.
    pub line: usize,
    /// The expected line there (None: the output should have ended).
    pub expected: Option<String>,
    /// The actual line there (None: the output ended too soon).
    pub actual: Option<String>,
    /// Whether `...` looked for `expected` from `line` to the end in vain.
    pub searched: bool,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |line: &Option<String>| match line {
            Some(line) => format!("{line:?}"),
            None => "(the end of the output)".to_string(),
        };
        if self.searched {
            return write!(
                f,
                "no output line from line {} on matches what `...` is followed by:\n  expected: {}",
                self.line,
                show(&self.expected)
            );
        }
        write!(
            f,
            "first mismatch at output line {}:\n  expected: {}\n  actual:   {}",
            self.line,
            show(&self.expected),
            show(&self.actual)
        )
    }
}

/// The lines of `text` that count: trailing spaces and trailing empty lines dropped.
pub fn lines(text: &[String]) -> Vec<&str> {
    let mut lines: Vec<&str> = text.iter().map(|l| l.trim_end()).collect();
    while lines.last() == Some(&"") {
        lines.pop();
    }
    lines
}

/// The first place `actual` departs from `expected`, or None if it matches.
/// `...` takes the fewest lines it can: up to the first line that matches
/// the expected line after it (or all that are left, when it is last).
pub fn first_mismatch(expected: &[String], actual: &str, names: &Names) -> Option<Mismatch> {
    let expected = lines(expected);
    let actual_owned: Vec<String> = actual.lines().map(str::to_string).collect();
    let actual = lines(&actual_owned);
    let (mut i, mut j) = (0, 0);
    while i < expected.len() {
        if expected[i].trim() == "..." {
            if i + 1 == expected.len() {
                return None; // the last `...` takes whatever is left
            }
            let next = expected[i + 1];
            let pieces = pieces(next, names);
            match (j..actual.len()).find(|&k| line_matches(&pieces, actual[k])) {
                Some(k) => j = k,
                None => {
                    return Some(Mismatch {
                        line: j + 1,
                        expected: Some(next.to_string()),
                        actual: None,
                        searched: true,
                    })
                }
            }
            i += 1;
            continue;
        }
        let Some(line) = actual.get(j) else {
            return Some(Mismatch {
                line: j + 1,
                expected: Some(expected[i].to_string()),
                actual: None,
                searched: false,
            });
        };
        if !line_matches(&pieces(expected[i], names), line) {
            return Some(Mismatch {
                line: j + 1,
                expected: Some(expected[i].to_string()),
                actual: Some(line.to_string()),
                searched: false,
            });
        }
        i += 1;
        j += 1;
    }
    actual.get(j).map(|line| Mismatch {
        line: j + 1,
        expected: None,
        actual: Some(line.to_string()),
        searched: false,
    })
}

fn pieces(line: &str, names: &Names) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut rest = line;
    let flush = |text: &mut String, out: &mut Vec<Piece>| {
        if !text.is_empty() {
            out.push(Piece::Text(std::mem::take(text)));
        }
    };
    while let Some(c) = rest.chars().next() {
        let wildcard = [
            ("[..]", Some(Piece::Any)),
            ("[N]", Some(Piece::Number)),
            ("[TIME]", Some(Piece::Time)),
            ("[HOST]", None),
            ("[USER]", None),
        ]
        .into_iter()
        .find(|(mark, _)| rest.starts_with(mark));
        if let Some((mark, piece)) = wildcard {
            match (mark, piece) {
                ("[HOST]", _) => text.push_str(&names.host),
                ("[USER]", _) => text.push_str(&names.user),
                (_, Some(piece)) => {
                    flush(&mut text, &mut out);
                    out.push(piece);
                }
                _ => {}
            }
            rest = &rest[mark.len()..];
        } else if c == ' ' {
            flush(&mut text, &mut out);
            out.push(Piece::Spaces);
            rest = rest.trim_start_matches(' ');
        } else {
            text.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    flush(&mut text, &mut out);
    out
}

fn line_matches(pieces: &[Piece], line: &str) -> bool {
    let Some((first, rest)) = pieces.split_first() else {
        return line.is_empty();
    };
    match first {
        Piece::Text(text) => line
            .strip_prefix(text.as_str())
            .is_some_and(|after| line_matches(rest, after)),
        Piece::Any => (0..=line.len())
            .filter(|&at| line.is_char_boundary(at))
            .any(|at| line_matches(rest, &line[at..])),
        Piece::Number => {
            let digits = line.len() - line.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            (1..=digits).any(|n| line_matches(rest, &line[n..]))
        }
        Piece::Spaces => {
            let spaces = line.len() - line.trim_start_matches(' ').len();
            (1..=spaces).any(|n| line_matches(rest, &line[n..]))
        }
        Piece::Time => line
            .get(..24)
            .filter(|stamp| is_time(stamp))
            .is_some_and(|_| line_matches(rest, &line[24..])),
    }
}

/// `2026-12-04T17:20:12.371Z`: runlock's instants (`format::rfc3339`).
fn is_time(stamp: &str) -> bool {
    const SHAPE: &str = "dddd-dd-ddTdd:dd:dd.dddZ";
    stamp.len() == SHAPE.len()
        && stamp.chars().zip(SHAPE.chars()).all(|(c, s)| match s {
            'd' => c.is_ascii_digit(),
            s => c == s,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        Names {
            host: "runner-01".into(),
            user: "etl".into(),
        }
    }

    fn check(expected: &str, actual: &str) -> Option<Mismatch> {
        let expected: Vec<String> = expected.lines().map(str::to_string).collect();
        first_mismatch(&expected, actual, &names())
    }

    #[test]
    fn each_wildcard_stands_for_its_own_kind_of_text_only() {
        assert_eq!(
            check(
                "pid: [N] on [HOST] by [USER]",
                "pid: 42 on runner-01 by etl"
            ),
            None
        );
        assert!(check("pid: [N]", "pid: 4x").is_some());
        assert!(check("by [USER]", "by root").is_some());
        assert_eq!(
            check(
                "since [TIME] ([..] ago)",
                "since 2026-12-04T17:20:12.371Z (1s ago)"
            ),
            None
        );
        assert!(check("since [TIME]", "since 2026-12-04 17:20:12").is_some());
        assert_eq!(check("a [..] z", "a  z"), None);
        assert!(check("a [..] z", "a b y").is_some());
        assert_eq!(check("[error    ] x", "[error    ] x"), None);
    }

    #[test]
    fn spaces_match_spaces_of_any_width_and_trailing_ones_are_ignored() {
        assert_eq!(check("KEY   TOKEN", "KEY TOKEN   "), None);
        assert!(check("KEY TOKEN", "KEYTOKEN").is_some());
    }

    #[test]
    fn dots_take_the_fewest_lines_up_to_the_next_match() {
        assert_eq!(check("...\nb\n...", "a\nb\nc"), None);
        assert_eq!(check("...\nb", "b"), None);
        assert_eq!(
            check("a\n...\nz", "a\nb"),
            Some(Mismatch {
                line: 2,
                expected: Some("z".into()),
                actual: None,
                searched: true,
            })
        );
    }

    #[test]
    fn the_first_differing_line_is_named() {
        assert_eq!(
            check("a\nb\nc", "a\nx\nc"),
            Some(Mismatch {
                line: 2,
                expected: Some("b".into()),
                actual: Some("x".into()),
                searched: false,
            })
        );
        assert_eq!(
            check("a", "a\nextra\n\n"),
            Some(Mismatch {
                line: 2,
                expected: None,
                actual: Some("extra".into()),
                searched: false,
            })
        );
        assert_eq!(check("a\n\n", "a\n"), None);
    }
}
