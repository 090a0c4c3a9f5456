//! `tracing` set-up: logs go to stderr, as text or JSON lines (`--log-format json`).
//!
//! The level comes from `RUST_LOG` when it is set, else from `-v` (warn, info, debug, trace).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber. `verbosity` counts `-v` flags.
pub fn init(format: LogFormat, verbosity: u8) {
    let level = match verbosity {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal: pod logs and files get plain text.
        .with_ansi(std::io::stderr().is_terminal());
    // A second init (tests calling into the library twice) is harmless; ignore its error.
    let _ = match format {
        LogFormat::Text => builder.with_target(false).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
