//! A markdown page read as the steps of its shell transcripts (the syntax is
//! in [`super`]'s documentation).

use anyhow::{bail, Context, Result};
use std::path::Path;

/// One thing the runner does, from one place in the page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A line of a ```bash block: run in every session, must exit 0.
    Setup(Command),
    /// A command of a ```console block, with the output it must print.
    Shown {
        /// The command, and the session (prompt) it runs in.
        command: Command,
        /// The lines shown after it, wildcards and all.
        expected: Vec<String>,
    },
    /// `<!-- transcript wait PROMPT$ COMMAND -->`: COMMAND, again until it exits 0.
    Wait(Command),
}

impl Step {
    /// The step as the page writes it, for the runner's report.
    pub fn shown(&self) -> String {
        match self {
            Step::Setup(command) => format!("(each shell) {}", command.text),
            Step::Shown { command, .. } => command.shown(),
            Step::Wait(command) => format!("(until it succeeds) {}", command.shown()),
        }
    }
}

/// A command as the page writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// The page's line it starts on (counted from 1).
    pub line: usize,
    /// The session: the prompt without its `$` (empty for a bare `$ `).
    pub session: String,
    /// The command's text: continued lines and here-documents included.
    pub text: String,
}

impl Command {
    /// Whether the command runs in the background (ends in `&`, not `&&`).
    pub fn background(&self) -> bool {
        let text = self.text.trim_end();
        text.ends_with('&') && !text.ends_with("&&")
    }

    /// `PROMPT$ TEXT`, as the page shows it.
    pub fn shown(&self) -> String {
        format!("{}$ {}", self.session, self.text)
    }
}

/// What marks a runner directive: `<!-- transcript wait PROMPT$ COMMAND -->`.
const WAIT_DIRECTIVE: &str = "<!-- transcript wait ";

/// The steps of `text` (the page at `path`, for messages), in page order.
pub fn steps(path: &Path, text: &str) -> Result<Vec<Step>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut steps = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let at = |n: usize| format!("{}:{}", path.display(), n + 1);
        if let Some(rest) = line.trim().strip_prefix(WAIT_DIRECTIVE) {
            let inner = rest
                .strip_suffix("-->")
                .with_context(|| format!("{}: a directive ends on its own line", at(i)))?;
            let (session, command) = prompted(inner.trim())
                .with_context(|| format!("{}: `wait` needs PROMPT$ COMMAND", at(i)))?;
            steps.push(Step::Wait(Command {
                line: i + 1,
                session,
                text: command.to_string(),
            }));
            i += 1;
            continue;
        }
        let Some(info) = line.strip_prefix("```") else {
            i += 1;
            continue;
        };
        let language = info.split([',', ' ']).next().unwrap_or("");
        let start = i + 1;
        let end = (start..lines.len())
            .find(|&j| lines[j].trim_end() == "```")
            .with_context(|| format!("{}: the code block is not closed", at(i)))?;
        match language {
            "console" => console(&lines, start, end, &mut steps).with_context(|| at(i))?,
            "bash" => bash(&lines, start, end, &mut steps),
            _ => {}
        }
        i = end + 1;
    }
    Ok(steps)
}

/// `PROMPT$ COMMAND` split, where PROMPT is empty or a name of letters,
/// digits, `-` and `_`.
fn prompted(line: &str) -> Option<(String, &str)> {
    let (prompt, command) = line.split_once("$ ")?;
    let named = prompt
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    named.then(|| (prompt.to_string(), command))
}

/// The lines a command started on `lines[first]` takes: `\` at a line's end
/// continues it; a here-document runs to its delimiter line.
fn command_end(lines: &[&str], first: usize, end: usize) -> usize {
    let mut last = first;
    while lines[last].trim_end().ends_with('\\') && last + 1 < end {
        last += 1;
    }
    if let Some(delimiter) = here_document(lines[first]) {
        while last + 1 < end && lines[last].trim() != delimiter {
            last += 1;
        }
    }
    last
}

/// The delimiter of a here-document the line opens (`<<'EOF'`, `<<EOF`, `<<-EOF`).
fn here_document(line: &str) -> Option<String> {
    let after = line.split_once("<<")?.1;
    let after = after.strip_prefix('-').unwrap_or(after).trim_start();
    let word: String = after
        .trim_start_matches(['\'', '"'])
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!word.is_empty()).then_some(word)
}

fn console(lines: &[&str], start: usize, end: usize, steps: &mut Vec<Step>) -> Result<()> {
    let mut i = start;
    while i < end {
        let Some((session, first)) = prompted(lines[i]) else {
            bail!(
                "line {}: a console block's first line is a command (PROMPT$ COMMAND)",
                i + 1
            );
        };
        let last = command_end(lines, i, end);
        let mut text = vec![first.to_string()];
        text.extend(lines[i + 1..=last].iter().map(|l| l.to_string()));
        let mut expected = Vec::new();
        let mut next = last + 1;
        while next < end && prompted(lines[next]).is_none() {
            expected.push(lines[next].to_string());
            next += 1;
        }
        steps.push(Step::Shown {
            command: Command {
                line: i + 1,
                session,
                text: text.join("\n"),
            },
            expected,
        });
        i = next;
    }
    Ok(())
}

fn bash(lines: &[&str], start: usize, end: usize, steps: &mut Vec<Step>) {
    let mut i = start;
    while i < end {
        let trimmed = lines[i].trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            i += 1;
            continue;
        }
        let last = command_end(lines, i, end);
        steps.push(Step::Setup(Command {
            line: i + 1,
            session: String::new(),
            text: lines[i..=last].join("\n"),
        }));
        i = last + 1;
    }
}

/// The part of `text` under the heading line `heading` (up to the next
/// heading of the same level or higher), with the lines before it blanked,
/// so that line numbers stay the page's.
pub fn section(text: &str, heading: &str) -> Result<String> {
    let level = heading.chars().take_while(|&c| c == '#').count();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_end() == heading)
        .with_context(|| format!("no heading {heading:?}"))?;
    let mut in_code = false;
    let mut end = lines.len();
    for (i, line) in lines.iter().enumerate().skip(start + 1) {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !in_code && (1..=level).contains(&hashes) && line[hashes..].starts_with(' ') {
            end = i;
            break;
        }
    }
    let mut out = vec![""; start];
    out.extend(&lines[start..end]);
    Ok(out.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_outputs_setup_and_waits_are_read_in_page_order() {
        let page = "text\n```bash\n# a comment\nexport A=1 \\\n  B=2\ncat > f <<'EOF'\n$ x\nEOF\n```\n\
                    <!-- transcript wait a$ test -S sock -->\n```console\na$ run &\nout 1\n\nb$ ls\n```\n";
        let steps = steps(Path::new("p.md"), page).expect("read");
        let command = |line, session: &str, text: &str| Command {
            line,
            session: session.into(),
            text: text.into(),
        };
        assert_eq!(
            steps,
            vec![
                Step::Setup(command(4, "", "export A=1 \\\n  B=2")),
                Step::Setup(command(6, "", "cat > f <<'EOF'\n$ x\nEOF")),
                Step::Wait(command(10, "a", "test -S sock")),
                Step::Shown {
                    command: command(12, "a", "run &"),
                    expected: vec!["out 1".into(), "".into()],
                },
                Step::Shown {
                    command: command(15, "b", "ls"),
                    expected: vec![],
                },
            ]
        );
        assert!(command(1, "", "a & ").background() && !command(1, "", "a && b").background());
    }

    #[test]
    fn a_section_keeps_the_pages_line_numbers() {
        let text = "# T\n## A\none\n```\n## not a heading\n```\n## B\ntwo\n";
        assert_eq!(
            section(text, "## A").expect("found"),
            "\n## A\none\n```\n## not a heading\n```"
        );
    }
}
