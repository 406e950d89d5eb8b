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

/// The only crates whose `debug` and `trace` are logged. Every other
/// target (the store clients and what they stand on: aws-sdk-s3, aws-sigv4,
/// azure_core, hyper, h2, tower, rustls, tonic, tokio-postgres, …) is capped
/// at `info` whatever `RUST_LOG` asks: below that they log request headers,
/// strings to sign and signatures, and a new dependency must not be able to
/// add a secret to the log.
const OURS: &[&str] = &["runlock_agent", "runlockd", "runlock_protocol"];

/// Whether an event or span of `target` at `level` may be logged at all
/// (see [`OURS`]). In tracing, more verbose levels compare greater. A `log`
/// record (rustls logs through `log`) arrives under its own target too.
fn may_be_logged(target: &str, level: Level) -> bool {
    let crate_name = target.split("::").next().unwrap_or(target);
    level <= Level::INFO || OURS.contains(&crate_name)
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
    fn only_our_own_crates_log_below_info() {
        for theirs in [
            "azure_core::policies::transport",
            "aws_sdk_s3::operation",
            "aws_config::imds",
            "aws_smithy_http_client::hyper",
            "tower::buffer",
            "rustls::client::hs",
            "h2",
            "hyperfine",
            "runlock_agentish",
        ] {
            for level in [Level::DEBUG, Level::TRACE] {
                assert!(!may_be_logged(theirs, level), "{theirs} at {level}");
            }
            assert!(may_be_logged(theirs, Level::INFO), "{theirs} at info");
        }
        for ours in [
            "runlock_agent::registry",
            "runlockd",
            "runlock_protocol::codec",
        ] {
            assert!(may_be_logged(ours, Level::TRACE), "{ours}");
        }
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
