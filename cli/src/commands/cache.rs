//! `shardstream cache`: node cache maintenance (`cache gc` removes the folders of finished runs).

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use shardstream_launcher::identity::default_cache_root;
use shardstream_launcher::{cache_gc, os_env, GcReport};

use super::run::parse_duration;
use crate::output::outln;
use crate::Global;

/// `cache ACTION`.
#[derive(Debug, clap::Args)]
pub struct CacheArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: CacheAction,
}

/// The `cache` actions.
#[derive(Debug, clap::Subcommand)]
pub enum CacheAction {
    /// Remove the cache folders of runs that are over: never one that a `shardstream run` or a
    /// process with the cache open still holds (their file locks say so, also over NFS).
    Gc {
        /// Cache root (the folder holding <run-id>/<node-rank>/ folders); default
        /// $XDG_CACHE_HOME/shardstream, ~/.cache/shardstream or /tmp/shardstream-cache.
        #[arg(long, env = "SHARDSTREAM_CACHE_ROOT")]
        cache_root: Option<PathBuf>,
        /// Remove only runs last used longer ago than this (e.g. 7d, 12h); without it, every
        /// run not in use, even one whose pod is about to be retried.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        older_than: Option<Duration>,
        /// Report what would be removed, remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

impl CacheAction {
    /// Whether `--json` was given.
    pub fn json(&self) -> bool {
        match self {
            CacheAction::Gc { json, .. } => *json,
        }
    }
}

/// Runs `cache`.
pub fn run(args: CacheArgs, global: &Global) -> anyhow::Result<()> {
    let _ = global;
    match args.action {
        CacheAction::Gc {
            cache_root,
            older_than,
            dry_run,
            json,
        } => gc(cache_root, older_than, dry_run, json),
    }
}

fn gc(
    cache_root: Option<PathBuf>,
    older_than: Option<Duration>,
    dry_run: bool,
    json: bool,
) -> anyhow::Result<()> {
    let root = match cache_root {
        Some(root) => root,
        None => default_cache_root(&os_env)?,
    };
    let now = SystemTime::now();
    let report = cache_gc(
        &root,
        |run| older_than.is_none_or(|limit| run.idle_for(now) > limit),
        dry_run,
    )
    .with_context(|| format!("cache gc of {}", root.display()))?;
    if json {
        outln!("{}", report_json(&root, &report, dry_run))?;
    } else {
        print_text(&report, dry_run)?;
    }
    Ok(())
}

fn report_json(root: &std::path::Path, report: &GcReport, dry_run: bool) -> serde_json::Value {
    serde_json::json!({
        "cache_root": root.display().to_string(),
        "dry_run": dry_run,
        "removed": report
            .removed
            .iter()
            .map(|(run_id, bytes)| serde_json::json!({"run_id": run_id, "bytes": bytes}))
            .collect::<Vec<_>>(),
        "freed_bytes": report.freed_bytes(),
        "busy": report.busy,
        "kept": report.kept,
        "foreign": report
            .foreign
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>(),
        "gc_leftovers_removed": report.tombstones,
    })
}

fn print_text(report: &GcReport, dry_run: bool) -> anyhow::Result<()> {
    let verb = if dry_run { "would remove" } else { "removed" };
    for (run_id, bytes) in &report.removed {
        outln!("{verb} {run_id} ({bytes} bytes)")?;
    }
    for run_id in &report.busy {
        outln!("in use, kept {run_id}")?;
    }
    for path in &report.foreign {
        outln!(
            "not a shardstream run folder, left alone: {}",
            path.display()
        )?;
    }
    outln!(
        "{verb} {} run(s), {} bytes; {} in use; {} too recent",
        report.removed.len(),
        report.freed_bytes(),
        report.busy.len(),
        report.kept.len()
    )?;
    Ok(())
}
