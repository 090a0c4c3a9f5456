//! The signals the launcher passes on to its command, and where they come from: the OS
//! ([`OsSignals`]) or code (a [`Signaller`], which tests and the CLI use alike).

use std::sync::mpsc::Sender;
use std::thread::JoinHandle;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::{Handle, Signals};
use tracing::{debug, warn};

use crate::error::{LauncherError, Result};

/// What the supervisor waits on: a signal to forward, or the child's exit.
#[derive(Debug)]
pub(crate) enum Event {
    Signal(ForwardSignal),
    Exited(std::io::Result<std::process::ExitStatus>),
}

/// A signal forwarded to the command's process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ForwardSignal {
    /// `SIGTERM`: what Kubernetes sends at pod deletion, preemption or eviction. Starts the
    /// grace period, after which the group gets `SIGKILL`.
    Term,
    /// `SIGINT`: Ctrl-C. Starts the grace period too.
    Int,
    /// `SIGHUP`: forwarded only (torchrun stops on it, other programs may reload).
    Hup,
}

impl ForwardSignal {
    /// The signal number.
    pub fn number(self) -> i32 {
        match self {
            ForwardSignal::Term => SIGTERM,
            ForwardSignal::Int => SIGINT,
            ForwardSignal::Hup => SIGHUP,
        }
    }

    /// The forwarded signal with this number, if it is one.
    pub fn from_number(n: i32) -> Option<ForwardSignal> {
        match n {
            SIGTERM => Some(ForwardSignal::Term),
            SIGINT => Some(ForwardSignal::Int),
            SIGHUP => Some(ForwardSignal::Hup),
            _ => None,
        }
    }

    /// Whether it asks the command to stop, so the grace period starts.
    pub fn starts_grace(self) -> bool {
        matches!(self, ForwardSignal::Term | ForwardSignal::Int)
    }

    pub(crate) fn to_rustix(self) -> Option<rustix::process::Signal> {
        rustix::process::Signal::from_named_raw(self.number())
    }
}

/// Hands signals to a running supervisor, which forwards them to the command's group.
#[derive(Debug, Clone)]
pub struct Signaller {
    pub(crate) tx: Sender<Event>,
}

impl Signaller {
    /// Forwards `signal`; `false` once the supervisor has finished waiting.
    pub fn forward(&self, signal: ForwardSignal) -> bool {
        self.tx.send(Event::Signal(signal)).is_ok()
    }
}

/// While it lives, `SIGTERM`, `SIGINT` and `SIGHUP` sent to this process are caught (they no
/// longer kill it) and handed to a [`Signaller`]. Dropping it stops the listening thread; the
/// signals stay caught, which is harmless because the launcher is about to exit.
#[derive(Debug)]
pub struct OsSignals {
    handle: Handle,
    thread: Option<JoinHandle<()>>,
}

impl OsSignals {
    /// Starts catching the three signals. Install it before starting the command, so that a
    /// `SIGTERM` arriving in between is forwarded rather than killing the launcher.
    pub fn install(signaller: Signaller) -> Result<OsSignals> {
        OsSignals::from_early(EarlySignals::install()?, signaller)
    }

    /// Takes over from [`EarlySignals`]: what they caught is forwarded first, in order.
    pub fn from_early(early: EarlySignals, signaller: Signaller) -> Result<OsSignals> {
        let EarlySignals {
            mut signals,
            caught,
        } = early;
        for sig in caught {
            signaller.forward(sig);
        }
        let handle = signals.handle();
        let thread = std::thread::Builder::new()
            .name("shardstream-signals".into())
            .spawn(move || {
                for n in signals.forever() {
                    let Some(sig) = ForwardSignal::from_number(n) else {
                        continue;
                    };
                    debug!(signal = n, "caught signal");
                    if !signaller.forward(sig) {
                        break;
                    }
                }
            })
            .map_err(|source| LauncherError::Signals { source })?;
        Ok(OsSignals {
            handle,
            thread: Some(thread),
        })
    }
}

/// Catches `SIGTERM`, `SIGINT` and `SIGHUP` from the launcher's start, before there is a
/// command to forward them to (while the cache folder is prepared and mounts are waited for):
/// they no longer kill the launcher half-way, and [`EarlySignals::stop_requested`] says whether
/// to give up before starting the command. Hand them to [`crate::Supervisor::run_with`], which
/// forwards what was caught to the command as soon as it starts.
#[derive(Debug)]
pub struct EarlySignals {
    signals: Signals,
    caught: Vec<ForwardSignal>,
}

impl EarlySignals {
    /// Starts catching the three signals.
    pub fn install() -> Result<EarlySignals> {
        let signals = Signals::new([SIGTERM, SIGINT, SIGHUP])
            .map_err(|source| LauncherError::Signals { source })?;
        Ok(EarlySignals {
            signals,
            caught: Vec::new(),
        })
    }

    /// The first `SIGTERM` or `SIGINT` caught so far, if any (a `SIGHUP` does not stop a run).
    pub fn stop_requested(&mut self) -> Option<ForwardSignal> {
        self.caught.extend(
            self.signals
                .pending()
                .filter_map(ForwardSignal::from_number),
        );
        self.caught.iter().copied().find(|s| s.starts_grace())
    }
}

impl Drop for OsSignals {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                warn!("signal thread panicked");
            }
        }
    }
}
