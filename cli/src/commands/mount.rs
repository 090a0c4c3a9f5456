//! `shardstream mount`: a read-only FUSE view of a dataset (`shards/` and `samples/`).
//!
//! Foreground: mounts, writes `--ready-file` once the mount serves requests, and on
//! `SIGTERM`/`SIGINT`/`SIGHUP` unmounts and exits 0 (also when someone runs `fusermount3 -u`).
//! Background (the default): starts itself with `--foreground` in a process group of its own,
//! waits for the ready file, prints the daemon's pid and exits; a failure before readiness is
//! reported with the daemon's log.
//!
//! In a pod: a dead mount (`ENOTCONN`) that a killed sidecar left at the mount point is
//! detached before mounting again, `--allow-other` as a user other than root needs
//! `user_allow_other` in /etc/fuse.conf (refused up front with exit code 78 otherwise), and
//! `shardstream mount-check MOUNTPOINT` is the liveness probe.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use shardstream_fuse::{DatasetFs, FsConfig, MountError, MountOptions, StreamingSource};
use shardstream_streamer::dataset::{StreamingConfig, StreamingDataset};

use crate::exit::ConfigError;
use crate::metrics_server;
use crate::node_args::{streaming_config, BudgetArgs, NodeArgs};
use crate::output::outln;
use crate::Global;

/// `mount DATASET MOUNTPOINT`: a read-only FUSE view of a dataset.
#[derive(Debug, Clone, clap::Args)]
pub struct MountArgs {
    /// Dataset location (local path or s3://, gs://, az:// URL of an MDS dataset).
    pub dataset: String,
    /// Where to mount it (an existing, empty folder).
    pub mountpoint: PathBuf,
    /// Subfolder of the dataset to mount (Mosaic's `split`).
    #[arg(long)]
    pub split: Option<String>,
    /// Which node's cache.
    #[command(flatten)]
    pub node: NodeArgs,
    /// RAM and disk budgets (read-ahead and kept-open shards stay within half the disk budget).
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Most shards fetched ahead of a sequential reader.
    #[arg(long, default_value_t = 8)]
    pub readahead_shards: usize,
    /// Seconds a read waits for its shard before failing with EIO (the fetch goes on in the
    /// background); default: as long as the streamer retries a failing server.
    #[arg(long)]
    pub fetch_timeout: Option<f64>,
    /// Check the index's hashes of every fetched shard.
    #[arg(long)]
    pub validate_hash: bool,
    /// Name sample files by index even for datasets made from a folder or an ImageFolder tree.
    #[arg(long)]
    pub by_index: bool,
    /// Stay in the foreground (the default starts a daemon and returns once it is mounted).
    #[arg(long)]
    pub foreground: bool,
    /// Written once the mount serves requests (and removed at unmount): a startup probe target.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Let other users read the mount (FUSE `allow_other`).
    #[arg(long)]
    pub allow_other: bool,
    /// Serve every read through the daemon: no FUSE passthrough (by default the kernel reads
    /// cached shards of `shards/` straight from their cache files where it can: Linux 6.9+ and
    /// CAP_SYS_ADMIN; without those the mount falls back on its own).
    #[arg(long)]
    pub no_passthrough: bool,
    /// Seconds the background start waits for the daemon to be ready.
    #[arg(long, default_value_t = 300)]
    pub ready_timeout: u64,
    /// Serve this mount's own metrics for Prometheus on this address while it is mounted (a
    /// mount run alone; under `shardstream run` its counters are in the node's sum that `run`
    /// serves, so no flag is needed there).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
}

/// Runs `mount`.
pub fn run(args: MountArgs, _global: &Global) -> anyhow::Result<()> {
    if args.foreground {
        serve(&args)
    } else {
        daemonize(&args)
    }
}

fn serve(args: &MountArgs) -> anyhow::Result<()> {
    let config = StreamingConfig {
        validate_hash: args.validate_hash,
        allow_unsafe_types: true,
        ..streaming_config(&args.dataset, args.split.clone(), &args.node, &args.budget)
    };
    let dataset = StreamingDataset::open(config)
        .with_context(|| format!("cannot open dataset {}", args.dataset))?;
    tracing::info!(
        dataset = %args.dataset,
        cache_dir = %dataset.cache_dir().display(),
        shards = dataset.num_shards(),
        samples = dataset.num_samples(),
        "dataset opened"
    );
    // Served as long as the mount is: dropped when `serve` returns.
    let _metrics = match &args.metrics_addr {
        Some(addr) => {
            let counted = dataset.clone();
            Some(metrics_server::serve(addr, move || {
                counted.metrics().to_prometheus()
            })?)
        }
        None => None,
    };
    let source = StreamingSource::new(dataset, args.budget.cache_limit.map(|b| b.0))?;
    let fs_config = FsConfig {
        by_path: !args.by_index,
        max_readahead_shards: args.readahead_shards,
        fetch_timeout: args
            .fetch_timeout
            .map(Duration::try_from_secs_f64)
            .transpose()
            .map_err(|_| {
                ConfigError("--fetch-timeout must be a positive number of seconds".into())
            })?,
        ..FsConfig::default()
    };
    let fs = DatasetFs::new(Arc::new(source), fs_config)
        .with_context(|| format!("cannot read the index of {}", args.dataset))?;
    let options = MountOptions {
        allow_other: args.allow_other,
        passthrough: !args.no_passthrough,
        fs_name: format!("shardstream:{}", args.dataset),
        ..MountOptions::default()
    };
    let mut mount = match shardstream_fuse::mount(fs, &args.mountpoint, &options) {
        Ok(mount) => mount,
        // A setting this user may not have: a configuration error, with the fix named.
        Err(MountError::AllowOtherRefused(reason)) => return Err(ConfigError(reason).into()),
        Err(e) => {
            return Err(anyhow::Error::new(e))
                .with_context(|| format!("cannot mount at {}", args.mountpoint.display()))
        }
    };
    if let Some(ready) = &args.ready_file {
        write_ready_file(ready, &args.mountpoint)?;
    }
    let reason = wait_for_end(&mut mount)?;
    if let Some(ready) = &args.ready_file {
        let _ = std::fs::remove_file(ready);
    }
    match reason {
        End::Signal(name) => {
            tracing::info!(signal = name, "unmounting");
            mount.unmount().context("cannot unmount")?;
        }
        End::Unmounted(result) => {
            result.context("the FUSE session failed")?;
            tracing::info!("unmounted from outside; exiting");
        }
    }
    Ok(())
}

enum End {
    Signal(&'static str),
    Unmounted(Result<(), shardstream_fuse::MountError>),
}

fn wait_for_end(mount: &mut shardstream_fuse::Mount) -> anyhow::Result<End> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the signal runtime")?;
    rt.block_on(async {
        let mut term = signal(SignalKind::terminate()).context("cannot catch SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("cannot catch SIGINT")?;
        let mut hup = signal(SignalKind::hangup()).context("cannot catch SIGHUP")?;
        loop {
            tokio::select! {
                _ = term.recv() => return Ok(End::Signal("SIGTERM")),
                _ = int.recv() => return Ok(End::Signal("SIGINT")),
                _ = hup.recv() => return Ok(End::Signal("SIGHUP")),
                _ = tokio::time::sleep(Duration::from_millis(200)) => {
                    if let Some(result) = mount.wait_ended(Duration::ZERO) {
                        return Ok(End::Unmounted(result));
                    }
                }
            }
        }
    })
}

/// Writes `pid mountpoint` to `path` atomically (temp name, then rename).
fn write_ready_file(path: &Path, mountpoint: &Path) -> anyhow::Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(
        &tmp,
        format!("{} {}\n", std::process::id(), mountpoint.display()),
    )
    .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))
}

fn daemonize(args: &MountArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the shardstream binary")?;
    let ready = match &args.ready_file {
        Some(r) => r.clone(),
        None => {
            std::env::temp_dir().join(format!("shardstream-mount-{}.ready", std::process::id()))
        }
    };
    let log = ready.with_extension("log");
    let _ = std::fs::remove_file(&ready);
    let log_file =
        std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    let log_err = log_file
        .try_clone()
        .with_context(|| format!("cannot reopen {}", log.display()))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(std::env::args_os().skip(1)).arg("--foreground");
    if args.ready_file.is_none() {
        cmd.arg("--ready-file").arg(&ready);
    }
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // glibc reads this only at start: without it every serving thread gets its own arena,
        // and freed read buffers stay resident in each (peak RSS grows with the thread count).
        cmd.env("MALLOC_ARENA_MAX", "2");
    }
    cmd.stdin(std::process::Stdio::null())
        .stdout(log_file)
        .stderr(log_err);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().context("cannot start the mount daemon")?;
    let deadline = Instant::now() + Duration::from_secs(args.ready_timeout);
    loop {
        if ready.exists() {
            outln!("{}", child.id())?;
            tracing::debug!(ready = %ready.display(), log = %log.display(), "daemon ready");
            return Ok(());
        }
        if let Some(status) = child
            .try_wait()
            .context("cannot wait for the mount daemon")?
        {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            bail!(
                "the mount daemon exited ({status}) before it was ready:\n{}",
                text.trim()
            );
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the mount daemon was not ready after {}s (log: {})",
                args.ready_timeout,
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
