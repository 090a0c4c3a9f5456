//! Runs the pod's command (torchrun, usually) as a child in its own process group and stays
//! between it and Kubernetes:
//! - `SIGTERM`/`SIGINT`/`SIGHUP` are forwarded to the child's whole group;
//! - after `SIGTERM` or `SIGINT`, the group gets `grace` to exit, then `SIGKILL`;
//! - the child's exit code is returned (`128 + n` if signal `n` ended it), the convention
//!   shells and Kubernetes use, so a pod's status reads the same as without the wrapper; a
//!   child that exits 0 after a forwarded `SIGTERM`/`SIGINT` reports `128 + n` too
//!   ([`outcome_code`]): it was stopped, not finished;
//! - once the child is gone, anything left in its group gets `SIGKILL`, then the shutdown
//!   hooks run in order, each within its own timeout.
//!
//! torchrun starts each worker in a session of its own and stops them itself on the signals
//! above, so the group signal reaches torchrun (and any helper it did not detach); workers of a
//! torchrun that had to be killed are ended by the container's exit.
//!
//! Kubernetes sends `SIGKILL` `terminationGracePeriodSeconds` (default 30) after `SIGTERM`:
//! keep `grace` plus the hooks' timeouts below it.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::{kill_process_group, Pid, Signal};
use tracing::{info, warn};

use crate::error::{LauncherError, Result};
use crate::hooks::{run_hooks, HookReport, ShutdownHook};
use crate::signals::{EarlySignals, Event, ForwardSignal, OsSignals, Signaller};
use shardstream_identity::Resolved;

/// The default grace period between a forwarded `SIGTERM` and `SIGKILL`: leaves 10 s of
/// Kubernetes' default 30 s for the hooks.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(20);

/// How the command ended.
#[derive(Debug)]
pub struct Outcome {
    /// The exit code to exit with ([`outcome_code`]): the child's, or `128 + n` when signal
    /// `n` ended it or when it exited 0 after being asked to stop.
    pub exit_code: i32,
    /// The child's status.
    pub status: ExitStatus,
    /// The signals forwarded, in order.
    pub forwarded: Vec<ForwardSignal>,
    /// Whether the grace period ran out and the group was killed.
    pub killed_after_grace: bool,
    /// What each shutdown hook did.
    pub hooks: Vec<HookReport>,
}

/// The exit code a shell would report for `status`.
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

/// The exit code of a supervised run: [`exit_code`], except that a command asked to stop
/// (`SIGTERM`/`SIGINT` forwarded) which then exits 0 reports `128 + n` of the first such
/// signal. A trainer that saves a checkpoint on `SIGTERM` and exits cleanly has still been
/// stopped, not finished: exiting 0 would mark its Kubernetes index Succeeded and the Job would
/// never run it again. A non-zero code of the command's own is kept as it is.
pub fn outcome_code(status: ExitStatus, forwarded: &[ForwardSignal]) -> i32 {
    let code = exit_code(status);
    match forwarded.iter().find(|s| s.starts_grace()) {
        Some(stop) if code == 0 => 128 + stop.number(),
        _ => code,
    }
}

/// A command to run under supervision. Build it, then [`Supervisor::run`] (signals from the
/// OS) or [`Supervisor::spawn`] (signals from a [`Signaller`]).
pub struct Supervisor {
    program: OsString,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    grace: Duration,
    hooks: Vec<ShutdownHook>,
    stdout: Option<Stdio>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("grace", &self.grace)
            .field("hooks", &self.hooks.len())
            .finish_non_exhaustive()
    }
}

impl Supervisor {
    /// The command: program first, then its arguments.
    pub fn new<I, S>(command: I) -> Result<Supervisor>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let mut it = command.into_iter().map(Into::into);
        let program = it.next().ok_or(LauncherError::EmptyCommand)?;
        Ok(Supervisor {
            program,
            args: it.collect(),
            env: Vec::new(),
            grace: DEFAULT_GRACE,
            hooks: Vec::new(),
            stdout: None,
        })
    }

    /// Adds a variable to the command's environment (which otherwise is the launcher's).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Supervisor {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Exports `SHARDSTREAM_RUN_ID`, `SHARDSTREAM_NODE_RANK` and `SHARDSTREAM_CACHE_DIR`.
    pub fn export_resolved(mut self, resolved: &Resolved, cache_dir: &Path) -> Supervisor {
        for (k, v) in resolved.exports(cache_dir) {
            self.env.push((k.into(), v));
        }
        self
    }

    /// Time between a forwarded `SIGTERM`/`SIGINT` and `SIGKILL` (default [`DEFAULT_GRACE`]).
    pub fn grace_period(mut self, grace: Duration) -> Supervisor {
        self.grace = grace;
        self
    }

    /// Registers a hook to run after the command is gone ("drain checkpoint uploads",
    /// "unmount"); hooks run in the order registered. The hook gets its deadline; if it has
    /// not returned by then the supervisor moves on without it.
    pub fn on_shutdown(
        mut self,
        name: impl Into<String>,
        timeout: Duration,
        hook: impl FnOnce(Instant) -> std::result::Result<(), String> + Send + 'static,
    ) -> Supervisor {
        self.hooks
            .push(ShutdownHook::new(name.into(), timeout, Box::new(hook)));
        self
    }

    /// Where the command's stdout goes (inherited by default).
    pub fn stdout(mut self, stdout: Stdio) -> Supervisor {
        self.stdout = Some(stdout);
        self
    }

    /// Starts the command; signals come from [`Running::signaller`]. If it cannot be started,
    /// the hooks run before the error is returned.
    pub fn spawn(self) -> Result<Running> {
        let (tx, rx) = channel();
        self.spawn_with(tx, rx).map_err(fail_with_hooks)
    }

    /// Catches the OS signals, starts the command, waits for it and runs the hooks. The hooks
    /// also run if the command cannot be started (they undo what was set up before it).
    pub fn run(self) -> Result<Outcome> {
        self.run_with(EarlySignals::install()?)
    }

    /// [`Supervisor::run`] with signals caught since `early` was installed: those are
    /// forwarded to the command as soon as it starts (a `SIGTERM` then starts the grace period).
    pub fn run_with(self, early: EarlySignals) -> Result<Outcome> {
        let (tx, rx) = channel();
        let os = OsSignals::from_early(early, Signaller { tx: tx.clone() })?;
        let outcome = match self.spawn_with(tx, rx) {
            Ok(running) => running.wait(),
            Err(failed) => Err(fail_with_hooks(failed)),
        };
        drop(os);
        outcome
    }

    fn spawn_with(
        self,
        tx: Sender<Event>,
        rx: Receiver<Event>,
    ) -> std::result::Result<Running, (LauncherError, Vec<ShutdownHook>)> {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        // Its own group, so one kill reaches torchrun and whatever it started in its group,
        // and a terminal's Ctrl-C reaches it only through us (once, not twice).
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        if let Some(out) = self.stdout {
            cmd.stdout(out);
        }
        let program = self.program.to_string_lossy().into_owned();
        match cmd.spawn() {
            Ok(child) => {
                info!(program = %program, pid = child.id(), "started");
                Ok(Running {
                    pgid: Pid::from_child(&child),
                    child,
                    program,
                    tx,
                    rx,
                    grace: self.grace,
                    hooks: self.hooks,
                })
            }
            Err(source) => Err((LauncherError::Spawn { program, source }, self.hooks)),
        }
    }
}

/// A started command.
#[derive(Debug)]
pub struct Running {
    child: Child,
    pgid: Pid,
    program: String,
    tx: Sender<Event>,
    rx: Receiver<Event>,
    grace: Duration,
    hooks: Vec<ShutdownHook>,
}

impl Running {
    /// The child's process id (also its process group id).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// A handle to forward signals with.
    pub fn signaller(&self) -> Signaller {
        Signaller {
            tx: self.tx.clone(),
        }
    }

    /// The child's stdout, if [`Supervisor::stdout`] piped it.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// Forwards signals until the child exits, kills the group after the grace period, then
    /// clears the group and runs the hooks.
    pub fn wait(self) -> Result<Outcome> {
        let Running {
            mut child,
            pgid,
            program,
            tx,
            rx,
            grace,
            hooks,
        } = self;
        std::thread::Builder::new()
            .name("shardstream-wait".into())
            .spawn(move || {
                // The receiver outlives this thread's send unless the supervisor failed.
                let _ = tx.send(Event::Exited(child.wait()));
            })
            .map_err(|source| LauncherError::Wait {
                program: program.clone(),
                source,
            })?;

        let mut forwarded = Vec::new();
        let mut kill_at: Option<Instant> = None;
        let mut killed_after_grace = false;
        let status = loop {
            let event = match kill_at {
                Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match event {
                Ok(Event::Signal(sig)) => {
                    info!(signal = ?sig, pgid = pgid.as_raw_nonzero().get(), "forwarding");
                    if let Some(s) = sig.to_rustix() {
                        signal_group(pgid, s);
                    }
                    forwarded.push(sig);
                    if sig.starts_grace() && kill_at.is_none() && !killed_after_grace {
                        kill_at = Some(Instant::now() + grace);
                    }
                }
                Ok(Event::Exited(status)) => {
                    break status.map_err(|source| LauncherError::Wait {
                        program: program.clone(),
                        source,
                    })?
                }
                Err(RecvTimeoutError::Timeout) => {
                    warn!(grace = ?grace, "grace period over; killing the process group");
                    signal_group(pgid, Signal::KILL);
                    killed_after_grace = true;
                    kill_at = None;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(LauncherError::Wait {
                        program,
                        source: std::io::Error::other("waiter thread ended without a status"),
                    })
                }
            }
        };
        // Whatever the child left in its group (a helper it started, a worker it lost track of)
        // would hold the cache, a GPU or a mount after the run: it goes too.
        if signal_group(pgid, Signal::KILL) {
            warn!("killed processes the command left behind in its group");
        }
        let exit_code = outcome_code(status, &forwarded);
        info!(program = %program, status = %status, exit_code, "exited");
        let hooks = run_hooks(hooks);
        Ok(Outcome {
            exit_code,
            status,
            forwarded,
            killed_after_grace,
            hooks,
        })
    }
}

/// Runs the hooks of a command that never started (they undo what was set up for it).
fn fail_with_hooks((error, hooks): (LauncherError, Vec<ShutdownHook>)) -> LauncherError {
    run_hooks(hooks);
    error
}

/// Sends `sig` to the group; `true` if any process received it.
fn signal_group(pgid: Pid, sig: Signal) -> bool {
    match kill_process_group(pgid, sig) {
        Ok(()) => true,
        Err(Errno::SRCH) => false,
        Err(e) => {
            warn!(error = %e, "signalling the process group failed");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    /// A wait status as `waitpid` reports it: exited with `code`.
    fn exited(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    /// A wait status: killed by signal `sig`.
    fn killed(sig: i32) -> ExitStatus {
        ExitStatus::from_raw(sig)
    }

    #[test]
    fn a_stopped_command_that_exits_0_reports_the_stop() {
        use ForwardSignal::{Hup, Int, Term};
        assert_eq!(outcome_code(exited(0), &[]), 0);
        assert_eq!(outcome_code(exited(0), &[Term]), 128 + 15);
        assert_eq!(outcome_code(exited(0), &[Int, Term]), 128 + 2);
        // SIGHUP alone does not ask to stop (a program may reload on it).
        assert_eq!(outcome_code(exited(0), &[Hup]), 0);
        assert_eq!(outcome_code(exited(0), &[Hup, Term]), 128 + 15);
        // The command's own failure is kept.
        assert_eq!(outcome_code(exited(3), &[Term]), 3);
        assert_eq!(outcome_code(exited(3), &[]), 3);
        assert_eq!(outcome_code(killed(9), &[Term]), 128 + 9);
        assert_eq!(outcome_code(killed(15), &[]), 128 + 15);
    }
}
