//! runlockd.toml(5), made from the commented example configuration: its
//! opening comment is the description, each `[section]` a subsection, and
//! each group of comments and settings (active or commented out) one entry
//! naming its settings, with the comments as text and the settings as an example.

use anyhow::{bail, ensure};
use clap_mangen::roff::{bold, roman, Inline, Roff};

/// A line of a group: prose from a comment, or a setting (`key = value`,
/// perhaps commented out) shown as written.
enum Line<'a> {
    Prose(&'a str),
    Setting { key: &'a str, text: &'a str },
}

/// Comments and settings between blank lines.
struct Group<'a> {
    section: Option<&'a str>,
    lines: Vec<Line<'a>>,
}

pub fn render(
    example: &str,
    path: &str,
    version: &str,
    date: &str,
    sections: &crate::sections::Sections,
) -> anyhow::Result<String> {
    let (header, groups) = parse(example)?;
    let mut page = Roff::new();
    page.control(
        "TH",
        [
            "RUNLOCKD.TOML",
            "5",
            date,
            &format!("runlock {version}"),
            "runlock",
        ],
    )
    .control("SH", ["NAME"])
    .text([roman(
        "runlockd.toml - the settings of runlockd, the runlock agent",
    )])
    .control("SH", ["SYNOPSIS"])
    .text([bold(path)])
    .control("SH", ["DESCRIPTION"]);
    for paragraph in header {
        page.control("PP", []).text([roman(paragraph)]);
    }

    page.control("SH", ["SETTINGS"]);
    let mut section = None;
    for group in &groups {
        if group.section != section {
            section = group.section;
            if let Some(name) = section {
                page.control("SS", [format!("[{name}]").as_str()]);
            }
        }
        render_group(&mut page, group);
    }

    sections.render(&mut page);
    page.control("SH", ["SEE ALSO"])
        .text([roman("runlockd(8), runlock(1)")]);
    Ok(page.render())
}

fn render_group(page: &mut Roff, group: &Group) {
    let keys: Vec<&str> = group
        .lines
        .iter()
        .filter_map(|line| match line {
            Line::Setting { key, .. } => Some(*key),
            Line::Prose(_) => None,
        })
        .collect();
    if keys.is_empty() {
        page.control("PP", []).text([roman(prose_of(&group.lines))]);
        return;
    }
    let mut names: Vec<Inline> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        if i > 0 {
            names.push(roman(", "));
        }
        names.push(bold(*key));
    }
    page.control("TP", []).text(names);
    // Runs of prose become paragraphs and runs of settings example blocks, in
    // the file's order (a setting's comment may follow an earlier setting).
    let mut first = true;
    let mut lines = group.lines.iter().peekable();
    while let Some(line) = lines.next() {
        if !first {
            page.control("IP", []);
        }
        first = false;
        match line {
            Line::Prose(text) => {
                let mut paragraph = vec![*text];
                while let Some(Line::Prose(next)) = lines.peek() {
                    paragraph.push(next);
                    lines.next();
                }
                page.text([roman(paragraph.join(" "))]);
            }
            Line::Setting { text, .. } => {
                page.control("nf", []).text([roman(*text)]);
                while let Some(Line::Setting { text, .. }) = lines.peek() {
                    page.text([roman(*text)]);
                    lines.next();
                }
                page.control("fi", []);
            }
        }
    }
}

fn prose_of(lines: &[Line]) -> String {
    lines
        .iter()
        .filter_map(|line| match line {
            Line::Prose(text) => Some(*text),
            Line::Setting { .. } => None,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The opening comment's paragraphs (split at a bare `#`), and the groups after it.
fn parse(example: &str) -> anyhow::Result<(Vec<String>, Vec<Group<'_>>)> {
    let mut lines = example.lines().enumerate();
    let mut header = vec![String::new()];
    for (_, line) in lines.by_ref() {
        let Some(comment) = line.strip_prefix('#') else {
            ensure!(
                line.trim().is_empty(),
                "the example must open with a comment"
            );
            break;
        };
        let text = comment.trim();
        let paragraph = header.last_mut().expect("header starts with one paragraph");
        if text.is_empty() {
            header.push(String::new());
        } else {
            if !paragraph.is_empty() {
                paragraph.push(' ');
            }
            paragraph.push_str(text);
        }
    }
    header.retain(|p| !p.is_empty());
    ensure!(!header.is_empty(), "the example has no opening comment");

    let mut groups = Vec::new();
    let mut section = None;
    let mut group = Group {
        section,
        lines: Vec::new(),
    };
    for (number, line) in lines {
        let line = line.trim_end();
        let line_of_group = if line.is_empty() {
            None
        } else if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = Some(name);
            None
        } else if let Some(comment) = line.strip_prefix('#') {
            let text = comment.trim();
            Some(match setting_key(text) {
                Some(key) => Line::Setting { key, text },
                None => Line::Prose(text),
            })
        } else {
            match setting_key(line) {
                Some(key) => Some(Line::Setting { key, text: line }),
                None => bail!(
                    "line {}: neither a comment nor a setting: {line}",
                    number + 1
                ),
            }
        };
        match line_of_group {
            Some(l) => group.lines.push(l),
            None => {
                if !group.lines.is_empty() {
                    groups.push(group);
                }
                group = Group {
                    section,
                    lines: Vec::new(),
                };
            }
        }
    }
    if !group.lines.is_empty() {
        groups.push(group);
    }
    Ok((header, groups))
}

/// `key = value`, the key in lower case and underscores.
fn setting_key(text: &str) -> Option<&str> {
    let (key, _) = text.split_once(" = ")?;
    (!key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_')).then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "# /etc/x.toml: the example.\n# More.\n#\n# Second paragraph.\n\n\
        # Where it listens.\nsocket = \"/run/x.sock\"\n\n[limits]\n# How many.\n\
        # connections = 1024   # all together\n# Then the rest.\n# handshake_timeout = \"5s\"\n\n\
        [s3]\n# Prose alone.\n";

    #[test]
    fn every_setting_is_named_under_its_section_with_its_comment() {
        let page = render(
            EXAMPLE,
            "/etc/x.toml",
            "1.2.3",
            "2026-01-02",
            &crate::sections::config_file(),
        )
        .expect("renders");
        assert!(page.contains(".TH RUNLOCKD.TOML 5 2026-01-02 \"runlock 1.2.3\" runlock"));
        assert!(page.contains("/etc/x.toml: the example. More.\n.PP\nSecond paragraph."));
        assert!(page.contains(
            ".TP\n\\fBsocket\\fR\nWhere it listens.\n.IP\n.nf\nsocket = \"/run/x.sock\"\n.fi"
        ));
        assert!(page.contains(".SS [limits]\n.TP\n\\fBconnections\\fR, \\fBhandshake_timeout\\fR"));
        assert!(page.contains("connections = 1024   # all together\n.fi\n.IP\nThen the rest."));
        assert!(page.contains(".SS [s3]\n.PP\nProse alone."));
    }

    #[test]
    fn a_line_that_is_neither_comment_nor_setting_is_refused() {
        let err = render(
            "# Head.\n\nnot a setting\n",
            "/x",
            "1",
            "2026-01-02",
            &crate::sections::config_file(),
        )
        .expect_err("refused");
        assert!(err.to_string().contains("line 3"), "{err}");
    }

    #[test]
    fn prose_that_mentions_equals_is_not_a_setting() {
        assert_eq!(setting_key("ttl = \"30s\""), Some("ttl"));
        assert_eq!(setting_key("Default: root = the agent's own user."), None);
        assert_eq!(
            setting_key("access_key_id / secret_access_key: prefer"),
            None
        );
    }
}
