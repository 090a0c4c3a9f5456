//! `shardstream mount-check MOUNTPOINT`: the liveness probe of a FUSE sidecar. Exits 0 when a
//! mount is there and its server answers (a `stat` and a directory listing of the mount's root
//! within `--timeout`); non-zero, with the reason on one line, for a dead mount (`ENOTCONN`: the
//! server was killed), a folder with nothing mounted on it, or a server that does not answer.
//! The decision is the fuse crate's ([`shardstream_fuse::mountpoint::probe`]).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context};
use shardstream_fuse::mountpoint::{probe, MountState};

use super::run::parse_duration;
use crate::output::outln;

/// `mount-check MOUNTPOINT`: is a live mount there.
#[derive(Debug, Clone, clap::Args)]
pub struct MountCheckArgs {
    /// The mount point to check.
    pub mountpoint: PathBuf,
    /// How long the mount has to answer (a hung server fails the check instead of hanging it;
    /// keep it below the probe's timeoutSeconds).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// Runs `mount-check`.
pub fn run(args: &MountCheckArgs) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::channel();
    let path = args.mountpoint.clone();
    // On a thread of its own: a hung server blocks the calls in the kernel; the process then
    // exits without waiting for it.
    std::thread::Builder::new()
        .name("mount-check".into())
        .spawn(move || {
            let _ = tx.send(check(&path));
        })
        .context("cannot start the check")?;
    let shown = args.mountpoint.display();
    match rx.recv_timeout(args.timeout) {
        Ok(Ok(())) => {
            outln!("{shown}: {}", MountState::Live.describe())?;
            Ok(())
        }
        Ok(Err(e)) => Err(e.context(format!("{shown} is not a live mount"))),
        Err(_) => bail!(
            "{shown} did not answer within {:?}: its server hangs",
            args.timeout
        ),
    }
}

fn check(path: &Path) -> anyhow::Result<()> {
    let state = probe(path).with_context(|| format!("cannot look at {}", path.display()))?;
    if state != MountState::Live {
        bail!("{}", state.describe());
    }
    // A listing goes to the server (a stat may be answered from the kernel's cache).
    std::fs::read_dir(path)
        .and_then(|mut entries| entries.next().transpose())
        .with_context(|| format!("cannot list {}", path.display()))?;
    Ok(())
}
