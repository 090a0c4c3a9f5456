//! `shardstream run`: the pod entrypoint wrapper around torchrun (docs/deploy.md).
//!
//! Resolves the run id and node rank (docs/cache.md), prepares and leases
//! `<cache-root>/<run-id>/<node-rank>/`, mounts `--mount` datasets and waits until they are
//! ready, runs the command with `SHARDSTREAM_RUN_ID`, `SHARDSTREAM_NODE_RANK` and
//! `SHARDSTREAM_CACHE_DIR` exported, forwards `SIGTERM`/`SIGINT`/`SIGHUP` to it, kills it a grace
//! period after `SIGTERM`/`SIGINT`, unmounts, and exits with the command's exit code (`128 + n`
//! when signal `n` ended it, or when it exited 0 after a forwarded `SIGTERM`/`SIGINT`). Its own
//! failures have the codes of `crate::exit` (78 for a configuration error, 127 for a command
//! not found), and a command line that says several nodes (`--nnodes 2`) needs a node rank.

use std::ffi::OsString;
use std::time::Duration;

use anyhow::Context;
use shardstream_checkpoint::MetricsSnapshot as CheckpointSnapshot;
use shardstream_launcher::identity::resolve_for_command;
use shardstream_launcher::{
    locate_resolved, os_env, prepare_cache_dir, start_mount, EarlySignals, HookResult,
    LauncherError, MountSpec, Supervisor,
};
use tracing::{info, warn};

use crate::metrics_server;
use crate::node_args::NodeArgs;
use crate::Global;

/// How long each mount has to unmount after the command is gone.
const UNMOUNT_TIMEOUT: Duration = Duration::from_secs(10);

/// `run -- COMMAND...`: the pod entrypoint wrapper around torchrun.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Which node's cache.
    #[command(flatten)]
    pub node: NodeArgs,
    /// Serve the node's metrics for Prometheus on this address (e.g. 0.0.0.0:9464): the sum of
    /// the counters of every process of the node that streams (ranks, DataLoader workers,
    /// mounts), including those that already exited.
    #[arg(long, env = "SHARDSTREAM_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    /// Mount DATASET at PATH (with `shardstream mount`) for the command's lifetime
    /// (repeatable); the command starts once every mount is ready.
    #[arg(long, value_name = "DATASET:PATH")]
    pub mount: Vec<MountSpec>,
    /// How long each mount may take to become ready.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub mount_timeout: Duration,
    /// After SIGTERM or SIGINT, how long the command has to exit (drain checkpoint uploads)
    /// before its process group gets SIGKILL. Keep it, plus 10 s per mount, below the pod's
    /// terminationGracePeriodSeconds.
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = parse_duration)]
    pub grace_period: Duration,
    /// The command to run (usually torchrun ...).
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

/// Runs `run`. On success it does not return: the process exits with the command's code.
pub fn run(args: RunArgs, global: &Global) -> anyhow::Result<()> {
    let _ = global;
    // From here on SIGTERM/SIGINT no longer kill us half-way through the set-up (leaving mount
    // processes behind); a stop requested before the command starts is honoured below.
    let mut early = EarlySignals::install()?;
    let overrides = args.node.overrides();
    // The command's own flags count too: `torchrun --nnodes=2` with no node rank anywhere is
    // refused rather than run as node 0 on every node.
    let resolved =
        resolve_for_command(&overrides.run, &args.command, &os_env).context("resolving the run")?;
    resolved.log();
    let dir =
        locate_resolved(&overrides, &resolved, &os_env).context("locating the cache folder")?;
    let lease = prepare_cache_dir(&dir, &resolved)
        .with_context(|| format!("preparing the cache folder {}", dir.display()))?;
    info!(cache_dir = %lease.dir().display(), "cache folder ready");
    // Served until this process exits: the node's sum, read from the folder at each scrape.
    let _metrics = match args.metrics_addr.as_deref().filter(|a| !a.is_empty()) {
        Some(addr) => {
            let node = lease.dir().to_path_buf();
            Some(metrics_server::serve(addr, move || {
                match shardstream_streamer::dataset::node_sum(&node) {
                    Ok(sum) => {
                        // The checkpoint writers' and readers' counters ride in the sum by
                        // name; their owner renders them.
                        let checkpoint = CheckpointSnapshot::from_named(|name| {
                            sum.named.counters.get(name).copied()
                        });
                        sum.dataset.to_prometheus() + &checkpoint.to_prometheus()
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot read the node's metrics");
                        String::new()
                    }
                }
            })?)
        }
        None => None,
    };
    let exports = resolved.exports(lease.dir());

    let mut mounts = Vec::with_capacity(args.mount.len());
    if !args.mount.is_empty() {
        let exe = std::env::current_exe().context("locating the shardstream binary")?;
        for spec in &args.mount {
            let mut stop = || early.stop_requested().is_some();
            match start_mount(&exe, spec, &exports, args.mount_timeout, &mut stop) {
                Ok(mount) => mounts.push(mount),
                Err(LauncherError::Stopped { .. }) => break,
                Err(e) => {
                    // Take down the mounts made so far, last first.
                    while let Some(mount) = mounts.pop() {
                        drop(mount);
                    }
                    return Err(e.into());
                }
            }
        }
    }
    if let Some(sig) = early.stop_requested() {
        warn!(signal = ?sig, "stopped before the command started");
        // Unmount (in reverse order) before the lease goes.
        while let Some(mount) = mounts.pop() {
            drop(mount);
        }
        drop(lease);
        std::process::exit(128 + sig.number());
    }

    let mut supervisor = Supervisor::new(args.command)?
        .export_resolved(&resolved, lease.dir())
        .grace_period(args.grace_period);
    // Unmount in reverse order: a later mount may sit inside an earlier one.
    while let Some(mount) = mounts.pop() {
        let name = format!("unmount {}", mount.spec().mountpoint.display());
        supervisor = supervisor.on_shutdown(name, UNMOUNT_TIMEOUT, move |deadline| {
            mount.unmount(deadline)
        });
    }
    let outcome = supervisor.run_with(early)?;
    drop(lease);
    if outcome.killed_after_grace {
        warn!(grace = ?args.grace_period, "the command outlived its grace period and was killed");
    }
    let hooks_failed = outcome
        .hooks
        .iter()
        .filter(|h| h.result != HookResult::Done)
        .count();
    info!(exit_code = outcome.exit_code, hooks_failed, "run finished");
    std::process::exit(outcome.exit_code)
}

/// A duration as `300ms`, `20s`, `5m`, `12h`, `7d`, a plain number of seconds, or a sum
/// (`1h30m`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(|| format!("{text:?}: a number needs a unit (ms, s, m, h, d)"))?;
        if digits == 0 {
            return Err(format!("{text:?} is not a duration (e.g. 20s, 7d, 1h30m)"));
        }
        let (number, tail) = rest.split_at(digits);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let n: u64 = number
            .parse()
            .map_err(|_| format!("{text:?}: {number} is too large"))?;
        let part = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            "h" => Duration::from_secs(n.saturating_mul(3_600)),
            "d" => Duration::from_secs(n.saturating_mul(86_400)),
            other => return Err(format!("{text:?}: unknown unit {other:?} (ms, s, m, h, d)")),
        };
        total = total.saturating_add(part);
        rest = next;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_duration("20"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_duration("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in ["", "s", "5x", "1.5h", "-3s", "h5"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
