//! `shardstream-ckpt-fault`: saves one synthetic checkpoint and, when asked, freezes at a chosen
//! phase of the save so that a crash test can kill it there (SIGKILL) and check what survives.
//!
//! ```text
//! shardstream-ckpt-fault ROOT ID [--world-size N] [--files-per-rank K] [--file-size BYTES]
//!                                [--part-size BYTES] [--seed S]
//! SHARDSTREAM_CKPT_PAUSE_AT=none|mid-upload|after-uploads|before-manifest|after-manifest
//! ```
//!
//! ROOT is a URL or path (`shardstream-storage` rules). Every rank `r` writes files
//! `__{r}_{k}.distcp` whose bytes are [`pattern`]`(seed, id, r, k)`; rank 0 also writes
//! `.metadata`, published at the checkpoint root after commit. The phases:
//! - `mid-upload`: the second multipart part sent freezes (other uploads keep going);
//! - `after-uploads`: every file is uploaded, the commit has not started;
//! - `before-manifest`: the commit's HEAD checks passed, the manifest PUT freezes;
//! - `after-manifest`: the manifest is written, the `.metadata` copy freezes.
//!
//! At the pause it prints `PAUSED <phase>` on stdout; on success `COMMITTED <id> <attempt>`.
//! Exit status 1 with a one-line reason on failure, 2 on bad usage.

use bytes::Bytes;
use shardstream_checkpoint::layout::MANIFEST_NAME;
use shardstream_checkpoint::testing::{FaultAction, FaultStore};
use shardstream_checkpoint::{CheckpointRoot, CommitRequest, UploadConfig};
use std::io::Write as _;
use std::sync::Arc;

struct Args {
    root: String,
    id: String,
    world_size: u32,
    files_per_rank: u32,
    file_size: u64,
    part_size: u64,
    seed: u64,
}

fn usage(msg: &str) -> ! {
    eprintln!("shardstream-ckpt-fault: {msg}");
    eprintln!("usage: shardstream-ckpt-fault ROOT ID [--world-size N] [--files-per-rank K] [--file-size BYTES] [--part-size BYTES] [--seed S]");
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut pos = Vec::new();
    let mut a = Args {
        root: String::new(),
        id: String::new(),
        world_size: 2,
        files_per_rank: 2,
        file_size: 3 << 20,
        part_size: 1 << 20,
        seed: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        if let Some(key) = arg.strip_prefix("--") {
            let Some(v) = it.next() else {
                usage(&format!("--{key} needs a value"))
            };
            let n: u64 = v
                .parse()
                .unwrap_or_else(|_| usage(&format!("--{key} {v}: not a number")));
            let small = || u32::try_from(n).unwrap_or_else(|_| usage("value too large"));
            match key {
                "world-size" => a.world_size = small(),
                "files-per-rank" => a.files_per_rank = small(),
                "file-size" => a.file_size = n,
                "part-size" => a.part_size = n,
                "seed" => a.seed = n,
                _ => usage(&format!("unknown option --{key}")),
            }
        } else {
            pos.push(arg);
        }
    }
    match <[String; 2]>::try_from(pos) {
        Ok([root, id]) => {
            a.root = root;
            a.id = id;
        }
        Err(_) => usage("expected ROOT and ID"),
    }
    a
}

/// The bytes of rank `rank`'s file `k` (splitmix64 stream keyed by all four values).
pub fn pattern(seed: u64, id: &str, rank: u32, k: u32, len: u64) -> Vec<u8> {
    let mut x = seed ^ (u64::from(rank) << 32) ^ u64::from(k);
    for b in id.bytes() {
        x = x.wrapping_mul(0x100_0000_01b3) ^ u64::from(b);
    }
    let mut out = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    while (out.len() as u64) < len {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        out.extend_from_slice(&z.to_le_bytes());
    }
    out.truncate(usize::try_from(len).unwrap_or(0));
    out
}

fn announce(phase: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "PAUSED {phase}");
    let _ = out.flush();
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    let phase = std::env::var("SHARDSTREAM_CKPT_PAUSE_AT").unwrap_or_else(|_| "none".into());
    let base = CheckpointRoot::open_url(&args.root).unwrap_or_else(|e| {
        eprintln!("shardstream-ckpt-fault: {e}");
        std::process::exit(1)
    });
    let hook_phase = phase.clone();
    let pause = FaultAction::Pause(Arc::new(move |_what: &str| announce(&hook_phase)));
    let mut fault = FaultStore::new(base.store().clone());
    match phase.as_str() {
        "none" | "after-uploads" => {}
        "mid-upload" => fault = fault.on_part(2, pause),
        "before-manifest" => fault = fault.on_put(MANIFEST_NAME, pause),
        "after-manifest" => fault = fault.on_copy(pause),
        other => usage(&format!("unknown SHARDSTREAM_CKPT_PAUSE_AT {other:?}")),
    }
    let root = CheckpointRoot::new(Arc::new(fault), base.root().clone());
    if let Err(e) = run(&args, &root, &phase).await {
        eprintln!("shardstream-ckpt-fault: {e}");
        std::process::exit(1);
    }
}

async fn run(
    args: &Args,
    root: &CheckpointRoot,
    phase: &str,
) -> shardstream_checkpoint::Result<()> {
    let attempt = root.begin_save(&args.id).await?;
    let config = UploadConfig {
        part_size: args.part_size,
        memory_budget: args.part_size * 4,
        // The pause points are in the multipart path: files over a part go up in parts.
        single_put_max: 0,
        ..UploadConfig::default()
    };
    let mut ranks = Vec::new();
    for rank in 0..args.world_size {
        let w = root.rank_writer(&attempt, rank, &config)?;
        let (seed, id, n, size) = (
            args.seed,
            args.id.clone(),
            args.files_per_rank,
            args.file_size,
        );
        ranks.push(tokio::spawn(async move {
            let mut files: Vec<(String, shardstream_checkpoint::UploadSource)> = (0..n)
                .map(|k| {
                    let data = Bytes::from(pattern(seed, &id, rank, k, size));
                    (
                        format!("__{rank}_{k}.distcp"),
                        shardstream_checkpoint::UploadSource::Bytes(data),
                    )
                })
                .collect();
            if rank == 0 {
                let meta = format!("{{\"id\":\"{id}\",\"seed\":{seed}}}");
                files.push((
                    ".metadata".into(),
                    shardstream_checkpoint::UploadSource::Bytes(meta.into()),
                ));
            }
            w.upload_all(files).await
        }));
    }
    let mut records = Vec::new();
    for r in ranks {
        let rank_records = r.await.map_err(|e| {
            shardstream_checkpoint::CheckpointError::InvalidConfig(format!(
                "a rank task failed: {e}"
            ))
        })??;
        records.extend(rank_records);
    }
    if phase == "after-uploads" {
        announce(phase);
        std::future::pending::<()>().await;
    }
    let manifest = root
        .commit(
            &attempt,
            CommitRequest {
                records,
                world_size: args.world_size,
                aliases: vec![(".metadata".into(), ".metadata".into())],
                ..Default::default()
            },
        )
        .await?;
    println!("COMMITTED {} {}", manifest.checkpoint_id, manifest.attempt);
    Ok(())
}
