//! How a failed command ends: one exit code, decided here from the error's type (the table in
//! docs/deploy.md, "Exit codes", which a Kubernetes `podFailurePolicy` can match on), and one
//! report on stderr: a line of text, or one JSON object under `--json`.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success |
//! | 1 | any other failure (I/O, network, a corrupt shard, a failed verification) |
//! | 2 | usage error (clap) |
//! | 78 | configuration error (`EX_CONFIG`): no run id, no node rank where several nodes run, a refused setting |
//! | 126 | `run`: the command exists but cannot be executed |
//! | 127 | `run`: the command was not found |
//! | 128+n | ended by signal n (`run`: also a command that exited 0 after `run` forwarded `SIGTERM`/`SIGINT`); 141 when stdout was closed |
//!
//! `run` exits with its command's own code when the command ran; the codes above are those of
//! `shardstream` itself.

use std::fmt;
use std::io::{self, Write};
use std::process::ExitCode;

use shardstream_launcher::{IdentityError, LauncherError};
use shardstream_storage::StorageError;
use shardstream_streamer::StreamerError;

/// Any failure without a code of its own.
pub const FAILURE: u8 = 1;
/// A usage error (clap's own code).
pub const USAGE: u8 = 2;
/// A configuration error (`EX_CONFIG` of sysexits.h).
pub const CONFIG: u8 = 78;
/// `run`: the command exists but is not executable (as a shell reports it).
pub const NOT_EXECUTABLE: u8 = 126;
/// `run`: the command was not found (as a shell reports it).
pub const NOT_FOUND: u8 = 127;
/// Stdout was closed (`| head`): 128 + `SIGPIPE`, what a shell reports for a tool that the
/// closed pipe ended.
pub const STDOUT_CLOSED: u8 = 128 + 13;

/// A setting the CLI refuses although it parses (a flag value out of range, two flags that
/// contradict each other): exits [`CONFIG`].
#[derive(Debug)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// The reader of stdout went away (`shardstream inspect ds | head -1`): the command ends
/// quietly with [`STDOUT_CLOSED`].
#[derive(Debug)]
pub struct StdoutClosed;

impl fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stdout was closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// The exit code for `err`: the first cause in its chain that has a code of its own decides,
/// else [`FAILURE`].
pub fn code(err: &anyhow::Error) -> u8 {
    err.chain().find_map(code_of).unwrap_or(FAILURE)
}

fn code_of(cause: &(dyn std::error::Error + 'static)) -> Option<u8> {
    if cause.is::<StdoutClosed>() {
        return Some(STDOUT_CLOSED);
    }
    if cause.is::<ConfigError>() || cause.is::<IdentityError>() {
        return Some(CONFIG);
    }
    if let Some(e) = cause.downcast_ref::<LauncherError>() {
        return launcher_code(e);
    }
    if let Some(e) = cause.downcast_ref::<StreamerError>() {
        return streamer_code(e);
    }
    if let Some(e) = cause.downcast_ref::<StorageError>() {
        return storage_code(e);
    }
    None
}

fn launcher_code(e: &LauncherError) -> Option<u8> {
    match e {
        LauncherError::Identity(_)
        | LauncherError::ForeignCacheDir { .. }
        | LauncherError::InvalidMountSpec { .. } => Some(CONFIG),
        LauncherError::EmptyCommand => Some(USAGE),
        LauncherError::Spawn { source, .. } => match source.kind() {
            io::ErrorKind::NotFound => Some(NOT_FOUND),
            io::ErrorKind::PermissionDenied => Some(NOT_EXECUTABLE),
            _ => Some(FAILURE),
        },
        // Transient (a node folder still held by the pod being replaced) or I/O: a retry may
        // succeed, so not a configuration error.
        _ => None,
    }
}

fn streamer_code(e: &StreamerError) -> Option<u8> {
    match e {
        StreamerError::InvalidConfig { .. }
        | StreamerError::InvalidWeights { .. }
        | StreamerError::LimitTooSmall { .. } => Some(CONFIG),
        // Transparent: the storage error itself is not in the chain, only its source.
        StreamerError::Storage(s) => storage_code(s),
        _ => None,
    }
}

fn storage_code(e: &StorageError) -> Option<u8> {
    match e {
        StorageError::InvalidUrl { .. } | StorageError::Config { .. } => Some(CONFIG),
        _ => None,
    }
}

/// The messages of `err`'s chain, each cause once: a cause whose text a message before it
/// already contains is left out. Typed errors commonly print their source in their own
/// message (`"could not start x: No such file or directory (os error 2)"`) and name it as
/// their `source()` as well, so the chain would otherwise say it twice.
pub fn messages(err: &anyhow::Error) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for cause in err.chain() {
        let text = cause.to_string().replace('\n', " ");
        let text = text.trim();
        if text.is_empty() || out.iter().any(|m| m.contains(text)) {
            continue;
        }
        out.push(text.to_string());
    }
    out
}

/// The one-line report: `shardstream: error: <message>: <cause>: ...`.
pub fn text_report(messages: &[String]) -> String {
    format!("shardstream: error: {}", messages.join(": "))
}

/// The JSON report: `{"error": "<message>", "causes": ["<cause>", ...], "exit_code": N}`.
pub fn json_report(messages: &[String], code: u8) -> String {
    let (error, causes) = messages
        .split_first()
        .map_or(("", &[][..]), |(e, c)| (e, c));
    serde_json::json!({ "error": error, "causes": causes, "exit_code": code }).to_string()
}

/// Reports `err` on stderr (text, or JSON when `json`) and returns its exit code. A closed
/// stdout is reported by its exit code alone.
pub fn report(err: &anyhow::Error, json: bool) -> ExitCode {
    let code = code(err);
    if code != STDOUT_CLOSED {
        let messages = messages(err);
        let line = if json {
            json_report(&messages, code)
        } else {
            text_report(&messages)
        };
        // Nowhere left to say it if stderr is gone too; never panic over it.
        let _ = writeln!(io::stderr().lock(), "{line}");
    }
    ExitCode::from(code)
}

/// Ends a command line that clap refused: clap's own report and code (2; 0 for `--help` and
/// `--version`), or under `--json` one JSON object with its first line.
pub fn usage(err: clap::Error, json: bool) -> ExitCode {
    if !json || !err.use_stderr() {
        err.exit();
    }
    let rendered = err.render().to_string();
    let first = rendered
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("invalid command line");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    let _ = writeln!(
        io::stderr().lock(),
        "{}",
        json_report(&[first.to_string()], USAGE)
    );
    ExitCode::from(USAGE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    fn enoent() -> io::Error {
        io::Error::from_raw_os_error(2)
    }

    #[test]
    fn a_cause_already_in_the_message_is_printed_once() {
        let err = anyhow::Error::new(LauncherError::Spawn {
            program: "no-such-program".into(),
            source: enoent(),
        });
        let m = messages(&err);
        assert_eq!(
            m,
            vec!["could not start no-such-program: No such file or directory (os error 2)"]
        );
        assert_eq!(
            text_report(&m).matches("No such file or directory").count(),
            1
        );
        assert_eq!(code(&err), NOT_FOUND);
    }

    #[test]
    fn context_and_distinct_causes_are_all_kept() {
        let err = Err::<(), _>(enoent())
            .context("reading /x/index.json")
            .context("cannot open dataset /x")
            .unwrap_err();
        assert_eq!(
            messages(&err),
            vec![
                "cannot open dataset /x",
                "reading /x/index.json",
                "No such file or directory (os error 2)"
            ]
        );
        assert_eq!(code(&err), FAILURE);
    }

    #[test]
    fn json_report_has_error_causes_and_code() {
        let err = Err::<(), _>(IdentityError::MissingRunId {
            torchelastic: "unset".into(),
        })
        .context("resolving the run")
        .unwrap_err();
        let code = code(&err);
        assert_eq!(code, CONFIG);
        let v: serde_json::Value =
            serde_json::from_str(&json_report(&messages(&err), code)).unwrap_or_default();
        assert_eq!(v["error"], "resolving the run");
        assert!(v["causes"][0]
            .as_str()
            .is_some_and(|c| c.starts_with("no run id")));
        assert_eq!(v["exit_code"], 78);
    }

    #[test]
    fn codes_from_typed_errors() {
        let identity = LauncherError::Identity(IdentityError::MissingNodeRank {
            hint: "--nnodes=2".into(),
        });
        assert_eq!(code(&anyhow::Error::new(identity)), CONFIG);
        let denied = LauncherError::Spawn {
            program: "./train.sh".into(),
            source: io::Error::from(io::ErrorKind::PermissionDenied),
        };
        assert_eq!(code(&anyhow::Error::new(denied)), NOT_EXECUTABLE);
        let config = StreamerError::InvalidConfig {
            setting: "memory_limit",
            reason: "zero".into(),
        };
        assert_eq!(
            code(&anyhow::Error::new(config).context("cannot open dataset")),
            CONFIG
        );
        assert_eq!(
            code(&anyhow::Error::new(ConfigError("--x 0".into()))),
            CONFIG
        );
        assert_eq!(
            code(&anyhow::Error::new(StdoutClosed).context("printing")),
            STDOUT_CLOSED
        );
        assert_eq!(code(&anyhow::anyhow!("anything else")), FAILURE);
    }
}
