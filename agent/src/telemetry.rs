//! Logging: text or JSON to stderr, filtered by `RUST_LOG` (default `info`);
//! plain text without colours or timestamps under journald, which adds its own.

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

/// Installs the global subscriber; call once.
pub fn init(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text if std::env::var_os("JOURNAL_STREAM").is_some() => {
            builder.with_ansi(false).without_time().init()
        }
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}
