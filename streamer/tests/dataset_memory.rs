//! The memory contract: streaming shards of 256 MiB from a real S3 server (moto) with
//! `memory_limit = 64 MiB` keeps the process's peak RSS (`VmHWM`) under the base RSS plus the
//! limit.
//!
//! The base is measured, not assumed: a child process runs the same code (same binary, same
//! runtime, same consumer that decodes and checks every 1 MiB sample) over a dataset of one
//! small shard. A second child streams two incompressible 256 MiB shards, each twice the whole
//! budget, cold from the server. Its peak may exceed the base by at most `memory_limit`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // helpers outside #[test] fns

use crate::common;
use common::child::{run_child, spawn, wait, ChildSpec};
use common::{moto_with, runtime, upload, write_dataset, Spec};

const MIB: u64 = 1 << 20;
const TEST: &str = "streaming_256mib_shards_under_64mib_stays_within_base_plus_limit";

#[test]
fn streaming_256mib_shards_under_64mib_stays_within_base_plus_limit() {
    if run_child() {
        return;
    }
    let rt = runtime();
    let small = tempfile::tempdir().unwrap();
    let large = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let sample_bytes = MIB as usize;
    write_dataset(
        small.path(),
        &Spec {
            samples: 2,
            sample_bytes,
            shard_limit: 4 * MIB,
            compression: None,
            hashes: false,
        },
    );
    write_dataset(
        large.path(),
        &Spec {
            samples: 510,
            sample_bytes,
            shard_limit: 256 * MIB,
            compression: None,
            hashes: false,
        },
    );
    let shard = std::fs::metadata(large.path().join("shard.00000.mds"))
        .unwrap()
        .len();
    assert!(shard > 250 * MIB, "shard of {shard} bytes");
    let server = moto_with(small.path(), &rt);
    upload(&server, large.path(), "large", &rt);
    let limit = 64 * MIB;
    let run = |name: &str, prefix: &str| {
        let cache = tempfile::tempdir().unwrap();
        let spec = ChildSpec {
            endpoint: server.endpoint(),
            prefix: prefix.into(),
            cache_root: cache.path().to_path_buf(),
            processes: 1,
            rank: 0,
            memory_limit: limit,
            cache_limit: None,
            shuffle: true,
            sample_bytes,
            out: out.path().join(format!("{name}.json")),
        };
        let report = wait(spawn(TEST, &spec), &spec.out);
        (
            report["peak_rss"].as_u64().unwrap(),
            report["ids"].as_array().unwrap().len(),
            report["fetch_bytes"].as_u64().unwrap(),
        )
    };
    let (base, n_small, _) = run("base", "ds");
    let (peak, n_large, fetched) = run("large", "large");
    eprintln!(
        "base peak RSS {:.1} MiB, 256 MiB shards peak RSS {:.1} MiB, limit {} MiB",
        base as f64 / MIB as f64,
        peak as f64 / MIB as f64,
        limit / MIB
    );
    assert_eq!(n_small, 2);
    assert_eq!(n_large, 510);
    assert!(
        fetched > 2 * 250 * MIB,
        "the large shards were streamed ({fetched})"
    );
    assert!(
        peak <= base + limit,
        "peak RSS {peak} exceeds base {base} + memory_limit {limit}"
    );
}
