//! A SIGTERM that reaches the launcher before the command exists (while the cache folder is
//! prepared and mounts are awaited) neither kills the launcher nor is lost: it is reported by
//! `stop_requested`, and forwarded to the command as soon as it starts. Alone in its own test
//! binary: it signals the whole test process.

use std::time::{Duration, Instant};

use shardstream_launcher::{EarlySignals, ForwardSignal, Supervisor};

#[test]
fn a_sigterm_before_the_command_starts_is_kept_and_forwarded() {
    let mut early = EarlySignals::install().unwrap();
    assert_eq!(early.stop_requested(), None);
    signal_hook::low_level::raise(signal_hook::consts::SIGHUP).unwrap();
    assert_eq!(early.stop_requested(), None, "SIGHUP does not stop a run");
    signal_hook::low_level::raise(signal_hook::consts::SIGTERM).unwrap();
    // Still alive; the signal is remembered.
    assert_eq!(early.stop_requested(), Some(ForwardSignal::Term));

    // The command gets both, in order, as soon as it starts: a plain `sleep` dies of the first
    // (SIGHUP) at once, long before its 60 s, and the launcher reports 128 + 1.
    let start = Instant::now();
    let outcome = Supervisor::new(["sleep", "60"])
        .unwrap()
        .run_with(early)
        .unwrap();
    assert_eq!(outcome.exit_code, 129);
    assert_eq!(
        outcome.forwarded,
        vec![ForwardSignal::Hup, ForwardSignal::Term]
    );
    assert!(start.elapsed() < Duration::from_secs(30));
}
