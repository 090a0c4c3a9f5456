//! Shutdown hooks: work that must happen after the command is gone and before the pod is
//! (drain checkpoint uploads, unmount a FUSE view), in order, each within its own timeout so
//! that one stuck hook cannot eat the time of the next.

use std::fmt;
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::time::{Duration, Instant};

use tracing::{info, warn};

type HookFn = Box<dyn FnOnce(Instant) -> Result<(), String> + Send>;

/// A registered hook (see [`crate::Supervisor::on_shutdown`]).
pub struct ShutdownHook {
    name: String,
    timeout: Duration,
    run: HookFn,
}

impl fmt::Debug for ShutdownHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShutdownHook")
            .field("name", &self.name)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl ShutdownHook {
    pub(crate) fn new(name: String, timeout: Duration, run: HookFn) -> ShutdownHook {
        ShutdownHook { name, timeout, run }
    }
}

/// How a hook ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookResult {
    /// It returned `Ok`.
    Done,
    /// It returned this error.
    Failed(String),
    /// Its deadline passed; it was left running in the background.
    TimedOut,
    /// It panicked.
    Panicked,
}

/// What one hook did.
#[derive(Debug, Clone)]
pub struct HookReport {
    /// The hook's name.
    pub name: String,
    /// How it ended.
    pub result: HookResult,
    /// How long the supervisor waited for it.
    pub elapsed: Duration,
}

/// Runs the hooks in order. Each runs on a thread of its own, so a hook that overruns is
/// abandoned (and reported) instead of blocking the ones after it.
pub(crate) fn run_hooks(hooks: Vec<ShutdownHook>) -> Vec<HookReport> {
    hooks.into_iter().map(run_one).collect()
}

fn run_one(hook: ShutdownHook) -> HookReport {
    let start = Instant::now();
    let deadline = start + hook.timeout;
    let (tx, rx) = channel();
    let run = hook.run;
    let spawned = std::thread::Builder::new()
        .name(format!("hook-{}", hook.name))
        .spawn(move || {
            // The supervisor may have given up on us; nobody to tell then.
            let _ = tx.send(run(deadline));
        });
    let result = match spawned {
        Err(e) => HookResult::Failed(format!("could not start: {e}")),
        Ok(_) => match rx.recv_timeout(hook.timeout) {
            Ok(Ok(())) => HookResult::Done,
            Ok(Err(e)) => HookResult::Failed(e),
            Err(RecvTimeoutError::Timeout) => HookResult::TimedOut,
            // The sender dropped without sending: the hook panicked.
            Err(RecvTimeoutError::Disconnected) => HookResult::Panicked,
        },
    };
    let elapsed = start.elapsed();
    match &result {
        HookResult::Done => info!(hook = %hook.name, ?elapsed, "shutdown hook done"),
        other => {
            warn!(hook = %hook.name, ?elapsed, result = ?other, "shutdown hook did not finish")
        }
    }
    HookReport {
        name: hook.name,
        result,
        elapsed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn hook(
        name: &str,
        timeout_ms: u64,
        f: impl FnOnce(Instant) -> Result<(), String> + Send + 'static,
    ) -> ShutdownHook {
        ShutdownHook::new(name.into(), Duration::from_millis(timeout_ms), Box::new(f))
    }

    #[test]
    fn hooks_run_in_order_and_a_stuck_one_does_not_block_the_next() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let (o1, o3) = (order.clone(), order.clone());
        // The stuck hook waits on a channel nobody sends to until the test ends.
        let (_keep, stuck_rx) = channel::<()>();
        let reports = run_hooks(vec![
            hook("drain", 5_000, move |_| {
                o1.lock().unwrap().push("drain");
                Ok(())
            }),
            hook("stuck", 200, move |_| {
                let _ = stuck_rx.recv();
                Ok(())
            }),
            hook("unmount", 5_000, move |deadline| {
                assert!(deadline > Instant::now());
                o3.lock().unwrap().push("unmount");
                Err("busy".into())
            }),
            hook("panics", 5_000, |_| panic!("boom")),
        ]);
        let results: Vec<_> = reports
            .iter()
            .map(|r| (r.name.as_str(), r.result.clone()))
            .collect();
        assert_eq!(
            results,
            vec![
                ("drain", HookResult::Done),
                ("stuck", HookResult::TimedOut),
                ("unmount", HookResult::Failed("busy".into())),
                ("panics", HookResult::Panicked),
            ]
        );
        assert!(reports[1].elapsed >= Duration::from_millis(200));
        assert_eq!(*order.lock().unwrap(), vec!["drain", "unmount"]);
    }
}
