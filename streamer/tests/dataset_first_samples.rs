//! Time to first sample against a real moto S3 server: the first samples of a shard are served
//! while the rest of it is still on its way. A gate in front of the server stalls the shard's
//! GET body after its first 2 MiB; the first samples must arrive while the body is stalled (a
//! condition, not a timing), and after the gate opens every sample must be the source's.
//! With `validate_hash` on, nothing is served before the whole shard is checked.

#![allow(clippy::unwrap_used, clippy::expect_used)] // helpers outside #[test] fns

use crate::common;
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use common::{check_sample, moto_with, runtime, s3_location, write_dataset, Spec};
use shardstream_storage::testing::GateStore;
use shardstream_streamer::order::OrderConfig;
use shardstream_streamer::{StreamPlan, StreamedSample, StreamingConfig, StreamingDataset};

/// Long enough for a loaded machine; the waits end as soon as their condition holds.
const DEADLINE: Duration = Duration::from_secs(120);
const SAMPLE_BYTES: usize = 8 << 10;

fn config(cache: &Path, validate_hash: bool) -> StreamingConfig {
    StreamingConfig {
        remote: "s3://bucket/ds".into(),
        cache_root: Some(cache.to_path_buf()),
        run_id: Some("run".into()),
        node_rank: Some(0),
        // Download buffers of 1 MiB.
        memory_limit: Some(4 << 20),
        validate_hash,
        ..StreamingConfig::default()
    }
}

fn in_order() -> StreamPlan {
    StreamPlan::single_process(OrderConfig::default(), 0)
}

/// A dataset of one 8 MiB shard (1000 samples of 8 KiB) behind a gate that stalls the shard's
/// GET bodies at byte `from`.
struct Stalled {
    _data: tempfile::TempDir,
    cache: tempfile::TempDir,
    _server: shardstream_storage::testing::MotoServer,
    gate: GateStore,
    rt: tokio::runtime::Runtime,
    spec: Spec,
}

fn stalled(from: u64, hashes: bool) -> Stalled {
    let rt = runtime();
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let spec = Spec {
        samples: 1000,
        sample_bytes: SAMPLE_BYTES,
        shard_limit: 64 << 20,
        compression: None,
        hashes,
    };
    write_dataset(data.path(), &spec);
    let server = moto_with(data.path(), &rt);
    let loc = s3_location(&server.endpoint(), "ds");
    let gate = GateStore::new(Arc::clone(loc.store()), "shard.00000.mds", from);
    Stalled {
        _data: data,
        cache,
        _server: server,
        gate,
        rt,
        spec,
    }
}

impl Stalled {
    fn open(&self, validate_hash: bool) -> StreamingDataset {
        let gate = self.gate.clone();
        let loc = s3_location(&self._server.endpoint(), "ds").map_store(move |_| Arc::new(gate));
        let ds = StreamingDataset::open_at(config(self.cache.path(), validate_hash), loc).unwrap();
        assert_eq!(ds.num_shards(), 1, "the test needs one large shard");
        ds
    }

    fn wait_held(&self) {
        self.rt.block_on(async {
            tokio::time::timeout(DEADLINE, self.gate.wait_held(1))
                .await
                .expect("the download never reached the stalled part of the shard")
        });
    }
}

/// Streams the epoch on a thread, sending each sample as it comes.
fn consume(ds: StreamingDataset) -> mpsc::Receiver<StreamedSample> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for item in ds.stream(in_order()).unwrap() {
            if tx.send(item.unwrap()).is_err() {
                return;
            }
        }
    });
    rx
}

#[test]
fn first_samples_arrive_while_the_rest_of_the_shard_is_stalled() {
    // Everything past the first 2 MiB is held back: the header, the offset table and about 250
    // samples get through.
    let s = stalled(2 << 20, false);
    let ds = s.open(false);
    let rx = consume(ds.clone());

    let mut got = Vec::new();
    for _ in 0..100 {
        let item = rx
            .recv_timeout(DEADLINE)
            .expect("a first sample was not served while the rest of its shard was stalled");
        got.push(item);
    }
    // The shard is incomplete right now: its body is stalled at the gate, and no shard has
    // been committed to the cache.
    s.wait_held();
    assert_eq!(s.gate.counts().released, 0);
    assert_eq!(
        ds.metrics().shards_fetched,
        0,
        "the shard is not complete yet"
    );
    let handle = ds.shard(0).unwrap();
    assert!(!handle.is_complete());
    check_sample(
        7,
        &handle.sample(7).unwrap().decode().unwrap(),
        SAMPLE_BYTES,
    );

    s.gate.open();
    while let Ok(item) = rx.recv_timeout(DEADLINE) {
        got.push(item);
        if got.len() as u64 == s.spec.samples {
            break;
        }
    }
    assert_eq!(got.len() as u64, s.spec.samples);
    for (i, item) in got.iter().enumerate() {
        assert_eq!(item.index, i as u64);
        check_sample(item.index, &item.sample.decode().unwrap(), SAMPLE_BYTES);
    }
    assert!(s.gate.counts().released >= 1);
    // The download finished and was committed once; the handle now reads the cached file.
    // The commit (fsync, rename) follows the last byte, which the stream may already have
    // served; the stream's end waits for it, so wait for the consumer to see the end.
    assert!(
        matches!(
            rx.recv_timeout(DEADLINE),
            Err(mpsc::RecvTimeoutError::Disconnected)
        ),
        "the stream never ended"
    );
    assert!(handle.is_complete(), "the download was never committed");
    let m = ds.metrics();
    assert_eq!(m.shards_fetched, 1);
    assert_eq!(
        std::fs::metadata(handle.path()).unwrap().len(),
        handle.len()
    );
    check_sample(
        999,
        &handle.sample(999).unwrap().decode().unwrap(),
        SAMPLE_BYTES,
    );

    // A second open of the same cache is a hit: nothing is fetched again.
    drop(handle);
    let again = s.open(false);
    let first = again.sample(0).unwrap();
    check_sample(0, &first.decode().unwrap(), SAMPLE_BYTES);
    assert_eq!(again.metrics().fetch_requests, 0);
}

#[test]
fn with_validate_hash_nothing_is_served_before_the_shard_is_checked() {
    let s = stalled(2 << 20, true);
    let ds = s.open(true);
    let rx = consume(ds.clone());
    s.wait_held();
    // The stalled body keeps the shard incomplete, so its hash cannot have been checked: no
    // sample may have been served.
    assert!(
        rx.try_recv().is_err(),
        "a sample was served before its shard's hash was checked"
    );
    assert_eq!(ds.metrics().samples, 0);
    s.gate.open();
    let mut n = 0u64;
    while let Ok(item) = rx.recv_timeout(DEADLINE) {
        check_sample(item.index, &item.sample.decode().unwrap(), SAMPLE_BYTES);
        n += 1;
        if n == s.spec.samples {
            break;
        }
    }
    assert_eq!(n, s.spec.samples);
}

#[test]
fn compressed_shards_without_hashes_stream_while_they_decompress() {
    let rt = runtime();
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let spec = Spec {
        samples: 600,
        sample_bytes: 4000,
        shard_limit: 512 << 10,
        compression: Some("zstd"),
        hashes: false,
    };
    write_dataset(data.path(), &spec);
    let server = moto_with(data.path(), &rt);
    let ds = StreamingDataset::open_at(
        config(cache.path(), false),
        s3_location(&server.endpoint(), "ds"),
    )
    .unwrap();
    assert!(ds.num_shards() > 2);
    let mut n = 0u64;
    for item in ds.stream(in_order()).unwrap() {
        let item = item.unwrap();
        assert_eq!(item.index, n);
        check_sample(
            item.index,
            &item.sample.decode().unwrap(),
            spec.sample_bytes,
        );
        n += 1;
    }
    assert_eq!(n, spec.samples);
    assert_eq!(ds.metrics().shards_fetched, ds.num_shards() as u64);
}
