//! Logging: text or JSON to stderr, filtered by `RUST_LOG` (default `info`);
//! plain text without colours or timestamps under systemd, whose journal adds its own.

use tracing_subscriber::EnvFilter;

/// The log formats `--log-format` accepts.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// How text lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TextStyle {
    ansi: bool,
    timestamps: bool,
}

/// Under systemd the journal stamps each line and shows escapes as raw bytes,
/// so both go; elsewhere lines keep their time, and colours only on a terminal.
fn text_style(under_systemd: bool, stderr_is_terminal: bool) -> TextStyle {
    TextStyle {
        ansi: stderr_is_terminal && !under_systemd,
        timestamps: !under_systemd,
    }
}

/// systemd sets `JOURNAL_STREAM` when stderr goes to the journal, and
/// `INVOCATION_ID` for every unit it starts.
fn under_systemd() -> bool {
    ["JOURNAL_STREAM", "INVOCATION_ID"]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
}

/// Installs the global subscriber; call once.
pub fn init(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => {
            let style = text_style(under_systemd(), std::io::stderr().is_terminal());
            let builder = builder.with_ansi(style.ansi);
            if style.timestamps {
                builder.init()
            } else {
                builder.without_time().init()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_gets_neither_colours_nor_timestamps() {
        let plain = TextStyle {
            ansi: false,
            timestamps: false,
        };
        assert_eq!(text_style(true, true), plain);
        assert_eq!(text_style(true, false), plain);
    }

    #[test]
    fn elsewhere_colours_only_on_a_terminal() {
        assert_eq!(
            text_style(false, true),
            TextStyle {
                ansi: true,
                timestamps: true
            }
        );
        assert_eq!(
            text_style(false, false),
            TextStyle {
                ansi: false,
                timestamps: true
            }
        );
    }
}
