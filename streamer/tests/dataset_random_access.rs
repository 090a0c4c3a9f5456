//! Random access (`StreamingDataset::sample` and `sample_now`) against a real moto S3 server:
//! `sample_now` reads only what needs no fetch (a shard kept open by `sample`, or complete in the
//! node's cache) and never starts a download; `sample` keeps shards open for the next calls.

#![allow(clippy::unwrap_used, clippy::expect_used)] // helpers outside #[test] fns

use crate::common;
use common::{check_sample, node_config, served, Spec};
use shardstream_streamer::StreamingDataset;
use std::time::{Duration, Instant};

#[test]
fn sample_now_reads_kept_and_cached_shards_and_never_fetches() {
    let spec = Spec::small(300);
    let served = served(&spec);
    let (cache, location) = (&served.cache, &served.location);
    let ds = StreamingDataset::open_at(node_config(cache.path()), location.clone()).unwrap();
    let (first_of_3, _) = (0..300u64)
        .map(|i| (i, ds.shard_of(i).unwrap().0))
        .find(|&(_, s)| s == 3)
        .unwrap();

    // Nothing open or cached yet: no read, and no fetch started.
    assert!(ds.sample_now(0).is_none());
    assert_eq!(ds.metrics().fetch_requests, 0);

    let s = ds.sample(0).unwrap();
    check_sample(0, &s.decode().unwrap(), spec.sample_bytes);
    let fetched = ds.metrics().fetch_requests;
    assert!(fetched > 0);
    // Shard 0 is kept open: its other samples come without the engine, and without the cache
    // (no hit counted: not reopened).
    let hits = ds.metrics().cache_hits;
    for i in 1..5 {
        let s = ds.sample_now(i).expect("kept shard");
        check_sample(i, &s.decode().unwrap(), spec.sample_bytes);
    }
    assert_eq!(ds.metrics().cache_hits, hits);
    // Shard 3 needs a download: `sample_now` leaves it to `sample`.
    assert!(ds.sample_now(first_of_3).is_none());
    assert_eq!(ds.metrics().fetch_requests, fetched);
    let s = ds.sample(first_of_3).unwrap();
    check_sample(first_of_3, &s.decode().unwrap(), spec.sample_bytes);

    // Another dataset object on the same node cache: shard 0 is complete there, so once its
    // engine runs, `sample_now` opens it on the calling thread (a cache hit, no request).
    // `sample` returns once a shard's header is on disk and its download goes on in the
    // background: wait for both downloads' commits first.
    for shard in [0, 3] {
        let handle = ds.shard(shard).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !handle.is_complete() {
            assert!(
                Instant::now() < deadline,
                "shard {shard} was never committed"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    drop(ds);
    let again = StreamingDataset::open_at(node_config(cache.path()), location.clone()).unwrap();
    let s = again.sample(first_of_3 + 1).unwrap(); // starts the engine (shard 3: a hit)
    check_sample(first_of_3 + 1, &s.decode().unwrap(), spec.sample_bytes);
    let s = again.sample_now(2).expect("a shard complete in the cache");
    check_sample(2, &s.decode().unwrap(), spec.sample_bytes);
    let m = again.metrics();
    assert_eq!(m.fetch_requests, 0, "{m:?}");
}
