//! `merge-index ROOT`: Mosaic's `merge_index(ROOT)` for parts written with `shard --part`.
//!
//! Reads every `ROOT/<part>/index.json` in sorted key order, prefixes each shard's `raw_data`,
//! `zip_data`, `raw_meta` and `zip_meta` basename with `<part>/`, and writes
//! `{"version": 2, "shards": [...]}` to `ROOT/index.json` as Python's `json.dump` does (no key
//! sorting at the top; shard entries keep their keys' order). Unlike Mosaic, which picks up any
//! `.json` file at any depth of a local ROOT, only `ROOT/*/index.json` counts.
//!
//! With `--binary-index`, or when a part has an `index.ssx` (its `shard` ran with
//! `--binary-index`), the merged index also gets its binary form, `ROOT/index.ssx`, built
//! from the merged JSON without a JSON tree: the parts' own `index.ssx` name their shards
//! without the `<part>/` folder, and a merged dataset of 10^6 shards is where the binary
//! form matters.

use anyhow::{bail, Context};
use bytes::Bytes;
use serde_json::{json, Value as Json};
use shardstream_sharding::mds::index_bin::{self, BINARY_INDEX_BASENAME};
use shardstream_sharding::mds::pyjson;
use shardstream_sharding::safe_path::check_relative;
use shardstream_storage::Location;

use crate::output::outln;
use crate::runtime;

/// Arguments of `merge-index`.
#[derive(Debug, clap::Args)]
pub struct MergeIndexArgs {
    /// Dataset root holding one folder per part (local path or URL).
    pub root: String,
    /// Also write ROOT/index.ssx, the compact binary form of the merged index.json (also done
    /// when a part has an index.ssx).
    #[arg(long)]
    pub binary_index: bool,
    /// Print a JSON summary.
    #[arg(long)]
    pub json: bool,
}

/// What a merge produced.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MergeSummary {
    /// The part folders merged, in order.
    pub parts: Vec<String>,
    /// Shards in the merged index.
    pub shards: u64,
    /// Samples in the merged index.
    pub samples: u64,
    /// Whether ROOT/index.ssx was written.
    pub binary_index: bool,
}

/// Runs `merge-index`.
pub fn run(args: MergeIndexArgs) -> anyhow::Result<()> {
    let root = Location::open(&args.root).with_context(|| format!("cannot open {}", args.root))?;
    let summary = runtime::build(2)?.block_on(merge(&root, args.binary_index))?;
    if args.json {
        outln!("{}", serde_json::to_string(&summary)?)?;
    } else {
        outln!(
            "merged {} parts ({} shards, {} samples) into {}{}",
            summary.parts.len(),
            summary.shards,
            summary.samples,
            root.url_of("index.json"),
            if summary.binary_index {
                format!(" and {}", root.url_of(BINARY_INDEX_BASENAME))
            } else {
                String::new()
            }
        )?;
    }
    Ok(())
}

/// Merges `root/*/index.json` into `root/index.json`, and into `root/index.ssx` when
/// `binary_index` or a part has an `index.ssx`.
pub async fn merge(root: &Location, binary_index: bool) -> anyhow::Result<MergeSummary> {
    let listing = root
        .list("")
        .await
        .with_context(|| format!("cannot list {}", root.url()))?;
    let mut parts: Vec<String> = listing
        .iter()
        .filter_map(|o| match o.key.split('/').collect::<Vec<_>>()[..] {
            [part, "index.json"] => Some(part.to_string()),
            _ => None,
        })
        .collect();
    parts.sort();
    parts.dedup();
    let binary_index = binary_index
        || listing.iter().any(|o| {
            matches!(o.key.split('/').collect::<Vec<_>>()[..], [_, name] if name == BINARY_INDEX_BASENAME)
        });
    if parts.is_empty() {
        bail!("no part index found: {} has no */index.json", root.url());
    }
    let mut shards = Vec::new();
    let mut samples = 0u64;
    for part in &parts {
        let rel = format!("{part}/index.json");
        let url = root.url_of(&rel);
        let text = root
            .get_at_most(&rel, shardstream_sharding::index_file::max_index_bytes())
            .await
            .with_context(|| format!("cannot read {url}"))?;
        let index: Json =
            serde_json::from_slice(&text).with_context(|| format!("{url}: not valid JSON"))?;
        let Some(entries) = index.get("shards").and_then(Json::as_array) else {
            bail!("{url}: no \"shards\" list (is it an MDS index?)");
        };
        for entry in entries {
            let mut entry = entry.clone();
            for key in ["raw_data", "zip_data", "raw_meta", "zip_meta"] {
                prefix_basename(&mut entry, key, part).with_context(|| format!("{url}: {key}"))?;
            }
            samples += entry.get("samples").and_then(Json::as_u64).unwrap_or(0);
            shards.push(entry);
        }
    }
    let count = shards.len() as u64;
    let merged = json!({"version": 2, "shards": shards});
    let json_bytes = pyjson::dumps(&merged, false);
    drop(merged);
    // Built (and so checked) before anything is written: a merge that cannot be read back
    // leaves the root as it was.
    let binary = if binary_index {
        let url = root.url_of("index.json");
        Some(
            index_bin::view_from_json(&url, json_bytes.as_bytes())
                .with_context(|| format!("{url}: the merged index does not read back"))?
                .into_bytes(),
        )
    } else {
        None
    };
    root.put("index.json", Bytes::from(json_bytes))
        .await
        .with_context(|| format!("cannot write {}", root.url_of("index.json")))?;
    // After index.json: a reader trusts index.ssx only if it mirrors the index.json beside it,
    // so a stale one from an earlier merge is ignored until this one lands.
    if let Some(binary) = binary {
        root.put(BINARY_INDEX_BASENAME, Bytes::from(binary))
            .await
            .with_context(|| format!("cannot write {}", root.url_of(BINARY_INDEX_BASENAME)))?;
    }
    tracing::info!(
        root = root.url(),
        parts = parts.len(),
        shards = count,
        samples,
        "merged index"
    );
    Ok(MergeSummary {
        parts,
        shards: count,
        samples,
        binary_index,
    })
}

/// `entry[key]["basename"] = part + "/" + basename` when `entry[key]` is a non-empty object, as
/// Mosaic's `if shard.get(key)` does.
fn prefix_basename(entry: &mut Json, key: &str, part: &str) -> anyhow::Result<()> {
    let Some(file) = entry.get_mut(key).and_then(Json::as_object_mut) else {
        return Ok(());
    };
    if file.is_empty() {
        return Ok(());
    }
    let basename = file
        .get("basename")
        .and_then(Json::as_str)
        .context("no basename")?;
    check_relative("index.json", basename)?;
    let joined = format!("{part}/{basename}");
    file.insert("basename".into(), Json::String(joined));
    Ok(())
}
