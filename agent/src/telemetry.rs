//! Logging: text or JSON to stderr, filtered by `RUST_LOG` (default `info`);
//! plain text without colours or timestamps under systemd, whose journal adds its own.

use tracing::Level;
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

/// Client libraries that log request headers or signing material at `debug`
/// or `trace` (azure_core every request with its `Authorization: SharedKey`
/// signature, aws-sigv4 its string to sign, hyper and h2 raw headers): only
/// their `info` and above are logged, whatever `RUST_LOG` asks, so that no log
/// holds a secret.
const CHATTY_WITH_SECRETS: &[&str] = &[
    "azure_core",
    "azure_storage",
    "azure_storage_blobs",
    "aws_sigv4",
    "aws_smithy_runtime",
    "aws_smithy_runtime_api",
    "hyper",
    "hyper_util",
    "h2",
    "reqwest",
    "tonic",
    "tokio_postgres",
];

/// Whether an event or span of `target` at `level` may be logged at all
/// (see [`CHATTY_WITH_SECRETS`]). In tracing, more verbose levels compare greater.
fn may_be_logged(target: &str, level: Level) -> bool {
    let crate_name = target.split("::").next().unwrap_or(target);
    level <= Level::INFO || !CHATTY_WITH_SECRETS.contains(&crate_name)
}

/// Installs the global subscriber; call once.
pub fn init(format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let no_secrets =
        tracing_subscriber::filter::filter_fn(|meta| may_be_logged(meta.target(), *meta.level()));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().finish().with(no_secrets).init(),
        LogFormat::Text => {
            let style = text_style(under_systemd(), std::io::stderr().is_terminal());
            let builder = builder.with_ansi(style.ansi);
            if style.timestamps {
                builder.finish().with(no_secrets).init()
            } else {
                builder.without_time().finish().with(no_secrets).init()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_libraries_log_nothing_below_info_and_ours_may() {
        assert!(!may_be_logged(
            "azure_core::policies::transport",
            Level::TRACE
        ));
        assert!(!may_be_logged(
            "azure_core::policies::transport",
            Level::DEBUG
        ));
        assert!(!may_be_logged("h2", Level::TRACE));
        assert!(may_be_logged("azure_core::http_client", Level::INFO));
        assert!(may_be_logged("runlock_agent::registry", Level::TRACE));
        assert!(may_be_logged("hyperfine", Level::TRACE));
    }

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
