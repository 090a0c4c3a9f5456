//! The cold-epoch ceilings of a machine and a store, measured with `object_store` alone (none of
//! shardstream's transfer code), so that a cold epoch's throughput can be read against what the
//! store and the disk can do together:
//!
//! - `get`: every object under a prefix fetched with N whole-object GETs in flight, bytes dropped
//!   (the raw parallel GET ceiling);
//! - `file`: the same GETs, each body written into a temporary file in DIR, fsynced and renamed
//!   into place, the folder fsynced once at the end: the discipline of the node cache
//!   (`streamer/src/cache/layout.rs`), so "≥ 0.85 of the cold ceiling" compares like with like.
//!
//! `benches/lib/ceilings.py` runs it against the benchmark's S3 server.
//!
//! ```text
//! cargo run --release -p shardstream-storage --example get_ceiling -- URL \
//!     [--concurrency 16] [--to DIR]
//! ```
//!
//! The store's configuration comes from the environment as for every command (`AWS_*`, ...).
//! Prints one JSON object: `objects`, `bytes`, `seconds` (listing excluded), `mode`.

use std::error::Error;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use shardstream_storage::object_store::ObjectStoreExt;
use shardstream_storage::Location;

type Res<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

struct Args {
    url: String,
    concurrency: usize,
    to: Option<PathBuf>,
}

fn parse_args() -> Res<Args> {
    let mut it = std::env::args().skip(1);
    let mut args = Args {
        url: String::new(),
        concurrency: 16,
        to: None,
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--concurrency" => {
                args.concurrency = it.next().ok_or("--concurrency needs a value")?.parse()?
            }
            "--to" => args.to = Some(it.next().ok_or("--to needs a folder")?.into()),
            _ if args.url.is_empty() => args.url = a,
            other => return Err(format!("unexpected argument {other:?}").into()),
        }
    }
    if args.url.is_empty() {
        return Err("usage: get_ceiling URL [--concurrency N] [--to DIR]".into());
    }
    if args.concurrency == 0 {
        return Err("--concurrency must be at least 1".into());
    }
    Ok(args)
}

/// Writes one body the way the cache commits a shard: temp file, write, fsync, rename.
fn commit_file(dir: &Path, name: &str, body: &[u8]) -> Res<()> {
    let flat = name.replace('/', "_");
    let tmp = dir.join(format!(".{flat}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(body)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(flat))?;
    Ok(())
}

async fn run(args: Args) -> Res<String> {
    let loc = Location::open(&args.url)?;
    let objects = loc.list("").await?;
    if let Some(dir) = &args.to {
        std::fs::create_dir_all(dir)?;
    }
    let started = Instant::now();
    let to = args.to.clone();
    let bytes: u64 = futures::stream::iter(objects.iter().map(|o| {
        let loc = &loc;
        let to = to.clone();
        async move {
            let path = loc.path(&o.key)?;
            let body = loc.store().get(&path).await?.bytes().await?;
            let n = body.len() as u64;
            if let Some(dir) = to {
                let key = o.key.clone();
                tokio::task::spawn_blocking(move || commit_file(&dir, &key, &body)).await??;
            }
            Res::Ok(n)
        }
    }))
    .buffer_unordered(args.concurrency)
    .try_fold(0u64, |acc, n| async move { Ok(acc + n) })
    .await?;
    if let Some(dir) = &args.to {
        std::fs::File::open(dir)?.sync_all()?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let mode = if args.to.is_some() { "file" } else { "get" };
    Ok(format!(
        r#"{{"objects": {}, "bytes": {bytes}, "seconds": {seconds}, "concurrency": {}, "mode": "{mode}"}}"#,
        objects.len(),
        args.concurrency
    ))
}

fn main() -> Res<()> {
    let args = parse_args()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let out = rt.block_on(run(args))?;
    println!("{out}");
    Ok(())
}
